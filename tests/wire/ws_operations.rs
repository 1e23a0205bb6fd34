//! The WebSocket binding under the relay's operations: a graceful shutdown sends every
//! socket `closing` and 1001 and still exits 0 (AEP-0003 §3.5 #4), and `/metrics`
//! counts WS connections, ingest and deliveries by binding.

use crate::support;

use serde_json::json;
use support::{event, Endpoint, RelayProcess, TestRelay, Ws};

#[test]
fn sigterm_sends_websockets_closing_and_1001_and_exits_0() {
    let relay = RelayProcess::spawn(&[]);
    let mut ws = Ws::connect(&relay, "");
    ws.send_json(
        &json!({"type": "hello", "versions": ["0.1"], "role": "both", "identity": {"agent": "a"}}),
    );
    assert_eq!(ws.recv()["type"], "hello");
    ws.subscribe("mine", json!({"filter": {"session": "s"}}));
    let line = event("s", 3, 14, "tool.started", "");
    ws.send(&line);
    assert_eq!(
        ws.recv_text(),
        line,
        "its own Event, through its subscription"
    );
    relay.signal("TERM");
    let (code, frames) = ws.until_close();
    assert_eq!(code, Some(1001));
    assert_eq!(
        frames,
        vec![json!({"type": "closing", "reason": "shutting down",
                    "delivered": [{"sub": "mine", "session": "s",
                                   "source": "aep://test/agent/a/session/s", "epoch": 3, "seq": 14}]})]
    );
    drop(ws);
    let (status, stderr) = relay.wait();
    assert!(status.success(), "exit status {status}; stderr:\n{stderr}");
    assert!(stderr.contains("shutdown complete"), "{stderr}");
}

#[test]
fn metrics_count_the_websocket_binding() {
    let relay = TestRelay::start();
    let mut watch = Ws::consumer(&relay);
    watch.subscribe("all", json!({}));
    let mut em = Ws::emitter(&relay, "", "a", json!({}));
    let line = event("s", 0, 1, "tool.started", "");
    em.send(&line);
    assert_eq!(watch.recv_text(), line);
    em.send("{}");
    assert_eq!(em.recv()["code"], "invalid-event");
    let text = relay.get_text("/metrics");
    for want in [
        r#"aep_connections{binding="ws"} 2"#,
        r#"aep_events_ingested_total{binding="ws"} 1"#,
        r#"aep_deliveries_total{binding="ws"} 1"#,
        r#"aep_deliveries_total{binding="sse"} 0"#,
        r#"aep_events_rejected_total{reason="invalid-event"} 1"#,
    ] {
        assert!(
            text.lines().any(|l| l == want),
            "{want} missing in:\n{text}"
        );
    }
}
