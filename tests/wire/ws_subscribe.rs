//! Subscriptions on `/socket` (AEP-0003 §5, §6.5, §7): the closed refusal set with the
//! connection surviving each refusal, multiplexing with single delivery, capture
//! ceilings, replay with `replay-exhausted`, and byte identity with a POSTed line.
//!
//! "Nothing else arrived" is shown with a sentinel: a later Event that every
//! subscription matches, read as the very next frame.

use crate::support;

use aep_relay::auth::{Auth, Scopes};
use serde_json::{json, Value};
use support::{event, Endpoint, TestRelay, Ws};

fn ev(session: &str, seq: u64, ty: &str) -> String {
    event(session, 0, seq, ty, "")
}

/// Posts a sentinel in session `zz` and asserts it is the next frame.
fn expect_sentinel(relay: &TestRelay, ws: &mut Ws, seq: u64) {
    let s = ev("zz", seq, "progress.status");
    relay.post_ok(&[&s]);
    let got = ws.recv();
    assert_eq!(
        got["id"],
        format!("zz-0-{seq}"),
        "expected only the sentinel next: {got}"
    );
}

#[test]
fn each_refusal_code_answers_in_band_and_the_connection_survives() {
    let relay = TestRelay::with(|c| {
        c.max_subscriptions_per_conn = 2;
        c.max_from_positions = 2;
    });
    let mut ws = Ws::consumer(&relay);
    ws.subscribe("live", json!({"filter": {}}));
    let refusals = [
        (json!({"id": "a", "filter": {"seq": 3}}), "invalid-filter"),
        (
            json!({"id": "b", "filter": {"nope-key!": 1}}),
            "invalid-filter",
        ),
        (json!({"id": "c", "filter": "type = 'x'"}), "invalid-filter"),
        (
            json!({"id": "d", "capture": "everything"}),
            "invalid-filter",
        ),
        (
            json!({"id": "e", "from": [{"session": "s"}]}),
            "invalid-filter",
        ),
        (json!({"id": "live"}), "invalid-filter"),
        (
            json!({"id": "f", "dialect": "cesql", "filter": {}}),
            "unknown-dialect",
        ),
        (
            json!({"id": "g", "from": [{"session": "a", "seq": 1}, {"session": "b", "seq": 1}, {"session": "c", "seq": 1}]}),
            "limit-exceeded",
        ),
    ];
    for (i, (req, code)) in refusals.iter().enumerate() {
        let mut f = req.clone();
        f["type"] = json!("subscribe");
        ws.send_json(&f);
        let r = ws.recv();
        assert_eq!(r["type"], "error", "{req}: {r}");
        assert_eq!(r["id"], req["id"], "{req}: {r}");
        assert_eq!(r["code"], *code, "{req}: {r}");
        assert!(r["detail"].as_str().is_some_and(|d| !d.is_empty()));
        // The live subscription is undisturbed.
        expect_sentinel(&relay, &mut ws, i as u64);
    }
    // Duplicate member names are not resolved silently.
    ws.send(r#"{"type":"subscribe","id":"dup","filter":{"type":"a.b","type":"c.d"}}"#);
    assert_eq!(ws.recv()["code"], "invalid-filter");
    // The subscription limit names itself.
    ws.subscribe("second", json!({"filter": {"session": "nothing-here"}}));
    ws.send_json(&json!({"type": "subscribe", "id": "third"}));
    let r = ws.recv();
    assert_eq!(
        (r["code"].as_str(), r["id"].as_str()),
        (Some("limit-exceeded"), Some("third"))
    );
    assert!(
        r["detail"]
            .as_str()
            .unwrap()
            .contains("AEP_MAX_SUBSCRIPTIONS"),
        "{r}"
    );
    expect_sentinel(&relay, &mut ws, 100);
    ws.close();
}

#[test]
fn subscribing_needs_a_consumer_role_and_the_watch_scope() {
    let relay = TestRelay::with(|c| {
        c.auth = Auth::new(
            None,
            &[("e".into(), Scopes::EMIT), ("w".into(), Scopes::WATCH)],
        )
    });
    let mut em = Ws::emitter(&relay, "access_token=e", "a", json!({}));
    em.send_json(&json!({"type": "subscribe", "id": "s1", "filter": {}}));
    let r = em.recv();
    assert_eq!(
        (r["code"].as_str(), r["id"].as_str()),
        (Some("unauthorized"), Some("s1"))
    );
    let (mut both, _) = Ws::hello(
        &relay,
        "access_token=e",
        "both",
        json!({"identity": {"agent": "a"}}),
    );
    both.send_json(&json!({"type": "subscribe", "id": "s2", "filter": {}}));
    let r = both.recv();
    assert_eq!(
        r["code"], "unauthorized",
        "an emit-only token may not watch"
    );
    assert!(r["detail"].as_str().unwrap().contains("watch"));
    // Both connections are still usable.
    let line = ev("s", 1, "tool.started");
    em.send(&line);
    let (mut watcher, _) = Ws::hello(&relay, "access_token=w", "consumer", json!({}));
    watcher.subscribe("all", json!({"from": "all"}));
    assert_eq!(watcher.recv_text(), line);
}

#[test]
fn an_event_matching_several_subscriptions_is_delivered_once() {
    let relay = TestRelay::start();
    let mut ws = Ws::consumer(&relay);
    ws.subscribe("by-type", json!({"filter": {"type": "tool.*"}}));
    ws.subscribe("by-session", json!({"filter": {"session": "s1"}}));
    ws.subscribe("everything", json!({"filter": {}}));
    let a = ev("s1", 1, "tool.started");
    let b = ev("s2", 1, "run.started");
    relay.post_ok(&[&a, &b]);
    assert_eq!(
        ws.recv_text(),
        a,
        "once, although three subscriptions match"
    );
    assert_eq!(ws.recv_text(), b);
    expect_sentinel(&relay, &mut ws, 1);
    // Unsubscribing one leaves the others.
    ws.send_json(&json!({"type": "unsubscribe", "id": "everything"}));
    assert_eq!(
        ws.recv(),
        json!({"type": "unsubscribed", "id": "everything"})
    );
    let c = ev("s3", 1, "run.started");
    let d = ev("s1", 2, "run.started");
    relay.post_ok(&[&c, &d]);
    assert_eq!(
        ws.recv_text(),
        d,
        "s3 matched only the dropped subscription"
    );
}

#[test]
fn several_ceilings_on_one_connection_deliver_the_widest_once() {
    let relay = TestRelay::start();
    let full = event(
        "s",
        0,
        1,
        "tool.completed",
        r#","capture":"full","data":{"tool":{"name":"Bash"},"status":"success","result":"secret output"}"#,
    );
    let mut narrow = Ws::consumer(&relay);
    narrow.subscribe("none", json!({"capture": "none"}));
    narrow.subscribe(
        "meta",
        json!({"capture": "metadata", "filter": {"type": "tool.*"}}),
    );
    let mut wide = Ws::consumer(&relay);
    wide.subscribe("meta", json!({"capture": "metadata"}));
    wide.subscribe("raw", json!({"filter": {"session": "s"}}));
    relay.post_ok(&[&full]);
    let v: Value = serde_json::from_str(&narrow.recv_text()).unwrap();
    assert_eq!(
        v["capture"], "metadata",
        "metadata is the widest of none and metadata"
    );
    assert!(v["data"].get("result").is_none());
    assert_eq!(v["data"]["status"], "success");
    assert_eq!(
        wide.recv_text(),
        full,
        "no ceiling on one subscription: as received"
    );
    expect_sentinel(&relay, &mut narrow, 1);
    assert_eq!(
        wide.recv()["id"],
        "zz-0-1",
        "the same sentinel, and nothing before it"
    );
}

#[test]
fn a_posted_line_arrives_byte_identical_in_a_ws_frame() {
    let relay = TestRelay::start();
    let mut ws = Ws::consumer(&relay);
    ws.subscribe("s", json!({}));
    let line = event(
        "s_8f2c",
        2,
        187,
        "tool.completed",
        r#",  "severity" : "info","acmeregion":"eu-1","subject":"caf\u00e9 \"q\" é","data":{"z":1.50,"a":[ ]}"#,
    );
    relay.post_ok(&[&line]);
    assert_eq!(
        ws.recv_text(),
        line,
        "the frame payload is the Event's original bytes"
    );
}

/// Every golden Event but the commands (refused over HTTP) arrives in a WS frame, byte
/// for byte as posted.
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn the_golden_events_arrive_byte_identical_in_ws_frames() {
    let relay = TestRelay::start();
    let mut ws = Ws::consumer(&relay);
    ws.subscribe("s", json!({}));
    let golden = support::fixture("aep-fixtures/golden/golden.jsonl");
    let lines: Vec<&str> = golden
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            !aep_relay::wire::envelope::is_command_type(v["type"].as_str().unwrap())
        })
        .collect();
    relay.post_ok(&lines);
    for l in lines {
        assert_eq!(ws.recv_text(), l);
    }
}

#[test]
fn replay_is_strictly_after_the_position_with_replay_exhausted_first() {
    let relay = TestRelay::with(|c| c.buffer_per_session = 3);
    let lines: Vec<String> = (1..=6).map(|q| ev("s1", q, "tool.started")).collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    relay.post_ok(&refs);
    let mut ws = Ws::consumer(&relay);
    ws.subscribe(
        "old",
        json!({"from": [{"session": "s1", "epoch": 0, "seq": 1}]}),
    );
    assert_eq!(
        ws.recv(),
        json!({"type": "replay-exhausted", "sub": "old", "session": "s1", "earliest": {"epoch": 0, "seq": 4},
               "source": "aep://test/agent/a/session/s1"})
    );
    for q in 4..=6 {
        assert_eq!(ws.recv_text(), lines[q - 1]);
    }
    // Strictly after a held position, no marker. The Events are already delivered on
    // this connection through "old"; a second subscription replays them again.
    ws.subscribe("recent", json!({"from": [{"session": "s1", "seq": 4}]}));
    assert_eq!(ws.recv_text(), lines[4]);
    assert_eq!(ws.recv_text(), lines[5]);
    // Then live, once for the connection.
    let seven = ev("s1", 7, "tool.started");
    relay.post_ok(&[&seven]);
    assert_eq!(ws.recv_text(), seven);
    expect_sentinel(&relay, &mut ws, 1);
}

#[test]
fn replay_all_has_no_marker_and_applies_the_filter() {
    let relay = TestRelay::with(|c| c.buffer_per_session = 2);
    let a: Vec<String> = (1..=4).map(|q| ev("a", q, "tool.started")).collect();
    let b = ev("b", 1, "run.started");
    relay.post_ok(&[&a[0], &a[1], &a[2], &a[3], &b]);
    let mut ws = Ws::consumer(&relay);
    ws.subscribe("all", json!({"from": "all", "filter": {"type": "tool.*"}}));
    assert_eq!(ws.recv_text(), a[2], "no replay-exhausted for from=all");
    assert_eq!(ws.recv_text(), a[3]);
    let live = ev("a", 5, "tool.started");
    relay.post_ok(&[&b, &live]);
    assert_eq!(
        ws.recv_text(),
        live,
        "the filter applies to live delivery too"
    );
}

#[test]
fn replay_on_one_subscription_follows_what_others_already_queued() {
    let relay = TestRelay::start();
    let mut ws = Ws::consumer(&relay);
    ws.subscribe("live", json!({"filter": {"session": "x"}}));
    let held = ev("s", 1, "tool.started");
    let x = ev("x", 1, "tool.started");
    relay.post_ok(&[&held, &x]);
    assert_eq!(ws.recv_text(), x);
    ws.subscribe("late", json!({"from": [{"session": "s", "seq": 0}]}));
    assert_eq!(ws.recv_text(), held);
    let x2 = ev("x", 2, "tool.started");
    relay.post_ok(&[&x2]);
    assert_eq!(ws.recv_text(), x2);
}
