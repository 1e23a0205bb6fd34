//! What an Event held from a JSONL source costs in memory: its own bytes plus a constant,
//! never the whitespace of its line. Alone in its test process: the counting allocator
//! sees every thread, and JSONL follower threads end a poll interval after their relay.

use std::io::Write;

mod counting;
mod support;

use counting::{assert_held_at_own_size, buffered_of_metrics, live, one_at_a_time};
use support::Endpoint;

/// Sessions, each with a replay buffer of one Event: what is held at the end.
const SESSIONS: usize = 32;
/// Whitespace after the Event on each line (legal JSON, trimmed by the scanner).
const PAD: usize = 256 * 1024;

/// A ~600-byte Event of `session` at `seq`.
fn event(session: &str, seq: u64) -> String {
    let pad = "x".repeat(380);
    format!(
        r#"{{"aep":"0.1","id":"{session}-{seq:08}","type":"tool.completed","time":"2026-07-03T10:15:04.221Z","source":"aep://host-a/agent/claude-code/session/{session}","agent":"claude-code","session":"{session}","seq":{seq},"data":{{"pad":"{pad}"}}}}"#
    )
}

/// AEP-0003 §3.1: JSONL lines (`--ingest-file`) padded with whitespace after the Event
/// are held at the Event's own size, not the whole line's (256 KiB).
#[test]
fn a_held_event_of_a_padded_jsonl_line_costs_its_own_bytes() {
    let _one = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("aep-ingest-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("padded.jsonl");
    let pad = " ".repeat(PAD);
    let mut kept = 0;
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for i in 0..SESSIONS {
            let ev = event(&format!("j{i:02}"), 1);
            kept += ev.len();
            writeln!(f, "{ev}{pad}").unwrap();
        }
    }
    let before = live();
    let relay = support::TestRelay::with(|c| {
        c.buffer_per_session = 1;
        c.max_sessions = SESSIONS;
        c.jsonl.files = vec![path.clone()];
    });
    // Replay of what is held, then live delivery of the rest: every Event once.
    let mut stream = relay.sse("from=all", &[]);
    let mut seen = std::collections::HashSet::new();
    while seen.len() < SESSIONS {
        seen.insert(stream.expect().id);
    }
    let held = buffered_of_metrics(&relay.get_text("/metrics"));
    assert_eq!(held, (kept, SESSIONS), "every line ingested");
    // The relay itself (connection slab, poll events, read scratch), the SSE stream and
    // the follower (its read chunk, the partial line of at most one padded line).
    let relay_and_follower = 2 * 1024 * 1024;
    assert_held_at_own_size(
        "held from padded JSONL lines",
        before,
        kept,
        SESSIONS,
        relay_and_follower,
    );
    drop(stream);
    drop(relay);
    let _ = std::fs::remove_dir_all(&dir);
}
