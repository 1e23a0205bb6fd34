//! The memory budget (`--max-memory`, docs/operating.md "Sizing for a small host"):
//! over real sockets, a relay given less memory than it is sent keeps answering 202,
//! evicts held Events and drops the consumers whose queues hold the most, and stays
//! under its budget (AEP-0003 §5 replay buffers, §8.4 backpressure).

use crate::support;
use aep_relay::config::MemoryBudget;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use support::*;

const BUDGET: usize = 8 << 20;

/// `name{labels} value` of `/metrics`, or `None`.
fn metric(relay: &TestRelay, name_and_labels: &str) -> Option<f64> {
    relay
        .get_text("/metrics")
        .lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn used(relay: &TestRelay) -> f64 {
    [
        "events",
        "records",
        "queues",
        "connections",
        "tls",
        "deflate",
    ]
    .iter()
    .map(|p| {
        metric(relay, &format!("aep_memory_used_bytes{{part=\"{p}\"}}"))
            .unwrap_or_else(|| panic!("aep_memory_used_bytes{{part=\"{p}\"}} missing"))
    })
    .sum()
}

/// `n` info Events of `session` from `seq` on, each about 1 KB.
fn batch(session: &str, from: u64, n: u64) -> Vec<String> {
    let pad = "x".repeat(900);
    (from..from + n)
        .map(|seq| {
            event(
                session,
                0,
                seq,
                "tool.completed",
                &format!(",\"pad\":\"{pad}\""),
            )
        })
        .collect()
}

fn budgeted(max_output: usize) -> TestRelay {
    TestRelay::with(|c| {
        c.max_memory = Some(MemoryBudget::flag(BUDGET));
        c.max_output_bytes = max_output;
    })
}

/// 24 MB of Events into an 8 MiB budget: every POST is accepted, the relay stays up
/// and under its budget, the newest Event is replayed, and the evictions are counted.
#[test]
fn a_flood_larger_than_the_budget_is_accepted_and_the_newest_events_kept() {
    let relay = budgeted(8 << 20);
    let (sessions, per) = (48u64, 500u64);
    for s in 0..sessions {
        relay.post_ok(&batch(&format!("flood-{s}"), 0, per));
    }
    assert_eq!(
        metric(&relay, "aep_memory_budget_bytes"),
        Some(BUDGET as f64)
    );
    let used = used(&relay);
    assert!(
        used <= BUDGET as f64,
        "{used} bytes used of a {BUDGET}-byte budget"
    );
    let evicted = metric(&relay, "aep_evictions_total{reason=\"memory\"}").unwrap();
    assert!(evicted > 0.0, "evictions for memory are counted");
    assert_eq!(
        metric(&relay, "aep_evictions_total{reason=\"ring\"}"),
        Some(0.0)
    );
    let newest = format!("\"id\":\"flood-{}-0-{}\"", sessions - 1, per - 1);
    let replayed = relay.replay_all();
    assert!(
        replayed.last().is_some_and(|d| d.contains(&newest)),
        "the newest Event is replayed last ({} replayed)",
        replayed.len()
    );
    assert!(
        (replayed.len() as u64) < sessions * per,
        "older Events were evicted"
    );
    let status: Value = serde_json::from_str(&relay.get_text("/status")).unwrap();
    assert_eq!(status["memory"]["budget"], BUDGET, "{}", status["memory"]);
}

/// A stalled WebSocket consumer of every session and a stalled SSE consumer of one of
/// two: once their queues hold over half the budget, the one holding the most, the
/// WebSocket, is dropped: it gets what was already on its way, then `closing` with the
/// position of the last Event it received in each stream (so a resume misses nothing),
/// then a close 1013; the SSE consumer stays.
#[test]
fn the_stalled_consumer_holding_the_most_is_dropped_with_its_positions() {
    let relay = budgeted(64 << 20);
    let mut ws = Ws::consumer(&relay);
    ws.subscribe("all", json!({}));
    let mut sse = relay.tcp();
    sse.write_all(
        b"GET /stream?filter=%7B%22session%22%3A%22a%22%7D HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n",
    )
    .unwrap();
    let mut first = [0u8; 15];
    sse.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200 OK");

    // Neither reads; 200 KB posts alternate between sessions a and b until a consumer
    // is dropped (the WebSocket's queue, with both sessions, holds about twice the
    // SSE stream's).
    let mut seq = [0u64; 2];
    for round in 0..200 {
        let s = round % 2;
        relay.post_ok(&batch(["a", "b"][s], seq[s], 200));
        seq[s] += 200;
        if metric(&relay, "aep_memory_dropped_consumers_total") == Some(1.0) {
            break;
        }
    }
    assert_eq!(
        metric(&relay, "aep_memory_dropped_consumers_total"),
        Some(1.0),
        "a consumer was dropped"
    );
    let status: Value = serde_json::from_str(&relay.get_text("/status")).unwrap();
    assert_eq!(status["connections"]["ws"], 0, "{}", status["connections"]);
    assert_eq!(status["connections"]["sse"], 1, "{}", status["connections"]);

    // The WebSocket reads what reached it, in order, then `closing`.
    let (code, frames) = ws.until_close();
    assert_eq!(code, Some(1013));
    let closing = frames.last().expect("closing");
    assert_eq!(closing["type"], "closing", "{closing}");
    let mut last = std::collections::HashMap::new();
    for f in &frames[..frames.len() - 1] {
        if f["type"] == "ping" {
            continue;
        }
        let session = f["session"].as_str().expect("an Event").to_string();
        let seq = f["seq"].as_u64().unwrap();
        let prev = last.insert(session.clone(), seq);
        assert_eq!(
            prev.map_or(0, |p| p + 1),
            seq,
            "{session}: in order, nothing lost"
        );
    }
    assert!(
        (last.values().sum::<u64>() + 2) < seq[0] + seq[1],
        "queued Events were discarded"
    );
    let positions = closing["positions"]
        .as_array()
        .or_else(|| closing["delivered"].as_array())
        .unwrap_or_else(|| panic!("positions in {closing}"));
    for p in positions {
        let session = p["session"].as_str().unwrap();
        assert_eq!(
            p["seq"].as_u64(),
            last.get(session).copied(),
            "{session}: closing names the last Event received ({closing})"
        );
    }
    assert_eq!(positions.len(), last.len(), "{closing}");
    drop(sse);
}

/// A stalled SSE consumer alone: it is dropped, and its stream ends after whole
/// Events (each `data:` a whole Event) with `: closing: memory budget`.
#[test]
fn a_stalled_sse_consumer_ends_after_its_last_whole_event() {
    let relay = budgeted(64 << 20);
    let mut sse: TcpStream = relay.tcp();
    sse.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 15];
    sse.read_exact(&mut first).unwrap();
    let mut seq = 0;
    for _ in 0..200 {
        relay.post_ok(&batch("s", seq, 200));
        seq += 200;
        if metric(&relay, "aep_memory_dropped_consumers_total") == Some(1.0) {
            break;
        }
    }
    assert_eq!(
        metric(&relay, "aep_memory_dropped_consumers_total"),
        Some(1.0)
    );
    let mut got = Vec::new();
    sse.read_to_end(&mut got).unwrap();
    let got = String::from_utf8(got).unwrap();
    let body = &got[got.find("\r\n\r\n").unwrap() + 4..];
    assert!(
        body.ends_with(": closing: memory budget\n\n"),
        "{}",
        &body[body.len().saturating_sub(200)..]
    );
    let mut n = 0;
    for m in body.split("\n\n").filter(|m| m.contains("data: ")) {
        let data = m.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
        let v: Value = serde_json::from_str(data).expect("a whole Event");
        assert_eq!(v["seq"], n, "in order, nothing lost");
        n += 1;
    }
    assert!(n > 0 && n < seq, "{n} of {seq} Events reached it");
    assert!(
        used(&relay) <= BUDGET as f64,
        "under the budget once it is gone"
    );
}
