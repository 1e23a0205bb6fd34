//! What a held Event costs in memory, whatever the shape of the request, message or file
//! it came in: its own bytes plus a constant, never the buffer it was read into. An
//! NDJSON batch is split into slices of the request body, a WebSocket message may carry
//! whitespace around its Event, and a slice keeps its whole buffer alive; the relay
//! copies an Event that is a strict part of its buffer into an allocation of its own
//! before the replay store keeps it (AEP-0003 §5: the buffer is counted in Events, so its
//! memory must follow the Events).
//!
//! Measured with a counting global allocator. The tests of this file take one lock, so
//! no other test allocates while one measures (JSONL, whose follower threads outlive
//! their relay by a poll interval, is measured alone in `tests/ingest_memory_jsonl.rs`).

use aep_relay::Config;
use aep_sim::Sim;
use bytes::Bytes;

use crate::counting;
use crate::support;

use counting::{assert_held_at_own_size, buffered_of_metrics, live, one_at_a_time};
use support::Endpoint;

const MIB: usize = 1024 * 1024;
/// Sessions, each with a replay buffer of one Event: what is held at the end (each
/// session holds one Event, as [`counting::PER_EVENT_CONSTANT`] assumes).
const SESSIONS: usize = 32;

/// A ~600-byte Event of `session` at `seq`.
fn event(session: &str, seq: u64) -> String {
    let pad = "x".repeat(380);
    format!(
        r#"{{"aep":"0.1","id":"{session}-{seq:08}","type":"tool.completed","time":"2026-07-03T10:15:04.221Z","source":"aep://host-a/agent/claude-code/session/{session}","agent":"claude-code","session":"{session}","seq":{seq},"data":{{"pad":"{pad}"}}}}"#
    )
}

/// An NDJSON batch of at least `size` bytes of Events of `session` (seq 1, 2, ...);
/// returns the body and its last line (the Event a buffer of one keeps).
fn batch(session: &str, size: usize) -> (Bytes, String) {
    let mut body = String::with_capacity(size + 1024);
    let mut seq = 0;
    let mut last = String::new();
    while body.len() < size {
        seq += 1;
        last = event(session, seq);
        body.push_str(&last);
        body.push('\n');
    }
    (Bytes::from(body), last)
}

fn config() -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        buffer_per_session: 1,
        max_sessions: SESSIONS,
        ..Config::default()
    }
}

/// `aep_buffered_bytes` and `aep_buffered_events` of `GET /metrics`, read over an
/// in-memory connection.
fn buffered(relay: &mut Sim) -> (usize, usize) {
    let c = relay.connect(None);
    relay.feed(
        c,
        b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
        true,
    );
    buffered_of_metrics(&String::from_utf8(relay.take_output(c).unwrap()).unwrap())
}

/// AEP-0003 §5: 32 sessions with a buffer of one, each fed one 1 MiB NDJSON body through
/// `Sim::ingest` (the same path as `POST /events`), hold 32 Events; what the relay keeps
/// allocated is their bytes plus a constant each, not 32 bodies (an Event that kept its
/// 1 MiB body alive would make it 33.6 MB for 32 Events, measured).
#[test]
fn a_held_event_of_a_large_batch_costs_its_own_bytes() {
    let _one = one_at_a_time();
    let mut relay = Sim::new(config()).unwrap();
    let mut kept = 0;
    let before = live();
    for i in 0..SESSIONS {
        let (body, last) = batch(&format!("s{i:02}"), MIB);
        kept += last.len();
        // The caller's handle goes with the call: only what the relay keeps stays live.
        relay.ingest(body).expect("batch accepted");
    }
    assert_held_at_own_size("held from 1 MiB batches", before, kept, SESSIONS, 0);
    // The metric and the status document say what is held: the Events' own bytes.
    assert_eq!(buffered(&mut relay), (kept, SESSIONS));
    let c = relay.connect(None);
    relay.feed(
        c,
        b"GET /status HTTP/1.1\r\nConnection: close\r\n\r\n",
        true,
    );
    let out = relay.take_output(c).unwrap();
    let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let status: serde_json::Value = serde_json::from_slice(&out[at..]).unwrap();
    assert_eq!(status["buffered_bytes"], kept, "{status}");
    assert_eq!(status["buffered_events"], SESSIONS, "{status}");
}

/// Whitespace around the Event (legal JSON, trimmed by the scanner) the padded messages
/// and lines carry: what a held Event would keep alive if it stayed a slice.
const PAD: usize = 256 * 1024;

/// AEP-0003 §3.5: Events sent over a real WebSocket, each message carrying `PAD` bytes
/// of whitespace after its Event (half of them in one frame, half in two fragments), are
/// held at their own size, not their whole message's (256 KiB each).
#[test]
fn a_held_event_of_a_padded_websocket_message_costs_its_own_bytes() {
    let _one = one_at_a_time();
    let relay = support::TestRelay::with(|c| {
        c.buffer_per_session = 1;
        c.max_sessions = SESSIONS;
    });
    let mut ws = support::Raw::connect(&relay);
    ws.send(
        0x81,
        br#"{"type":"hello","versions":["0.1"],"role":"emitter","identity":{"agent":"claude-code"}}"#,
    );
    assert_eq!(ws.read().0, 0x81, "hello answered");
    let pad = " ".repeat(PAD);
    let before = live();
    let mut kept = 0;
    for i in 0..SESSIONS {
        let ev = event(&format!("w{i:02}"), 1);
        kept += ev.len();
        if i % 2 == 0 {
            ws.send(0x81, format!("{ev}{pad}").as_bytes());
        } else {
            ws.send(0x01, ev.as_bytes());
            ws.send(0x80, pad.as_bytes());
        }
    }
    // Frames are handled in order: the pong says every Event before it was ingested.
    ws.send(0x81, br#"{"type":"ping","t":1}"#);
    let (op, p) = ws.read();
    assert_eq!(op, 0x81);
    assert!(
        String::from_utf8_lossy(&p).contains("pong"),
        "{}",
        String::from_utf8_lossy(&p)
    );
    // The connection's read buffer may keep the capacity of the largest message read.
    let connection = 2 * (PAD + 64 * 1024);
    assert_held_at_own_size(
        "held from padded WebSocket messages",
        before,
        kept,
        SESSIONS,
        connection,
    );
    assert_eq!(
        buffered_of_metrics(&relay.get_text("/metrics")),
        (kept, SESSIONS)
    );
}

/// The history rebuild (`--history`): session files whose lines carry whitespace after
/// the Event (legal JSONL, e.g. from an editor or another tool) rebuild replay buffers
/// holding each Event at its own size, not its whole line's (256 KiB).
#[test]
fn a_held_event_rebuilt_from_a_padded_history_line_costs_its_own_bytes() {
    use aep_relay::history::{History, HistoryConfig};
    use aep_relay::store::Store;
    let _one = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("aep-history-memory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("claude-code")).unwrap();
    let pad = " ".repeat(PAD);
    let mut kept = 0;
    for i in 0..SESSIONS {
        let session = format!("h{i:02}");
        let ev = event(&session, 1);
        kept += ev.len();
        let line = format!("{ev}{pad}\n");
        std::fs::write(
            dir.join("claude-code").join(format!("{session}.jsonl")),
            line,
        )
        .unwrap();
    }
    let before = live();
    let mut store = Store::new(1, SESSIONS);
    let (history, stats) = History::open(HistoryConfig::new(&dir), &mut store).unwrap();
    assert_eq!((stats.events, store.len()), (SESSIONS, SESSIONS));
    assert_held_at_own_size(
        "rebuilt from padded history lines",
        before,
        kept,
        SESSIONS,
        0,
    );
    assert_eq!(store.byte_len(), kept);
    drop(history);
    let _ = std::fs::remove_dir_all(&dir);
}
