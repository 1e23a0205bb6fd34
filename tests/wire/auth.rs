//! Bearer tokens and scopes over HTTP and SSE (AEP-0003 §8.1).

use crate::support;
use aep_relay::auth::{Auth, Scopes};
use support::*;

fn relay() -> TestRelay {
    TestRelay::with(|c| {
        c.auth = Auth::new(
            Some("all-0f-them"),
            &[
                ("emit-only".into(), Scopes::EMIT),
                ("watch-only".into(), Scopes::WATCH),
            ],
        )
    })
}

fn post(relay: &TestRelay, auth: Option<&str>, query: &str) -> (u16, serde_json::Value) {
    let mut req = agent()
        .post(&format!("{}{query}", relay.url("/events")))
        .set("AEP-Version", "0.1")
        .set("Content-Type", "application/json");
    if let Some(a) = auth {
        req = req.set("Authorization", a);
    }
    status_json(req.send_string(&event("s", 0, 1, "tool.completed", "")))
}

fn stream_status(relay: &TestRelay, query: &str, auth: Option<&str>) -> (u16, serde_json::Value) {
    let mut req = agent().get(&format!("{}?{query}", relay.url("/stream")));
    if let Some(a) = auth {
        req = req.set("Authorization", a);
    }
    match req.call() {
        Ok(r) => (r.status(), serde_json::Value::Null),
        Err(e) => status_json(Err(e)),
    }
}

#[test]
fn missing_or_wrong_token_is_401_with_a_json_body() {
    let relay = relay();
    let (status, json) = post(&relay, None, "");
    assert_eq!(
        (status, json["error"].as_str()),
        (401, Some("unauthorized"))
    );
    let (status, _) = post(&relay, Some("Bearer nope"), "");
    assert_eq!(status, 401);
    let (status, _) = stream_status(&relay, "", None);
    assert_eq!(status, 401);
    let (status, _) = status_json(agent().get(&relay.url("/events")).call());
    assert_eq!(status, 401, "discovery needs a token too");
}

#[test]
fn scopes_decide_what_a_token_may_do() {
    let relay = relay();
    assert_eq!(post(&relay, Some("Bearer emit-only"), "").0, 202);
    let (status, json) = post(&relay, Some("Bearer watch-only"), "");
    assert_eq!(status, 403);
    assert!(json["detail"].as_str().unwrap().contains("emit"), "{json}");
    let (status, json) = stream_status(&relay, "", Some("Bearer emit-only"));
    assert_eq!(status, 403);
    assert!(json["detail"].as_str().unwrap().contains("watch"));
    assert_eq!(
        stream_status(&relay, "live=0", Some("Bearer watch-only")).0,
        200
    );
    assert_eq!(post(&relay, Some("Bearer all-0f-them"), "").0, 202);
}

#[test]
fn query_token_works_for_eventsource_clients() {
    let relay = relay();
    relay_post_with_token(&relay);
    let msgs = relay
        .sse("access_token=watch-only&from=all&live=0", &[])
        .rest();
    assert_eq!(msgs.len(), 1);
    assert_eq!(post(&relay, None, "?access_token=emit-only").0, 202);
}

fn relay_post_with_token(relay: &TestRelay) {
    assert_eq!(post(relay, Some("Bearer emit-only"), "").0, 202);
}

#[test]
fn healthz_needs_no_token_and_adds_counts_with_one() {
    let relay = relay();
    let (status, json) = status_json(agent().get(&relay.url("/healthz")).call());
    assert_eq!(status, 200);
    assert_eq!(json, serde_json::json!({"ok": true}));
    let (_, json) = status_json(
        agent()
            .get(&relay.url("/healthz"))
            .set("Authorization", "Bearer watch-only")
            .call(),
    );
    assert_eq!(json["ok"], true);
    for k in ["sessions", "subscribers", "connections", "uptime_s"] {
        assert!(json[k].is_u64(), "{k} in {json}");
    }
}

#[test]
fn without_tokens_emit_and_watch_are_open() {
    let relay = TestRelay::start();
    assert_eq!(post(&relay, None, "").0, 202);
    assert_eq!(stream_status(&relay, "live=0", None).0, 200);
    let (_, json) = status_json(agent().get(&relay.url("/healthz")).call());
    assert!(
        json["connections"].is_u64(),
        "open relay: counts for everyone"
    );
}
