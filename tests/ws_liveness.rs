//! Liveness on `/socket` (AEP-0003 §3.5 #4, #5) through a real socket, end to end: the
//! reactor wakes for the core's deadlines. The exact instants (every heartbeat, the idle
//! close with `closing` and 1001, the peer that never says `hello`) are asserted on
//! virtual time in `tests/virtual_time.rs`; here the timeouts are whole seconds.

mod support;

use serde_json::json;
use std::time::Duration;
use support::{event, Endpoint, TestRelay, Ws};

fn quick() -> TestRelay {
    TestRelay::with(|c| {
        c.heartbeat = Duration::from_secs(1);
        c.ws_idle_timeout = Duration::from_secs(2);
    })
}

#[test]
fn the_relay_pings_every_heartbeat_and_a_peer_that_answers_stays() {
    let relay = quick();
    let mut ws = Ws::consumer(&relay);
    // Answer three pings: 3 s, longer than the idle timeout.
    let mut last = 0;
    for _ in 0..3 {
        let p = ws.recv_any();
        assert_eq!(p["type"], "ping", "{p}");
        let t = p["t"].as_u64().expect("t is milliseconds since the epoch");
        assert!(t >= last);
        last = t;
        ws.send_json(&json!({"type": "pong", "t": t}));
    }
    ws.send_json(&json!({"type": "ping", "t": [1, "x"]}));
    assert_eq!(
        ws.recv(),
        json!({"type": "pong", "t": [1, "x"]}),
        "still open"
    );
    ws.close();
}

#[test]
fn a_silent_peer_is_sent_closing_with_its_positions_then_1001() {
    let relay = quick();
    let mut ws = Ws::consumer(&relay);
    ws.subscribe("a", json!({"filter": {"session": ["s", "t"]}}));
    ws.subscribe("b", json!({"filter": {"session": "t"}}));
    ws.subscribe("quiet", json!({"filter": {"session": "none"}}));
    let lines = [
        event("s", 0, 5, "tool.started", ""),
        event("t", 2, 9, "tool.started", ""),
        event("s", 1, 0, "tool.started", ""),
    ];
    relay.post_ok(&[&lines[0], &lines[1], &lines[2]]);
    for l in &lines {
        assert_eq!(&ws.recv_text(), l);
    }
    // Say nothing more; pings arrive and are not answered.
    let (code, frames) = ws.until_close();
    assert_eq!(code, Some(1001));
    let closing = frames.last().expect("a closing frame before the close");
    assert_eq!(closing["type"], "closing", "{frames:?}");
    assert!(closing["reason"].as_str().unwrap().contains("idle"));
    assert_eq!(
        closing["delivered"],
        json!([
            {"sub": "a", "session": "s", "source": "aep://test/agent/a/session/s", "epoch": 1, "seq": 0},
            {"sub": "a", "session": "t", "source": "aep://test/agent/a/session/t", "epoch": 2, "seq": 9},
            {"sub": "b", "session": "t", "source": "aep://test/agent/a/session/t", "epoch": 2, "seq": 9},
        ])
    );
    assert!(
        frames[..frames.len() - 1]
            .iter()
            .all(|f| f["type"] == "ping"),
        "only pings between the last Event and closing: {frames:?}"
    );
}
