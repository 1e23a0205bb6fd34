//! Refusals: every refusal the relay answers is logged once at `info` with its code and
//! the peer (never a token or a query string), counted under its code in `/metrics`, and
//! explained: an `invalid-event` detail names the attribute at fault, a `hello` that was
//! sent but lacks what AEP-0003 §4 requires is `invalid-hello` naming the member, and a
//! close reason is spelled as its error code.

use crate::support;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use support::{Endpoint, Raw, TestRelay, Ws};

/// A valid Event with `agent` spelled as the JSON text `agent` (raw, not escaped).
fn event_with_agent(agent: &str, ty: &str) -> String {
    format!(
        r#"{{"aep":"0.1","id":"e-1","type":"{ty}","time":"2026-07-03T10:15:04.221Z","source":"aep://host-a/agent/a/session/s1","agent":"{agent}","session":"s1","seq":1}}"#
    )
}

/// Sends `req` on a fresh connection and reads the answer to its end; returns the
/// connection's local address (the peer the relay logs) and the answer.
fn exchange(addr: SocketAddr, req: &[u8]) -> (SocketAddr, String) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(support::WAIT)).unwrap();
    let peer = tcp.local_addr().unwrap();
    tcp.write_all(req).unwrap();
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out);
    (peer, String::from_utf8_lossy(&out).into_owned())
}

/// A WebSocket upgraded by hand on a fresh connection (with `auth` header lines);
/// returns its local address and the raw client.
fn ws_raw(addr: SocketAddr, auth: &str) -> (SocketAddr, Raw) {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(support::WAIT)).unwrap();
    let peer = tcp.local_addr().unwrap();
    (peer, Raw::upgrade(tcp, auth).0)
}

/// Reads server frames until a close frame; returns (close code, reason, text frames).
fn until_close(ws: &mut Raw) -> (u16, String, Vec<Value>) {
    let mut texts = Vec::new();
    loop {
        let (op, p) = ws.read();
        match op {
            0x81 => texts.push(serde_json::from_slice(&p).unwrap()),
            0x88 => {
                let code = u16::from_be_bytes([p[0], p[1]]);
                return (code, String::from_utf8(p[2..].to_vec()).unwrap(), texts);
            }
            _ => {}
        }
    }
}

const TOKEN: &str = "s3cret-token-XYZ";

/// docs/operating.md "Logging": one `info` line per refused request, connection or
/// message, with the status (or close code), the code and the peer; never the token,
/// never a query string. Runs the real binary with `AEP_LOG=info`, through 400, 403,
/// 404, 405, 413, 415, 426 and 431 answers, the WebSocket `hello` refusals and in-band
/// errors.
#[test]
fn every_refusal_is_logged_once_at_info_with_its_code_and_peer() {
    let relay = support::RelayProcess::spawn(&[
        "--token",
        TOKEN,
        "--max-body",
        "4096",
        "--max-head",
        "2048",
    ]);
    let addr = relay.addr;
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let post = |headers: &str, body: &str| {
        format!(
            "POST /events HTTP/1.1\r\nHost: x\r\n{auth}{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let ndjson = "AEP-Version: 0.1\r\nContent-Type: application/x-ndjson\r\n";
    let command = r#"{"aep":"0.1","id":"c-1","type":"control.cancel","time":"2026-07-03T10:15:04.221Z","source":"aep://host-b/agent/dash","agent":"dash","session":"s1","data":{}}"#;
    let bad_agent = event_with_agent("\\ud800", "tool.started");
    let big_header = format!("X-Pad: {}\r\n", "p".repeat(3000));
    let http: Vec<(String, &str, &str)> = vec![
        (
            format!("GET /nope?access_token={TOKEN}&x=query-text HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            "404",
            "not-found",
        ),
        (
            format!("DELETE /events HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"),
            "405",
            "method-not-allowed",
        ),
        (
            "GET /stream?access_token=WRONG-tok-123&filter=query-text HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into(),
            "401",
            "unauthorized",
        ),
        (post("Content-Type: application/json\r\n", "{}"), "400", "version-required"),
        (
            post("AEP-Version: 9.9\r\nContent-Type: application/json\r\n", "{}"),
            "426",
            "version-unsupported",
        ),
        (post("AEP-Version: 0.1\r\nContent-Type: text/plain\r\n", "{}"), "415", "unsupported-media-type"),
        (
            format!("POST /events HTTP/1.1\r\nHost: x\r\n{auth}{ndjson}Content-Length: 5000\r\n\r\n"),
            "413",
            "body-too-large",
        ),
        (
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{big_header}\r\n"),
            "431",
            "head-too-large",
        ),
        (post(ndjson, command), "403", "forbidden"),
        (post(ndjson, &bad_agent), "400", "invalid-event"),
        (
            format!("GET /stream?filter=%7B&access_token={TOKEN} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            "400",
            "invalid-filter",
        ),
    ];
    let mut peers = Vec::new();
    for (req, status, code) in &http {
        let (peer, answer) = exchange(addr, req.as_bytes());
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{req:.200}: {answer}"
        );
        let want = format!("from {peer}: {status} {code}");
        let line = relay.stderr.wait(&want, |l| l.contains(&want));
        assert!(
            line.contains(" INFO ") && line.contains("refused "),
            "{line}"
        );
        peers.push(peer);
    }

    // WebSocket: the hello refusals (then close 1008), a protocol close, an in-band error.
    let (peer, mut ws) = ws_raw(addr, &auth);
    ws.send(0x81, br#"{"type":"subscribe","id":"s"}"#);
    until_close(&mut ws);
    peers.push(peer);
    relay.stderr.wait("hello-required", |l| {
        l.contains(&format!("from {peer}: 1008 hello-required"))
    });

    let (peer, mut ws) = ws_raw(addr, &auth);
    ws.send(
        0x81,
        br#"{"type":"hello","versions":["0.1"],"role":"emitter"}"#,
    );
    until_close(&mut ws);
    peers.push(peer);
    relay.stderr.wait("invalid-hello", |l| {
        l.contains(&format!("from {peer}: 1008 invalid-hello"))
    });

    let (peer, mut ws) = ws_raw(addr, &auth);
    ws.send_bytes(&Raw::frame(0x81, b"{}", None)); // unmasked
    assert_eq!(until_close(&mut ws).0, 1002);
    peers.push(peer);
    relay.stderr.wait("1002", |l| {
        l.contains(&format!("from {peer}: 1002 ws-protocol-error"))
    });

    let (peer, mut ws) = ws_raw(addr, &auth);
    ws.send(
        0x81,
        br#"{"type":"hello","versions":["0.1"],"role":"emitter","identity":{"agent":"a"}}"#,
    );
    assert_eq!(ws.read().0, 0x81);
    ws.send(0x81, bad_agent.as_bytes());
    let (_, p) = ws.read();
    let err: Value = serde_json::from_slice(&p).unwrap();
    assert_eq!(err["code"], "invalid-event", "{err}");
    peers.push(peer);
    relay.stderr.wait("in-band invalid-event", |l| {
        l.contains(&format!("from {peer}: invalid-event: `agent`:"))
    });

    let lines = relay.stderr.snapshot();
    for peer in peers {
        let n = lines
            .iter()
            .filter(|l| l.contains("refused ") && l.contains(&format!("from {peer}:")))
            .count();
        assert_eq!(
            n,
            1,
            "one line for the refusal to {peer}:\n{}",
            lines.join("\n")
        );
    }
    for l in &lines {
        assert!(
            !l.contains(TOKEN) && !l.contains("WRONG-tok"),
            "a token was logged: {l}"
        );
        assert!(
            !l.contains("query-text") && !l.contains("access_token"),
            "a query string was logged: {l}"
        );
    }
}

/// `aep_events_rejected_total{reason="…"}` of `GET /metrics`.
fn rejected(relay: &TestRelay) -> Vec<(String, u64)> {
    let text = relay.get_text("/metrics");
    text.lines()
        .filter_map(|l| l.strip_prefix("aep_events_rejected_total{reason=\""))
        .map(|l| {
            let (code, n) = l.split_once("\"} ").unwrap();
            (code.to_string(), n.parse().unwrap())
        })
        .collect()
}

fn count(list: &[(String, u64)], code: &str) -> u64 {
    list.iter().find(|(c, _)| c == code).map_or(0, |(_, n)| *n)
}

/// Every refusal the relay answers is counted under its code: the SSE 400, the
/// WebSocket `hello` refusals and the RFC 6455 protocol closes (1002, 1003, 1007, 1009)
/// included.
#[test]
fn every_refusal_is_counted_under_its_code() {
    let relay = TestRelay::with(|c| c.max_ws_message_bytes = 1024);
    let resp = support::agent()
        .get(&relay.url("/stream?filter=%7B"))
        .call();
    let (status, body) = support::status_json(resp);
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid-filter")),
        "{body}"
    );

    for first in [
        json!({"type": "subscribe", "id": "s"}),
        json!({"type": "hello", "versions": ["9.9"], "role": "consumer"}),
        json!({"type": "hello", "versions": ["0.1"], "role": "emitter"}),
    ] {
        let mut ws = Ws::connect(&relay, "");
        ws.send_json(&first);
        assert_eq!(ws.until_close().0, Some(1008));
    }
    let mut cases: Vec<(Vec<u8>, u16)> = vec![
        (Raw::frame(0x81, b"{}", None), 1002),
        (Raw::frame(0x82, b"{}", Some([1, 2, 3, 4])), 1003),
        (Raw::frame(0x81, b"\xff\xfe", Some([1, 2, 3, 4])), 1007),
    ];
    cases.push((Raw::frame(0x81, &[b' '; 2000], Some([1, 2, 3, 4])), 1009));
    for (frame, code) in cases {
        let mut ws = Raw::connect(&relay);
        ws.hello();
        ws.send_bytes(&frame);
        assert_eq!(ws.expect_close(), code);
    }
    let got = rejected(&relay);
    for code in [
        "invalid-filter",
        "hello-required",
        "version-unsupported",
        "invalid-hello",
        "ws-protocol-error",
        "ws-unsupported-data",
        "ws-invalid-payload",
        "ws-message-too-big",
    ] {
        assert_eq!(count(&got, code), 1, "{code} in {got:?}");
    }
}

/// A 404 is an unknown path, not a refused Event or request of the protocol:
/// `/metrics` counts it under `not-found`, `/status` keeps it out of its refusals
/// (`rejected`) and reports it as `not_found`.
#[test]
fn status_refusals_leave_out_unknown_paths() {
    let relay = TestRelay::start();
    let (status, _) = support::status_json(support::agent().get(&relay.url("/favicon.ico")).call());
    assert_eq!(status, 404);
    let (status, _) = relay.post("application/json", "{}");
    assert_eq!(status, 400);
    let (_, doc) = support::status_json(support::agent().get(&relay.url("/status")).call());
    assert_eq!(doc["rejected"], json!({"invalid-event": 1}), "{doc}");
    assert_eq!(doc["not_found"], 1, "{doc}");
    assert_eq!(count(&rejected(&relay), "not-found"), 1);
}

/// AEP-0001 §5: an `invalid-event` detail names the attribute at fault, also for a JSON
/// fault inside its value (a lone surrogate in `agent`), over HTTP and over the
/// WebSocket, not only "invalid JSON at byte N".
#[test]
fn an_invalid_event_detail_names_the_attribute_at_fault() {
    let relay = TestRelay::start();
    let bad = event_with_agent("\\ud800", "tool.started");
    let (status, body) = relay.post("application/x-ndjson", &format!("{bad}\n"));
    assert_eq!(status, 400);
    assert_eq!(body["error"], "invalid-event");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("`agent`: invalid JSON at byte ") && detail.contains("\\ud800"),
        "{detail}"
    );
    let mut ws = Ws::emitter(&relay, "", "a", json!({}));
    ws.send(&bad);
    let err = ws.recv();
    assert_eq!(err["code"], "invalid-event", "{err}");
    assert!(
        err["detail"].as_str().unwrap().starts_with("`agent`: "),
        "{err}"
    );
}

/// AEP-0003 §3.5 #1, §4: a refused `hello` is answered with an `error` frame and a close
/// 1008 whose reason is the same code, one spelling for both (`hello-required`, never
/// "hello required").
#[test]
fn a_hello_refusal_closes_with_its_code_as_the_reason() {
    let relay = TestRelay::start();
    for (first, code) in [
        (&br#"{"type":"subscribe","id":"s"}"#[..], "hello-required"),
        (
            br#"{"type":"hello","versions":["9.9"],"role":"consumer"}"#,
            "version-unsupported",
        ),
        (
            br#"{"type":"hello","versions":["0.1"],"role":"both"}"#,
            "invalid-hello",
        ),
    ] {
        let mut ws = Raw::connect(&relay);
        ws.send(0x81, first);
        let (close, reason, texts) = until_close(&mut ws);
        assert_eq!(texts.len(), 1, "{texts:?}");
        assert_eq!(texts[0]["code"], code);
        assert_eq!((close, reason.as_str()), (1008, code));
    }
}
