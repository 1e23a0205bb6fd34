//! One in-memory connection's whole HTTP/SSE state machine (`aep_sim::Sim`, driving the
//! sans-IO `Core`: no socket, virtual time), with arbitrary bytes delivered in arbitrary
//! chunks.
//!
//! Kept to one connection so that an input costs little (execs/s): a stalled subscriber
//! beside it and a full replay store, too costly to set up per input here, are
//! `conn_script`'s (opcodes `open` SSE with a peer that never reads, `prefill`, `send`),
//! which combines them with everything else.
//!
//! Input layout (so the payload stays contiguous for the dictionary and the mutator):
//! - byte 0: flags. bit 0: the fuzzed connection stops reading its output (a write
//!   limit of 0..=255 bytes, from byte 1); bit 2: clock steps (below); bits 4-5: the
//!   payload is delivered `1 + (bits 4-5)` times over (pipelining without reading,
//!   cheaply), at most 4 KiB in all; bits 1, 3, 6, 7: unused.
//! - byte 1: the write limit (bit 0).
//! - byte 2: `n`, the number of chunk lengths (0..=15); bytes 3..3+n: the chunk lengths,
//!   used in turn (0 = one byte; after 64 chunks the rest goes whole). With bit 2, a
//!   length 0 is a clock step first: the virtual clock moves by the next length in turn
//!   (consumed) times 100 ms, a 0 there meaning a jump past every timeout
//!   (`harness::delta`), then one byte is sent.
//! - the rest: the payload.
//!
//! The clock comes from the input only, and the configured timeouts are short
//! (`harness::timeouts`: request 3 s, idle 5 s, heartbeat 4 s), so a run steps through a
//! few deadlines at most.
//!
//! Invariants asserted:
//! 1. Nothing panics, whatever the bytes and however they are split.
//! 2. Output stays bounded: after every chunk the connection's `queued_output` is at
//!    most `max_output_bytes` plus one answer (the largest single thing the relay queues
//!    at once: a response echoing at most the request head, one SSE message of at most
//!    one body, or the status page), `Config` limits included (AEP-0003 §8.4); and with the live frames
//!    held back behind a replay in progress (`queued_backlog`, bounded by
//!    `max_output_bytes` itself), at most `2 * max_output_bytes` plus one answer in all.
//! 3. Every request ends in a response or a close: once the peer has sent EOF and every
//!    timer has run (request timeout, linger), the connection is closed.
//! 4. What the relay writes (when the peer reads) is a sequence of well-formed HTTP/1.1
//!    responses, up to a `101` (the rest is WebSocket) or an SSE stream.
//! 5. No request smuggling: the relay never gives more final (non-1xx) responses than
//!    there are requests in the input as a reference framer reads it (RFC 9112 §6.3:
//!    `Transfer-Encoding: chunked`, else `Content-Length`, else no body, whatever the
//!    method). A relay that frames a body differently, e.g. ignores the body of a `GET`
//!    with `Content-Length` and reads it as the next request, answers more.
//! 6. Determinism: the same input gives byte-identical output and queue sizes (one
//!    input in 8 runs twice, `harness::deterministic`).
#![no_main]

use aep_relay::ConnId;
use aep_relay_fuzz::harness;
use aep_sim::Sim;
use libfuzzer_sys::fuzz_target;

const MAX_HEAD: usize = 1024;
const MAX_BODY: usize = 2048;
const MAX_OUTPUT: usize = 64 * 1024;
/// Most bytes one input delivers, repetitions included (bits 4-5).
const MAX_DELIVERED: usize = 4 * 1024;
/// Most chunks one input is split into; the rest goes whole. A byte-by-byte delivery
/// costs a core call per byte; 64 of them split a request head anywhere in its first
/// line and headers, and lengths up to 255 reach past any head (`MAX_HEAD`) and body.
const MAX_CHUNKS: usize = 64;

/// RFC 9112 §7.1 chunked body at the start of `b`: bytes used, or `None` when it is
/// incomplete, malformed or refused by the size limits the relay applies (at least as
/// permissive as the relay's decoder: any chunk extension, any trailer lines).
fn reference_chunked(b: &[u8]) -> Option<usize> {
    let line = |from: usize| -> Option<usize> {
        let rel = b.get(from..)?.windows(2).position(|w| w == b"\r\n")?;
        Some(from + rel)
    };
    let mut at = 0;
    let mut total = 0usize;
    loop {
        let end = line(at)?;
        let l = &b[at..end];
        let digits = l.iter().take_while(|c| c.is_ascii_hexdigit()).count();
        if digits == 0 || digits > 15 || l[digits..].contains(&b'\n') {
            return None;
        }
        let size = usize::from_str_radix(std::str::from_utf8(&l[..digits]).ok()?, 16).ok()?;
        at = end + 2;
        if size == 0 {
            // Trailer fields, then the empty line.
            loop {
                let end = line(at)?;
                let empty = end == at;
                at = end + 2;
                if empty {
                    return Some(at);
                }
            }
        }
        total += size;
        if total > MAX_BODY || b.len() < at + size + 2 || &b[at + size..at + size + 2] != b"\r\n" {
            return None;
        }
        at += size + 2;
    }
}

/// How many requests a reference framer finds in `input` (RFC 9112 §6.3), counting one
/// more for anything it cannot frame (the relay may answer that with an error) and
/// stopping there.
fn reference_requests(mut input: &[u8]) -> usize {
    let mut count = 0;
    while !input.is_empty() {
        count += 1;
        let mut headers = [httparse::EMPTY_HEADER; aep_relay::wire::http::MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let Ok(httparse::Status::Complete(head)) = req.parse(input) else {
            return count;
        };
        if head > MAX_HEAD {
            return count;
        }
        let value = |name: &str| -> Vec<String> {
            req.headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).trim().to_owned())
                .collect()
        };
        let (te, cl) = (value("transfer-encoding"), value("content-length"));
        let body = match (te.first(), cl.first()) {
            (Some(t), None) if t.eq_ignore_ascii_case("chunked") => {
                match reference_chunked(&input[head..]) {
                    Some(n) => n,
                    None => return count,
                }
            }
            (Some(_), _) => return count,
            (None, Some(first)) => {
                let ok = cl.iter().all(|v| v == first)
                    && !first.is_empty()
                    && first.bytes().all(|b| b.is_ascii_digit());
                match first.parse::<usize>() {
                    Ok(n) if ok && n <= MAX_BODY && input.len() >= head + n => n,
                    _ => return count,
                }
            }
            (None, None) => 0,
        };
        input = &input[head + body..];
    }
    count
}

/// The relay's final responses in `out`, parsed one after another (asserting each is
/// well-formed), up to a `101` or an SSE stream, and whether parsing stopped at one.
fn final_responses(mut out: &[u8]) -> usize {
    let mut count = 0;
    while !out.is_empty() {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        let head = match resp.parse(out) {
            Ok(httparse::Status::Complete(n)) => n,
            other => panic!(
                "not an HTTP response ({other:?}): {:?}",
                String::from_utf8_lossy(&out[..out.len().min(200)])
            ),
        };
        let code = resp.code.unwrap_or(0);
        let header = |name: &str| {
            resp.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).into_owned())
        };
        if code == 101 || header("content-type").is_some_and(|t| t.starts_with("text/event-stream"))
        {
            return count + usize::from(code != 101);
        }
        if code >= 200 {
            count += 1;
        }
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(out.len() >= head + len, "a response cut short");
        out = &out[head + len..];
    }
    count
}

fn bounded(relay: &Sim, key: ConnId, what: &str) {
    let one = harness::one_http_answer(MAX_HEAD, MAX_BODY);
    if let Some(q) = relay.queued_output(key) {
        assert!(
            q <= MAX_OUTPUT + one,
            "{what}: {q} bytes queued, over max_output_bytes {MAX_OUTPUT} + one answer"
        );
        let held = relay.queued_backlog(key).unwrap_or(0);
        assert!(
            q + held <= 2 * MAX_OUTPUT + one,
            "{what}: {q} bytes queued and {held} held behind a replay, over 2 * max_output_bytes {MAX_OUTPUT} + one answer"
        );
    }
}

fuzz_target!(|data: &[u8]| harness::deterministic(data, play));

/// One run; returns its transcript (what the peers read, queue sizes after each chunk).
fn play(data: &[u8]) -> Vec<u8> {
    let mut transcript = Vec::new();
    let [flags, limit, n, rest @ ..] = data else {
        return transcript;
    };
    let n = usize::from(*n % 16).min(rest.len());
    let (splits, payload) = rest.split_at(n);
    let stalled = flags & 1 != 0;
    let jumps = flags & 4 != 0;
    // Pipelining is capped at MAX_DELIVERED bytes in all (enough to queue far more than
    // the output bound: 4 KiB of `GET /events` draws ~250 KiB of answers).
    let repeat =
        (1 + usize::from(flags >> 4 & 3)).min((MAX_DELIVERED / payload.len().max(1)).max(1));

    let mut relay = Sim::new(harness::http_config(MAX_HEAD, MAX_BODY, MAX_OUTPUT)).expect("config");
    let key = relay.connect(stalled.then_some(usize::from(*limit)));

    let mut out = Vec::new();
    let mut open = true;
    let mut turn = 0;
    let mut chunks = 0;
    let mut next_len = || {
        let len = splits
            .get(turn % splits.len().max(1))
            .copied()
            .unwrap_or(u8::MAX);
        turn += 1;
        len
    };
    'feed: for _ in 0..repeat {
        let mut at = 0;
        while at < payload.len() {
            let len = next_len();
            if len == 0 && jumps {
                relay.advance(harness::delta(next_len()));
            }
            // Past MAX_CHUNKS chunks the rest of this repetition goes in one piece.
            chunks += 1;
            let len = if chunks > MAX_CHUNKS {
                payload.len()
            } else {
                usize::from(len).max(1)
            };
            let chunk = &payload[at..(at + len).min(payload.len())];
            at += chunk.len();
            if !relay.feed(key, chunk, false) {
                open = false;
                break 'feed;
            }
            bounded(&relay, key, "connection");
            let q = relay.queued_output(key).unwrap_or(0) + relay.queued_backlog(key).unwrap_or(0);
            transcript.extend_from_slice(&(q as u64).to_le_bytes());
            if !stalled {
                out.extend(relay.take_output(key).unwrap_or_default());
            }
        }
    }
    if open {
        relay.feed(key, &[], true);
    }
    // Every timer runs: request timeout (408), linger, idle.
    relay.advance(2 * harness::JUMP);
    assert!(
        !relay.is_open(key),
        "connection still open after EOF and every timeout"
    );
    out.extend(relay.take_output(key).unwrap_or_default());
    if !stalled {
        let sent = payload.repeat(if open { repeat } else { 1 });
        let answered = final_responses(&out);
        if open {
            let requests = reference_requests(&sent);
            assert!(
                answered <= requests,
                "{answered} responses to {requests} requests: {:?}",
                String::from_utf8_lossy(&sent[..sent.len().min(400)])
            );
        }
    }
    transcript.extend(out);
    transcript
}
