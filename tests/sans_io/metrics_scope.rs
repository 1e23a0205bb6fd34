//! `GET /metrics` is read with `watch`; the peer addresses of its per-connection series
//! are shown only to `admin`, as every connection is (`GET /connections`, AEP-0003 §8.1:
//! one tenant learns nothing of another's hosts). Driven through in-memory connections,
//! so the consumer's stall, and the drops it causes, are exact.

use aep_relay::auth::{Auth, Scopes};
use aep_relay::{Config, ConnId};
use aep_sim::Sim;
use bytes::Bytes;

/// The body of `GET /metrics` with `token`.
fn metrics(relay: &mut Sim, token: &str) -> String {
    let c = relay.connect(None);
    let req = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n");
    relay.feed(c, req.as_bytes(), true);
    let out = String::from_utf8(relay.take_output(c).unwrap()).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
    out[out.find("\r\n\r\n").unwrap() + 4..].to_string()
}

/// The `aep_connection_dropped_events_total` lines.
fn dropped_series(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("aep_connection_dropped_events_total{"))
        .collect()
}

#[test]
fn peer_addresses_in_metrics_are_for_admin_only() {
    let mut relay = Sim::new(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        max_output_bytes: 64 * 1024,
        auth: Auth::new(
            None,
            &[
                ("watch-tok".into(), Scopes::WATCH),
                ("admin-tok".into(), Scopes::WATCH.with(Scopes::ADMIN)),
            ],
        ),
        ..Config::default()
    })
    .unwrap();
    // A consumer that never reads: debug Events past half its queue are dropped.
    let stalled: ConnId = relay.connect(Some(0));
    relay.feed(
        stalled,
        b"GET /stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer watch-tok\r\n\r\n",
        false,
    );
    let batch: Vec<String> = (1..=400)
        .map(|i| {
            format!(
                r#"{{"aep":"0.1","id":"e{i}","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a","agent":"a","session":"s","seq":{i},"severity":"debug","data":{{"pad":"{}"}}}}"#,
                "x".repeat(200)
            )
        })
        .collect();
    relay.ingest(Bytes::from(batch.join("\n"))).unwrap();

    let watch = metrics(&mut relay, "watch-tok");
    let series = dropped_series(&watch);
    assert_eq!(series.len(), 1, "the stalled consumer had drops:\n{watch}");
    assert!(
        series[0].starts_with(&format!(
            r#"aep_connection_dropped_events_total{{conn="{stalled}"}} "#
        )),
        "{}",
        series[0]
    );
    assert!(!watch.contains("peer="), "no peer for watch:\n{watch}");
    assert!(
        !watch.contains("127.0.0.1"),
        "no address for watch:\n{watch}"
    );

    let admin = metrics(&mut relay, "admin-tok");
    let series = dropped_series(&admin);
    assert_eq!(series.len(), 1, "{admin}");
    assert!(
        series[0].contains(r#"peer="127.0.0.1:40000""#),
        "admin sees the peer: {}",
        series[0]
    );
}
