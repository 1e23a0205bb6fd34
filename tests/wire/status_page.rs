//! The status page at `GET /` and its data at `GET /status` (auth: `watch`).
#![cfg(feature = "status-page")]

use crate::support;
use aep_relay::auth::{Auth, Scopes};
use support::*;

#[test]
fn status_page_is_self_contained_html_behind_watch() {
    let relay = TestRelay::with(|c| {
        c.auth = Auth::new(
            None,
            &[("w".into(), Scopes::WATCH), ("e".into(), Scopes::EMIT)],
        )
    });
    assert_eq!(status_json(agent().get(&relay.url("/")).call()).0, 401);
    assert_eq!(
        status_json(agent().get(&relay.url("/?access_token=e")).call()).0,
        403
    );
    let resp = agent().get(&relay.url("/?access_token=w")).call().unwrap();
    assert_eq!(resp.content_type(), "text/html");
    let html = resp.into_string().unwrap();
    assert!(html.starts_with("<!doctype html>"));
    for external in ["src=\"http", "href=\"http", "src=\"//", "@import"] {
        assert!(!html.contains(external), "no external assets: {external}");
    }
    assert!(
        html.contains("/status") && html.contains("/stream"),
        "reads the relay's own endpoints"
    );
}

#[test]
fn status_json_reports_sessions_positions_and_counters() {
    let relay = TestRelay::start();
    let _watcher = relay.sse("", &[]);
    relay.post_ok(&[
        &event("a", 0, 3, "run.started", ""),
        &event("a", 0, 4, "run.finished", ""),
        &event("b", 2, 9, "run.started", ""),
    ]);
    let (status, s) = status_json(agent().get(&relay.url("/status")).call());
    assert_eq!(status, 200);
    assert_eq!(s["sessions"]["count"], 2);
    let recent = s["sessions"]["recent"].as_array().unwrap();
    let a = recent.iter().find(|x| x["session"] == "a").unwrap();
    assert_eq!(a["events"], 2);
    assert_eq!(a["latest"], serde_json::json!({"epoch": 0, "seq": 4}));
    assert_eq!(
        recent.last().unwrap()["session"],
        "b",
        "most recently written last"
    );
    assert_eq!(s["ingested"], 3);
    assert_eq!(s["deliveries"], 3);
    assert_eq!(s["subscriptions"], 1);
    assert_eq!(s["connections"]["sse"], 1);
}
