//! `aep-relay tail URL`: follows a relay's SSE stream (AEP-0003 §3.3) and prints each
//! Event's `data:` (the Event's original bytes) as one JSONL line on standard output.
//!
//! # Resume
//!
//! `tail` remembers, per session, the highest `(epoch, seq)` it printed (from the SSE
//! `id:`, its session `%XX`-unescaped by `sse::parse_last_event_id`, so a resume names
//! exactly the session the Event carried, whatever its bytes). When the stream ends or fails (relay restart, network, no byte for
//! `--idle-timeout-secs` although the relay sends a heartbeat every 15 s), it reconnects
//! with a growing pause (0.1 s doubling to 2 s) and asks for what follows:
//!
//! - started with `--from all`: `from=all` again, and Events at or below a printed
//!   position of their session are skipped (the AEP-0003 §7 resume rule applied
//!   client-side), so every held session is caught up, including sessions that began
//!   while `tail` was disconnected;
//! - otherwise: `from=[{session, epoch, seq}, …]` with the last printed position of every
//!   session printed so far (the 1000 most recent when more: the relay's default
//!   `AEP_MAX_FROM`, with a warning), and the `--from` positions of sessions not printed
//!   yet.
//!   (A session whose first Event arrives while `tail` is disconnected is not named; use
//!   `--from all` to catch those too.)
//!
//! Events without a position (foreign-emitter session Events such as `attention.routed`
//! and commands, which a resume may deliver again, AEP-0003 §7) are skipped when their
//! `(source, id)` is among the last 65 536 such Events printed. So no Event is printed
//! twice and none is missed while the relay still holds it; when it no longer does, the
//! relay says `replay-exhausted` and `tail` reports it on standard error.
//!
//! Exit status: 0 at the end of a `--live=0` replay (or when standard output is closed);
//! 1 when `--live=0` cannot reach the relay at all (a live `tail` keeps trying, like
//! `tail -F`); 2 for a refused request (400 `invalid-filter`, 401, 403, 404, …: retrying
//! would not help) or bad arguments. Everything else is retried.

use aep_relay::envelope::{Capture, Event, Scope};
use aep_relay::sse::{self, From};
use bytes::Bytes;
use clap::{ArgAction, Args};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

/// Most positions one resume names: the relay's default `AEP_MAX_FROM`.
const MAX_FROM: usize = aep_relay::config::DEFAULT_MAX_FROM;
/// How many position-less Events are remembered for de-duplication.
const FOREIGN_WINDOW: usize = 65_536;
/// First and longest pause between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

fn parse_live(v: &str) -> Result<bool, String> {
    match v {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(format!("--live takes 0 or 1, got {v:?}")),
    }
}

/// `aep-relay tail` arguments.
#[derive(Args, Debug)]
pub struct TailArgs {
    /// The relay, `http://HOST:PORT` (its `/stream` is used), or the full URL of an SSE
    /// stream.
    url: String,
    /// An attr-match filter, as JSON (AEP-0003 §6), e.g. '{"type":["attention.*"]}'.
    #[arg(long, value_name = "JSON")]
    filter: Option<String>,
    /// Capture ceiling: none, metadata, redacted or full (AEP-0003 §6.4).
    #[arg(long, value_name = "LEVEL")]
    capture: Option<String>,
    /// Start with a replay: `all` (every held session) or a JSON array of
    /// {"session","epoch","seq"} positions to resume after. Live only when absent.
    #[arg(long, value_name = "POSITIONS|all")]
    from: Option<String>,
    /// Bearer token, sent as `Authorization: Bearer …` (AEP-0003 §8.1).
    #[arg(long, env = "AEP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// `--live=0`: print the replay and exit instead of following live Events.
    #[arg(long, value_name = "0|1", default_value = "1", value_parser = parse_live,
          action = ArgAction::Set)]
    live: bool,
    /// Seconds without a byte from the relay (heartbeats count) before the connection is
    /// given up and reopened.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    idle_timeout_secs: f64,
}

/// What `tail` has printed, for resuming.
#[derive(Default)]
struct Progress {
    /// Highest printed `(epoch, seq)` per session.
    last: HashMap<String, (u64, u64)>,
    /// When each session last printed (a counter), to name the most recent on resume.
    recency: HashMap<String, u64>,
    clock: u64,
    /// `(source, id)` of recently printed Events without a position.
    foreign: HashSet<(String, String)>,
    foreign_order: VecDeque<(String, String)>,
}

impl Progress {
    /// Whether to print the Event (and records it when so). `resume_filter`: skip
    /// sequenced Events at or below the printed position of their session.
    fn admit(&mut self, id: Option<&str>, data: &[u8], resume_filter: bool) -> bool {
        if let Some(p) = id.and_then(sse::parse_last_event_id) {
            let pos = (p.epoch, p.seq);
            self.clock += 1;
            match self.recency.get_mut(&p.session) {
                Some(t) => *t = self.clock,
                None => {
                    self.recency.insert(p.session.clone(), self.clock);
                }
            }
            match self.last.get_mut(&p.session) {
                Some(last) => {
                    if resume_filter && pos <= *last {
                        return false;
                    }
                    *last = (*last).max(pos);
                }
                None => {
                    self.last.insert(p.session, pos);
                }
            }
            return true;
        }
        let Ok(ev) = Event::scan(Bytes::copy_from_slice(data)) else {
            return true;
        };
        if ev.scope() == Scope::Agent {
            return true; // never replayed, so never repeated
        }
        let key = (ev.source().to_string(), ev.id().to_string());
        if self.foreign.contains(&key) {
            return false;
        }
        if self.foreign_order.len() >= FOREIGN_WINDOW {
            if let Some(old) = self.foreign_order.pop_front() {
                self.foreign.remove(&old);
            }
        }
        self.foreign.insert(key.clone());
        self.foreign_order.push_back(key);
        true
    }
}

/// How a connection ended.
enum End {
    /// The relay closed the stream.
    Eof,
    /// Standard output is gone.
    OutputClosed,
    /// A read failed (timeout, reset).
    Failed(String),
}

struct Tail {
    stream_url: String,
    filter: Option<String>,
    capture: Option<String>,
    initial: From,
    token: Option<String>,
    live: bool,
    agent: ureq::Agent,
    progress: Progress,
}

impl Tail {
    /// The `from` of the next request, `None` for live only; and whether the resume
    /// filter applies.
    fn next_from(&self, resumed: bool) -> (Option<String>, bool) {
        match &self.initial {
            From::All => (Some("all".into()), resumed),
            initial => {
                let mut map: Vec<(String, (u64, u64))> = match initial {
                    From::Positions(ps) => ps
                        .iter()
                        .filter(|p| !self.progress.last.contains_key(&p.session))
                        .map(|p| (p.session.clone(), (p.epoch, p.seq)))
                        .collect(),
                    _ => Vec::new(),
                };
                let mut seen: Vec<(u64, &String, (u64, u64))> = self
                    .progress
                    .last
                    .iter()
                    .map(|(s, p)| (self.progress.recency.get(s).copied().unwrap_or(0), s, *p))
                    .collect();
                // The relay answers a longer `from` with 400 limit-exceeded: name the most
                // recently printed sessions (the others may miss Events while away).
                let room = MAX_FROM.saturating_sub(map.len());
                if seen.len() > room {
                    eprintln!(
                        "aep-relay tail: {} sessions printed; resuming the {room} most recent (AEP_MAX_FROM), the others may miss Events (use --from all)",
                        seen.len()
                    );
                    seen.sort_by_key(|e| std::cmp::Reverse(e.0));
                    seen.truncate(room);
                }
                map.extend(seen.into_iter().map(|(_, s, p)| (s.clone(), p)));
                if map.is_empty() {
                    return (None, false);
                }
                map.sort();
                let arr: Vec<serde_json::Value> = map
                    .into_iter()
                    .map(|(s, (e, q))| serde_json::json!({"session": s, "epoch": e, "seq": q}))
                    .collect();
                (Some(serde_json::Value::Array(arr).to_string()), false)
            }
        }
    }

    fn request_url(&self, from: &Option<String>) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if let Some(f) = &self.filter {
            q.append_pair("filter", f);
        }
        if let Some(c) = &self.capture {
            q.append_pair("capture", c);
        }
        if let Some(f) = from {
            q.append_pair("from", f);
        }
        if !self.live {
            q.append_pair("live", "0");
        }
        let q = q.finish();
        if q.is_empty() {
            self.stream_url.clone()
        } else if self.stream_url.contains('?') {
            format!("{}&{q}", self.stream_url)
        } else {
            format!("{}?{q}", self.stream_url)
        }
    }

    /// Reads one connection's messages, printing Events.
    fn pump(&mut self, reader: impl Read, out: &mut impl Write, resume_filter: bool) -> End {
        let mut r = BufReader::with_capacity(64 * 1024, reader);
        let mut line = Vec::new();
        let mut id: Option<String> = None;
        let mut data: Vec<u8> = Vec::new();
        let mut has_data = false;
        loop {
            if r.buffer().is_empty() {
                // About to wait for the network: let what was printed out.
                if out.flush().is_err() {
                    return End::OutputClosed;
                }
            }
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) => return End::Eof,
                Ok(_) => {}
                Err(e) => return End::Failed(e.to_string()),
            }
            if line.last() != Some(&b'\n') {
                return End::Failed("the stream ended inside a line".into());
            }
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.is_empty() {
                if has_data && self.progress.admit(id.as_deref(), &data, resume_filter) {
                    data.push(b'\n');
                    if out.write_all(&data).is_err() {
                        return End::OutputClosed;
                    }
                }
                id = None;
                data.clear();
                has_data = false;
                continue;
            }
            if let Some(comment) = line.strip_prefix(b":") {
                let c = String::from_utf8_lossy(comment);
                if let Some(rest) = c.trim_start().strip_prefix("replay-exhausted ") {
                    let (session, earliest) = rest.rsplit_once(' ').unwrap_or((rest, "?"));
                    eprintln!(
                        "aep-relay tail: replay-exhausted: session {session}: the relay no longer holds the Events before {earliest}; some were missed"
                    );
                }
                continue;
            }
            let (field, value) = match memchr::memchr(b':', &line) {
                Some(i) => {
                    let v = &line[i + 1..];
                    (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (&line[..], &b""[..]),
            };
            match field {
                b"data" => {
                    if has_data {
                        data.push(b'\n');
                    }
                    data.extend_from_slice(value);
                    has_data = true;
                }
                b"id" => id = Some(String::from_utf8_lossy(value).into_owned()),
                _ => {}
            }
        }
    }
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("aep-relay tail: {msg}");
    ExitCode::from(2)
}

/// Runs `tail`.
pub fn run(args: TailArgs) -> ExitCode {
    let Some(rest) = args.url.strip_prefix("http://") else {
        return fail(format!(
            "{}: only http:// URLs are supported by this build (put a TLS-terminating proxy's plain endpoint, or run tail on the relay's host)",
            args.url
        ));
    };
    let stream_url = match rest.find('/') {
        None => format!("{}/stream", args.url),
        Some(i) if rest[i..] == *"/" => format!("{}stream", args.url),
        Some(_) => args.url.clone(),
    };
    if let Some(f) = &args.filter {
        if let Err(e) = serde_json::from_str::<serde_json::Value>(f) {
            return fail(format!("--filter is not JSON: {e}"));
        }
    }
    if let Some(c) = &args.capture {
        if Capture::parse(c).is_none() {
            return fail(format!(
                "--capture must be none, metadata, redacted or full, got {c:?}"
            ));
        }
    }
    let initial = match &args.from {
        None => From::Live,
        Some(s) if s == "all" => From::All,
        Some(s) => {
            let v: serde_json::Value = match serde_json::from_str(s) {
                Ok(v) => v,
                Err(e) => return fail(format!("--from is neither `all` nor JSON: {e}")),
            };
            match sse::parse_from_value(&v, usize::MAX) {
                Ok(f) => f,
                Err(e) => return fail(format!("--from: {}", e.detail)),
            }
        }
    };
    let Ok(idle) = Duration::try_from_secs_f64(args.idle_timeout_secs) else {
        return fail("--idle-timeout-secs must be a positive number of seconds");
    };
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout_read(idle.max(Duration::from_millis(100)))
        .build();
    let mut tail = Tail {
        stream_url,
        filter: args.filter,
        capture: args.capture,
        initial,
        token: args.token,
        live: args.live,
        agent,
        progress: Progress::default(),
    };
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(64 * 1024, stdout.lock());
    let mut resumed = false;
    let mut backoff = BACKOFF_MIN;
    let mut down_since_reported = false;
    let mut ever_connected = false;
    loop {
        let (from, filter) = tail.next_from(resumed);
        let url = tail.request_url(&from);
        let mut req = tail.agent.get(&url).set("Accept", "text/event-stream");
        if let Some(t) = &tail.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let why = match req.call() {
            Ok(resp) => {
                if resumed {
                    eprintln!(
                        "aep-relay tail: reconnected; resuming from {}",
                        from.as_deref().unwrap_or("live (no position printed yet)")
                    );
                } else {
                    eprintln!("aep-relay tail: following {url}");
                }
                down_since_reported = false;
                ever_connected = true;
                backoff = BACKOFF_MIN;
                match tail.pump(resp.into_reader(), &mut out, filter) {
                    End::OutputClosed => return ExitCode::SUCCESS,
                    End::Eof if !tail.live => {
                        let _ = out.flush();
                        return ExitCode::SUCCESS;
                    }
                    End::Eof => "the relay closed the stream".to_string(),
                    End::Failed(e) => e,
                }
            }
            Err(ureq::Error::Status(code, resp)) => {
                let body = resp.into_string().unwrap_or_default();
                if matches!(code, 408 | 429) || code >= 500 {
                    format!("HTTP {code}: {}", body.trim())
                } else {
                    let _ = out.flush();
                    return fail(format!("{url}: HTTP {code}: {}", body.trim()));
                }
            }
            Err(e) if !tail.live && !ever_connected => {
                eprintln!("aep-relay tail: {url}: {e}");
                return ExitCode::from(1);
            }
            Err(e) => e.to_string(),
        };
        if out.flush().is_err() {
            return ExitCode::SUCCESS;
        }
        if !down_since_reported {
            eprintln!("aep-relay tail: disconnected: {why}; reconnecting");
            down_since_reported = true;
        }
        resumed = true;
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pump_prints_data_and_tracks_positions() {
        let mut t = Tail {
            stream_url: "http://x/stream".into(),
            filter: None,
            capture: None,
            initial: From::Live,
            token: None,
            live: true,
            agent: ureq::agent(),
            progress: Progress::default(),
        };
        let routed = r#"{"aep":"0.1","id":"r1","type":"attention.routed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/b","agent":"b","session":"s"}"#;
        let wire = format!(
            ": aep-relay stream open\n\nevent: tool.completed\nid: s:0:3\ndata: {{\"a\":1}}\n\n: ping\n\nevent: attention.routed\ndata: {routed}\n\n: replay-exhausted s 0:2\n\nevent: attention.routed\ndata: {routed}\n\n"
        );
        let mut out = Vec::new();
        assert!(matches!(t.pump(wire.as_bytes(), &mut out, false), End::Eof));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{{\"a\":1}}\n{routed}\n")
        );
        assert_eq!(t.progress.last["s"], (0, 3));
        let (from, filter) = t.next_from(true);
        assert_eq!(
            from.as_deref(),
            Some(r#"[{"session":"s","epoch":0,"seq":3}]"#)
        );
        assert!(!filter);
        // from=all: a replayed Event at or below the printed position is skipped.
        t.initial = From::All;
        let again = "id: s:0:3\ndata: {\"a\":1}\n\nid: s:0:4\ndata: {\"a\":2}\n\n";
        let mut out = Vec::new();
        let (_, filter) = t.next_from(true);
        t.pump(again.as_bytes(), &mut out, filter);
        assert_eq!(out, b"{\"a\":2}\n");
        assert!(t.request_url(&Some("all".into())).ends_with("?from=all"));
    }

    #[test]
    fn a_resume_names_at_most_max_from_sessions_the_most_recent() {
        let mut t = Tail {
            stream_url: "http://x/stream".into(),
            filter: None,
            capture: None,
            initial: From::Live,
            token: None,
            live: true,
            agent: ureq::agent(),
            progress: Progress::default(),
        };
        for i in 0..1500 {
            assert!(t.progress.admit(Some(&format!("s{i}:0:1")), b"{}", false));
        }
        let (from, _) = t.next_from(true);
        let v: serde_json::Value = serde_json::from_str(&from.unwrap()).unwrap();
        let names: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["session"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), MAX_FROM);
        assert!(!names.contains(&"s499") && names.contains(&"s500") && names.contains(&"s1499"));
    }
}
