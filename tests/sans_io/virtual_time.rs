//! Every timer of the relay, on virtual time: the sans-IO core driven by `aep_sim`, whose
//! clock moves only when a test says so and runs each deadline at its own instant. No
//! real socket and no real timeout: the assertions are about exact instants (AEP-0003
//! §3.3.3 heartbeats, §3.5 #4 and #5 WebSocket liveness; RFC 9110 §15.5.9 408).
//!
//! Defaults used: heartbeat 15 s, WebSocket idle 90 s, request timeout 30 s, keep-alive
//! idle 120 s, linger 2 s, shutdown deadline 10 s.

use crate::support;

use aep_relay::core::Stop;
use aep_relay::Config;
use aep_sim::Sim;
use serde_json::{json, Value};
use std::time::Duration;
use support::event;
use support::sim::{sse_peer, text, ws_frames, ws_peer, ws_send, ws_take, Frame};

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

fn sim() -> Sim {
    Sim::new(Config::default()).unwrap()
}

/// The base the core counts WebSocket `ping` times from (`aep_sim` passes it).
const UNIX_BASE_MS: u64 = 1_767_225_600_000;

#[test]
fn an_idle_sse_stream_gets_a_ping_exactly_each_heartbeat_and_writes_push_it_back() {
    let mut sim = sim();
    let c = sse_peer(&mut sim, "");
    sim.advance(S(15) - MS(1));
    assert_eq!(text(&mut sim, c), "", "nothing before the heartbeat");
    sim.advance(MS(1));
    assert_eq!(text(&mut sim, c), ": ping\n\n", "at 15 s exactly");
    // An Event at 20 s is a write: the next ping is due 15 s after it, not at 30 s.
    sim.advance(S(5));
    sim.ingest(event("s", 0, 1, "tool.started", "").into())
        .unwrap();
    assert!(text(&mut sim, c).starts_with("event: tool.started\n"));
    sim.advance(S(15) - MS(1));
    assert_eq!(
        text(&mut sim, c),
        "",
        "no ping at 30 s: the Event wrote at 20 s"
    );
    sim.advance(MS(1));
    assert_eq!(text(&mut sim, c), ": ping\n\n", "at 35 s");
    sim.advance(S(45));
    assert_eq!(text(&mut sim, c), ": ping\n\n".repeat(3), "50, 65 and 80 s");
}

#[test]
fn websocket_pings_come_each_heartbeat_after_hello_with_times_from_the_wall_clock_base() {
    let mut sim = sim();
    let c = ws_peer(&mut sim, "", Some(r#""role":"consumer""#));
    let mut times = Vec::new();
    for _ in 0..4 {
        sim.advance(S(15) - MS(1));
        assert_eq!(ws_take(&mut sim, c), vec![], "not before the heartbeat");
        sim.advance(MS(1));
        let got = ws_take(&mut sim, c);
        let [Frame::Text(p)] = &got[..] else {
            panic!("{got:?}")
        };
        assert_eq!(p["type"], "ping");
        times.push(p["t"].as_u64().unwrap());
        // Answering keeps the connection alive.
        ws_send(
            &mut sim,
            c,
            &json!({"type": "pong", "t": p["t"]}).to_string(),
        );
    }
    let want: Vec<u64> = (1..=4).map(|i| UNIX_BASE_MS + i * 15_000).collect();
    assert_eq!(
        times, want,
        "t is the base plus the virtual time elapsed, in ms"
    );
    assert!(sim.is_open(c), "answered every 15 s for 60 s: not idle");
}

#[test]
fn a_silent_websocket_gets_closing_with_its_positions_then_1001_at_the_idle_timeout() {
    let mut sim = sim();
    let c = ws_peer(&mut sim, "", Some(r#""role":"consumer""#));
    ws_send(
        &mut sim,
        c,
        r#"{"type":"subscribe","id":"a","filter":{"session":["s","t"]}}"#,
    );
    ws_send(
        &mut sim,
        c,
        r#"{"type":"subscribe","id":"b","filter":{"session":"t"}}"#,
    );
    ws_take(&mut sim, c);
    let lines = [
        event("s", 0, 5, "tool.started", ""),
        event("t", 2, 9, "tool.started", ""),
        event("s", 1, 0, "tool.started", ""),
    ];
    sim.ingest(lines.join("\n").into()).unwrap();
    assert_eq!(ws_take(&mut sim, c).len(), 3);
    // Silent since the subscribe at t = 0: closed at 90 s, not a millisecond before.
    sim.advance(S(90) - MS(1));
    let pings = ws_take(&mut sim, c);
    assert_eq!(pings.len(), 5, "pings at 15..75 s: {pings:?}");
    assert!(sim.is_open(c));
    sim.advance(MS(1));
    let got = ws_take(&mut sim, c);
    let [Frame::Text(closing), Frame::Close(code)] = &got[..] else {
        panic!("{got:?}")
    };
    assert_eq!(*code, 1001);
    assert_eq!(closing["type"], "closing");
    assert!(closing["reason"].as_str().unwrap().contains("idle"));
    assert_eq!(
        closing["delivered"],
        json!([
            {"sub": "a", "session": "s", "source": "aep://test/agent/a/session/s", "epoch": 1, "seq": 0},
            {"sub": "a", "session": "t", "source": "aep://test/agent/a/session/t", "epoch": 2, "seq": 9},
            {"sub": "b", "session": "t", "source": "aep://test/agent/a/session/t", "epoch": 2, "seq": 9},
        ])
    );
    // The peer does not answer the close: the linger drops it 2 s later.
    sim.advance(S(2));
    assert!(!sim.is_open(c));
}

#[test]
fn any_frame_from_the_peer_resets_its_idle_timeout() {
    let mut sim = sim();
    let c = ws_peer(&mut sim, "", Some(r#""role":"consumer""#));
    sim.advance(S(80));
    ws_send(&mut sim, c, r#"{"type":"ping"}"#);
    sim.advance(S(89));
    assert!(
        sim.is_open(c),
        "the ping at 80 s moved the idle close to 170 s"
    );
    ws_take(&mut sim, c);
    sim.advance(S(1));
    let got = ws_take(&mut sim, c);
    assert!(matches!(got.last(), Some(Frame::Close(1001))), "{got:?}");
}

#[test]
fn a_websocket_that_never_says_hello_is_closed_when_idle_with_no_aep_frame() {
    let mut sim = sim();
    let c = ws_peer(&mut sim, "", None);
    sim.advance(S(90) - MS(1));
    assert_eq!(ws_take(&mut sim, c), vec![], "no ping before hello");
    sim.advance(MS(1));
    assert_eq!(ws_take(&mut sim, c), vec![Frame::Close(1001)]);
}

/// The status line and JSON error of an HTTP answer.
fn answer(raw: &str) -> (u16, Value) {
    let status = raw[9..12].parse().unwrap();
    let body = &raw[raw.find("\r\n\r\n").unwrap() + 4..];
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[test]
fn a_head_or_body_that_trickles_in_gets_408_at_the_request_timeout() {
    let mut sim = sim();
    let head = sim.connect(None);
    sim.feed(head, b"POST /events HTTP/1.1\r\nHost: x\r\n", false);
    sim.advance(S(30) - MS(1));
    assert_eq!(text(&mut sim, head), "");
    sim.advance(MS(1));
    let (status, body) = answer(&text(&mut sim, head));
    assert_eq!(status, 408);
    assert_eq!(body["error"], "request-timeout");

    let part = sim.connect(None);
    sim.advance(S(10));
    sim.feed(
        part,
        b"POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\"",
        false,
    );
    // The clock runs from the request's first byte (t = 10 s), not the connection's.
    sim.advance(S(30) - MS(1));
    assert_eq!(text(&mut sim, part), "");
    sim.advance(MS(1));
    assert_eq!(answer(&text(&mut sim, part)).0, 408);
}

#[test]
fn a_body_discarded_after_its_answer_gets_no_408_only_a_close() {
    let mut sim = sim();
    let c = sim.connect(None);
    // 404 on a POST with a body: answered at once, the body is read and dropped.
    sim.feed(
        c,
        b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab",
        false,
    );
    assert_eq!(answer(&text(&mut sim, c)).0, 404);
    sim.advance(S(30));
    assert_eq!(
        text(&mut sim, c),
        "",
        "one request, one answer (RFC 9112 §9.3)"
    );
    sim.advance(S(2));
    assert!(!sim.is_open(c), "closed after the linger");
}

#[test]
fn an_idle_keep_alive_connection_closes_at_the_idle_timeout() {
    let mut sim = sim();
    let c = sim.connect(None);
    sim.advance(S(60));
    sim.feed(c, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false);
    assert_eq!(answer(&text(&mut sim, c)).0, 200);
    sim.advance(S(120) - MS(1));
    assert!(sim.is_open(c), "idle since the answer at 60 s");
    sim.advance(MS(1));
    assert!(!sim.is_open(c));
}

#[test]
fn after_its_last_answer_a_silent_peer_is_dropped_at_the_linger() {
    let mut sim = sim();
    let c = sim.connect(None);
    sim.feed(
        c,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        false,
    );
    assert_eq!(answer(&text(&mut sim, c)).0, 200);
    assert!(sim.is_shut(c), "half-closed after the answer");
    sim.advance(S(2) - MS(1));
    assert!(sim.is_open(c), "draining the peer's input for the linger");
    sim.advance(MS(1));
    assert!(!sim.is_open(c));
}

#[test]
fn a_graceful_shutdown_that_cannot_flush_stops_at_its_deadline() {
    let mut sim = sim();
    // A consumer that reads nothing: its `: shutting-down` can never be written.
    let stuck = sim.connect(Some(0));
    sim.feed(stuck, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", false);
    sim.shutdown();
    assert_eq!(sim.stopped(), None);
    sim.advance(S(10) - MS(1));
    assert_eq!(sim.stopped(), None);
    sim.advance(MS(1));
    assert_eq!(sim.stopped(), Some(Stop::DeadlinePassed(1)));
}

#[test]
fn a_graceful_shutdown_of_readers_stops_once_drained() {
    let mut sim = sim();
    let c = sse_peer(&mut sim, "");
    sim.shutdown();
    assert_eq!(text(&mut sim, c), ": shutting-down\n\n");
    sim.feed(c, b"", true);
    assert_eq!(sim.stopped(), Some(Stop::Drained));
}

/// A keep-alive connection whose answer was still queued when the shutdown began (its
/// peer reads slowly) is ended once that answer is written, like an idle one: the
/// shutdown does not wait for its deadline on a connection with no request left.
#[test]
fn a_keep_alive_answer_still_queued_at_a_shutdown_ends_its_connection_once_written() {
    let mut sim = sim();
    let c = sim.connect(Some(16));
    sim.feed(c, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false);
    sim.shutdown();
    assert!(sim.is_open(c), "its answer is not written yet");
    let mut got = Vec::new();
    while let Some(more) = sim.take_output(c).filter(|b| !b.is_empty()) {
        got.extend(more);
    }
    let got = String::from_utf8(got).unwrap();
    assert!(got.starts_with("HTTP/1.1 200 "), "the answer whole: {got}");
    assert!(sim.is_shut(c), "half-closed once its answer is written");
    sim.feed(c, b"", true);
    assert_eq!(sim.stopped(), Some(Stop::Drained));
}

/// The same for a body being discarded after its answer (a refused `POST`): once the
/// body is read, the connection ends instead of waiting for a next request.
#[test]
fn a_body_being_discarded_at_a_shutdown_ends_its_connection_once_read() {
    let mut sim = sim();
    let c = sim.connect(None);
    sim.feed(
        c,
        b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc",
        false,
    );
    assert!(text(&mut sim, c).starts_with("HTTP/1.1 404 "));
    sim.shutdown();
    assert!(!sim.is_shut(c), "the body is still arriving");
    sim.feed(c, b"defghij", false);
    assert!(sim.is_shut(c), "half-closed once the body is read");
    sim.feed(c, b"", true);
    assert_eq!(sim.stopped(), Some(Stop::Drained));
}

#[test]
fn a_reused_connection_slot_does_not_inherit_the_old_deadline() {
    let mut sim = sim();
    let old = sim.connect(None);
    sim.feed(old, b"POST /events HTTP/1.1\r\n", false); // armed: 408 at 30 s
    sim.advance(S(20));
    sim.reset(old);
    let new = sim.connect(None);
    assert_eq!(new, old, "the slot is reused");
    sim.advance(S(15));
    assert!(
        sim.is_open(new),
        "35 s: the old 408 deadline did not fire on the new one"
    );
    assert_eq!(text(&mut sim, new), "");
    sim.advance(S(120) - S(15) - MS(1));
    assert!(sim.is_open(new));
    sim.advance(MS(1));
    assert!(
        !sim.is_open(new),
        "its own keep-alive idle timeout, from t = 20 s"
    );
}

#[test]
fn after_every_connection_ends_no_deadline_remains() {
    let mut sim = sim();
    let a = sse_peer(&mut sim, "");
    let b = ws_peer(&mut sim, "", Some(r#""role":"consumer""#));
    let c = sim.connect(None);
    sim.feed(c, b"GET /events HTTP/1.1\r\n", false);
    for id in [a, b, c] {
        sim.feed(id, b"", true);
    }
    sim.advance(S(3600));
    assert_eq!(sim.core().connections(), 0);
    assert_eq!(sim.core().armed_deadlines(), 0);
    assert_eq!(sim.core().poll_timeout(), None);
}

#[test]
fn the_core_wakes_no_earlier_than_its_next_deadline() {
    let mut sim = sim();
    let c = sse_peer(&mut sim, "");
    let start = sim.now();
    assert_eq!(sim.core().poll_timeout(), Some(start + S(15)));
    sim.advance(S(15));
    assert_eq!(sim.core().poll_timeout(), Some(start + S(30)));
    assert_eq!(ws_frames(&[]), vec![]);
    assert!(sim.is_open(c));
}

/// RFC 9112 §9.3: one request, one answer. A keep-alive peer that sent a request and
/// does not read its answer has no request in flight: it gets no 408 at the request
/// timeout (an answer to nothing, paired by a client with its next request); it is
/// closed as idle at the keep-alive idle timeout.
#[test]
fn a_peer_that_does_not_read_its_answer_gets_no_408_and_is_closed_when_idle() {
    let mut sim = sim();
    let c = sim.connect(Some(0));
    sim.feed(c, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false);
    let answer_bytes = sim.queued_output(c).unwrap();
    assert!(answer_bytes > 0, "the answer waits, unread");
    sim.advance(S(30));
    assert_eq!(
        sim.queued_output(c),
        Some(answer_bytes),
        "nothing more queued: no 408"
    );
    sim.advance(S(90) - MS(1));
    assert!(sim.is_open(c));
    sim.advance(MS(1));
    assert!(!sim.is_open(c), "closed at the idle timeout, 120 s");
}

/// A `live=0` replay to a slow reader is not cut short by the linger: the linger of a
/// stream that ends counts from the last byte the consumer took (AEP-0003 §5: nothing
/// lost silently).
#[test]
fn a_slow_live_0_replay_is_delivered_whole() {
    let mut sim = sim();
    let lines: Vec<String> = (0..2000)
        .map(|i| event("s", 0, i, "tool.started", ""))
        .collect();
    sim.ingest(lines.join("\n").into()).unwrap();
    // About 4 KiB a second: the replay takes minutes, far past the 30 s request timeout.
    let c = sim.connect(Some(4 * 1024));
    sim.feed(
        c,
        b"GET /stream?from=all&live=0 HTTP/1.1\r\nHost: x\r\n\r\n",
        false,
    );
    let mut got = Vec::new();
    while sim.is_open(c) {
        got.extend(sim.take_output(c).unwrap());
        sim.advance(S(1));
    }
    got.extend(sim.take_output(c).unwrap_or_default());
    let text = String::from_utf8(got).unwrap();
    assert_eq!(
        text.matches("\nid: s:0:").count(),
        2000,
        "every Event, then the end"
    );
}

/// A stream whose request head was still arriving when the shutdown began is ended as
/// soon as it opens (the shutdown had no stream to end for it then), so the relay still
/// stops once drained instead of waiting for its deadline.
#[test]
fn a_stream_opened_during_a_shutdown_is_ended_at_once() {
    let mut sim = sim();
    let c = sim.connect(None);
    sim.feed(c, b"GET /stream HTTP/1.1\r\n", false);
    sim.shutdown();
    sim.feed(c, b"Host: x\r\n\r\n", false);
    let out = text(&mut sim, c);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with(": shutting-down\n\n"), "{out}");
    sim.feed(c, b"", true);
    assert_eq!(sim.stopped(), Some(Stop::Drained));
}
