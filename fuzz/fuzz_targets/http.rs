//! One in-memory connection's whole HTTP/SSE state machine (`aep_sim::Sim`,
//! `feed`), with arbitrary bytes delivered in arbitrary chunks, and a stalled SSE
//! subscriber beside it.
//!
//! Input layout (so the payload stays contiguous for the dictionary and the mutator):
//! - byte 0: flags. bit 0: the fuzzed connection stops reading its output (a write
//!   limit of 0..=255 bytes, from byte 1); bit 1: a subscriber `GET /stream?from=all`
//!   that never reads is connected first; bit 2: the clock jumps past every timeout
//!   between chunks whose length byte is 0; bit 3: the replay store is filled first
//!   (every session's buffer full of ~1 KiB Events, half `info`, half `notice`), so a
//!   `from=all` replay is larger than the output bound; bits 4-7: the payload is delivered
//!   `1 + (bits 4-7)` times over (pipelining without reading, cheaply).
//! - byte 1: the write limit (bit 0).
//! - byte 2: `n`, the number of chunk lengths (0..=15); bytes 3..3+n: the chunk lengths,
//!   used in turn (0 = one byte, or a clock jump with bit 2).
//! - the rest: the payload.
//!
//! Invariants asserted:
//! 1. Nothing panics, whatever the bytes and however they are split.
//! 2. Output stays bounded: after every chunk each connection's `queued_output` is at
//!    most `max_output_bytes` plus one answer (the largest single thing the relay queues
//!    at once: a response echoing at most the request head, or one SSE message of at
//!    most one body), `Config` limits included (AEP-0003 §8.4); and with the live frames
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
#![no_main]

use std::time::Duration;

use aep_relay::{Config, ConnId};
use aep_sim::Sim;
use libfuzzer_sys::fuzz_target;

const MAX_HEAD: usize = 1024;
const BUFFER: usize = 16;
const SESSIONS: usize = 8;
const MAX_BODY: usize = 2048;
const MAX_OUTPUT: usize = 64 * 1024;

fn config() -> Config {
    let mut c = Config::default();
    c.listen = "127.0.0.1:0".parse().unwrap();
    // Small limits, so the fuzzer reaches them.
    c.buffer_per_session = BUFFER;
    c.max_sessions = SESSIONS;
    c.max_body_bytes = MAX_BODY;
    c.max_batch_events = 4;
    c.max_from_positions = 4;
    c.max_head_bytes = MAX_HEAD;
    c.max_output_bytes = MAX_OUTPUT; // the least `Config::validate` allows
    c
}

/// Every session's buffer full: `SESSIONS * BUFFER` Events of about 1 KiB each.
fn prefill_events() -> Vec<bytes::Bytes> {
    let pad = "x".repeat(900);
    let mut out = Vec::new();
    for s in 0..SESSIONS {
        for q in 0..BUFFER {
            let sev = if q % 2 == 0 { "info" } else { "notice" };
            out.push(bytes::Bytes::from(format!(
                r#"{{"aep":"0.1","id":"p{s}-{q}","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a/session/p{s}","agent":"a","session":"p{s}","seq":{q},"severity":"{sev}","data":{{"pad":"{pad}"}}}}"#
            )));
        }
    }
    out
}

/// The largest single thing the relay queues at once: a response echoing (part of) the
/// request head, or one SSE message carrying one Event (at most one body) plus its
/// `event:` / `id:` lines, which repeat the Event's type and session.
const ONE_ANSWER: usize = 3 * MAX_HEAD + 3 * MAX_BODY + 1024;

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
        let mut headers = [httparse::EMPTY_HEADER; aep_relay::http::MAX_HEADERS];
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
    if let Some(q) = relay.queued_output(key) {
        assert!(
            q <= MAX_OUTPUT + ONE_ANSWER,
            "{what}: {q} bytes queued, over max_output_bytes {MAX_OUTPUT} + one answer"
        );
        let held = relay.queued_backlog(key).unwrap_or(0);
        assert!(
            q + held <= 2 * MAX_OUTPUT + ONE_ANSWER,
            "{what}: {q} bytes queued and {held} held behind a replay, over 2 * max_output_bytes {MAX_OUTPUT} + one answer"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let [flags, limit, n, rest @ ..] = data else {
        return;
    };
    let n = usize::from(*n % 16).min(rest.len());
    let (splits, payload) = rest.split_at(n);
    let stalled = flags & 1 != 0;
    let with_sub = flags & 2 != 0;
    let jumps = flags & 4 != 0;
    let prefill = flags & 8 != 0;
    let repeat = 1 + usize::from(flags >> 4);

    let mut relay = Sim::new(config()).expect("config");
    if prefill {
        for ev in prefill_events() {
            relay.ingest(ev).expect("prefill Events are valid");
        }
    }
    
    let sub = with_sub.then(|| {
        let sub = relay.connect(Some(0));
        relay.feed(
            sub,
            b"GET /stream?from=all HTTP/1.1\r\nHost: x\r\n\r\n",
            false,
        );
        sub
    });
    let key = relay.connect(stalled.then_some(usize::from(*limit)));

    let mut out = Vec::new();
    let mut open = true;
    let mut turn = 0;
    'feed: for _ in 0..repeat {
        let mut at = 0;
        while at < payload.len() {
            let len = splits
                .get(turn % splits.len().max(1))
                .copied()
                .unwrap_or(u8::MAX);
            turn += 1;
            if len == 0 && jumps {
                relay.advance(Duration::from_secs(3600));
            }
            let len = usize::from(len).max(1);
            let chunk = &payload[at..(at + len).min(payload.len())];
            at += chunk.len();
            if !relay.feed(key, chunk, false) {
                open = false;
                break 'feed;
            }
            bounded(&relay, key, "connection");
            if let Some(sub) = sub {
                bounded(&relay, sub, "subscriber");
            }
            if !stalled {
                out.extend(relay.take_output(key).unwrap_or_default());
            }
        }
    }
    if open {
        relay.feed(key, &[], true);
    }
    // Every timer runs: request timeout (408), linger, idle.
    for _ in 0..3 {
        relay.advance(Duration::from_secs(3600));
    }
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
    if let Some(sub) = sub {
        bounded(&relay, sub, "subscriber");
    }
});
