//! `GET /connections` (scope `admin`) and `aep-relay top` against the real binary: a
//! consumer that does not read is named first, with what is queued toward it, how far
//! behind it is and what it lost, on its filter and ceiling, under its token's name; a
//! token without `admin` is refused, and its `/status` lists no lagging consumer.

use crate::support;
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};
use support::*;

/// The rows of `GET /connections` (with `token`, if any).
fn connections(relay: &RelayProcess, token: Option<&str>) -> (u16, Value) {
    let mut req = agent().get(&relay.url("/connections"));
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    status_json(req.call())
}

#[test]
fn a_consumer_that_does_not_read_is_named_first_with_its_lag() {
    let relay = RelayProcess::spawn(&["--max-output", "65536"]);
    // A consumer that never reads its socket: the kernel's buffers fill, then its queue.
    let mut stalled = relay.tcp();
    let filter = enc(r#"{"session":"bp"}"#);
    write!(
        stalled,
        "GET /stream?filter={filter}&capture=metadata HTTP/1.1\r\nHost: t\r\n\r\n"
    )
    .unwrap();
    let stalled_port = stalled.local_addr().unwrap().port();
    // Batches of 200 Events of ~1 KB until the relay reports the stalled consumer with
    // Events lost: its queue passed the marks, so it holds what it can.
    let pad = format!(",\"pad\":\"{}\"", "x".repeat(900));
    let mut row = Value::Null;
    for round in 0..100u64 {
        let lines: Vec<String> = (0..200)
            .map(|i| event("bp", 0, round * 200 + i, "tool.completed", &pad))
            .collect();
        relay.post_ok(&lines);
        let (status, doc) = connections(&relay, None);
        assert_eq!(status, 200, "{doc}");
        row = doc["connections"][0].clone();
        if row["dropped"]["info"].as_u64().unwrap_or(0) > 0 {
            break;
        }
    }
    let peer = row["peer"].as_str().unwrap_or_default();
    assert!(
        peer.ends_with(&format!(":{stalled_port}")),
        "the stalled consumer is the most lagging: {row}"
    );
    assert_eq!(row["binding"], "sse", "{row}");
    assert!(row["queued_bytes"].as_u64().unwrap() > 0, "{row}");
    assert!(row["behind"].as_u64().unwrap() > 0, "{row}");
    assert!(row["dropped"]["info"].as_u64().unwrap() > 0, "{row}");
    assert_eq!(
        row["subscriptions"],
        json!([{"id": null, "filter": {"session": ["bp"]}, "capture": "metadata"}]),
        "{row}"
    );

    // `aep-relay top --once` shows the same row first.
    let out = Command::new(bin())
        .args(["top", "--once", &relay.url("")])
        .env_remove("AEP_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("top runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "top: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = text.lines().nth(2).unwrap_or_default();
    assert!(
        first.contains(&format!(":{stalled_port}"))
            && first.contains(r#"{"session":["bp"]} @metadata"#),
        "top's first row is the stalled consumer:\n{text}"
    );
    drop(stalled);
}

#[test]
fn connections_need_the_admin_scope() {
    let dir = temp_dir("connections-admin");
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        "watcher watch name=dash\noncall watch admin name=oncall\n",
    )
    .unwrap();
    let relay = RelayProcess::spawn(&["--tokens-file", tokens.to_str().unwrap()]);
    let (status, doc) = connections(&relay, Some("watcher"));
    assert_eq!((status, &doc["error"]), (403, &json!("forbidden")), "{doc}");
    assert_eq!(connections(&relay, None).0, 401);
    // A stream names the token it was opened with, never the token itself.
    let _stream = relay.sse("", &[("Authorization", "Bearer watcher")]);
    let (status, doc) = connections(&relay, Some("oncall"));
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["total"], 2, "the stream and this request: {doc}");
    let rows = doc["connections"].as_array().unwrap();
    let sse: Vec<&Value> = rows.iter().filter(|r| r["binding"] == "sse").collect();
    assert_eq!(sse.len(), 1, "{doc}");
    assert_eq!(sse[0]["holder"], "dash", "{doc}");
    assert!(!doc.to_string().contains("watcher"), "never a token: {doc}");

    let status_of = |token: &str| {
        let resp = agent()
            .get(&relay.url("/status"))
            .set("Authorization", &format!("Bearer {token}"))
            .call();
        status_json(resp).1
    };
    assert!(status_of("watcher").get("lagging").is_none());
    assert!(status_of("oncall")["lagging"].is_array());

    let out = Command::new(bin())
        .args(["top", "--once", &relay.url(""), "--token", "watcher"])
        .env_remove("AEP_TOKEN")
        .output()
        .expect("top runs");
    assert_eq!(
        out.status.code(),
        Some(2),
        "a refused request ends top with 2"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("403") && !err.contains("watcher"), "{err}");
}
