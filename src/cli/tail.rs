//! `aep-relay tail URL`: follows a relay's SSE stream (AEP-0003 §3.3) and prints each
//! Event's `data:` (the Event's original bytes) as one JSONL line on standard output.
//!
//! # Resume
//!
//! `tail` remembers, per owning stream `(source, session)` (AEP-0001 §5.2: two emitters
//! that send one `session` string are two sessions sharing a name), the highest
//! `(epoch, seq)` it printed: the position from the SSE `id:`, its session
//! `%XX`-unescaped by `subscription::parse_last_event_id` (so a resume names exactly the session
//! the Event carried, whatever its bytes), and `source` from the Event's bytes
//! (`Event::scan`). When the stream ends or fails (relay restart, network, no byte for
//! `--idle-timeout-secs` although the relay sends a heartbeat every 15 s), it reconnects
//! with a growing pause (0.1 s doubling to 2 s) and asks for what follows:
//!
//! - started with `--from all`: `from=all` again;
//! - otherwise: `from=[{session, epoch, seq}, …]` naming each bare session printed so
//!   far once, at the *lowest* last printed position of its streams (a resume position
//!   names only the bare session and the relay replays every stream of that name strictly
//!   after it, AEP-0001 §7 #6, AEP-0003 §7); at most the 1000 most recently printed names
//!   (the relay's default `AEP_MAX_FROM`, with a warning), and the `--from` positions of
//!   sessions not printed yet.
//!
//! On the new connection each stream skips its sequenced Events at or below what it had
//! printed before the reconnection, whenever the relay replays them again (`from=all`, or
//! its name was named below it): the AEP-0003 §7 resume rule applied client-side, per
//! stream. So a stream at seq 3 is not cut off by a same-named stream at seq 50, and a
//! stream never printed before comes in full (from `from=all`, or strictly after the
//! named position). A backfill (AEP-0001 §7 #2) arriving later on that connection is
//! printed when above that mark, and always for a stream the relay resumes at its own
//! position. A session whose first Event arrives while `tail` is disconnected is not
//! named, and a new emitter of a printed name only comes back strictly after that name's
//! lowest printed position; `--from all` catches both.
//!
//! Events without a position (foreign-emitter session Events such as `attention.routed`
//! and commands, which a resume may deliver again, AEP-0003 §7) are skipped when their
//! `(source, id)` is among the last 65 536 such Events printed. So no Event is printed
//! twice and none is missed while the relay still holds it; when it no longer does, the
//! relay says `replay-exhausted` and `tail` reports it on standard error.
//!
//! Exit status: 0 at the end of a `--live=0` replay, which the relay marks with
//! `: replay-complete` (a replay closed without it was cut, and is resumed; one that
//! brings nothing new and still ends without it exits 2), or when standard output is closed;
//! 1 when `--live=0` cannot reach the relay at all (a live `tail` keeps trying, like
//! `tail -F`); 2 for a refused request (400 `invalid-filter`, 401, 403, 404, …: retrying
//! would not help), a failed TLS handshake of the same kind (the relay's certificate is
//! not trusted, or not valid for the URL's host; no TLS there) or bad arguments
//! (including a `--cacert` that is not a PEM certificate file). Everything else is
//! retried.
//!
//! # TLS
//!
//! An `https://` URL is followed over TLS with rustls (`aep_check::tls`, the client
//! `aep-relay check` uses too): the system's root certificates, or with `--cacert FILE`
//! exactly the certificates of that PEM file (a private CA, or the relay's self-signed
//! certificate).

use aep_relay::subscription::{self, Resume};
use aep_relay::wire::envelope::{Capture, Event, Scope};
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
    /// The relay, `http://HOST:PORT` or `https://HOST:PORT` (its `/stream` is used), or
    /// the full URL of an SSE stream.
    url: String,
    /// For an https:// URL: trust exactly the certificates of this PEM file (a private
    /// CA, or the relay's self-signed certificate) instead of the system's roots.
    #[arg(long, value_name = "FILE")]
    cacert: Option<std::path::PathBuf>,
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

/// A position `(epoch, seq)` in one owning stream (AEP-0001 §7 #3: ordered
/// lexicographically, the tuple order).
type Pos = (u64, u64);

/// One owning stream `(source, session)` that `tail` has printed from (AEP-0001 §5.2).
struct Stream {
    /// The Event's `source` attribute, verbatim (empty when the bytes did not scan).
    source: String,
    /// Highest printed position.
    last: Pos,
    /// On the current connection, the stream's sequenced Events at or below this are
    /// already printed and skipped: set on resume when the relay will replay them again
    /// (`from=all`, or the bare name was named below this stream's `last`).
    skip_upto: Option<Pos>,
}

/// What was printed under one bare session name: every stream of that name.
struct Name {
    /// Its streams, in the order first printed (almost always one).
    streams: Vec<Stream>,
    /// When the name last printed (a counter), to name the most recent on resume.
    recency: u64,
}

/// What `tail` has printed, for resuming.
#[derive(Default)]
struct Progress {
    /// Printed positions per bare session, then per stream of that name.
    names: HashMap<String, Name>,
    clock: u64,
    /// `(source, id)` of recently printed Events without a position.
    foreign: HashSet<(String, String)>,
    foreign_order: VecDeque<(String, String)>,
}

impl Progress {
    /// Whether to print the Event (and records it when so). A sequenced Event (an `id:`
    /// giving `session:epoch:seq`) belongs to the stream of its `source` and that
    /// session; it is skipped when at or below its own stream's `skip_upto`.
    fn admit(&mut self, id: Option<&str>, data: &[u8]) -> bool {
        let ev = Event::scan(Bytes::copy_from_slice(data)).ok();
        if let Some(p) = id.and_then(subscription::parse_last_event_id) {
            let source = ev.as_ref().map_or("", |e| e.source());
            let pos = (p.epoch, p.seq);
            self.clock += 1;
            let name = self.names.entry(p.session).or_insert_with(|| Name {
                streams: Vec::new(),
                recency: 0,
            });
            name.recency = self.clock;
            match name.streams.iter_mut().find(|s| s.source == source) {
                Some(s) => {
                    if s.skip_upto.is_some_and(|k| pos <= k) {
                        return false;
                    }
                    s.last = s.last.max(pos);
                }
                None => name.streams.push(Stream {
                    source: source.to_string(),
                    last: pos,
                    skip_upto: None,
                }),
            }
            return true;
        }
        let Some(ev) = ev else {
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

    /// Prepares the next connection's resume filter for a `from=all` replay: every stream
    /// comes again in full, so each skips what it printed.
    fn resume_all(&mut self) {
        for s in self.names.values_mut().flat_map(|n| n.streams.iter_mut()) {
            s.skip_upto = Some(s.last);
        }
    }

    /// Names bare session `name` in the next `from`: returns the lowest printed position
    /// of its streams (the relay replays each stream of the name strictly after it,
    /// AEP-0003 §7), and makes every stream printed beyond it skip up to its own `last`.
    /// `None` when nothing of `name` was printed.
    fn resume_name(&mut self, name: &str) -> Option<Pos> {
        let n = self.names.get_mut(name)?;
        let named = n.streams.iter().map(|s| s.last).min()?;
        for s in &mut n.streams {
            s.skip_upto = (s.last > named).then_some(s.last);
        }
        Some(named)
    }
}

/// How a connection ended.
enum End {
    /// The relay closed the stream.
    Eof,
    /// The relay said `: replay-complete`, then closed the stream (`--live=0`).
    Complete,
    /// Standard output is gone.
    OutputClosed,
    /// A read failed (timeout, reset).
    Failed(String),
}

struct Tail {
    stream_url: String,
    filter: Option<String>,
    capture: Option<String>,
    initial: Resume,
    token: Option<String>,
    live: bool,
    agent: ureq::Agent,
    progress: Progress,
    /// Events printed on the current connection.
    printed: usize,
}

impl Tail {
    /// The `from` of the next request, `None` for live only; sets the resume filter
    /// each printed stream applies on that connection.
    fn next_from(&mut self) -> Option<String> {
        let p = &mut self.progress;
        for s in p.names.values_mut().flat_map(|n| n.streams.iter_mut()) {
            s.skip_upto = None;
        }
        let initial = match &self.initial {
            Resume::All => {
                p.resume_all();
                return Some("all".into());
            }
            Resume::Positions(ps) => &ps[..],
            _ => &[],
        };
        let mut map: Vec<(String, Pos)> = initial
            .iter()
            .filter(|q| !p.names.contains_key(&q.session))
            .map(|q| (q.session.clone(), (q.epoch, q.seq)))
            .collect();
        let mut seen: Vec<(u64, &String)> = p.names.iter().map(|(s, n)| (n.recency, s)).collect();
        // The relay answers a longer `from` with 400 limit-exceeded: name the most recently
        // printed session names, each once whatever its number of streams (the others may
        // miss Events while away).
        let room = MAX_FROM.saturating_sub(map.len());
        if seen.len() > room {
            eprintln!(
                "aep-relay tail: {} sessions printed; resuming the {room} most recent (AEP_MAX_FROM), the others may miss Events (use --from all)",
                seen.len()
            );
            seen.sort_by_key(|e| std::cmp::Reverse(e.0));
            seen.truncate(room);
        }
        let kept: Vec<String> = seen.into_iter().map(|(_, s)| s.clone()).collect();
        for name in kept {
            if let Some(pos) = p.resume_name(&name) {
                map.push((name, pos));
            }
        }
        if map.is_empty() {
            return None;
        }
        map.sort();
        let arr: Vec<serde_json::Value> = map
            .into_iter()
            .map(|(s, (e, q))| serde_json::json!({"session": s, "epoch": e, "seq": q}))
            .collect();
        Some(serde_json::Value::Array(arr).to_string())
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
    fn pump(&mut self, reader: impl Read, out: &mut impl Write) -> End {
        let mut r = BufReader::with_capacity(64 * 1024, reader);
        let mut line = Vec::new();
        let mut id: Option<String> = None;
        let mut data: Vec<u8> = Vec::new();
        let mut has_data = false;
        let mut complete = false;
        self.printed = 0;
        loop {
            if r.buffer().is_empty() {
                // About to wait for the network: let what was printed out.
                if out.flush().is_err() {
                    return End::OutputClosed;
                }
            }
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) if complete => return End::Complete,
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
                if has_data && self.progress.admit(id.as_deref(), &data) {
                    data.push(b'\n');
                    if out.write_all(&data).is_err() {
                        return End::OutputClosed;
                    }
                    self.printed += 1;
                }
                id = None;
                data.clear();
                has_data = false;
                continue;
            }
            if let Some(comment) = line.strip_prefix(b":") {
                let c = String::from_utf8_lossy(comment);
                if c.trim() == "replay-complete" {
                    complete = true;
                } else if let Some(rest) = c.trim_start().strip_prefix("replay-exhausted ") {
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
    match tail_of(args) {
        Ok(tail) => follow(tail),
        Err(code) => code,
    }
}

/// The follower `args` describe, or the exit code of a usage error (said on stderr).
fn tail_of(args: TailArgs) -> Result<Tail, ExitCode> {
    let Ok(idle) = Duration::try_from_secs_f64(args.idle_timeout_secs) else {
        return Err(fail(
            "--idle-timeout-secs must be a positive number of seconds",
        ));
    };
    let (agent, rest) = super::client(
        &args.url,
        args.cacert.as_deref(),
        idle.max(Duration::from_millis(100)),
    )
    .map_err(fail)?;
    let stream_url = match rest.find('/') {
        None => format!("{}/stream", args.url),
        Some(i) if rest[i..] == *"/" => format!("{}stream", args.url),
        Some(_) => args.url.clone(),
    };
    if let Some(f) = &args.filter {
        if let Err(e) = serde_json::from_str::<serde_json::Value>(f) {
            return Err(fail(format!("--filter is not JSON: {e}")));
        }
    }
    if let Some(c) = &args.capture {
        if Capture::parse(c).is_none() {
            return Err(fail(format!(
                "--capture must be none, metadata, redacted or full, got {c:?}"
            )));
        }
    }
    let initial = match &args.from {
        None => Resume::Live,
        Some(s) if s == "all" => Resume::All,
        Some(s) => {
            let v: serde_json::Value = match serde_json::from_str(s) {
                Ok(v) => v,
                Err(e) => return Err(fail(format!("--from is neither `all` nor JSON: {e}"))),
            };
            match subscription::parse_from_value(&v, usize::MAX) {
                Ok(f) => f,
                Err(e) => return Err(fail(format!("--from: {}", e.detail))),
            }
        }
    };
    Ok(Tail {
        stream_url,
        filter: args.filter,
        capture: args.capture,
        initial,
        token: args.token,
        live: args.live,
        agent,
        progress: Progress::default(),
        printed: 0,
    })
}

/// Follows the stream, reconnecting with backoff, until it is complete (not `--live`),
/// the output closes, or the relay refuses for good; returns the exit code.
fn follow(mut tail: Tail) -> ExitCode {
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(64 * 1024, stdout.lock());
    let mut resumed = false;
    let mut backoff = BACKOFF_MIN;
    let mut down_since_reported = false;
    let mut ever_connected = false;
    loop {
        let from = tail.next_from();
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
                match tail.pump(resp.into_reader(), &mut out) {
                    End::OutputClosed => return ExitCode::SUCCESS,
                    End::Complete if !tail.live => {
                        let _ = out.flush();
                        return ExitCode::SUCCESS;
                    }
                    // A replay that ends without `: replay-complete` was cut: resume it
                    // from the last positions printed, unless the last attempt already
                    // brought nothing new (a relay that never says it).
                    End::Eof if !tail.live && tail.printed == 0 && resumed => {
                        let _ = out.flush();
                        return fail(format!(
                            "{url}: the replay ended without `: replay-complete`; Events may be missing"
                        ));
                    }
                    End::Eof if !tail.live => {
                        "the replay ended without `: replay-complete`".to_string()
                    }
                    End::Complete | End::Eof => "the relay closed the stream".to_string(),
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
            // An untrusted or mismatched certificate, or no TLS at that address: the
            // same on every attempt.
            Err(e) if aep_check::tls::failure(&e).is_some() => {
                let _ = out.flush();
                let why = aep_check::tls::failure(&e).map(ToString::to_string);
                return fail(format!("{url}: {}", why.unwrap_or_default()));
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

    fn tail(initial: Resume) -> Tail {
        Tail {
            stream_url: "http://x/stream".into(),
            filter: None,
            capture: None,
            initial,
            token: None,
            live: true,
            agent: ureq::agent(),
            progress: Progress::default(),
            printed: 0,
        }
    }

    /// A sequenced Event's SSE message from emitter `agent` of `session` at (0, `seq`).
    fn msg(agent: &str, session: &str, seq: u64) -> String {
        format!(
            "id: {session}:0:{seq}\ndata: {{\"id\":\"{seq}\",\"source\":\"aep://h/agent/{agent}\",\"session\":\"{session}\",\"seq\":{seq}}}\n\n"
        )
    }

    fn last(t: &Tail, session: &str, agent: &str) -> Pos {
        let src = format!("aep://h/agent/{agent}");
        t.progress.names[session]
            .streams
            .iter()
            .find(|s| s.source == src)
            .unwrap()
            .last
    }

    /// `--live=0` ends well only at `: replay-complete`: a stream closed without it was
    /// cut (the relay evicted a session mid-replay, or the connection broke).
    #[test]
    fn pump_tells_a_complete_replay_from_a_cut_one() {
        let ev = "event: tool.completed\nid: s:0:3\ndata: {\"a\":1}\n\n";
        let mut t = tail(Resume::Live);
        let mut out = Vec::new();
        let wire = format!(": aep-relay stream open\n\n{ev}: replay-complete\n\n");
        assert!(matches!(t.pump(wire.as_bytes(), &mut out), End::Complete));
        assert_eq!((t.printed, out), (1, b"{\"a\":1}\n".to_vec()));
        let mut t = tail(Resume::Live);
        let wire = format!(": aep-relay stream open\n\n{ev}");
        assert!(matches!(t.pump(wire.as_bytes(), &mut Vec::new()), End::Eof));
    }

    #[test]
    fn pump_prints_data_and_tracks_positions() {
        let mut t = tail(Resume::Live);
        let routed = r#"{"aep":"0.1","id":"r1","type":"attention.routed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/b","agent":"b","session":"s"}"#;
        let wire = format!(
            ": aep-relay stream open\n\nevent: tool.completed\nid: s:0:3\ndata: {{\"a\":1}}\n\n: ping\n\nevent: attention.routed\ndata: {routed}\n\n: replay-exhausted s 0:2\n\nevent: attention.routed\ndata: {routed}\n\n"
        );
        let mut out = Vec::new();
        assert!(matches!(t.pump(wire.as_bytes(), &mut out), End::Eof));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{{\"a\":1}}\n{routed}\n")
        );
        assert_eq!(t.progress.names["s"].streams[0].last, (0, 3));
        assert_eq!(
            t.next_from().as_deref(),
            Some(r#"[{"session":"s","epoch":0,"seq":3}]"#)
        );
        // from=all: a replayed Event at or below the printed position is skipped.
        t.initial = Resume::All;
        let again = "id: s:0:3\ndata: {\"a\":1}\n\nid: s:0:4\ndata: {\"a\":2}\n\n";
        let mut out = Vec::new();
        assert_eq!(t.next_from().as_deref(), Some("all"));
        t.pump(again.as_bytes(), &mut out);
        assert_eq!(out, b"{\"a\":2}\n");
        assert!(t.request_url(&Some("all".into())).ends_with("?from=all"));
    }

    /// AEP-0001 §5.2, AEP-0003 §7: two emitters' same-named sessions are two streams; the
    /// resume names the bare session once at the lower printed position, and each stream
    /// skips only what it printed itself.
    #[test]
    fn same_named_streams_resume_from_the_lower_and_skip_their_own() {
        let mut t = tail(Resume::Live);
        let mut wire: String = (0..=50).map(|q| msg("a", "s", q)).collect();
        wire.extend((0..=3).map(|q| msg("b", "s", q)));
        let mut out = Vec::new();
        t.pump(wire.as_bytes(), &mut out);
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 55);
        assert_eq!((last(&t, "s", "a"), last(&t, "s", "b")), ((0, 50), (0, 3)));
        assert_eq!(
            t.next_from().as_deref(),
            Some(r#"[{"session":"s","epoch":0,"seq":3}]"#)
        );
        // The relay's replay after s:0:3: a 4..=52 (4..=50 printed already), b 4..=5, and
        // a third emitter `c` never printed before, strictly after the named position.
        let mut again: String = (4..=52).map(|q| msg("a", "s", q)).collect();
        again.extend((4..=5).map(|q| msg("b", "s", q)));
        again.extend((4..=5).map(|q| msg("c", "s", q)));
        let mut out = Vec::new();
        t.pump(again.as_bytes(), &mut out);
        let printed: Vec<String> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                format!(
                    "{}{}",
                    v["source"]
                        .as_str()
                        .unwrap()
                        .strip_prefix("aep://h/agent/")
                        .unwrap(),
                    v["seq"]
                )
            })
            .collect();
        assert_eq!(printed, ["a51", "a52", "b4", "b5", "c4", "c5"]);
        assert_eq!(
            t.next_from().as_deref(),
            Some(r#"[{"session":"s","epoch":0,"seq":5}]"#)
        );
    }

    /// The resume filter skips only what was printed before the reconnection: a backfill
    /// (AEP-0001 §7 #2) below the stream's high-water arriving live afterwards is
    /// printed, with `from=all` and with a stream named at its own position (which the
    /// relay resumes exactly, so it is not filtered at all).
    #[test]
    fn live_backfill_after_a_resume_is_printed() {
        for initial in [Resume::Live, Resume::All] {
            let mut t = tail(initial);
            let mut out = Vec::new();
            t.pump(msg("a", "s", 5).as_bytes(), &mut out);
            t.next_from();
            // `from=all` replays 0..=5 again, `from=[s:0:5]` nothing; then 7 and the
            // backfills 6 and 2 arrive live.
            let (wire, want): (&[u64], &[u64]) = match t.initial {
                Resume::All => (&[0, 5, 7, 6, 2], &[7, 6]),
                _ => (&[7, 6, 2], &[7, 6, 2]),
            };
            let wire: String = wire.iter().map(|&q| msg("a", "s", q)).collect();
            let mut out = Vec::new();
            t.pump(wire.as_bytes(), &mut out);
            let seqs: Vec<u64> = String::from_utf8(out)
                .unwrap()
                .lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                        .as_u64()
                        .unwrap()
                })
                .collect();
            assert_eq!(seqs, want);
            assert_eq!(last(&t, "s", "a"), (0, 7));
        }
    }

    #[test]
    fn a_resume_names_at_most_max_from_sessions_the_most_recent() {
        let mut t = tail(Resume::Live);
        for i in 0..1500 {
            assert!(t.progress.admit(Some(&format!("s{i}:0:1")), b"{}"));
            // A second stream of the same name does not take a second entry.
            let other = format!(r#"{{"source":"aep://h/agent/b","session":"s{i}"}}"#);
            assert!(t
                .progress
                .admit(Some(&format!("s{i}:0:2")), other.as_bytes()));
        }
        let from = t.next_from();
        let v: serde_json::Value = serde_json::from_str(&from.unwrap()).unwrap();
        let names: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["session"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), MAX_FROM);
        assert!(!names.contains(&"s499") && names.contains(&"s500") && names.contains(&"s1499"));
        assert!(
            v.as_array().unwrap().iter().all(|p| p["seq"] == 1),
            "the lower"
        );
    }
}
