//! Evicting frees memory: when the relay evicts a whole stream (the
//! least-recently-written session beyond `max_sessions`, AEP-0003 §5) or the oldest Event
//! of a full replay buffer (`buffer_per_session`, AEP-0003 §5), what it held is freed, so
//! a relay that sees streams come and go for ever keeps its heap bounded by its
//! configuration. Measured in bytes with the counting global allocator of
//! `tests/counting`, never by time, through the relay's public ingest path
//! (`Core::ingest` via `aep_sim::Sim::ingest`, the same path as `POST /events`) and its
//! `GET /metrics`, so the test keeps its meaning however the store holds Events.
//!
//! The tests of this file take one lock, so no other test allocates while one measures.

use aep_relay::Config;
use aep_sim::Sim;
use bytes::Bytes;

use crate::counting;

use counting::{buffered_of_metrics, live, one_at_a_time};

/// A ~600-byte Event of `session` at `seq` (its `source` names the session, so each
/// session is its own stream).
fn event(session: &str, seq: u64) -> String {
    let pad = "x".repeat(380);
    format!(
        r#"{{"aep":"0.1","id":"{session}-{seq:08}","type":"tool.completed","time":"2026-07-03T10:15:04.221Z","source":"aep://host-a/agent/claude-code/session/{session}","agent":"claude-code","session":"{session}","seq":{seq},"data":{{"pad":"{pad}"}}}}"#
    )
}

fn config(buffer: usize, sessions: usize) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        buffer_per_session: buffer,
        max_sessions: sessions,
        ..Config::default()
    }
}

/// `aep_buffered_bytes` and `aep_buffered_events` of `GET /metrics`.
fn buffered(relay: &mut Sim) -> (usize, usize) {
    let c = relay.connect(None);
    relay.feed(
        c,
        b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
        true,
    );
    buffered_of_metrics(&String::from_utf8(relay.take_output(c).unwrap()).unwrap())
}

/// Heap bytes live now beyond `base`, printed with `what`.
fn held_since(base: usize, what: &str) -> usize {
    let held = live().saturating_sub(base);
    println!("{what}: {held} bytes live");
    held
}

const MAX_SESSIONS: usize = 64;
const STREAMS: usize = 100_000;
const PER_STREAM: u64 = 3;
/// Streams per NDJSON body: one ingest call carries the Events of this many streams.
const STREAMS_PER_BODY: usize = 100;

/// AEP-0003 §5: `--max-sessions 64`, 100 000 distinct streams of 3 Events each. Once
/// 1 000 streams have passed, the relay holds 64 of them and every new one evicts the
/// least-recently-written; after 100 000 it must hold no more than it did then, give or
/// take slack far below what the 99 000 evicted streams would keep if any per-stream
/// state leaked (a 16-byte leak per stream is 1.5 MB). What it holds is also bounded by
/// the configuration: 64 sessions × 3 Events × (their bytes + the per-Event constant of
/// `tests/counting`).
#[test]
fn max_sessions_churn_of_100k_streams_keeps_the_heap_bounded() {
    let _one = one_at_a_time();
    let mut relay = Sim::new(config(8, MAX_SESSIONS)).unwrap();
    let base = live();
    let mut at_1k = None;
    let mut peak = 0;
    let mut body = String::new();
    let mut event_len = 0;
    for first in (0..STREAMS).step_by(STREAMS_PER_BODY) {
        body.clear();
        for s in first..first + STREAMS_PER_BODY {
            for seq in 1..=PER_STREAM {
                let e = event(&format!("c{s:06}"), seq);
                event_len = event_len.max(e.len());
                body.push_str(&e);
                body.push('\n');
            }
        }
        let n = relay
            .ingest(Bytes::copy_from_slice(body.as_bytes()))
            .expect("batch accepted");
        assert_eq!(n, STREAMS_PER_BODY * PER_STREAM as usize);
        let done = first + STREAMS_PER_BODY;
        if done == 1_000 {
            at_1k = Some(held_since(base, "after 1 000 streams"));
        } else if done > 1_000 {
            peak = peak.max(live().saturating_sub(base));
        }
    }
    let at_1k = at_1k.unwrap();
    let at_end = held_since(base, "after 100 000 streams");
    println!("peak between them: {peak} bytes live");
    const SLACK: usize = 64 * 1024;
    assert!(
        peak <= 2 * at_1k + SLACK && at_end <= 2 * at_1k + SLACK,
        "churn grew the heap: {at_1k} bytes after 1 000 streams, {at_end} after {STREAMS} (peak {peak})"
    );
    // The relay holds the last 64 streams, all their Events: eviction happened.
    let held_events = MAX_SESSIONS * PER_STREAM as usize;
    let (bytes, events) = buffered(&mut relay);
    assert_eq!(
        events, held_events,
        "the relay holds {MAX_SESSIONS} streams"
    );
    assert!(bytes <= held_events * event_len, "{bytes} buffered bytes");
    let per_session = 4096; // a session's fixed cost: struct, names, index slots
                            // The evicted streams' records (AEP-0003 §5: a resume of one still gets
                            // `replay-exhausted`): at most `MIN_RECORDS` here, each its names (a 7-byte session
                            // twice, a 48-byte source) and about 224 bytes of slots and allocator overhead.
    let records = aep_relay::store::MIN_RECORDS * (2 * 7 + 48 + 224);
    let bound = held_events * (event_len + counting::PER_EVENT_CONSTANT)
        + MAX_SESSIONS * per_session
        + records
        + SLACK;
    assert!(
        at_end <= bound,
        "{at_end} bytes live for {held_events} held Events of {MAX_SESSIONS} sessions (bound {bound})"
    );
}

/// AEP-0003 §5: one session with a replay buffer of 100, fed 100 batches of 100 Events:
/// from the second batch on every admission evicts the oldest Event, and the heap stays
/// flat. Slack is half of one batch of Events; a leak of the evicted Events' bytes would
/// grow it by a whole batch (~60 KB) on each of the 98 batches after.
#[test]
fn evicting_the_oldest_events_of_a_full_buffer_frees_them() {
    let _one = one_at_a_time();
    const BUFFER: usize = 100;
    const BATCHES: u64 = 100;
    let mut relay = Sim::new(config(BUFFER, 4)).unwrap();
    let base = live();
    let mut full = None;
    let mut peak = 0;
    let mut body = String::new();
    let mut batch_bytes = 0;
    for b in 0..BATCHES {
        body.clear();
        for i in 0..BUFFER as u64 {
            body.push_str(&event("s_full", b * BUFFER as u64 + i + 1));
            body.push('\n');
        }
        batch_bytes = body.len();
        let n = relay
            .ingest(Bytes::copy_from_slice(body.as_bytes()))
            .expect("batch accepted");
        assert_eq!(n, BUFFER);
        match b {
            0 => {}
            1 => full = Some(held_since(base, "buffer full, after 2 batches")),
            _ => peak = peak.max(live().saturating_sub(base)),
        }
    }
    let full = full.unwrap();
    let at_end = held_since(base, "after 100 batches");
    println!("peak after the buffer was full: {peak} bytes live");
    assert_eq!(buffered(&mut relay).1, BUFFER, "the buffer holds {BUFFER}");
    assert!(
        peak <= full + batch_bytes / 2,
        "evictions kept memory: {full} bytes live when the buffer was full, peak {peak} after (a batch is {batch_bytes} bytes)"
    );
    assert!(
        at_end <= full + batch_bytes / 2,
        "{at_end} bytes live at the end, {full} when full"
    );
}
