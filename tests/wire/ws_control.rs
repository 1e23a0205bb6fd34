//! Emitters, session claims, the roster and control routing on `/socket` (AEP-0003 §4.1;
//! AEP-0004 §2, §4): Events take the HTTP ingest path, invalid ones are answered
//! in-band, commands reach exactly one claimant or are refused with a `cause`-correlated
//! error that never enters history.

use crate::support;

use aep_relay::auth::{Auth, Scopes};
use serde_json::{json, Value};
use support::{event, Endpoint, TestRelay, Ws};

fn ev(session: &str, seq: u64) -> String {
    event(session, 0, seq, "tool.started", "")
}

/// A command (no `seq`: the sender does not own the target's order, AEP-0004 §2.2).
fn command(id: &str, ty: &str, session: &str) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{id}","type":"{ty}","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/sender","agent":"sender","session":"{session}","data":{{"scope":"session"}}}}"#
    )
}

fn control_relay() -> TestRelay {
    TestRelay::with(|c| {
        c.auth = Auth::new(
            Some("t"),
            &[
                ("w".into(), Scopes::WATCH),
                ("ew".into(), Scopes::EMIT.with(Scopes::WATCH)),
            ],
        )
    })
}

/// An emitter claiming `session` (it sends one sequenced Event, seen by `watch`).
fn claimant(relay: &TestRelay, agent: &str, session: &str, accepts: &[&str], watch: &mut Ws) -> Ws {
    let mut ws = Ws::emitter(
        relay,
        "access_token=t",
        agent,
        json!({"capabilities": {"control": {"accepts": accepts}}}),
    );
    let line = event(
        session,
        0,
        1,
        "session.started",
        &format!(r#","x{agent}":1"#),
    );
    ws.send(&line);
    assert_eq!(
        watch.recv_text(),
        line,
        "the claim is in place once its Event fans out"
    );
    ws
}

/// A ping answered by a pong proves nothing else was queued before it.
fn expect_quiet(ws: &mut Ws) {
    ws.send_json(&json!({"type": "ping", "t": "q"}));
    assert_eq!(ws.recv(), json!({"type": "pong", "t": "q"}));
}

#[test]
fn emitted_events_take_the_http_path_and_arrive_byte_identical() {
    let relay = TestRelay::start();
    let mut sse = relay.sse("", &[]);
    let mut watch = Ws::consumer(&relay);
    watch.subscribe("all", json!({}));
    let mut em = Ws::emitter(&relay, "", "a", json!({}));
    let line = event("s", 0, 1, "tool.started", r#", "subject" : "x\u00e9""#);
    em.send(&line);
    assert_eq!(watch.recv_text(), line);
    assert_eq!(sse.expect().data, line);
    // History holds it: a later replay gives the same bytes.
    let mut late = Ws::consumer(&relay);
    late.subscribe("r", json!({"from": [{"session": "s", "seq": 0}]}));
    assert_eq!(late.recv_text(), line);
}

#[test]
fn an_invalid_event_is_answered_and_the_connection_stays() {
    let relay = TestRelay::start();
    let mut watch = Ws::consumer(&relay);
    watch.subscribe("all", json!({}));
    let mut em = Ws::emitter(&relay, "", "a", json!({}));
    em.send(r#"{"aep":"0.1","id":"bad-1","type":"tool.started","session":"s","seq":-1}"#);
    let r = em.recv();
    assert_eq!(
        (r["type"].as_str(), r["code"].as_str()),
        (Some("error"), Some("invalid-event"))
    );
    assert_eq!(r["id"], "bad-1");
    assert!(!r["detail"].as_str().unwrap().is_empty());
    em.send("[1, 2");
    let r = em.recv();
    assert_eq!(r["code"], "invalid-event");
    assert!(r.get("id").is_none());
    let line = ev("s", 1);
    em.send(&line);
    assert_eq!(
        watch.recv_text(),
        line,
        "the emitter is still connected and heard"
    );
}

#[test]
fn events_need_an_emitting_role_and_the_emit_scope() {
    let relay = control_relay();
    let mut cons = Ws::hello(&relay, "access_token=t", "consumer", json!({})).0;
    cons.send(&ev("s", 1));
    let r = cons.recv();
    assert_eq!(
        (r["code"].as_str(), r["id"].as_str()),
        (Some("unauthorized"), Some("s-0-1"))
    );
    let mut watcher = Ws::hello(
        &relay,
        "access_token=w",
        "both",
        json!({"identity": {"agent": "a"}}),
    )
    .0;
    watcher.send(&ev("s", 2));
    let r = watcher.recv();
    assert_eq!(r["code"], "unauthorized");
    assert!(r["detail"].as_str().unwrap().contains("emit"));
    expect_quiet(&mut cons);
    expect_quiet(&mut watcher);
}

#[test]
fn the_roster_lists_each_live_claim_with_declarations_verbatim() {
    let relay = TestRelay::start();
    let mut watch = Ws::consumer(&relay);
    watch.subscribe("all", json!({}));
    let control =
        json!({"accepts": ["control.cancel"], "ack_window_ms": 10000, "vendor": {"x": [1.5]}});
    let mut a = Ws::emitter(
        &relay,
        "",
        "agent-a",
        json!({"identity": {"agent": "agent-a", "instance": "host/1"},
               "capabilities": {"control": control, "emits": ["tool", "run"], "other": 1}}),
    );
    let mut b = Ws::emitter(&relay, "", "agent-b", json!({}));
    for (which, line) in [
        (0, ev("s1", 1)),
        (0, ev("s2", 1)),
        (0, ev("s1", 2)),
        (1, event("s1", 0, 7, "tool.started", r#","xb":1"#)),
    ] {
        [&mut a, &mut b][which].send(&line);
        assert_eq!(watch.recv_text(), line);
    }
    watch.send_json(&json!({"type": "roster", "id": "r-1"}));
    let entry_a = |s: &str| json!({"session": s, "agent": "agent-a", "instance": "host/1", "control": control, "emits": ["tool", "run"]});
    assert_eq!(
        watch.recv(),
        json!({"type": "roster", "id": "r-1", "entries": [
            entry_a("s1"),
            {"session": "s1", "agent": "agent-b"},
            entry_a("s2"),
        ]}),
        "one entry per (connection, session); the repeated session is shown, not merged"
    );
    // An emitter may not read it; it hears why and stays connected.
    b.send_json(&json!({"type": "roster", "id": "r-2"}));
    let r = b.recv();
    assert_eq!(
        (r["code"].as_str(), r["id"].as_str()),
        (Some("unauthorized"), Some("r-2"))
    );
    expect_quiet(&mut b);
    // A claim ends with its connection.
    b.close();
    watch.send_json(&json!({"type": "roster", "id": "r-3"}));
    assert_eq!(
        watch.recv(),
        json!({"type": "roster", "id": "r-3", "entries": [entry_a("s1"), entry_a("s2")]})
    );
    watch.send_json(&json!({"type": "roster"}));
    assert_eq!(watch.recv()["code"], "invalid-frame", "the id is required");
}

#[test]
fn without_a_token_the_relay_is_watch_only_for_control() {
    let relay = TestRelay::start();
    let mut watch = Ws::consumer(&relay);
    watch.subscribe("all", json!({}));
    let _target = claimant(&relay, "a", "s1", &["control.cancel"], &mut watch);
    let mut sender = Ws::consumer(&relay);
    sender.send(&command("cmd-1", "control.cancel", "s1"));
    let r = sender.recv();
    assert_eq!(
        (r["type"].as_str(), r["cause"].as_str(), r["code"].as_str()),
        (Some("error"), Some("cmd-1"), Some("unauthorized"))
    );
    assert!(r["detail"].as_str().unwrap().contains("watch-only"), "{r}");
    // HTTP never carries control.
    let (status, body) = relay.post(
        "application/json",
        &command("cmd-2", "control.cancel", "s1"),
    );
    assert_eq!((status, body["error"].as_str()), (403, Some("forbidden")));
}

#[test]
fn commands_need_the_control_scope() {
    let relay = control_relay();
    let mut watch = Ws::hello(&relay, "access_token=t", "consumer", json!({})).0;
    watch.subscribe("all", json!({}));
    let _target = claimant(&relay, "a", "s1", &["control.cancel"], &mut watch);
    let mut sender = Ws::hello(
        &relay,
        "access_token=ew",
        "both",
        json!({"identity": {"agent": "x"}}),
    )
    .0;
    sender.send(&command("cmd-1", "control.cancel", "s1"));
    let r = sender.recv();
    assert_eq!(
        (r["cause"].as_str(), r["code"].as_str()),
        (Some("cmd-1"), Some("unauthorized"))
    );
    assert!(r["detail"].as_str().unwrap().contains("control"));
}

#[test]
fn each_routing_refusal_is_cause_correlated_and_stays_out_of_history() {
    let relay = control_relay();
    let mut watch = Ws::hello(&relay, "access_token=t", "consumer", json!({})).0;
    watch.subscribe("all", json!({}));
    let _pausable = claimant(&relay, "p", "s-pause", &["control.pause"], &mut watch);
    let _mute = {
        let mut ws = Ws::emitter(&relay, "access_token=t", "m", json!({}));
        let line = ev("s-mute", 1);
        ws.send(&line);
        assert_eq!(watch.recv_text(), line);
        ws
    };
    let _twin1 = claimant(&relay, "t1", "s-twin", &["control.cancel"], &mut watch);
    let _twin2 = claimant(&relay, "t2", "s-twin", &["control.cancel"], &mut watch);
    let (mut sender, _) = Ws::hello(&relay, "access_token=t", "consumer", json!({}));
    for (id, ty, session, code) in [
        ("c1", "control.cancel", "s-nobody", "no-route"),
        ("c2", "control.cancel", "s-pause", "unsupported"),
        ("c3", "x.acme.control.reboot", "s-mute", "unsupported"),
        ("c4", "control.cancel", "s-twin", "ambiguous"),
    ] {
        sender.send(&command(id, ty, session));
        let r = sender.recv();
        assert_eq!(
            (r["type"].as_str(), r["cause"].as_str(), r["code"].as_str()),
            (Some("error"), Some(id), Some(code)),
            "{r}"
        );
        assert!(r.get("seq").is_none());
    }
    // Nobody received a command or a refusal Event, and history holds none of them.
    expect_quiet(&mut watch);
    let mut late = Ws::hello(&relay, "access_token=t", "consumer", json!({})).0;
    late.send_json(&json!({"type": "subscribe", "id": "h", "from": "all", "filter": {"type": ["control.*", "x.acme.*"]}}));
    assert_eq!(late.recv(), json!({"type": "subscribed", "id": "h"}));
    expect_quiet(&mut late);
}

#[test]
fn a_command_reaches_exactly_its_one_claimant_byte_identical() {
    let relay = control_relay();
    let mut watch = Ws::hello(&relay, "access_token=t", "consumer", json!({})).0;
    watch.subscribe("all", json!({}));
    // Two control-capable emitters compete: one claims s1, the other s3.
    let mut target = claimant(&relay, "a", "s1", &["control.cancel"], &mut watch);
    let mut other = claimant(&relay, "b", "s3", &["control.cancel"], &mut watch);
    // The target also watches everything: it must still get the command once.
    let (mut both, _) = Ws::hello(
        &relay,
        "access_token=t",
        "both",
        json!({"identity": {"agent": "c"}, "capabilities": {"control": {"accepts": ["control.cancel"]}}}),
    );
    both.subscribe("all", json!({}));
    let line = ev("s2", 1);
    both.send(&line);
    assert_eq!(
        both.recv_text(),
        line,
        "its own Event, through its subscription"
    );
    assert_eq!(watch.recv_text(), line);
    let (mut sender, _) = Ws::hello(&relay, "access_token=t", "consumer", json!({}));
    let cmd = command("cmd-1", "control.cancel", "s1");
    let spaced = cmd.replacen(r#""id":"cmd-1""#, r#""id" : "cmd-1""#, 1);
    sender.send(&spaced);
    assert_eq!(target.recv_text(), spaced, "forwarded byte-identically");
    assert_eq!(watch.recv_text(), spaced, "observers see it like any Event");
    assert_eq!(both.recv_text(), spaced);
    expect_quiet(&mut target);
    expect_quiet(&mut other);
    expect_quiet(&mut sender);
    // A claimant that also subscribes gets the command once, not twice.
    let to_both = command("cmd-2", "control.cancel", "s2");
    sender.send(&to_both);
    assert_eq!(both.recv_text(), to_both);
    expect_quiet(&mut both);
    assert_eq!(watch.recv_text(), to_both);
    // History keeps the routed commands, in their sessions.
    let mut late = Ws::hello(&relay, "access_token=t", "consumer", json!({})).0;
    late.subscribe("h", json!({"from": "all", "filter": {"type": "control.*"}}));
    let got: Vec<Value> = (0..2).map(|_| late.recv()).collect();
    let mut ids: Vec<&str> = got.iter().map(|v| v["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["cmd-1", "cmd-2"]);
}

#[test]
fn an_ambiguous_claim_routes_again_once_one_claimant_leaves() {
    let relay = control_relay();
    let mut watch = Ws::hello(&relay, "access_token=t", "consumer", json!({})).0;
    watch.subscribe("all", json!({}));
    let first = claimant(&relay, "a", "s", &["control.cancel"], &mut watch);
    let mut second = claimant(&relay, "b", "s", &["control.cancel"], &mut watch);
    let (mut sender, _) = Ws::hello(&relay, "access_token=t", "consumer", json!({}));
    let cmd = command("cmd-1", "control.cancel", "s");
    sender.send(&cmd);
    assert_eq!(sender.recv()["code"], "ambiguous");
    first.close();
    sender.send(&cmd);
    assert_eq!(
        second.recv_text(),
        cmd,
        "the retry reaches the one claimant left"
    );
    expect_quiet(&mut sender);
}

/// Events sent on a socket are kept in the durable history like POSTed ones (AEP-0003
/// §3.1.1), and a history that cannot keep them answers the emitter instead of
/// accepting them.
#[test]
fn socket_events_reach_the_history_or_are_refused() {
    let dir = std::env::temp_dir().join(format!("aep-ws-history-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let history = dir.clone();
    let relay =
        TestRelay::with(move |c| c.history = Some(aep_relay::history::HistoryConfig::new(history)));
    let mut em = Ws::emitter(&relay, "", "a", json!({}));
    em.send(&ev("hist", 1));
    // A sentinel round trip: the Event was handled before the ping is answered.
    em.send(r#"{"type":"ping","t":1}"#);
    assert_eq!(em.recv()["type"], "pong");
    let file = dir.join("a").join("hist.jsonl");
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text, ev("hist", 1) + "\n");
    // Make the history unwritable: the session file's directory becomes a file.
    std::fs::remove_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("a"), b"not a directory").unwrap();
    em.send(&ev("other", 1));
    let err = em.recv();
    assert_eq!(err["type"], "error");
    assert_eq!(err["code"], "history-unavailable");
    assert_eq!(err["id"], "other-0-1");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&dir);
}
