#![cfg(feature = "tls")]
//! Native TLS: HTTPS POST and SSE over TLS with a certificate generated in the test, and
//! the start-up refusal of an insecure off-host binding (AEP-0003 §8.1).

mod support;
use rustls::pki_types::ServerName;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use support::*;

struct Tls {
    relay: TestRelay,
    client: Arc<rustls::ClientConfig>,
}

fn tls_relay() -> Tls {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let server = aep_relay::tls::server_config_from_pem(
        ck.cert.pem().as_bytes(),
        ck.key_pair.serialize_pem().as_bytes(),
    )
    .unwrap();
    let relay = TestRelay::with(|c| c.tls = Some(server));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ck.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Tls {
        relay,
        client: Arc::new(client),
    }
}

impl Tls {
    fn connect(&self) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
        let conn = rustls::ClientConnection::new(
            self.client.clone(),
            ServerName::try_from("localhost").unwrap(),
        )
        .unwrap();
        let tcp = TcpStream::connect(self.relay.addr).unwrap();
        tcp.set_read_timeout(Some(WAIT)).unwrap();
        rustls::StreamOwned::new(conn, tcp)
    }
}

#[test]
fn https_post_and_sse_round_trip() {
    let tls = tls_relay();
    let mut sse = tls.connect();
    sse.write_all(b"GET /stream HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n")
        .unwrap();
    let mut sse = BufReader::new(sse);
    let mut line = String::new();
    sse.read_line(&mut line).unwrap();
    assert_eq!(line, "HTTP/1.1 200 OK\r\n");
    // Wait until the stream is open (its opening comment) before posting.
    while line != ": aep-relay stream open\n" {
        line.clear();
        sse.read_line(&mut line).unwrap();
    }

    let ev = event("tls", 0, 1, "tool.completed", "");
    let mut post = tls.connect();
    write!(
        post,
        "POST /events HTTP/1.1\r\nHost: localhost\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{ev}",
        ev.len()
    )
    .unwrap();
    let (status, _, body) = read_response(&mut post);
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));

    let mut data = None;
    while data.is_none() {
        line.clear();
        assert!(sse.read_line(&mut line).unwrap() > 0, "stream ended");
        data = line
            .strip_prefix("data: ")
            .map(|d| d.trim_end().to_string());
    }
    assert_eq!(data.unwrap(), ev);
}

#[test]
fn plain_http_to_a_tls_listener_gets_no_answer_in_clear() {
    let tls = tls_relay();
    let mut s = tls.relay.tcp();
    s.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = Vec::new();
    let _ = std::io::Read::read_to_end(&mut s, &mut buf);
    assert!(
        !buf.starts_with(b"HTTP/1.1 200"),
        "no plaintext service on a TLS listener"
    );
}

#[test]
fn off_host_binding_without_tls_and_token_is_refused_at_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_aep-relay"))
        .args(["--listen", "0.0.0.0:0"])
        .env_remove("AEP_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("AEP-0003 §8.1"), "{err}");
    assert!(err.contains("--allow-insecure-off-host"), "{err}");
}

#[test]
fn wss_hello_subscribe_and_delivery() {
    use tungstenite::Message;
    let tls = tls_relay();
    let stream = tls.connect();
    let (mut ws, resp) =
        tungstenite::client("ws://localhost/socket", stream).expect("WSS handshake");
    assert_eq!(resp.status().as_u16(), 101);
    ws.send(Message::text(
        r#"{"type":"hello","versions":["0.1"],"role":"consumer"}"#,
    ))
    .unwrap();
    let hello: serde_json::Value =
        serde_json::from_str(ws.read().unwrap().to_text().unwrap()).unwrap();
    assert_eq!(hello["type"], "hello");
    assert_eq!(hello["versions"], serde_json::json!(["0.1"]));
    ws.send(Message::text(
        r#"{"type":"subscribe","id":"s1","filter":{"session":"wss"}}"#,
    ))
    .unwrap();
    let ack: serde_json::Value =
        serde_json::from_str(ws.read().unwrap().to_text().unwrap()).unwrap();
    assert_eq!(ack, serde_json::json!({"type": "subscribed", "id": "s1"}));

    let ev = event("wss", 0, 1, "tool.completed", "");
    let mut post = tls.connect();
    write!(
        post,
        "POST /events HTTP/1.1\r\nHost: localhost\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{ev}",
        ev.len()
    )
    .unwrap();
    assert_eq!(read_response(&mut post).0, 202);
    let got = ws.read().unwrap();
    assert_eq!(
        got.to_text().unwrap(),
        ev,
        "the Event's original bytes over WSS"
    );
}
