//! The WebSocket binding (`GET /socket`, AEP-0003 §3.5, §4, §6.5; RFC 6455) on one
//! in-memory connection (`aep_sim::Sim`, driving the sans-IO `Core`: no socket, virtual
//! time) after a completed handshake: the frame reader and the AEP frames (`hello`,
//! `subscribe`, `unsubscribe`, `roster`, `ping`, Events, commands).
//!
//! A full replay store is `conn_script`'s (`prefill`, then a WebSocket's `subscribe` with
//! `from`), not set up per input here, so that an input costs less (execs/s).
//!
//! Input layout:
//! - byte 0: flags. bit 0: raw mode, the payload is the client's byte stream as is
//!   (else framed mode, below); bit 1: framed mode starts with a valid `hello` (role
//!   `both`), so the fuzzer reaches the frames after it; bit 2: the connection stops
//!   reading its output (write limit from byte 1); bit 3: the upgrade offers
//!   `permessage-deflate` (RFC 7692), as browsers do; bits 4-7: unused.
//! - byte 1: the write limit (bit 2).
//! - byte 2: `n` (0..=15) chunk lengths follow, used in turn to split the client bytes
//!   (after 64 chunks the rest goes whole).
//! - the rest: the payload. In framed mode each `\n`-separated line becomes one masked
//!   client frame: a line starting with a byte below 0x20 takes its opcode from that
//!   byte's low nibble and FIN from bit 4 being clear (0x01 text, 0x11 a first text
//!   fragment, 0x00 the last continuation, 0x09 ping, 0x08 close, 0x02 binary), the rest
//!   is the payload; a line starting with 0x1D is one text message compressed as a
//!   client compresses it (raw DEFLATE, sync flush, tail cut, its window kept from one
//!   message to the next; RFC 7692 §7.2.1) and sent with RSV1 set (a protocol error,
//!   1002, when bit 3 is clear); any other line is one complete text frame. A line starting with
//!   0x1F is no frame but a clock step: the virtual clock moves by its second byte times
//!   100 ms (none or 0: a jump past every timeout, `harness::delta`), which reaches the
//!   relay's `ping`s and the idle close (heartbeat 4 s, idle 6 s, `harness::timeouts`).
//!
//! Invariants asserted:
//! 1. Nothing panics; the upgrade answers `101 Switching Protocols`.
//! 2. Output stays bounded after every chunk: at most what the latest replay left queued
//!    plus `max_output_bytes` plus one frame for replies (the relay's own rule, which
//!    closes a peer that does not read its replies), replay being paced to
//!    `max_output_bytes` itself, so `2 * max_output_bytes` plus one answer in the output
//!    queue; and with the live frames held back behind a replay in progress
//!    (`queued_backlog`, bounded by `max_output_bytes` by the fan-out backpressure rule,
//!    AEP-0003 §8.4), `3 * max_output_bytes` plus one answer in all.
//! 3. What the relay sends (when the peer reads) is well-formed RFC 6455 server framing:
//!    unmasked, unfragmented, opcode text, close, ping or pong; every text frame is one
//!    JSON object (an AEP frame or an Event, AEP-0003 §2), after inflating it on its own
//!    when RSV1 is set, which happens only on text frames of a connection that
//!    negotiated `permessage-deflate` (RFC 7692 §6, §7.1.1.1); nothing follows a close
//!    frame (not even a replay page).
//! 4. Hello first (AEP-0003 §3.5 #1): in framed mode without the automatic hello, when
//!    the first complete client frame is a text message that is not a JSON object with
//!    `"type": "hello"`, the relay's first frame is an `error` with code
//!    `hello-required` and its next a close with code 1008 (unless a clock step comes
//!    before that frame: the idle close may then rightly answer first).
//! 5. After EOF and every timer, the connection is closed.
//! 6. Determinism: the same input gives byte-identical output (one input in 8 runs
//!    twice, `harness::deterministic`); the clock comes from the input only.
#![no_main]

use std::time::Duration;

use aep_relay::wire::ws::rfc6455::client_frame;
use aep_relay::{Config, ConnId};
use aep_relay_fuzz::harness;
use aep_sim::Sim;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use std::borrow::Cow;

const MAX_OUTPUT: usize = 64 * 1024;
/// Most chunks the client stream is split into; the rest goes whole (as in `http`).
const MAX_CHUNKS: usize = 64;
const MAX_WS_MESSAGE: usize = 4096;
/// One reply: an error echoing (part of) a message, or one Event frame.
const ONE_ANSWER: usize = 4 * MAX_WS_MESSAGE + 1024;

const HANDSHAKE: &[u8] = b"GET /socket HTTP/1.1\r\nHost: r\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
const OFFER: &[u8] =
    b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n";
const HELLO: &[u8] =
    br#"{"type":"hello","versions":["0.1"],"role":"both","identity":{"agent":"fuzz"}}"#;

fn config() -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        buffer_per_session: harness::BUFFER,
        max_sessions: harness::SESSIONS,
        max_from_positions: 4,
        max_output_bytes: MAX_OUTPUT,
        max_ws_message_bytes: MAX_WS_MESSAGE,
        ..harness::timeouts(Config::default())
    }
}

/// One masked client frame (RFC 6455 §5.2), its key derived from the payload's length.
fn masked_frame(first: u8, payload: &[u8], out: &mut Vec<u8>) {
    let key = [0x37, 0xfa, 0x21, payload.len() as u8];
    client_frame(first, payload, Some(key), out);
}

/// The client byte stream of framed mode, its clock steps `(offset, delta)` and the
/// first frame's payload when it is a complete text message.
type Framed = (Vec<u8>, Vec<(usize, Duration)>, Option<Vec<u8>>);

/// The client frames of framed mode, with the clock steps among them (`(offset in the
/// stream, delta)`, in order); also whether the first frame is a complete text message,
/// and its payload.
fn framed(payload: &[u8], hello: bool) -> Framed {
    let mut out = Vec::new();
    // The client's compressor, with context takeover (RFC 7692 §7.1.1.2 not offered).
    let mut zip = Compress::new(Compression::fast(), false);
    let mut steps = Vec::new();
    if hello {
        masked_frame(0x81, HELLO, &mut out);
    }
    let mut first_text = None;
    let mut frames = 0;
    for line in payload.split(|b| *b == b'\n') {
        if line.first() == Some(&0x1F) {
            steps.push((out.len(), harness::delta(line.get(1).copied().unwrap_or(0))));
            continue;
        }
        if line.first() == Some(&0x1D) {
            let mut z = Vec::with_capacity(line.len() + 64);
            zip.compress_vec(&line[1..], &mut z, FlushCompress::Sync)
                .expect("deflate");
            z.truncate(z.len().saturating_sub(4));
            frames += 1;
            masked_frame(0xC1, &z, &mut out);
            continue;
        }
        let (first, body) = match line.first() {
            Some(&c) if c < 0x20 => {
                let fin = if c & 0x10 == 0 { 0x80 } else { 0 };
                (fin | (c & 0x0F), &line[1..])
            }
            _ => (0x81, line),
        };
        // Hello first is checked only when no clock step comes before the first frame
        // (after one, the idle close may rightly come first).
        if frames == 0 && first == 0x81 && !hello && steps.is_empty() {
            first_text = Some(body.to_vec());
        }
        frames += 1;
        masked_frame(first, body, &mut out);
    }
    (out, steps, first_text)
}

/// The relay's frames (RFC 6455 §5.2 server side), as far as they are complete:
/// `(fin, opcode, payload)`, a payload with RSV1 set inflated (RFC 7692 §7.2.2, on its
/// own: `server_no_context_takeover`). Panics on a masked frame, on RSV1 where
/// `deflate` was not negotiated or on a frame other than text, on RSV2 and RSV3.
fn server_frames(mut b: &[u8], deflate: bool) -> Vec<(bool, u8, Cow<'_, [u8]>)> {
    let mut frames = Vec::new();
    while b.len() >= 2 {
        let (fin, opcode) = (b[0] & 0x80 != 0, b[0] & 0x0F);
        let rsv1 = b[0] & 0x40 != 0;
        assert_eq!(b[0] & 0x30, 0, "RSV2 and RSV3 are never set");
        assert!(
            !rsv1 || (deflate && opcode == 0x1),
            "RSV1 only on text frames of a connection that negotiated permessage-deflate"
        );
        assert_eq!(
            b[1] & 0x80,
            0,
            "server frames are never masked (RFC 6455 §5.1)"
        );
        let (len, head) = match b[1] & 0x7F {
            126 if b.len() >= 4 => (usize::from(u16::from_be_bytes([b[2], b[3]])), 4),
            127 if b.len() >= 10 => {
                let mut n = [0u8; 8];
                n.copy_from_slice(&b[2..10]);
                (u64::from_be_bytes(n) as usize, 10)
            }
            126 | 127 => break,
            n => (usize::from(n), 2),
        };
        if b.len() < head + len {
            break;
        }
        let body = &b[head..head + len];
        let body = if rsv1 {
            let mut input = body.to_vec();
            input.extend_from_slice(&[0, 0, 0xff, 0xff]);
            let mut text = Vec::with_capacity(4 * ONE_ANSWER);
            let mut d = Decompress::new(false);
            d.decompress_vec(&input, &mut text, FlushDecompress::Sync)
                .expect("the relay's compressed frames are valid DEFLATE");
            assert_eq!(d.total_in() as usize, input.len(), "inflated whole, alone");
            Cow::Owned(text)
        } else {
            Cow::Borrowed(body)
        };
        frames.push((fin, opcode, body));
        b = &b[head + len..];
    }
    frames
}

fn bounded(relay: &Sim, key: ConnId) {
    if let Some(q) = relay.queued_output(key) {
        assert!(
            q <= 2 * MAX_OUTPUT + ONE_ANSWER,
            "{q} bytes queued, over 2 * max_output_bytes {MAX_OUTPUT} + one answer"
        );
        let held = relay.queued_backlog(key).unwrap_or(0);
        assert!(
            q + held <= 3 * MAX_OUTPUT + ONE_ANSWER,
            "{q} bytes queued and {held} held behind a replay, over 3 * max_output_bytes {MAX_OUTPUT} + one answer"
        );
    }
}

fuzz_target!(|data: &[u8]| harness::deterministic(data, play));

/// One run; returns its transcript (what the peer read, queue sizes after each chunk).
fn play(data: &[u8]) -> Vec<u8> {
    let mut transcript = Vec::new();
    let [flags, limit, n, rest @ ..] = data else {
        return transcript;
    };
    let n = usize::from(*n % 16).min(rest.len());
    let (splits, payload) = rest.split_at(n);
    let raw = flags & 1 != 0;
    let hello = flags & 2 != 0;
    let stalled = flags & 4 != 0;
    let deflate = flags & 8 != 0;

    let mut relay = Sim::new(config()).expect("config");
    // A stalled peer reads the upgrade answer (in pieces of at most `limit` bytes), then
    // nothing more: the pipe keeps `limit` bytes and the rest stays in the relay's queue.
    let key = relay.connect(stalled.then(|| usize::from(*limit).max(1)));
    if deflate {
        relay.feed(key, &HANDSHAKE[..HANDSHAKE.len() - 2], false);
        relay.feed(key, OFFER, false);
    } else {
        relay.feed(key, HANDSHAKE, false);
    }
    let mut answer = Vec::new();
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let more = relay.take_output(key).unwrap_or_default();
        assert!(
            !more.is_empty(),
            "no complete upgrade answer: {:?}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend(more);
    }
    assert!(
        answer.starts_with(b"HTTP/1.1 101 "),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    let agreed = answer
        .windows(b"permessage-deflate".len())
        .any(|w| w == b"permessage-deflate");
    assert_eq!(agreed, deflate, "the offer browsers make is accepted");
    let (stream, steps, first_text) = if raw {
        (payload.to_vec(), Vec::new(), None)
    } else {
        framed(payload, hello)
    };

    let mut out = Vec::new();
    let mut at = 0;
    let mut turn = 0;
    let mut chunks = 0;
    let mut steps = steps.into_iter().peekable();
    loop {
        // The clock steps due at this point of the stream, then the next chunk (cut at
        // the next step).
        while let Some((_, d)) = steps.next_if(|(off, _)| *off <= at) {
            relay.advance(d);
        }
        if at >= stream.len() {
            break;
        }
        let len = splits
            .get(turn % splits.len().max(1))
            .copied()
            .unwrap_or(u8::MAX);
        turn += 1;
        let end = steps.peek().map_or(stream.len(), |(off, _)| *off);
        // Past MAX_CHUNKS chunks the rest goes whole (up to the next clock step).
        chunks += 1;
        let len = if chunks > MAX_CHUNKS {
            stream.len()
        } else {
            usize::from(len).max(1)
        };
        let chunk = &stream[at..(at + len).min(end)];
        at += chunk.len();
        if !relay.feed(key, chunk, false) {
            break;
        }
        bounded(&relay, key);
        let q = relay.queued_output(key).unwrap_or(0) + relay.queued_backlog(key).unwrap_or(0);
        transcript.extend_from_slice(&(q as u64).to_le_bytes());
        if !stalled {
            out.extend(relay.take_output(key).unwrap_or_default());
        }
    }
    relay.feed(key, &[], true);
    relay.advance(2 * harness::JUMP);
    assert!(
        !relay.is_open(key),
        "connection open after EOF and every timer"
    );
    if stalled {
        return transcript;
    }
    out.extend(relay.take_output(key).unwrap_or_default());

    let frames = server_frames(&out, deflate);
    let mut closed = false;
    for (fin, opcode, body) in &frames {
        assert!(*fin, "server frames are not fragmented");
        match opcode {
            0x1 => {
                // Validated without building a `Value` (the oracle is most of an
                // input's cost otherwise): one JSON text, starting with `{`.
                let first = body.iter().find(|b| !b.is_ascii_whitespace());
                assert!(
                    first == Some(&b'{'),
                    "text frame is not an object: {:?}",
                    String::from_utf8_lossy(body)
                );
                if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                    panic!(
                        "text frame is not JSON ({e}): {:?}",
                        String::from_utf8_lossy(body)
                    );
                }
            }
            0x8 | 0x9 | 0xA => {}
            other => panic!("server sent opcode {other:#x}"),
        }
        assert!(!closed, "a frame after the close frame (RFC 6455 §5.5.1)");
        closed |= *opcode == 0x8;
    }
    if let Some(first) = first_text {
        let is_hello = matches!(
            serde_json::from_slice::<Value>(&first),
            Ok(Value::Object(m)) if m.get("type").and_then(Value::as_str) == Some("hello")
        );
        if !is_hello && std::str::from_utf8(&first).is_ok() && first.len() <= MAX_WS_MESSAGE {
            let (_, op, body) = frames.first().expect("an answer to the first frame");
            assert_eq!(*op, 0x1, "first answer is a text frame");
            let v: Value = serde_json::from_slice(body).unwrap();
            assert_eq!(v["type"], "error", "{v}");
            assert_eq!(v["code"], "hello-required", "{v}");
            let (_, op, body) = frames.get(1).expect("a close after hello-required");
            assert_eq!(*op, 0x8);
            assert_eq!(&body[..2], &1008u16.to_be_bytes(), "close code 1008");
        }
    }
    transcript.extend(out);
    transcript
}
