#![cfg(feature = "tls")]
//! Native TLS: HTTPS POST and SSE over TLS with a certificate generated in the test, and
//! the start-up refusal of an insecure off-host binding (AEP-0003 §8.1). Then the
//! relay's own clients over TLS, the real binary against the real binary started with
//! `--tls-cert`/`--tls-key`: `aep-relay tail` (SSE over HTTPS) and `aep-relay check`
//! (HTTPS and WSS) with `--cacert`, and their one-line refusals (exit 2) of an untrusted
//! certificate, a hostname the certificate does not list, and a `--cacert` that is not
//! PEM.

use crate::support;
use rustls::pki_types::ServerName;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use support::*;

struct Tls {
    relay: TestRelay,
    client: Arc<rustls::ClientConfig>,
}

/// A client configuration trusting exactly `cert`.
fn trusting(cert: &rcgen::Certificate) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(client)
}

/// A TLS connection to `addr`, verifying the name `localhost`.
fn tls_connect(
    client: &Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let conn =
        rustls::ClientConnection::new(client.clone(), ServerName::try_from("localhost").unwrap())
            .unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// POSTs `body` (of `content_type`) to `/events` over TLS; asserts the 202.
fn post_over_tls(
    client: &Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
    content_type: &str,
    body: &str,
) {
    let mut post = tls_connect(client, addr);
    write!(
        post,
        "POST /events HTTP/1.1\r\nHost: localhost\r\nAEP-Version: 0.1\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (status, _, body) = read_response(&mut post);
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
}

/// A WSS consumer over `stream`: the upgrade (101), `hello` answered by `hello`, and
/// `subscribe` `id` to `session` answered `subscribed` (AEP-0003 §4, §4.1).
fn wss_consumer(
    stream: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    id: &str,
    session: &str,
) -> tungstenite::WebSocket<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    use tungstenite::Message;
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
    let sub = serde_json::json!({"type": "subscribe", "id": id, "filter": {"session": session}});
    ws.send(Message::text(sub.to_string())).unwrap();
    let ack: serde_json::Value =
        serde_json::from_str(ws.read().unwrap().to_text().unwrap()).unwrap();
    assert_eq!(ack, serde_json::json!({"type": "subscribed", "id": id}));
    ws
}

/// The real binary serving TLS with a fresh self-signed certificate for `localhost`
/// (in a temp dir named after `name`), with `extra` flags, and a client that trusts it.
fn spawn_tls_relay(
    name: &str,
    extra: &[&str],
) -> (RelayProcess, Arc<rustls::ClientConfig>, std::path::PathBuf) {
    let dir = temp_dir(name);
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let mut args = vec![
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    (RelayProcess::spawn(&args), trusting(&ck.cert), dir)
}

/// `GET {target}` over TLS, read up to the stream's opening comment.
fn open_https_stream(
    client: &Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
    target: &str,
) -> BufReader<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let mut s = tls_connect(client, addr);
    s.write_all(format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .unwrap();
    let mut s = BufReader::new(s);
    let mut line = String::new();
    while line != ": aep-relay stream open\n" {
        line.clear();
        assert!(s.read_line(&mut line).unwrap() > 0);
    }
    s
}

fn tls_relay() -> Tls {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let server = aep_relay::tls::server_config_from_pem(
        ck.cert.pem().as_bytes(),
        ck.key_pair.serialize_pem().as_bytes(),
    )
    .unwrap();
    let relay = TestRelay::with(|c| c.tls = Some(server));
    Tls {
        relay,
        client: trusting(&ck.cert),
    }
}

impl Tls {
    fn connect(&self) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
        tls_connect(&self.client, self.relay.addr)
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
    let tls = tls_relay();
    let mut ws = wss_consumer(tls.connect(), "s1", "wss");

    let ev = event("wss", 0, 1, "tool.completed", "");
    post_over_tls(&tls.client, tls.relay.addr, "application/json", &ev);
    let got = ws.read().unwrap();
    assert_eq!(
        got.to_text().unwrap(),
        ev,
        "the Event's original bytes over WSS"
    );
}

// ---------------------------------------------------------------------------------------
// The relay's own clients over TLS: `aep-relay tail` and `aep-relay check`.

/// The real relay serving TLS with a fresh self-signed ECDSA P-256 certificate for
/// `names`, its certificate file (the `--cacert` that trusts it) and a client config
/// trusting it (for the test's own POSTs).
struct TlsProcess {
    relay: RelayProcess,
    cacert: PathBuf,
    client: Arc<rustls::ClientConfig>,
    dir: PathBuf,
}

impl TlsProcess {
    fn start(tag: &str, names: &[&str]) -> TlsProcess {
        let dir = temp_dir(&format!("tls-{tag}"));
        let ck = rcgen::generate_simple_self_signed(
            names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        let (cacert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cacert, ck.cert.pem()).unwrap();
        std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
        let relay = RelayProcess::spawn(&[
            "--tls-cert",
            cacert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ]);
        TlsProcess {
            relay,
            cacert,
            client: trusting(&ck.cert),
            dir,
        }
    }

    /// `https://localhost:PORT`.
    fn url(&self) -> String {
        format!("https://localhost:{}", self.relay.addr.port())
    }

    /// POSTs `ev` over TLS and asserts the 202.
    fn post(&self, ev: &str) {
        post_over_tls(&self.client, self.relay.addr, "application/json", ev);
    }

    /// A certificate file that does not trust this relay: another self-signed one.
    fn other_cacert(&self) -> PathBuf {
        let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let p = self.dir.join("other.pem");
        std::fs::write(&p, other.cert.pem()).unwrap();
        p
    }

    /// A `--cacert` that is not PEM: the certificate in DER.
    fn der_cacert(&self) -> PathBuf {
        let pem = std::fs::read(&self.cacert).unwrap();
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let der = CertificateDer::from_pem_slice(&pem).unwrap();
        let p = self.dir.join("cert.der");
        std::fs::write(&p, der.as_ref()).unwrap();
        p
    }
}

impl Drop for TlsProcess {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `aep-relay {args}` to its end (a refusal exits at once) with `envs`, standard
/// input closed.
fn run(args: &[&str], envs: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .env_remove("AEP_TOKEN")
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .stdin(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Asserts a refusal: exit status 2, nothing on standard output, and exactly one line
/// on standard error, containing `want`; returns that line.
fn assert_refused(out: &Output, want: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains(want), "{want:?} in {err}");
    err
}

#[test]
fn tail_follows_sse_over_https_trusting_cacert() {
    let tls = TlsProcess::start("tail", &["localhost"]);
    let cacert = tls.cacert.to_str().unwrap();
    let mut child = Command::new(bin())
        .args(["tail", &tls.url(), "--cacert", cacert])
        .env_remove("AEP_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = Lines::collect(child.stdout.take().unwrap(), "");
    let err = Lines::collect(child.stderr.take().unwrap(), "tail");
    err.wait("the subscription over TLS", |l| {
        l.starts_with("aep-relay tail: following https://localhost:")
    });
    let evs: Vec<String> = (0..3).map(|i| ev("a", "tls-tail", i)).collect();
    for e in &evs {
        tls.post(e);
    }
    assert_eq!(
        out.wait_count(3, "the Events over HTTPS"),
        evs,
        "byte-identical"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// An untrusted certificate ends `tail` and `check` at once with one line and exit 2,
/// whether the roots are a `--cacert` that does not sign it or the system's
/// (`SSL_CERT_FILE`, which the system store reads first, pointing at the same other
/// certificate, so the test does not depend on this machine's bundle).
#[test]
fn an_untrusted_certificate_is_refused_in_one_line() {
    let tls = TlsProcess::start("untrusted", &["localhost"]);
    let url = tls.url();
    let other = tls.other_cacert();
    let other_s = other.to_str().unwrap();
    for cmd in ["tail", "check"] {
        let e = assert_refused(
            &run(&[cmd, &url, "--cacert", other_s], &[]),
            "is not trusted",
        );
        assert!(e.contains("--cacert"), "{e}");
        let e = assert_refused(
            &run(&[cmd, &url], &[("SSL_CERT_FILE", &other)]),
            "is not trusted",
        );
        assert!(
            e.contains("pass --cacert FILE"),
            "the hint for system roots: {e}"
        );
    }
    // The same relay, trusted: no refusal (the run is against the same listener).
    tls.post(&ev("a", "tls-untrusted", 0));
}

/// A certificate for `localhost` reached as `127.0.0.1`: the name is not one it lists.
#[test]
fn a_hostname_mismatch_is_refused_in_one_line() {
    let tls = TlsProcess::start("mismatch", &["localhost"]);
    let url = format!("https://127.0.0.1:{}", tls.relay.addr.port());
    let cacert = tls.cacert.to_str().unwrap();
    for cmd in ["tail", "check"] {
        assert_refused(
            &run(&[cmd, &url, "--cacert", cacert], &[]),
            "hostname mismatch",
        );
    }
}

#[test]
fn a_cacert_that_is_not_pem_is_refused_in_one_line() {
    let tls = TlsProcess::start("der", &["localhost"]);
    let url = tls.url();
    let der = tls.der_cacert();
    for cmd in ["tail", "check"] {
        let e = assert_refused(
            &run(&[cmd, &url, "--cacert", der.to_str().unwrap()], &[]),
            "not a PEM certificate file",
        );
        assert!(e.contains("cert.der"), "names the file: {e}");
        assert_refused(
            &run(&[cmd, &url, "--cacert", "/nonexistent/ca.pem"], &[]),
            "cannot read it",
        );
    }
}

/// The whole conformance run over HTTPS and WSS (AEP-0003 §10), against a relay that
/// listens only with TLS: nothing fails; the control checks that need a token skip.
#[test]
fn check_passes_over_https_and_wss_trusting_cacert() {
    let tls = TlsProcess::start("check", &["localhost", "127.0.0.1"]);
    let cacert = tls.cacert.to_str().unwrap();
    for url in [
        tls.url(),
        format!("https://127.0.0.1:{}", tls.relay.addr.port()),
    ] {
        let out = run(&["check", &url, "--cacert", cacert, "--timeout", "10"], &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for id in [
            "discovery",
            "batch-filtered-delivery",
            "ws-hello-reply",
            "ws-resume",
        ] {
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(&format!("PASS {id} "))),
                "{id} over TLS:\n{stdout}"
            );
        }
        let summary = stdout.lines().last().unwrap();
        assert!(summary.contains(" passed, 0 failed, "), "{summary}");
    }
}

/// After a reconnection storm every subscriber resumes its session (RFC 8446 §2.2):
/// more clients than a stateful server cache holds (rustls' default, 256 sessions),
/// each with its own session cache as real clients have, reconnect and all resume.
#[test]
fn every_client_resumes_after_a_reconnection_storm() {
    let tls = tls_relay();
    const CLIENTS: usize = 300;
    let configs: Vec<Arc<rustls::ClientConfig>> = (0..CLIENTS)
        .map(|_| {
            let mut c = (*tls.client).clone();
            c.resumption = rustls::client::Resumption::in_memory_sessions(4);
            Arc::new(c)
        })
        .collect();
    // One request per connection: reading its answer also takes in the tickets the
    // relay sends after the handshake.
    let get = |config: &Arc<rustls::ClientConfig>| {
        let mut s = tls_connect(config, tls.relay.addr);
        s.write_all(b"GET /events HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        assert_eq!(read_response(&mut s).0, 200);
        s.conn.handshake_kind()
    };
    for c in &configs {
        assert_eq!(get(c), Some(rustls::HandshakeKind::Full));
    }
    let resumed = configs
        .iter()
        .filter(|c| get(c) == Some(rustls::HandshakeKind::Resumed))
        .count();
    assert_eq!(resumed, CLIENTS, "every reconnection resumes its session");
}

// ---------------------------------------------------------------------------------------
// Backpressure and shutdown over TLS: the rules of plaintext, unchanged.

/// Reads until the relay ends the connection: a `close_notify`, or the TCP close of a
/// connection it cut (rustls' `UnexpectedEof`, a reset); everything read.
fn read_until_closed(s: &mut impl std::io::Read) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                return got
            }
            Err(e) => panic!("reading over TLS: {e}"),
        }
    }
}

impl Tls {
    /// POSTs `lines` as one NDJSON batch over TLS; asserts the 202.
    fn post_lines(&self, lines: &[String]) {
        let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
        post_over_tls(&self.client, self.relay.addr, "application/x-ndjson", &body);
    }

    /// `GET /metrics` over TLS, as text.
    fn metrics(&self) -> String {
        let mut s = self.connect();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let (status, _, body) = read_response(&mut s);
        assert_eq!(status, 200);
        String::from_utf8(body).unwrap()
    }

    /// `GET /stream?{query}` over TLS with extra header lines: the stream, once it is
    /// open (its 200 head and opening comment read).
    fn sse(&self, query: &str, headers: &str) -> SseStream {
        let mut s = self.connect();
        write!(
            s,
            "GET /stream?{query} HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n{headers}\r\n"
        )
        .unwrap();
        let mut s = BufReader::new(s);
        let mut line = String::new();
        s.read_line(&mut line).unwrap();
        assert_eq!(line, "HTTP/1.1 200 OK\r\n");
        while line != ": aep-relay stream open\n" {
            line.clear();
            assert!(s.read_line(&mut line).unwrap() > 0, "stream ended");
        }
        SseStream::new(Box::new(s))
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .unwrap()
}

/// A consumer that stops reading over TLS is bounded, has its info Events dropped and
/// counted, is disconnected when a `notice` cannot be queued (AEP-0003 §8.4), and
/// resumes exactly with `Last-Event-ID`: the rules and the assertions of
/// `tests/wire/operations.rs`'s plaintext test, over HTTPS. The records sealed for it and
/// not yet written count in `aep_output_queued_bytes` and in its bound.
#[test]
fn a_stalled_tls_consumer_is_bounded_dropped_disconnected_and_resumes_exactly() {
    const MAX_OUTPUT: usize = 64 * 1024;
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let server = aep_relay::tls::server_config_from_pem(
        ck.cert.pem().as_bytes(),
        ck.key_pair.serialize_pem().as_bytes(),
    )
    .unwrap();
    let tls = Tls {
        relay: TestRelay::with(|c| {
            c.tls = Some(server);
            c.max_output_bytes = MAX_OUTPUT;
            c.buffer_per_session = 100_000;
        }),
        client: trusting(&ck.cert),
    };
    let mut stalled = tls.connect();
    stalled
        .write_all(b"GET /stream HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 15];
    std::io::Read::read_exact(&mut stalled, &mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200 OK");
    let healthy = tls.sse("", "");

    let (batches, per) = (800u64, 50u64);
    let mut healthy =
        flood_beside_a_stalled_consumer(healthy, batches, per, |lines| tls.post_lines(lines));

    let text = tls.metrics();
    assert!(
        metric(&text, r#"aep_dropped_events_total{severity="info"}"#) > 0.0,
        "info Events toward the stalled consumer were dropped and counted"
    );
    let queued = metric(&text, "aep_output_queued_bytes");
    assert!(
        queued <= (MAX_OUTPUT + 4096) as f64,
        "bounded memory, sealed records included: {queued} bytes queued"
    );
    assert!(
        queued >= (MAX_OUTPUT / 2) as f64,
        "the stalled consumer's queue is counted: {queued} bytes queued"
    );

    let notice = backpressure_notice(batches * per);
    tls.post_lines(std::slice::from_ref(&notice));
    assert_eq!(healthy.expect().data, notice, "others still get it");
    assert_eq!(
        metric(&tls.metrics(), "aep_backpressure_disconnects_total"),
        1.0
    );

    // The stalled consumer reads what it had and finds the stream ended…
    let got = String::from_utf8(read_until_closed(&mut stalled)).unwrap();
    // …and resumes exactly after its last position, notice included, no duplicate.
    let resume = |id: &str| tls.sse("live=0", &format!("Last-Event-ID: {id}\r\n"));
    assert_resumes_exactly(&got, resume, &notice, batches * per);
}

/// SIGTERM drains TLS connections as it drains plaintext ones (AEP-0003 §3.5 #4): an
/// SSE stream over HTTPS ends with `: shutting-down` and a TLS `close_notify`; a WSS
/// consumer gets `closing` with its exact position, then close 1001; the relay exits 0.
#[test]
fn sigterm_drains_https_sse_and_wss_with_their_closing_frames() {
    use tungstenite::Message;
    let (relay, client, dir) = spawn_tls_relay("tls-sigterm", &[]);
    let mut sse = open_https_stream(&client, relay.addr, "/stream");

    let mut ws = wss_consumer(tls_connect(&client, relay.addr), "mine", "s");
    let ev = event("s", 3, 14, "tool.started", "");
    post_over_tls(&client, relay.addr, "application/json", &ev);
    assert_eq!(ws.read().unwrap().to_text().unwrap(), ev);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(sse.read_line(&mut line).unwrap() > 0);
    }
    assert_eq!(line.trim_end(), format!("data: {ev}"));

    relay.signal("TERM");

    // SSE over HTTPS: the rest of the stream, then a clean TLS end (close_notify: a
    // read of 0, not rustls' UnexpectedEof).
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut sse, &mut rest).expect("a close_notify ends the stream");
    assert!(rest.contains(": shutting-down\n"), "{rest:?}");

    // WSS: `closing` with the exact position, then close 1001.
    let mut frames = Vec::new();
    let code = loop {
        match ws.read() {
            Ok(Message::Text(t)) => {
                frames.push(serde_json::from_str::<serde_json::Value>(&t).unwrap())
            }
            Ok(Message::Close(c)) => break c.map(|c| u16::from(c.code)),
            Ok(_) => {}
            Err(e) => panic!("WSS ended without a close frame: {e}"),
        }
    };
    assert_eq!(code, Some(1001));
    assert_eq!(
        frames,
        vec![
            serde_json::json!({"type": "closing", "reason": "shutting down",
                    "delivered": [{"sub": "mine", "session": "s",
                                   "source": "aep://test/agent/a/session/s", "epoch": 3, "seq": 14}]})
        ]
    );
    drop(ws);
    drop(sse);
    let (status, stderr) = relay.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "exit status {status}; stderr:\n{stderr}");
    assert!(stderr.contains("shutdown complete"), "{stderr}");
}

/// An HTTPS SSE consumer far behind on reading when SIGTERM comes (its socket full,
/// records sealed for it waiting in rustls) still gets every Event queued for it, then
/// `: shutting-down`, then the TLS `close_notify`: the relay half-closes only once the
/// sealed records are all written, never with some left in rustls.
#[test]
fn sigterm_drains_an_https_consumer_behind_on_reading_to_its_last_record() {
    let (relay, client, dir) = spawn_tls_relay("tls-drain", &["--max-output", "33554432"]);
    let mut sse = open_https_stream(
        &client,
        relay.addr,
        "/stream?filter=%7B%22session%22%3A%22d%22%7D",
    );
    // ~12 MB toward a consumer that reads nothing meanwhile: more than the kernel's
    // socket buffers take (up to 4 MiB of send buffer here), under the 32 MiB bound.
    let pad = "p".repeat(1000);
    let (batches, per) = (120u64, 100u64);
    for b in 0..batches {
        let body: String = (0..per)
            .map(|i| {
                event(
                    "d",
                    0,
                    b * per + i + 1,
                    "tool.completed",
                    &format!(",\"pad\":\"{pad}\""),
                ) + "\n"
            })
            .collect();
        let mut post = tls_connect(&client, relay.addr);
        write!(
            post,
            "POST /events HTTP/1.1\r\nHost: localhost\r\nAEP-Version: 0.1\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        assert_eq!(read_response(&mut post).0, 202);
    }
    // The relay holds a backlog for it (queued and sealed) when SIGTERM comes.
    let mut m = tls_connect(&client, relay.addr);
    m.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let (_, _, body) = read_response(&mut m);
    let queued: f64 = String::from_utf8(body)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("aep_output_queued_bytes "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(queued > 1e6, "{queued} bytes queued");
    relay.signal("TERM");
    let mut seq = 0u64;
    let mut line = String::new();
    loop {
        line.clear();
        match sse.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => panic!("HTTPS stream cut after {seq} Events: {e}"),
        }
        if let Some(data) = line.strip_prefix("data: ") {
            seq += 1;
            assert!(
                data.contains(&format!("\"seq\":{seq},")),
                "Event {seq} in order, none lost"
            );
            if seq.is_multiple_of(20) {
                // A slow reader, so that the relay's last writes find its socket full:
                // the end of the drain is a partial write of sealed records.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        } else if line == ": shutting-down\n" {
            assert_eq!(seq, batches * per, "every Event queued before SIGTERM");
        }
    }
    assert_eq!(seq, batches * per, "every Event, then a clean close_notify");
    drop(sse);
    let (status, stderr) = relay.wait();
    assert!(status.success(), "exit status {status}; stderr:\n{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
