//! `GET /socket`: the upgrade and the `hello` exchange (AEP-0003 §3.5 #1, §4), over a
//! real TCP connection.

use crate::support;

use aep_relay::auth::Auth;
use serde_json::json;
use support::{raw_request, Endpoint, TestRelay, Ws};

#[test]
fn hello_is_answered_with_one_version_and_real_capabilities() {
    let relay = TestRelay::with(|c| c.buffer_per_session = 77);
    let (ws, hello) = Ws::hello(
        &relay,
        "",
        "consumer",
        json!({"versions": ["9.9", "0.1"], "identity": {"agent": "dash"}}),
    );
    assert_eq!(
        hello["versions"],
        json!(["0.1"]),
        "exactly one version: {hello}"
    );
    assert_eq!(hello["role"], "both");
    let caps = &hello["capabilities"];
    assert_eq!(caps["filters"], json!(["attr-match"]));
    assert_eq!(caps["replay"]["buffer"], 77);
    assert_eq!(caps["replay"]["all"], true);
    assert_eq!(
        caps["capture"],
        json!(["none", "metadata", "redacted", "full"])
    );
    assert_eq!(caps["roster"], json!({}));
    assert_eq!(caps["control"]["accepts"], json!([]));
    assert_eq!(caps["control"]["routes"], false, "no token: no control");
    ws.close();
}

#[test]
fn a_first_frame_other_than_hello_gets_hello_required_then_close() {
    let relay = TestRelay::start();
    for first in [
        json!({"type": "subscribe", "id": "s", "filter": {}}),
        serde_json::from_str(&support::event("s", 0, 1, "tool.started", "")).unwrap(),
    ] {
        let mut ws = Ws::connect(&relay, "");
        ws.send_json(&first);
        let (code, frames) = ws.until_close();
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(frames[0]["type"], "error");
        assert_eq!(frames[0]["code"], "hello-required");
        assert_eq!(code, Some(1008));
    }
    let mut ws = Ws::connect(&relay, "");
    ws.send("not json at all");
    let (_, frames) = ws.until_close();
    assert_eq!(frames[0]["code"], "hello-required");
}

#[test]
fn no_version_in_common_gets_version_unsupported_then_close() {
    let relay = TestRelay::start();
    let mut ws = Ws::connect(&relay, "");
    ws.send_json(&json!({"type": "hello", "versions": ["2.0", "1.3"], "role": "consumer"}));
    let (code, frames) = ws.until_close();
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0]["code"], "version-unsupported");
    assert_eq!(frames[0]["versions"], json!(["0.1"]));
    assert_eq!(code, Some(1008));
}

/// AEP-0003 §4 rules 2 and 3. A hello was sent, so the answer is not `hello-required` but
/// `invalid-hello`, whose detail names the member at fault; then close 1008.
#[test]
fn emitters_must_name_their_agent_and_roles_are_closed() {
    let relay = TestRelay::start();
    for (hello, member) in [
        (
            json!({"type": "hello", "versions": ["0.1"], "role": "emitter"}),
            "`identity.agent`",
        ),
        (
            json!({"type": "hello", "versions": ["0.1"], "role": "both", "identity": {"agent": ""}}),
            "`identity.agent`",
        ),
        (
            json!({"type": "hello", "versions": ["0.1"], "role": "emitter", "identity": {"instance": "h/1"}}),
            "`identity.agent`",
        ),
        (
            json!({"type": "hello", "versions": ["0.1"], "role": "observer"}),
            "`role`",
        ),
        (json!({"type": "hello", "versions": ["0.1"]}), "`role`"),
    ] {
        let mut ws = Ws::connect(&relay, "");
        ws.send_json(&hello);
        let (code, frames) = ws.until_close();
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(frames[0]["code"], "invalid-hello", "{hello}");
        let detail = frames[0]["detail"].as_str().unwrap();
        assert!(detail.contains("AEP-0003 §4"), "{detail}");
        assert!(detail.contains(member), "{hello}: {detail}");
        assert_eq!(code, Some(1008));
    }
}

#[test]
fn unknown_capability_keys_and_frame_types_are_ignored() {
    let relay = TestRelay::start();
    let (mut ws, _) = Ws::hello(
        &relay,
        "",
        "consumer",
        json!({"capabilities": {"teleport": {"x": 1}, "filters": ["cesql"]}, "extra": true}),
    );
    ws.send_json(&json!({"type": "frobnicate", "id": "f"}));
    ws.send_json(&json!({"type": "hello", "versions": ["0.1"], "role": "both"}));
    ws.send_json(&json!({"type": "ping", "t": 42}));
    assert_eq!(
        ws.recv(),
        json!({"type": "pong", "t": 42}),
        "nothing answered before it"
    );
    ws.close();
}

#[test]
fn the_upgrade_needs_a_token_when_one_is_configured() {
    let relay = TestRelay::with(|c| c.auth = Auth::new(Some("t"), &[]));
    let url = format!("ws://{}/socket", relay.addr);
    match tungstenite::client::client(url, relay.tcp()) {
        Err(tungstenite::handshake::HandshakeError::Failure(tungstenite::Error::Http(r))) => {
            assert_eq!(r.status(), 401);
            let body: serde_json::Value =
                serde_json::from_slice(r.body().as_ref().unwrap()).unwrap();
            assert_eq!(body["error"], "unauthorized");
        }
        other => panic!(
            "expected 401 before the upgrade, got {:?}",
            other.map(|(_, r)| r)
        ),
    }
    let (_, hello) = Ws::hello(&relay, "access_token=t", "consumer", json!({}));
    assert_eq!(hello["capabilities"]["control"]["routes"], true);
}

#[test]
fn a_plain_get_of_socket_is_told_to_upgrade() {
    let relay = TestRelay::start();
    let (status, headers, body) = raw_request(&relay, b"GET /socket HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 426);
    assert!(headers
        .iter()
        .any(|(k, v)| k == "upgrade" && v == "websocket"));
    assert_eq!(body["error"], "upgrade-required");
    let (status, headers, _) = raw_request(
        &relay,
        b"POST /socket HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(status, 405);
    assert!(headers.iter().any(|(k, v)| k == "allow" && v == "GET"));
}

#[test]
fn discovery_names_the_socket_roster_and_control() {
    let relay = TestRelay::start();
    let (status, doc) = support::status_json(support::agent().get(&relay.url("/events")).call());
    assert_eq!(status, 200);
    assert_eq!(doc["endpoints"]["socket"], "/socket");
    assert_eq!(doc["capabilities"]["roster"], json!({}));
    assert_eq!(doc["capabilities"]["control"]["accepts"], json!([]));
}
