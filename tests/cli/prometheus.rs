//! `GET /metrics` under the tools operators run: `promtool check metrics` finds nothing
//! to lint after traffic; a real Prometheus scraping real relays every second sees the
//! traffic through PromQL (`/api/v1/query`): ingest rates, deliveries by binding, drops,
//! the latency histograms, and, clustered with a real nats-server, the cluster state, lag
//! and outbox through an engine outage; every query of the Grafana dashboard
//! (`contrib/grafana/aep-relay.json`) runs there and names only metrics the relay
//! exports, and every metric the relay exports has a panel. On virtual time (no tool
//! needed), the histograms measure what they say.
//!
//! Prometheus and promtool come from Debian's `prometheus` package (`.ci/run` installs
//! it), nats-server from `nats-server`. When one is missing a test skips with a message,
//! except under `CI=true`, where it fails. Prometheus runs as a child process on
//! loopback (a free port, a temporary directory for its config and TSDB), never as the
//! package's service. Every wait polls a condition, bounded by [`WAIT`], and fails with
//! what it saw.
#![cfg(feature = "cli")]

use crate::support;

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::nats::NatsServer;
use support::*;

use aep_relay::Config;
use aep_sim::Sim;

/// The token of the clustered relays (every scope), which Prometheus presents.
const TOKEN: &str = "t";
/// Every relay's output bound: small, so that a stalled consumer drops soon.
const MAX_OUTPUT: &str = "65536";
/// How often Prometheus scrapes.
const SCRAPE: &str = "1s";
/// The dashboard, as shipped.
const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/contrib/grafana/aep-relay.json"
);

// ---------------------------------------------------------------------------------------
// The tools
// ---------------------------------------------------------------------------------------

/// `name` on `PATH` (or in `/usr/bin`, `/usr/sbin`).
fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `name`'s path, or `None` after saying the test skips; under `CI=true` a missing tool
/// fails the test.
fn tool(name: &str) -> Option<PathBuf> {
    let found = find_binary(name);
    if found.is_none() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{name} is not on PATH, and CI=true needs it (apt-get install prometheus)");
        }
        eprintln!("skipping: {name} not on PATH (apt-get install prometheus)");
    }
    found
}

/// A nats-server when cluster mode can be tested: the binary has the `cluster` feature
/// and nats-server is installed (missing: skipped, or failed under `CI=true`, by
/// [`NatsServer::start`]).
fn nats() -> Option<NatsServer> {
    if !cfg!(feature = "cluster") {
        eprintln!("skipping the cluster part: built without the `cluster` feature");
        return None;
    }
    NatsServer::start()
}

/// Runs `promtool check metrics` over `text`; fails on a non-zero exit or any finding.
fn promtool_check(promtool: &Path, text: &str, who: &str) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("promtool runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics on {who}'s /metrics: {} {said}\n/metrics was:\n{text}",
        out.status
    );
    eprintln!("promtool check metrics: {who}'s /metrics is clean");
}

// ---------------------------------------------------------------------------------------
// Relays, their consumers and their traffic
// ---------------------------------------------------------------------------------------

/// A relay under test: the real binary, with the token it needs (if any).
struct Relay {
    proc: RelayProcess,
    token: Option<&'static str>,
    name: &'static str,
}

impl Relay {
    /// A relay on its own.
    fn single(name: &'static str) -> Relay {
        Relay {
            proc: RelayProcess::spawn(&["--max-output", MAX_OUTPUT]),
            token: None,
            name,
        }
    }

    /// Relay `id` of the cluster on `nats`, with [`TOKEN`]; waits until it is connected.
    fn clustered(nats: &NatsServer, id: &'static str) -> Relay {
        let url = nats.url();
        let args = [
            "--cluster",
            &url,
            "--relay-id",
            id,
            "--token",
            TOKEN,
            "--max-output",
            MAX_OUTPUT,
        ];
        let r = Relay {
            proc: RelayProcess::spawn(&args),
            token: Some(TOKEN),
            name: id,
        };
        let deadline = Instant::now() + WAIT;
        while status_json(r.get("/readyz").call()).0 != 200 {
            assert!(
                Instant::now() < deadline,
                "{id}: /readyz not 200 within {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        r
    }

    /// `GET {path}` with the relay's token.
    fn get(&self, path: &str) -> ureq::Request {
        let req = agent().get(&self.proc.url(path));
        match self.token {
            Some(t) => req.set("Authorization", &format!("Bearer {t}")),
            None => req,
        }
    }

    /// The text of `/metrics`.
    fn metrics(&self) -> String {
        self.get("/metrics")
            .call()
            .unwrap_or_else(|e| panic!("{}: GET /metrics: {e}", self.name))
            .into_string()
            .unwrap()
    }

    /// Sample `name` (with its labels, as written) of `/metrics`.
    fn metric(&self, name: &str) -> f64 {
        let text = self.metrics();
        sample(&text, name).unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
    }

    /// POSTs `lines` as one NDJSON batch: status and JSON body.
    fn post(&self, lines: &[String]) -> (u16, Value) {
        let mut req = agent()
            .post(&self.proc.url("/events"))
            .set("AEP-Version", "0.1")
            .set("Content-Type", "application/x-ndjson");
        if let Some(t) = self.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        status_json(req.send_string(&(lines.join("\n") + "\n")))
    }

    /// POSTs `lines`, asserting 202 with their count.
    fn post_ok(&self, lines: &[String]) {
        let (status, body) = self.post(lines);
        assert_eq!(
            (status, &body["accepted"]),
            (202, &json!(lines.len())),
            "{}: POST answered {status} {body}",
            self.name
        );
    }

    /// `?access_token=` for the relay's token, or nothing.
    fn query(&self) -> String {
        self.token
            .map_or(String::new(), |t| format!("access_token={t}"))
    }
}

impl Endpoint for Relay {
    fn addr(&self) -> SocketAddr {
        self.proc.addr
    }
}

/// The value of the sample `name` (labels as written) in exposition `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// An SSE consumer over raw TCP that reads everything, counting its Events (one `data:`
/// line each), in a thread that ends with the connection.
fn sse_reader(r: &Relay) -> Arc<AtomicU64> {
    let mut tcp = TcpStream::connect(r.addr()).unwrap();
    let req = format!(
        "GET /stream?{} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n",
        r.query()
    );
    tcp.write_all(req.as_bytes()).unwrap();
    let head = read_head(&mut tcp);
    assert!(head.starts_with("HTTP/1.1 200"), "{}: {head}", r.name);
    let n = Arc::new(AtomicU64::new(0));
    let count = n.clone();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(tcp);
        let mut line = String::new();
        while matches!(lines.read_line(&mut line), Ok(k) if k > 0) {
            if line.starts_with("data:") {
                count.fetch_add(1, Ordering::SeqCst);
            }
            line.clear();
        }
    });
    n
}

/// A WebSocket consumer subscribed to everything that reads everything, counting its
/// Events, in a thread that ends with the connection.
fn ws_reader(r: &Relay) -> Arc<AtomicU64> {
    let (mut ws, _) = Ws::hello(r, &r.query(), "consumer", json!({}));
    ws.subscribe("all", json!({}));
    let n = Arc::new(AtomicU64::new(0));
    let count = n.clone();
    std::thread::spawn(move || loop {
        match ws.sock.read() {
            Ok(tungstenite::Message::Text(t)) => {
                if !t.starts_with(r#"{"type":"ping""#) {
                    count.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok(_) => {}
            Err(_) => break,
        }
    });
    n
}

/// Waits until `n` holds at least `want`.
fn wait_count(n: &AtomicU64, want: u64, what: &str) {
    let deadline = Instant::now() + WAIT;
    while n.load(Ordering::SeqCst) < want {
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {want} Events within {WAIT:?}",
            n.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// An SSE consumer that never reads, on a socket whose receive buffer is set to 4 KiB
/// before it connects (so the kernel holds little for it and the relay's queue fills).
/// Returns once the stream's response head arrived.
fn stalled_reader(r: &Relay) -> TcpStream {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = r.addr() else {
        panic!("the relay listens on IPv4 loopback")
    };
    // SAFETY: a fresh socket this function owns: setsockopt and connect on it with
    // correctly sized arguments, then handed to TcpStream, which closes it.
    let mut tcp = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let size: libc::c_int = 4096;
        let rc = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &size as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(rc, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let rc = libc::connect(
            fd,
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(rc, 0, "connect: {}", std::io::Error::last_os_error());
        TcpStream::from_raw_fd(fd)
    };
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let req = format!(
        "GET /stream?{} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n",
        r.query()
    );
    tcp.write_all(req.as_bytes()).unwrap();
    let head = read_head(&mut tcp);
    assert!(head.starts_with("HTTP/1.1 200"), "{}: {head}", r.name);
    tcp
}

/// `n` small Events of `session` from `seq` on.
fn events(session: &str, from: u64, n: u64) -> Vec<String> {
    (from..from + n).map(|s| ev("a", session, s)).collect()
}

/// Posts padded `info` Events (2 KiB each, 50 a batch) until the relay counts drops
/// toward the stalled consumer; the other consumers keep reading. At most 400 batches.
fn until_drops(r: &Relay, session: &str) {
    let pad = format!(r#","data":{{"pad":"{}"}}"#, "x".repeat(2048));
    for b in 0..400u64 {
        let lines: Vec<String> = (b * 50..b * 50 + 50)
            .map(|s| envelope_with(session, s, &pad))
            .collect();
        r.post_ok(&lines);
        if r.metric(r#"aep_dropped_events_total{severity="info"}"#) > 0.0 {
            return;
        }
    }
    panic!(
        "{}: no drop after 400 batches toward a stalled consumer",
        r.name
    );
}

/// A sequenced `tool.completed` of agent `a` in `session` at (0, `seq`), with `extra`
/// members.
fn envelope_with(session: &str, seq: u64, extra: &str) -> String {
    event(session, 0, seq, "tool.completed", extra)
}

// ---------------------------------------------------------------------------------------
// Prometheus
// ---------------------------------------------------------------------------------------

/// A real Prometheus on loopback, scraping the given relays every [`SCRAPE`], killed on
/// drop (its directory removed).
struct Prometheus {
    child: Child,
    dir: PathBuf,
    base: String,
    log: Lines,
}

/// One sample of an instant vector: its labels and value.
#[derive(Debug, Clone)]
struct Sample {
    labels: serde_json::Map<String, Value>,
    value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> &str {
        self.labels.get(name).and_then(Value::as_str).unwrap_or("")
    }
}

/// A port free on 127.0.0.1 a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Prometheus {
    /// Starts `prometheus` with a config scraping each relay as job `name` (with its
    /// token as a bearer credential), and waits for `/-/ready`.
    fn start(bin: &Path, relays: &[&Relay]) -> Prometheus {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "aep-prometheus-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let mut config = format!(
            "global:\n  scrape_interval: {SCRAPE}\n  scrape_timeout: {SCRAPE}\n  evaluation_interval: {SCRAPE}\nscrape_configs:\n"
        );
        for r in relays {
            config.push_str(&format!(
                "  - job_name: {}\n    static_configs:\n      - targets: ['{}']\n",
                r.name,
                r.addr()
            ));
            if let Some(t) = r.token {
                config.push_str(&format!(
                    "    authorization:\n      type: Bearer\n      credentials: {t}\n"
                ));
            }
        }
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let mut child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting prometheus");
        let log = Lines::collect(child.stderr.take().unwrap(), "");
        let mut p = Prometheus {
            child,
            dir,
            base: format!("http://127.0.0.1:{port}"),
            log,
        };
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(r) = agent().get(&format!("{}/-/ready", p.base)).call() {
                if r.status() == 200 {
                    break;
                }
            }
            if let Some(status) = p.child.try_wait().unwrap() {
                panic!("prometheus exited ({status}); it said:\n{}", p.said());
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within {WAIT:?}; it said:\n{}",
                p.said()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    fn said(&self) -> String {
        self.log.snapshot().join("\n")
    }

    /// `GET /api/v1/query?query={promql}`: the instant vector (a scalar as one sample),
    /// or the error Prometheus answered.
    fn query(&self, promql: &str) -> Result<Vec<Sample>, String> {
        let url = format!("{}/api/v1/query?query={}", self.base, enc(promql));
        let (status, body) = status_json(agent().get(&url).call());
        if status != 200 || body["status"] != "success" {
            return Err(format!("{status} {body}"));
        }
        let value = |v: &Value| -> f64 {
            v[1].as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("a sample value in {body}"))
        };
        Ok(match body["data"]["resultType"].as_str() {
            Some("vector") => body["data"]["result"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| Sample {
                    labels: s["metric"].as_object().cloned().unwrap_or_default(),
                    value: value(&s["value"]),
                })
                .collect(),
            Some("scalar") => vec![Sample {
                labels: Default::default(),
                value: value(&body["data"]["result"]),
            }],
            other => return Err(format!("result type {other:?}: {body}")),
        })
    }

    /// Polls `promql` until `ok` holds of its result (at most [`WAIT`]); prints and
    /// returns that result. Fails with the last result and the scrape targets' health.
    fn until(&self, promql: &str, what: &str, ok: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
        let deadline = Instant::now() + WAIT;
        loop {
            let got = self.query(promql);
            if let Ok(samples) = &got {
                if ok(samples) {
                    let shown: Vec<String> = samples.iter().map(show).collect();
                    eprintln!("PromQL {promql} = [{}]", shown.join(", "));
                    return samples.clone();
                }
            }
            if Instant::now() >= deadline {
                let (_, targets) =
                    status_json(agent().get(&format!("{}/api/v1/targets", self.base)).call());
                panic!(
                    "{what}: `{promql}` did not hold within {WAIT:?}; last result {got:?}\ntargets: {targets}"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `{labels} value` of a sample, for the log.
fn show(s: &Sample) -> String {
    let labels: Vec<String> = s
        .labels
        .iter()
        .filter(|(k, _)| k.as_str() != "instance")
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    format!("{{{}}} {}", labels.join(","), s.value)
}

/// The samples of `got` whose label `name` is `value`.
fn with<'a>(got: &'a [Sample], name: &str, value: &str) -> Vec<&'a Sample> {
    got.iter().filter(|s| s.label(name) == value).collect()
}

/// The one value of `got` with label `name` = `value` (`None`: absent).
fn value_of(got: &[Sample], name: &str, value: &str) -> Option<f64> {
    with(got, name, value).first().map(|s| s.value)
}

// ---------------------------------------------------------------------------------------
// The dashboard
// ---------------------------------------------------------------------------------------

/// Every PromQL expression of the dashboard: its panels' targets (rows' nested panels
/// included) and its query variables.
fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(DASHBOARD).expect("contrib/grafana/aep-relay.json");
    let d: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    fn panels(list: &Value, out: &mut Vec<String>) {
        for p in list.as_array().into_iter().flatten() {
            if p["type"] != "row" {
                assert_eq!(
                    p["datasource"],
                    json!({"type": "prometheus", "uid": "${datasource}"}),
                    "panel {:?} queries the data source variable",
                    p["title"]
                );
            }
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push(e.to_string());
                }
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&d["panels"], &mut out);
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] == "query" {
            let q = v["query"]["query"].as_str().or(v["query"].as_str());
            out.push(q.expect("a query variable's query").to_string());
        }
    }
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(
        vars.contains(&"datasource")
            && d["templating"]["list"][0]["type"] == "datasource"
            && d["templating"]["list"][0]["query"] == "prometheus",
        "the dashboard has a Prometheus datasource variable"
    );
    assert!(out.len() > 20, "the dashboard has its queries: {out:?}");
    out
}

/// The metric names an expression queries (`aep_…` identifiers).
fn names_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("aep_") {
        let start = i + at;
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        let before = start.checked_sub(1).map(|j| b[j]);
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_') {
            out.insert(expr[start..end].to_string());
        }
        i = end;
    }
    out
}

/// A dashboard expression as Prometheus takes it: Grafana's variables replaced.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "10s")
        .replace("$instance", ".+")
}

/// The families of an exposition (`# TYPE` lines) with their types, and every name a
/// query may use: sample names, and each histogram's `_bucket`, `_sum` and `_count`.
fn exported(text: &str) -> (Vec<(String, String)>, BTreeSet<String>) {
    let mut families = Vec::new();
    let mut names = BTreeSet::new();
    for l in text.lines() {
        if let Some(t) = l.strip_prefix("# TYPE ") {
            let (name, kind) = t.split_once(' ').expect("# TYPE name kind");
            families.push((name.to_string(), kind.to_string()));
            names.insert(name.to_string());
            if kind == "histogram" {
                for s in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{s}"));
                }
            }
        } else if !l.starts_with('#') && !l.is_empty() {
            let end = l.find(['{', ' ']).unwrap_or(l.len());
            names.insert(l[..end].to_string());
        }
    }
    (families, names)
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// `promtool check metrics` has nothing to say about `/metrics` after traffic of every
/// kind: ingest, SSE and WebSocket deliveries, refusals, drops toward a stalled
/// consumer (its per-connection series), the histograms, and cluster mode.
#[test]
fn promtool_finds_nothing_to_lint_after_traffic() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let single = Relay::single("single");
    let sse = sse_reader(&single);
    let ws = ws_reader(&single);
    let _stalled = stalled_reader(&single);
    single.post_ok(&events("lint", 0, 5));
    wait_count(&sse, 5, "the SSE consumer");
    wait_count(&ws, 5, "the WebSocket consumer");
    assert_eq!(single.post(&["{}".to_string()]).0, 400);
    assert_eq!(status_json(single.get("/nope").call()).0, 404);
    until_drops(&single, "lint-drops");
    let text = single.metrics();
    assert!(
        text.contains("aep_connection_dropped_events_total{conn="),
        "{text}"
    );
    assert!(
        sample(
            &text,
            r#"aep_delivery_latency_seconds_count{binding="sse"}"#
        ) > Some(0.0)
    );
    assert!(sample(&text, r#"aep_delivery_latency_seconds_count{binding="ws"}"#) > Some(0.0));
    assert!(sample(&text, "aep_post_duration_seconds_count") > Some(0.0));
    promtool_check(&promtool, &text, "a single relay");

    let Some(nats) = nats() else {
        return;
    };
    let r1 = Relay::clustered(&nats, "r1");
    let sse = sse_reader(&r1);
    r1.post_ok(&events("lint", 0, 3));
    wait_count(&sse, 3, "r1's SSE consumer");
    let text = r1.metrics();
    assert!(
        text.contains(r#"aep_cluster_state{state="connected"} 1"#),
        "{text}"
    );
    promtool_check(&promtool, &text, "a clustered relay");
}

/// A real Prometheus scraping a single relay and a clustered one every second sees the
/// known traffic through PromQL: ingest rates, exact delivery counts by binding, drops,
/// the latency histograms, and the cluster's state, lag and outbox through an engine
/// outage. Every dashboard query then runs there and returns data.
#[test]
fn prometheus_sees_the_traffic_through_promql() {
    let (Some(prometheus), Some(_)) = (tool("prometheus"), tool("promtool")) else {
        return;
    };
    let started = Instant::now();
    let single = Relay::single("single");
    let mut nats = nats();
    let r1 = nats.as_ref().map(|n| Relay::clustered(n, "r1"));
    let mut relays = vec![&single];
    relays.extend(r1.as_ref());
    let prom = Prometheus::start(&prometheus, &relays);
    for r in &relays {
        let up = format!(r#"up{{job="{}"}}"#, r.name);
        prom.until(&up, "the relay is scraped", |s| {
            s.len() == 1 && s[0].value == 1.0
        });
    }

    // Known traffic: 10 Events, each to one SSE consumer, one WebSocket consumer and a
    // stalled SSE consumer (small enough to fit its socket).
    let sse = sse_reader(&single);
    let ws = ws_reader(&single);
    let _stalled = stalled_reader(&single);
    single.post_ok(&events("known", 0, 10));
    wait_count(&sse, 10, "the SSE consumer");
    wait_count(&ws, 10, "the WebSocket consumer");
    prom.until(
        r#"rate(aep_events_ingested_total{job="single",binding="http"}[10s])"#,
        "ingest is seen as a rate",
        |s| s.len() == 1 && s[0].value > 0.0,
    );
    let deliveries = prom.until(
        r#"aep_deliveries_total{job="single"}"#,
        "deliveries by binding",
        |s| {
            value_of(s, "binding", "sse") == Some(20.0)
                && value_of(s, "binding", "ws") == Some(10.0)
        },
    );
    assert_eq!(deliveries.len(), 2, "{deliveries:?}");
    prom.until(
        r#"sum by (binding) (rate(aep_deliveries_total{job="single"}[10s]))"#,
        "delivery rates by binding",
        |s| {
            value_of(s, "binding", "sse").is_some_and(|v| v > 0.0)
                && value_of(s, "binding", "ws").is_some_and(|v| v > 0.0)
        },
    );
    prom.until(
        r#"aep_connections{job="single"}"#,
        "connections by binding",
        |s| value_of(s, "binding", "sse") == Some(2.0) && value_of(s, "binding", "ws") == Some(1.0),
    );

    // Drops toward the stalled consumer.
    until_drops(&single, "drops");
    prom.until(
        r#"increase(aep_dropped_events_total{job="single",severity="info"}[30s])"#,
        "drops",
        |s| s.len() == 1 && s[0].value > 0.0,
    );
    prom.until(
        r#"aep_connection_dropped_events_total{job="single"}"#,
        "drops by connection",
        |s| {
            !s.is_empty()
                && s.iter()
                    .all(|x| x.value > 0.0 && !x.label("peer").is_empty())
        },
    );
    prom.until(
        r#"sum by (binding) (aep_delivery_latency_seconds_count{job="single"})"#,
        "delivery latency samples by binding",
        |s| {
            value_of(s, "binding", "sse").is_some_and(|v| v > 0.0)
                && value_of(s, "binding", "ws").is_some_and(|v| v > 0.0)
        },
    );
    prom.until(
        r#"histogram_quantile(0.99, sum by (binding, le) (rate(aep_delivery_latency_seconds_bucket{job="single"}[30s])))"#,
        "a p99 delivery latency per binding",
        |s| with(s, "binding", "sse").iter().chain(&with(s, "binding", "ws")).filter(|x| x.value.is_finite()).count() == 2,
    );
    prom.until(
        r#"histogram_quantile(0.99, rate(aep_post_duration_seconds_bucket{job="single"}[30s]))"#,
        "a p99 POST duration",
        |s| s.len() == 1 && s[0].value.is_finite(),
    );
    prom.until(
        r#"aep_events_rejected_total{job="single"}"#,
        "nothing refused yet",
        |s| s.is_empty(),
    );
    assert_eq!(single.post(&["{}".to_string()]).0, 400);
    prom.until(
        r#"sum by (reason) (aep_events_rejected_total{job="single"})"#,
        "refusals by reason",
        |s| value_of(s, "reason", "invalid-event") == Some(1.0),
    );

    // Cluster mode: state, lag and outbox, connected, through an outage, and back.
    if let (Some(nats), Some(r1)) = (nats.as_mut(), r1.as_ref()) {
        let r1_sse = sse_reader(r1);
        r1.post_ok(&events("clustered", 0, 4));
        wait_count(&r1_sse, 4, "r1's SSE consumer");
        prom.until(r#"aep_cluster_state{job="r1"} == 1"#, "r1 connected", |s| {
            s.len() == 1 && s[0].label("state") == "connected"
        });
        prom.until(r#"aep_cluster_lag_messages{job="r1"}"#, "r1's lag", |s| {
            s.len() == 1 && s[0].value == 0.0
        });
        prom.until(
            r#"rate(aep_events_ingested_total{job="r1",binding="http"}[10s])"#,
            "r1's ingest rate",
            |s| s.len() == 1 && s[0].value > 0.0,
        );
        prom.until(
            r#"aep_deliveries_total{job="r1",binding="sse"}"#,
            "r1's deliveries",
            |s| s.len() == 1 && s[0].value == 4.0,
        );

        nats.kill();
        prom.until(
            r#"aep_cluster_state{job="r1"} == 1"#,
            "r1 degraded once the engine is gone",
            |s| s.len() == 1 && s[0].label("state") == "degraded",
        );
        r1.post_ok(&events("outage", 0, 3));
        wait_count(&r1_sse, 7, "r1's SSE consumer during the outage");
        prom.until(
            r#"aep_cluster_outbox_events{job="r1"}"#,
            "r1's outbox during the outage",
            |s| s.len() == 1 && s[0].value == 3.0,
        );

        nats.restart();
        prom.until(
            r#"aep_cluster_state{job="r1"} == 1"#,
            "r1 connected again",
            |s| s.len() == 1 && s[0].label("state") == "connected",
        );
        prom.until(
            r#"aep_cluster_outbox_events{job="r1"}"#,
            "r1's outbox emptied into the stream",
            |s| s.len() == 1 && s[0].value == 0.0,
        );
        prom.until(
            r#"max_over_time(aep_cluster_state{job="r1",state="degraded"}[1m])"#,
            "the outage in r1's history",
            |s| s.len() == 1 && s[0].value == 1.0,
        );
        prom.until(
            r#"aep_cluster_reconnects_total{job="r1"}"#,
            "r1's reconnect counted",
            |s| s.len() == 1 && s[0].value >= 1.0,
        );
        prom.until(
            r#"aep_cluster_lag_messages{job="r1"}"#,
            "r1 caught up",
            |s| s.len() == 1 && s[0].value == 0.0,
        );
    }

    // Every query of the dashboard runs in this Prometheus and returns data (the
    // cluster's only when a clustered relay is scraped).
    for expr in dashboard_exprs() {
        let clustered_only = names_in(&expr)
            .iter()
            .any(|n| n.starts_with("aep_cluster_"));
        if clustered_only && r1.is_none() {
            continue;
        }
        let promql = substitute(&expr);
        if let Some(args) = promql.strip_prefix("label_values(") {
            // A Grafana function, not PromQL: the metric it reads labels of has series.
            let metric = args.split(',').next().unwrap();
            prom.until(metric, "the variable's metric", |s| !s.is_empty());
            continue;
        }
        prom.until(&promql, "a dashboard query returns data", |s| !s.is_empty());
    }
    eprintln!("prometheus test took {:?}", started.elapsed());
}

/// Every metric the dashboard queries exists in a running relay's `/metrics`, and every
/// metric family the relay exports has a query in the dashboard: a clustered relay, so
/// that the cluster's metrics are there (the cluster's names skipped only when
/// nats-server is missing locally).
#[test]
fn dashboard_queries_exactly_the_metrics_the_relay_exports() {
    let nats = nats();
    let relay = match &nats {
        Some(n) => Relay::clustered(n, "dash"),
        None => Relay::single("dash"),
    };
    let (families, names) = exported(&relay.metrics());
    let exprs = dashboard_exprs();
    let queried: BTreeSet<String> = exprs.iter().flat_map(|e| names_in(e)).collect();
    for name in &queried {
        if nats.is_none() && name.starts_with("aep_cluster_") {
            continue;
        }
        assert!(
            names.contains(name),
            "the dashboard queries {name}, which /metrics does not have; it has {names:?}"
        );
    }
    for (family, kind) in &families {
        let used = match kind.as_str() {
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| queried.contains(&format!("{family}{s}"))),
            _ => queried.contains(family),
        };
        assert!(used, "no dashboard panel queries {family} ({kind})");
    }
    // Rates only of counters, quantiles only of histogram buckets.
    for expr in &exprs {
        for name in names_in(expr) {
            let kind = families
                .iter()
                .find(|(f, _)| {
                    name == *f
                        || name
                            .strip_prefix(f.as_str())
                            .is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s))
                })
                .map(|(_, k)| k.as_str());
            if expr.contains(&format!("rate({name}")) || expr.contains(&format!("increase({name}"))
            {
                assert!(
                    matches!(kind, Some("counter") | Some("histogram") | None),
                    "{expr}: rate/increase of {name}, a {kind:?}"
                );
            }
        }
    }
    eprintln!(
        "the dashboard's {} queries use {} metric names, all in /metrics; all {} families have a panel",
        exprs.len(),
        queried.len(),
        families.len()
    );
}

/// The histograms measure what they say, on virtual time (the sans-IO core driven by
/// `aep_sim`, no tool needed): a delivery written in the turn it was fanned out is 0 s;
/// one whose socket was full until 300 ms later is 0.3 s; a heartbeat is no delivery and
/// adds no sample; a `POST /events` whose body arrives 2 s after its head took 2 s.
#[test]
fn histograms_measure_fan_out_to_write_and_post_time_on_virtual_time() {
    let mut sim = Sim::new(Config::default()).unwrap();
    let metrics = |sim: &mut Sim| -> String {
        let c = sim.connect(None);
        sim.feed(
            c,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            false,
        );
        let out = String::from_utf8(sim.take_output(c).unwrap()).unwrap();
        out.split_once("\r\n\r\n").unwrap().1.to_string()
    };
    // A consumer whose socket holds at most 1500 untaken bytes.
    let c = sim.connect(Some(1500));
    sim.feed(c, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", false);
    assert!(String::from_utf8(sim.take_output(c).unwrap())
        .unwrap()
        .starts_with("HTTP/1.1 200 OK"));
    sim.ingest(ev("a", "h", 0).into()).unwrap();
    assert!(!sim.take_output(c).unwrap().is_empty(), "written at once");
    let pad = format!(r#","data":{{"pad":"{}"}}"#, "x".repeat(500));
    let batch: String = (1..4).map(|s| envelope_with("h", s, &pad) + "\n").collect();
    sim.ingest(batch.into()).unwrap();
    assert!(sim.queued_output(c).unwrap() > 0, "the socket is full");
    sim.advance(Duration::from_millis(300));
    sim.take_output(c).unwrap();
    assert_eq!(sim.queued_output(c), Some(0), "written 300 ms later");
    let text = metrics(&mut sim);
    let m = |name: &str| sample(&text, name).unwrap_or_else(|| panic!("no {name}:\n{text}"));
    let b = |le: &str| {
        m(&format!(
            r#"aep_delivery_latency_seconds_bucket{{binding="sse",le="{le}"}}"#
        ))
    };
    assert_eq!(
        m(r#"aep_delivery_latency_seconds_count{binding="sse"}"#),
        2.0,
        "{text}"
    );
    assert_eq!(
        (b("0.0001"), b("0.25"), b("0.5"), b("+Inf")),
        (1.0, 1.0, 2.0, 2.0)
    );
    assert!((m(r#"aep_delivery_latency_seconds_sum{binding="sse"}"#) - 0.3).abs() < 1e-9);
    assert_eq!(
        m(r#"aep_delivery_latency_seconds_count{binding="ws"}"#),
        0.0
    );

    // A heartbeat (15 s) is written, but it carries no Event: no sample.
    sim.advance(Duration::from_secs(15));
    let out = String::from_utf8(sim.take_output(c).unwrap()).unwrap();
    assert!(out.ends_with("\n\n: ping\n\n"), "{out}");
    let text = metrics(&mut sim);
    assert_eq!(
        sample(
            &text,
            r#"aep_delivery_latency_seconds_count{binding="sse"}"#
        ),
        Some(2.0)
    );

    // POST time: from the head's first byte to the answer.
    let body = ev("a", "h", 9);
    let p = sim.connect(None);
    let head = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    sim.feed(p, head.as_bytes(), false);
    sim.advance(Duration::from_secs(2));
    sim.feed(p, body.as_bytes(), false);
    let answer = String::from_utf8(sim.take_output(p).unwrap()).unwrap();
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    let text = metrics(&mut sim);
    let m = |name: &str| sample(&text, name).unwrap_or_else(|| panic!("no {name}:\n{text}"));
    assert_eq!(m("aep_post_duration_seconds_count"), 1.0);
    assert_eq!(m(r#"aep_post_duration_seconds_bucket{le="1"}"#), 0.0);
    assert_eq!(m(r#"aep_post_duration_seconds_bucket{le="2.5"}"#), 1.0);
    assert!((m("aep_post_duration_seconds_sum") - 2.0).abs() < 1e-9);
}

/// Events read from a JSONL source (`--stdin`) are counted under `binding="jsonl"`, so
/// that `rate(aep_events_ingested_total[…])` sees every ingest path.
#[test]
fn jsonl_ingest_is_counted_under_its_binding() {
    let mut relay = RelayProcess::spawn_with(&["--stdin"], &[], true, "127.0.0.1:0");
    let mut stdin = relay.stdin.take().unwrap();
    for line in events("jsonl", 0, 3) {
        writeln!(stdin, "{line}").unwrap();
    }
    stdin.flush().unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let text = relay.get_text("/metrics");
        let n = sample(&text, r#"aep_events_ingested_total{binding="jsonl"}"#);
        if n == Some(3.0) {
            assert_eq!(
                sample(&text, r#"aep_events_ingested_total{binding="http"}"#),
                Some(0.0)
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "jsonl ingest not counted: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
