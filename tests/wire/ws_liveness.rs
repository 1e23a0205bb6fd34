//! Liveness on `/socket` (AEP-0003 §3.5 #4, #5) through a real socket, end to end: the
//! reactor wakes for the core's deadlines. The exact instants (every heartbeat, the idle
//! close with `closing` and its positions, 1001, the peer that never says `hello`) are asserted on
//! virtual time in `tests/sans_io/virtual_time.rs`; here the timeouts are whole seconds.

use crate::support;

use serde_json::json;
use std::time::Duration;
use support::{TestRelay, Ws};

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
