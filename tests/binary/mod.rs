//! Test support for running the real `aep-relay` binary: spawn it on an ephemeral port,
//! learn the port from its start-up line, watch its stderr, post Events, read SSE
//! streams with bounded waits, SIGKILL it. Every wait has a deadline and fails the test
//! with a message; nothing sleeps to synchronise.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest any single wait may take.
pub const WAIT: Duration = Duration::from_secs(15);

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_aep-relay")
}

/// The lines so far, and whether the pipe has closed.
type Shared = Arc<(Mutex<(Vec<String>, bool)>, Condvar)>;

/// Lines a child wrote to one of its pipes, collected by a thread.
#[derive(Clone, Default)]
pub struct Lines(Shared);

impl Lines {
    /// Starts collecting `pipe`, echoing each line to the test's stderr with `tag`.
    pub fn collect(pipe: impl Read + Send + 'static, tag: &'static str) -> Lines {
        let lines = Lines::default();
        let l = lines.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(pipe);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let s = String::from_utf8_lossy(&buf).trim_end().to_string();
                        if !tag.is_empty() {
                            eprintln!("[{tag}] {s}");
                        }
                        let (m, cv) = &*l.0;
                        m.lock().unwrap().0.push(s);
                        cv.notify_all();
                    }
                }
            }
            let (m, cv) = &*l.0;
            m.lock().unwrap().1 = true;
            cv.notify_all();
        });
        lines
    }

    /// Everything collected so far.
    pub fn snapshot(&self) -> Vec<String> {
        self.0 .0.lock().unwrap().0.clone()
    }

    /// Waits until a line satisfying `pred` exists (at index `from` or later); returns
    /// its index and text. Fails the test after [`WAIT`] or when the pipe closes first.
    pub fn wait_from(
        &self,
        from: usize,
        what: &str,
        pred: impl Fn(&str) -> bool,
    ) -> (usize, String) {
        let deadline = Instant::now() + WAIT;
        let (m, cv) = &*self.0;
        let mut g = m.lock().unwrap();
        loop {
            if let Some((i, l)) = g.0.iter().enumerate().skip(from).find(|(_, l)| pred(l)) {
                return (i, l.clone());
            }
            if g.1 {
                panic!(
                    "waiting for {what}: the pipe closed first; it said:\n{}",
                    g.0.join("\n")
                );
            }
            let now = Instant::now();
            if now >= deadline {
                panic!("waited {WAIT:?} for {what}; got:\n{}", g.0.join("\n"));
            }
            g = cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// [`Lines::wait_from`] from the start.
    pub fn wait(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.wait_from(0, what, pred).1
    }

    /// Waits until at least `n` lines were collected; returns the first `n`.
    pub fn wait_count(&self, n: usize, what: &str) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        let (m, cv) = &*self.0;
        let mut g = m.lock().unwrap();
        loop {
            if g.0.len() >= n {
                return g.0[..n].to_vec();
            }
            let now = Instant::now();
            if g.1 || now >= deadline {
                panic!(
                    "waiting for {n} lines of {what}; got {}:\n{}",
                    g.0.len(),
                    g.0.join("\n")
                );
            }
            g = cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// Waits until the pipe closes; returns everything.
    pub fn wait_closed(&self, what: &str) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        let (m, cv) = &*self.0;
        let mut g = m.lock().unwrap();
        while !g.1 {
            let now = Instant::now();
            if now >= deadline {
                panic!(
                    "waited {WAIT:?} for {what} to end; got:\n{}",
                    g.0.join("\n")
                );
            }
            g = cv.wait_timeout(g, deadline - now).unwrap().0;
        }
        g.0.clone()
    }
}

/// A running `aep-relay` (the relay itself), SIGKILLed on drop.
pub struct Relay {
    pub child: Child,
    pub addr: SocketAddr,
    pub stderr: Lines,
    pub stdin: Option<ChildStdin>,
}

impl Relay {
    /// Runs `aep-relay --listen 127.0.0.1:0 {args}` and waits for its start-up line.
    pub fn spawn(args: &[&str]) -> Relay {
        Relay::spawn_with(args, false, "127.0.0.1:0")
    }

    /// With `stdin`, standard input is a pipe kept in [`Relay::stdin`]; `listen` is the
    /// address to bind.
    pub fn spawn_with(args: &[&str], stdin: bool, listen: &str) -> Relay {
        let mut child = Command::new(bin())
            .args(["--listen", listen])
            .args(args)
            .env("AEP_LOG", "info")
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let stderr = Lines::collect(child.stderr.take().unwrap(), "relay");
        let line = stderr.wait("the start-up line", |l| {
            l.starts_with("aep-relay listening on ")
        });
        let addr = line["aep-relay listening on ".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|e| panic!("no address in {line:?}: {e}"));
        Relay {
            stdin: child.stdin.take(),
            child,
            addr,
            stderr,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// POSTs an NDJSON batch; returns (status, JSON body).
    pub fn post(&self, lines: &[String]) -> (u16, serde_json::Value) {
        let body = lines.join("\n") + "\n";
        let resp = agent()
            .post(&self.url("/events"))
            .set("AEP-Version", "0.1")
            .set("Content-Type", "application/x-ndjson")
            .send_string(&body);
        let resp = match resp {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("POST failed: {e}"),
        };
        let status = resp.status();
        let json = serde_json::from_str(&resp.into_string().unwrap()).unwrap();
        (status, json)
    }

    /// POSTs and asserts 202.
    pub fn post_ok(&self, lines: &[String]) {
        let (status, json) = self.post(lines);
        assert_eq!(status, 202, "POST answered {status} {json}");
    }

    /// Opens `GET /stream?{query}`.
    pub fn sse(&self, query: &str) -> Sse {
        let resp = agent()
            .get(&format!("{}?{query}", self.url("/stream")))
            .call()
            .expect("the stream opens");
        Sse {
            reader: BufReader::new(Box::new(resp.into_reader())),
        }
    }

    /// Every Event `from=all&live=0` replays, as (data, id) pairs; plus comments.
    pub fn replay_all(&self) -> Vec<String> {
        self.sse("from=all&live=0")
            .rest()
            .into_iter()
            .map(|m| m.data)
            .collect()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout_read(WAIT).build()
}

/// One SSE message.
#[derive(Debug, Default, Clone)]
pub struct Msg {
    pub id: Option<String>,
    pub data: String,
    /// Comments before it (heartbeats and the stream-open comment excluded).
    pub comments: Vec<String>,
}

pub struct Sse {
    reader: BufReader<Box<dyn Read + Send>>,
}

impl Sse {
    /// The next message; `None` at the end of the stream. A read waits at most [`WAIT`].
    pub fn next(&mut self) -> Option<Msg> {
        let mut m = Msg::default();
        let mut has = false;
        loop {
            let mut line = String::new();
            let n = self
                .reader
                .read_line(&mut line)
                .unwrap_or_else(|e| panic!("SSE read failed (waited {WAIT:?}?): {e}"));
            if n == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if has {
                    return Some(m);
                }
                continue;
            }
            if let Some(c) = line.strip_prefix(": ") {
                if c != "ping" && !c.starts_with("aep-relay") {
                    m.comments.push(c.to_string());
                }
            } else if let Some(v) = line.strip_prefix("data: ") {
                m.data = v.to_string();
                has = true;
            } else if let Some(v) = line.strip_prefix("id: ") {
                m.id = Some(v.to_string());
            }
        }
    }

    pub fn expect(&mut self) -> Msg {
        self.next().expect("the stream ended early")
    }

    pub fn rest(&mut self) -> Vec<Msg> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

/// A valid sequenced Event of `agent`/`session` at (0, `seq`).
pub fn ev(agent: &str, session: &str, seq: u64) -> String {
    serde_json::json!({
        "aep": "0.1", "id": format!("{seq}"), "type": "tool.completed",
        "time": "2026-07-03T10:00:00Z",
        "source": format!("aep://test/agent/{agent}/session/{session}"),
        "agent": agent, "session": session, "seq": seq
    })
    .to_string()
}

/// A fresh, empty directory for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("aep-relay-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `../shared/{rel}`, or `None` after saying it is absent.
pub fn shared(rel: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared")
        .join(rel);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("SKIPPED: fixture {} is absent (../shared)", p.display());
        None
    }
}

/// Every regular file under `dir`, recursively, but a history root's lock file (`DIR/.aep-relay.lock`).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if d == dir && e.file_name() == aep_relay::history::LOCK_FILE {
                // The history root's lock file, not a session log.
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}
