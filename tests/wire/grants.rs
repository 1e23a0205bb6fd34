#![cfg(feature = "tls")]
//! A token's grants over real sockets, plaintext and TLS alike (docs/operating.md,
//! "Multi-tenant relay"): `filter` and `capture` hold on SSE, WebSocket, replay,
//! `live=0`, the down-levelled copies, the roster and `/status`; a mis-scoped `agent`
//! emit and a command outside `commands` or `targets` are refused and reach neither a
//! consumer nor the history (AEP-0003 §6.1, §4.1; AEP-0001 §8.2; AEP-0004 §4.2 item 3).
//!
//! Each scenario runs over a [`Dial`]: plain TCP, or TLS to the same relay built with a
//! certificate made in the test. Events are posted in publication order with the one a
//! consumer must not see first: receiving the visible one next proves the hidden one was
//! not delivered (every path delivers in publication order).

use crate::support;
use aep_relay::auth::Auth;
use rustls::pki_types::ServerName;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use support::*;
use tungstenite::{Message, WebSocket};

/// The tokens file of these tests (never a real secret).
const TOKENS: &str = r#"
admin-tok    emit,watch,control name=admin
tenant-a     watch name=tenant-a filter={"agent": "a"} capture=metadata
bot-a        emit name=bot-a agent=a
ops-a        control,watch name=ops-a commands=control.cancel targets=a
"#;

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// How a test reaches the relay: plain TCP or TLS.
struct Dial {
    relay: TestRelay,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Dial {
    fn start(tls: bool) -> Dial {
        let specs = Auth::parse_tokens_file(Path::new("tokens"), TOKENS).unwrap();
        let auth = Auth::with_tokens(None, &specs);
        if !tls {
            return Dial {
                relay: TestRelay::with(|c| c.auth = auth),
                tls: None,
            };
        }
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let server = aep_relay::tls::server_config_from_pem(
            ck.cert.pem().as_bytes(),
            ck.key_pair.serialize_pem().as_bytes(),
        )
        .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ck.cert.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Dial {
            relay: TestRelay::with(|c| {
                c.auth = auth;
                c.tls = Some(server);
            }),
            tls: Some(Arc::new(client)),
        }
    }

    fn addr(&self) -> SocketAddr {
        self.relay.addr
    }

    fn connect(&self) -> Box<dyn Stream> {
        let tcp = TcpStream::connect(self.addr()).unwrap();
        tcp.set_read_timeout(Some(WAIT)).unwrap();
        match &self.tls {
            None => Box::new(tcp),
            Some(c) => {
                let name = ServerName::try_from("localhost").unwrap();
                let conn = rustls::ClientConnection::new(c.clone(), name).unwrap();
                Box::new(rustls::StreamOwned::new(conn, tcp))
            }
        }
    }

    /// `POST /events` of `lines` (NDJSON when more than one) with `token`.
    fn post(&self, token: &str, lines: &[String]) -> (u16, Value) {
        let (ct, body) = match lines {
            [one] => ("application/json", one.clone()),
            _ => ("application/x-ndjson", lines.join("\n")),
        };
        let mut s = self.connect();
        write!(
            s,
            "POST /events HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nAEP-Version: 0.1\r\nContent-Type: {ct}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let (status, _, body) = read_response(&mut s);
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// `GET {target}`: the status and the reader positioned after the head.
    fn get(&self, target: &str) -> (u16, BufReader<Box<dyn Stream>>) {
        let mut s = self.connect();
        write!(
            s,
            "GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut r = BufReader::new(s);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            head.push_str(&line);
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, r)
    }

    /// A WebSocket after `hello` as `role` (with `extra` hello members).
    fn ws(&self, token: &str, role: &str, extra: Value) -> (WebSocket<Box<dyn Stream>>, Value) {
        let url = format!("ws://localhost/socket?access_token={token}");
        let (mut ws, resp) = tungstenite::client(url, self.connect()).expect("handshake");
        assert_eq!(resp.status(), 101);
        let mut h = json!({"type": "hello", "versions": ["0.1"], "role": role});
        for (k, v) in extra.as_object().unwrap() {
            h[k] = v.clone();
        }
        ws.send(Message::text(h.to_string())).unwrap();
        let reply = recv(&mut ws);
        (ws, reply)
    }
}

/// The next text frame as JSON, relay `ping`s skipped; `Null` for a close.
fn recv(ws: &mut WebSocket<Box<dyn Stream>>) -> Value {
    loop {
        match ws.read().expect("read") {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["type"] != "ping" {
                    return v;
                }
            }
            Message::Close(_) => return Value::Null,
            _ => {}
        }
    }
}

fn send(ws: &mut WebSocket<Box<dyn Stream>>, v: &Value) {
    ws.send(Message::text(v.to_string())).unwrap();
}

/// The `data:` of the next SSE Event on `r` (comments skipped); `None` at the end.
fn next_sse(r: &mut impl BufRead) -> Option<Value> {
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        if let Some(d) = line.strip_prefix("data: ") {
            return Some(serde_json::from_str(d.trim_end()).unwrap());
        }
    }
}

/// Every SSE Event of a stream that ends (`live=0`).
fn all_sse(mut r: impl BufRead) -> Vec<Value> {
    let mut v = Vec::new();
    while let Some(e) = next_sse(&mut r) {
        v.push(e);
    }
    v
}

/// An Event of `agent` in `session` at `seq`, captured `full` with a payload field the
/// metadata level removes (`tool.completed`'s `result`, AEP-0002 §5.1).
fn full(agent: &str, session: &str, seq: u64) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{session}-{seq}","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/{agent}/session/{session}","agent":"{agent}","session":"{session}","seq":{seq},"capture":"full","data":{{"tool":{{"name":"Bash"}},"status":"ok","result":"secret output"}}}}"#
    )
}

/// A command (AEP-0004 §2) to `session`.
fn command(id: &str, ty: &str, session: &str) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{id}","type":"{ty}","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/ops","agent":"ops","session":"{session}","data":{{"scope":"session"}}}}"#
    )
}

/// What the admin reads back of the history: every Event held, by id.
fn history_ids(d: &Dial) -> Vec<String> {
    let (status, r) = d.get("/stream?live=0&from=all&access_token=admin-tok");
    assert_eq!(status, 200);
    all_sse(r)
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect()
}

fn filter_and_capture_hold_on_every_path(tls: bool) {
    let d = Dial::start(tls);
    let (status, mut sse) = d.get("/stream?capture=full&access_token=tenant-a");
    assert_eq!(status, 200);
    let (mut ws, hello) = d.ws("tenant-a", "consumer", json!({}));
    assert_eq!(hello["type"], "hello", "{hello}");
    send(
        &mut ws,
        &json!({"type": "subscribe", "id": "all", "capture": "full"}),
    );
    assert_eq!(recv(&mut ws), json!({"type": "subscribed", "id": "all"}));

    assert_eq!(d.post("admin-tok", &[full("b", "sb", 1)]).0, 202);
    assert_eq!(d.post("admin-tok", &[full("a", "sa", 1)]).0, 202);
    // Live, SSE and WS: the first Event they get is agent a's, down-levelled to the
    // grant's ceiling although the request asked for `full`.
    for got in [next_sse(&mut sse).unwrap(), recv(&mut ws)] {
        assert_eq!(got["agent"], "a", "{got}");
        assert_eq!(got["capture"], "metadata", "{got}");
        assert!(!got.to_string().contains("secret output"), "{got}");
    }
    // Replay on both bindings, and `live=0`.
    send(
        &mut ws,
        &json!({"type": "subscribe", "id": "r", "from": "all"}),
    );
    assert_eq!(recv(&mut ws), json!({"type": "subscribed", "id": "r"}));
    let got = recv(&mut ws);
    assert_eq!(
        (got["agent"].as_str(), got["capture"].as_str()),
        (Some("a"), Some("metadata"))
    );
    send(&mut ws, &json!({"type": "ping", "t": 1}));
    assert_eq!(
        recv(&mut ws)["type"],
        "pong",
        "nothing but agent a's Event was replayed"
    );
    for target in [
        "/stream?live=0&from=all&capture=full&access_token=tenant-a",
        "/stream?live=0&filter=%7B%22session%22%3A%22sb%22%7D&access_token=tenant-a",
        "/stream?from=all&live=0&filter=%7B%22agent%22%3A%22b%22%7D&access_token=tenant-a",
    ] {
        let (status, r) = d.get(target);
        assert_eq!(status, 200);
        let evs = all_sse(r);
        assert!(
            evs.iter()
                .all(|e| e["agent"] == "a" && e["capture"] == "metadata"),
            "{target}: {evs:?}"
        );
    }
    // The admin sees both: the Event hidden from the tenant was there to see.
    assert_eq!(history_ids(&d), ["sb-1", "sa-1"]);

    // The roster shows only agent a's claims; `/status` only agent a's sessions.
    let (mut ca, _) = d.ws("admin-tok", "emitter", json!({"identity": {"agent": "a"}}));
    let (mut cb, _) = d.ws("admin-tok", "emitter", json!({"identity": {"agent": "b"}}));
    ca.send(Message::text(full("a", "sa", 2))).unwrap();
    cb.send(Message::text(full("b", "sb", 2))).unwrap();
    let (mut admin, _) = d.ws("admin-tok", "consumer", json!({}));
    // Both claims are in place once the admin's roster lists them.
    loop {
        send(&mut admin, &json!({"type": "roster", "id": "q"}));
        if recv(&mut admin)["entries"].as_array().unwrap().len() == 2 {
            break;
        }
    }
    send(&mut ws, &json!({"type": "roster", "id": "q"}));
    let roster = loop {
        let f = recv(&mut ws);
        if f["type"] == "roster" {
            break f;
        }
    };
    assert_eq!(
        roster["entries"],
        json!([{"session": "sa", "agent": "a"}]),
        "{roster}"
    );
    let (status, mut r) = d.get("/status?access_token=tenant-a");
    assert_eq!(status, 200);
    let mut body = String::new();
    let _ = r.read_to_string(&mut body);
    let doc: Value = serde_json::from_str(body.trim()).unwrap_or_else(|_| {
        // A chunked or length-framed body: the JSON object is what lies between braces.
        let s = &body[body.find('{').unwrap()..=body.rfind('}').unwrap()];
        serde_json::from_str(s).unwrap()
    });
    let rows = doc["sessions"]["recent"].as_array().unwrap();
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r["agent"] == "a"),
        "{rows:?}"
    );
}

fn agent_and_commands_are_refused_and_kept_nowhere(tls: bool) {
    let d = Dial::start(tls);
    let (status, mut watch) = d.get("/stream?access_token=admin-tok");
    assert_eq!(status, 200);
    // POST: one Event of another agent, and a batch holding one: 403, nothing kept.
    let (status, body) = d.post("bot-a", &[full("b", "s", 1)]);
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("forbidden")),
        "{body}"
    );
    let (status, body) = d.post("bot-a", &[full("a", "s", 1), full("b", "s", 2)]);
    assert_eq!((status, body["line"].as_u64()), (403, Some(2)), "{body}");
    assert_eq!(d.post("bot-a", &[full("a", "s", 3)]).0, 202);
    assert_eq!(
        next_sse(&mut watch).unwrap()["id"],
        "s-3",
        "the refused ones reached no one"
    );

    // WebSocket: a hello with another identity is refused; an Event of another agent
    // gets `unauthorized` in-band.
    let (mut wrong, reply) = d.ws("bot-a", "emitter", json!({"identity": {"agent": "b"}}));
    assert_eq!(
        (reply["type"].as_str(), reply["code"].as_str()),
        (Some("error"), Some("unauthorized")),
        "{reply}"
    );
    assert_eq!(recv(&mut wrong), Value::Null, "then the close");
    let (mut em, hello) = d.ws("bot-a", "emitter", json!({"identity": {"agent": "a"}}));
    assert_eq!(hello["type"], "hello");
    em.send(Message::text(full("b", "s", 4))).unwrap();
    let err = recv(&mut em);
    assert_eq!(
        (err["code"].as_str(), err["id"].as_str()),
        (Some("unauthorized"), Some("s-4")),
        "{err}"
    );
    em.send(Message::text(full("a", "s", 5))).unwrap();
    assert_eq!(next_sse(&mut watch).unwrap()["id"], "s-5");

    // Commands: a claimant of session `sa` as agent a, another of `sc` as agent c.
    let accepts =
        json!({"capabilities": {"control": {"accepts": ["control.cancel", "control.pause"]}}});
    let mut claim = |agent: &str, session: &str, seq: u64| {
        let mut extra = accepts.clone();
        extra["identity"] = json!({"agent": agent});
        let (mut c, _) = d.ws("admin-tok", "emitter", extra);
        c.send(Message::text(full(agent, session, seq))).unwrap();
        assert_eq!(
            next_sse(&mut watch).unwrap()["id"],
            format!("{session}-{seq}")
        );
        c
    };
    let mut ca = claim("a", "sa", 1);
    let _cc = claim("c", "sc", 1);
    let (mut ops, _) = d.ws("ops-a", "consumer", json!({}));
    for (id, ty, session) in [
        ("k1", "control.pause", "sa"),
        ("k2", "control.cancel", "sc"),
    ] {
        ops.send(Message::text(command(id, ty, session))).unwrap();
        let err = recv(&mut ops);
        assert_eq!(
            (err["code"].as_str(), err["cause"].as_str()),
            (Some("unauthorized"), Some(id)),
            "{err}"
        );
    }
    ops.send(Message::text(command("k3", "control.cancel", "sa")))
        .unwrap();
    let got = recv(&mut ca);
    assert_eq!(
        got["id"], "k3",
        "the allowed command reaches its claimant, the refused ones did not"
    );
    assert_eq!(
        next_sse(&mut watch).unwrap()["id"],
        "k3",
        "nor any consumer"
    );
    let mut ids = history_ids(&d);
    ids.sort();
    assert_eq!(ids, ["k3", "s-3", "s-5", "sa-1", "sc-1"], "nor the history");
}

#[test]
fn filter_and_capture_hold_on_every_path_over_plaintext() {
    filter_and_capture_hold_on_every_path(false);
}

#[test]
fn filter_and_capture_hold_on_every_path_over_tls() {
    filter_and_capture_hold_on_every_path(true);
}

#[test]
fn agent_commands_and_targets_are_refused_over_plaintext() {
    agent_and_commands_are_refused_and_kept_nowhere(false);
}

#[test]
fn agent_commands_and_targets_are_refused_over_tls() {
    agent_and_commands_are_refused_and_kept_nowhere(true);
}

#[test]
fn the_discovery_document_names_the_grants_enforced() {
    let d = Dial::start(false);
    let (status, mut r) = d.get("/events?access_token=admin-tok");
    assert_eq!(status, 200);
    let mut body = String::new();
    let _ = r.read_to_string(&mut body);
    let s = &body[body.find('{').unwrap()..=body.rfind('}').unwrap()];
    let doc: Value = serde_json::from_str(s).unwrap();
    assert_eq!(
        doc["capabilities"]["auth"]["grants"],
        json!(["filter", "capture", "agent", "commands", "targets"])
    );
}

/// A socket's `hello` tells its token's grant in `capabilities.auth.grant` (a capability
/// key of this relay's: AEP-0003 §4 rule 4, unknown ones are ignored), each member only
/// when the grant has it, never the token nor its holder's name; a static token has no
/// `exp`.
#[test]
fn the_hello_tells_each_token_its_grant() {
    let d = Dial::start(false);
    let grant = |token: &str, role: &str, extra: Value| {
        let (_ws, hello) = d.ws(token, role, extra);
        assert_eq!(hello["type"], "hello", "{hello}");
        let auth = &hello["capabilities"]["auth"];
        assert_eq!(auth["schemes"], json!(["bearer"]), "{hello}");
        let text = hello.to_string();
        assert!(!text.contains(token), "never the token: {text}");
        auth["grant"].clone()
    };
    assert_eq!(
        grant("admin-tok", "consumer", json!({})),
        json!({"scopes": ["emit", "watch", "control"]})
    );
    assert_eq!(
        grant("tenant-a", "consumer", json!({})),
        json!({"scopes": ["watch"], "filter": {"agent": ["a"]}, "capture": "metadata"})
    );
    assert_eq!(
        grant("bot-a", "emitter", json!({"identity": {"agent": "a"}})),
        json!({"scopes": ["emit"], "agent": "a"})
    );
    let ops = grant("ops-a", "consumer", json!({}));
    assert_eq!(
        ops,
        json!({"scopes": ["watch", "control"], "commands": ["control.cancel"], "targets": ["a"]})
    );
    assert!(
        !ops.to_string().contains("ops-a"),
        "never the holder's name"
    );
}
