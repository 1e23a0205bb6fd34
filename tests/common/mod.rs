//! Shared test support: a real relay on an ephemeral port in a thread, a raw HTTP/1.1
//! client over TCP, ureq for ordinary requests, and an SSE reader.
#![allow(dead_code)]

pub mod whatwg;

use aep_relay::{Config, Relay, StopHandle};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long any single wait in a test may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(10);

/// A relay running on 127.0.0.1 with an ephemeral port, stopped on drop.
pub struct TestRelay {
    pub addr: SocketAddr,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
}

impl TestRelay {
    pub fn start() -> TestRelay {
        TestRelay::with(|_| {})
    }

    pub fn with(tweak: impl FnOnce(&mut Config)) -> TestRelay {
        let mut config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..Config::default()
        };
        tweak(&mut config);
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut relay = Relay::bind(config).expect("relay binds");
            tx.send((relay.local_addr(), relay.stop_handle())).unwrap();
            relay.run().expect("relay runs");
        });
        let (addr, stop) = rx.recv_timeout(WAIT).expect("relay started");
        TestRelay {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `GET {path}` (e.g. `/metrics`): the body as text, as [`get_text`].
    pub fn get_text(&self, path: &str) -> String {
        get_text(&self.url(path))
    }

    /// POSTs `body` to /events with `AEP-Version: 0.1`; returns (status, JSON body).
    pub fn post(&self, content_type: &str, body: &str) -> (u16, serde_json::Value) {
        let resp = agent()
            .post(&self.url("/events"))
            .set("AEP-Version", "0.1")
            .set("Content-Type", content_type)
            .send_string(body);
        status_json(resp)
    }

    /// POSTs an NDJSON batch and asserts 202 with the count.
    pub fn post_ok(&self, lines: &[&str]) {
        let body = lines.join("\n") + "\n";
        let (status, json) = self.post("application/x-ndjson", &body);
        assert_eq!(status, 202, "POST answered {status} {json}");
        assert_eq!(json["accepted"], lines.len());
    }

    /// Opens `GET /stream?{query}` with extra headers.
    pub fn sse(&self, query: &str, headers: &[(&str, &str)]) -> SseStream {
        let mut req = agent()
            .get(&format!("{}?{}", self.url("/stream"), query))
            .set("Accept", "text/event-stream");
        for (k, v) in headers {
            req = req.set(k, v);
        }
        let resp = req.call().expect("stream opens");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.header("content-type"), Some("text/event-stream"));
        SseStream {
            reader: BufReader::new(resp.into_reader()),
        }
    }

    /// Opens a raw TCP connection to the relay.
    pub fn tcp(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s
    }
}

impl Drop for TestRelay {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout_read(WAIT).build()
}

/// `GET {url}` of any relay (a [`TestRelay`] or a spawned binary): the body as text.
/// Panics on a transport error or an error status.
pub fn get_text(url: &str) -> String {
    agent().get(url).call().unwrap().into_string().unwrap()
}

/// Status and JSON body of a ureq result, error statuses included.
pub fn status_json(resp: Result<ureq::Response, ureq::Error>) -> (u16, serde_json::Value) {
    let resp = match resp {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = resp.status();
    let text = resp.into_string().unwrap();
    let json = if text.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("body is not JSON ({e}): {text}"))
    };
    (status, json)
}

/// One SSE message as a client sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SseMessage {
    pub event: Option<String>,
    pub id: Option<String>,
    pub data: String,
    /// Comment lines (without the leading `:` and space) seen before this message.
    pub comments: Vec<String>,
}

pub struct SseStream {
    reader: BufReader<Box<dyn Read + Send + Sync>>,
}

impl SseStream {
    /// The next message (with the comments before it); `None` at end of stream.
    /// Heartbeat `ping` comments are skipped.
    pub fn next(&mut self) -> Option<SseMessage> {
        let mut msg = SseMessage::default();
        let mut has_data = false;
        loop {
            let mut line = String::new();
            let n = self
                .reader
                .read_line(&mut line)
                .unwrap_or_else(|e| panic!("SSE read failed (waited {WAIT:?}?): {e}"));
            if n == 0 {
                return None;
            }
            let line = line.trim_end_matches('\n').trim_end_matches('\r');
            if line.is_empty() {
                if has_data {
                    return Some(msg);
                }
                continue;
            }
            if let Some(c) = line.strip_prefix(':') {
                let c = c.strip_prefix(' ').unwrap_or(c);
                if c != "ping" && !c.starts_with("aep-relay") {
                    msg.comments.push(c.to_string());
                }
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "event" => msg.event = Some(value.to_string()),
                "id" => msg.id = Some(value.to_string()),
                "data" => {
                    if has_data {
                        msg.data.push('\n');
                    }
                    msg.data.push_str(value);
                    has_data = true;
                }
                _ => {}
            }
        }
    }

    /// The next message, which must exist.
    pub fn expect(&mut self) -> SseMessage {
        self.next().expect("the stream ended early")
    }

    /// Reads every remaining message until the stream ends.
    pub fn rest(&mut self) -> Vec<SseMessage> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

/// Sends raw bytes and reads one HTTP response (status, lowercased headers, body).
pub fn read_response(stream: &mut impl Read) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).expect("response head");
        assert!(
            n > 0,
            "connection closed before a response head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).unwrap();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let len = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map(|(_, v)| v.parse::<usize>().unwrap())
        .unwrap_or(0);
    let mut body = vec![0; len];
    stream.read_exact(&mut body).unwrap();
    (status, headers, body)
}

/// Writes `bytes` on a fresh connection and reads one response.
pub fn raw_request(
    relay: &TestRelay,
    bytes: &[u8],
) -> (u16, Vec<(String, String)>, serde_json::Value) {
    let mut s = relay.tcp();
    s.write_all(bytes).unwrap();
    let (status, headers, body) = read_response(&mut s);
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    (status, headers, json)
}

/// Reads `../shared/<rel>` or returns None after saying that the fixture is absent.
pub fn fixture(rel: &str) -> Option<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared")
        .join(rel);
    match std::fs::read_to_string(&path) {
        Ok(s) => Some(s),
        Err(_) => {
            eprintln!("SKIP: fixture {} is absent", path.display());
            None
        }
    }
}

/// A valid sequenced Event in `session` at (`epoch`, `seq`), with optional extra members
/// (a string starting with `,` inserted before the closing brace).
pub fn event(session: &str, epoch: u64, seq: u64, ty: &str, extra: &str) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{session}-{epoch}-{seq}","type":"{ty}","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/a/session/{session}","agent":"a","session":"{session}","seq":{seq},"epoch":{epoch}{extra}}}"#
    )
}

/// URL-encodes a query value.
pub fn enc(v: &str) -> String {
    form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

/// The `aep-relay` binary running as a child process; its stderr is collected.
pub struct RelayProcess {
    pub child: std::process::Child,
    pub addr: SocketAddr,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    stderr_thread: Option<JoinHandle<()>>,
}

impl RelayProcess {
    /// Starts the binary with `args` (a `--listen 127.0.0.1:0` is added) and `envs`, and
    /// waits for its start-up line.
    pub fn spawn(args: &[&str], envs: &[(&str, &str)]) -> RelayProcess {
        use std::process::{Command, Stdio};
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_aep-relay"));
        cmd.args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("binary starts");
        let stderr = child.stderr.take().unwrap();
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = text.clone();
        let stderr_thread = std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            let mut line = String::new();
            let mut tx = Some(tx);
            while r.read_line(&mut line).unwrap_or(0) > 0 {
                if let Some(rest) = line.strip_prefix("aep-relay listening on ") {
                    let addr: SocketAddr = rest.split(' ').next().unwrap().parse().unwrap();
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr);
                    }
                }
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let addr = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("no start-up line; stderr: {}", text.lock().unwrap()));
        RelayProcess {
            child,
            addr,
            stderr: text,
            stderr_thread: Some(stderr_thread),
        }
    }

    /// Sends a signal (`"TERM"`, `"INT"`, `"KILL"`) to the process.
    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// Waits for the process to exit (bounded) and returns its status and whole stderr.
    pub fn wait(mut self) -> (std::process::ExitStatus, String) {
        let deadline = std::time::Instant::now() + WAIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(std::time::Instant::now() < deadline, "relay did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        if let Some(t) = self.stderr_thread.take() {
            let _ = t.join();
        }
        let text = self.stderr.lock().unwrap().clone();
        (status, text)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
