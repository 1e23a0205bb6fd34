//! The checks, in the order of [`super::CHECKS`]. Each one sets up its own `live-`
//! session(s), so a check's verdict never depends on another's.
//!
//! A check is a method returning [`Outcome`]: `Ok(detail)` is a PASS, `Err(Verdict)` a
//! FAIL or SKIP with its reason. `?` on a `Result<_, String>` turns the message into a
//! FAIL.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use super::client::{query, Ended, Http, SseItem, Target};
use super::tls::Client;
use super::ws::{ConnectError, Incoming, Ws};
use super::{rfc3339, CheckResult, Options, Status, CHECKS};

/// Why a check did not pass.
pub(super) enum Verdict {
    Fail(String),
    Skip(String),
}

impl From<String> for Verdict {
    fn from(s: String) -> Verdict {
        Verdict::Fail(s)
    }
}

impl From<&str> for Verdict {
    fn from(s: &str) -> Verdict {
        Verdict::Fail(s.to_string())
    }
}

type Outcome = Result<String, Verdict>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(Verdict::Fail(format!($($msg)+)));
        }
    };
}

fn skip<T>(why: impl Into<String>) -> Result<T, Verdict> {
    Err(Verdict::Skip(why.into()))
}

/// The closed refusal code set of `subscribe` (AEP-0003 §6.5).
const SUBSCRIBE_CODES: [&str; 4] = [
    "invalid-filter",
    "unknown-dialect",
    "unauthorized",
    "limit-exceeded",
];

/// The most Events `--evict` floods; a relay advertising more is skipped.
const MAX_FLOOD: u64 = 100_000;

/// Runs every check, calling `each` as each one ends.
pub(super) fn run(
    opts: &Options,
    target: Target,
    tls: Option<Client>,
    mut each: impl FnMut(&CheckResult),
) -> Vec<CheckResult> {
    let mut cx = Ctx::new(opts, target, tls);
    let mut out = Vec::with_capacity(CHECKS.len());
    for &(id, section, title) in CHECKS {
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| cx.check(id))).unwrap_or_else(|_| {
            Err(Verdict::Fail(
                "the checker itself panicked (a bug in aep-relay check; please report it)".into(),
            ))
        });
        let (status, detail) = match outcome {
            Ok(d) => (Status::Pass, d),
            Err(Verdict::Fail(d)) => (Status::Fail, d),
            Err(Verdict::Skip(d)) => (Status::Skip, d),
        };
        let r = CheckResult {
            id,
            section,
            title,
            status,
            detail,
            elapsed: started.elapsed(),
        };
        each(&r);
        out.push(r);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Synthetic Events

/// A valid sequenced Event of the checker in `session` at `(epoch, seq)`; `extra` is
/// inserted before the closing brace (it starts with `,`). Its `id` is
/// `{session}-{epoch}-{seq}`.
fn synth(session: &str, epoch: u64, seq: u64, ty: &str, extra: &str) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{session}-{epoch}-{seq}","type":"{ty}","time":"{}","source":"aep://aep-relay-check/agent/aep-relay-check/session/{session}","agent":"aep-relay-check","session":"{session}","seq":{seq},"epoch":{epoch}{extra}}}"#,
        rfc3339(SystemTime::now())
    )
}

/// A command (AEP-0004 §2): `session` names the target, no `seq`.
fn command(session: &str, id: &str, ty: &str, data: &str) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{id}","type":"{ty}","time":"{}","source":"aep://aep-relay-check/agent/aep-relay-check-sender","agent":"aep-relay-check-sender","session":"{session}","data":{data}}}"#,
        rfc3339(SystemTime::now())
    )
}

/// A resume position as the `from` JSON wants it.
fn from(session: &str, epoch: u64, seq: u64) -> Value {
    json!([{ "session": session, "epoch": epoch, "seq": seq }])
}

/// `(type, session, epoch, seq)` of an Event line the checker built.
fn routing(line: &str) -> (String, String, u64, u64) {
    let v: Value = serde_json::from_str(line).unwrap_or_default();
    (
        v["type"].as_str().unwrap_or_default().to_string(),
        v["session"].as_str().unwrap_or_default().to_string(),
        v["epoch"].as_u64().unwrap_or(0),
        v["seq"].as_u64().unwrap_or(0),
    )
}

/// The messages of an SSE read, as `(event, id, data)`.
fn messages(items: &[SseItem]) -> Vec<(Option<&str>, Option<&str>, &str)> {
    items
        .iter()
        .filter_map(|i| match i {
            SseItem::Message { event, id, data } => {
                Some((event.as_deref(), id.as_deref(), data.as_str()))
            }
            SseItem::Comment(_) => None,
        })
        .collect()
}

/// The `replay-exhausted` comments of an SSE read.
fn exhausted_comments(items: &[SseItem]) -> Vec<&str> {
    items
        .iter()
        .filter_map(|i| match i {
            SseItem::Comment(c) => c.strip_prefix("replay-exhausted "),
            _ => None,
        })
        .collect()
}

/// Shortens a text for a detail.
fn short(s: &str) -> String {
    let mut out: String = s.chars().take(160).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// Reads an SSE `id:` the way a consumer does: `{session}:{epoch}:{seq}` (AEP-0003
/// §3.3 #2), the two numbers taken from the right (a session may hold `:`), then each
/// `%XX` of the session (hex, either case) decoded to its byte. `None` when the two
/// numbers are missing, a `%` is not followed by two hex digits, or the decoded session
/// is not UTF-8.
///
/// A relay escapes a session this way so that any session string fits one printable
/// `id:` line; this decoder follows the rule as docs/consuming.md ("How a session is written in
/// `id:`") documents it, written from that text and not from the relay's encoder, so the
/// checker judges the relay by what it sends, not by the relay's own code. It only
/// decodes: a resume sends back the `id:` the relay wrote, as an `EventSource` does.
fn parse_event_id(id: &str) -> Option<(String, u64, u64)> {
    let number = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let mut parts = id.rsplitn(3, ':');
    let seq = number(parts.next()?)?;
    let epoch = number(parts.next()?)?;
    let session = parts.next()?.as_bytes();
    let mut out = Vec::with_capacity(session.len());
    let mut i = 0;
    while i < session.len() {
        if session[i] == b'%' {
            let hex = |b: u8| char::from(b).to_digit(16);
            let hi = hex(*session.get(i + 1)?)?;
            let lo = hex(*session.get(i + 2)?)?;
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(session[i]);
            i += 1;
        }
    }
    Some((String::from_utf8(out).ok()?, epoch, seq))
}

/// Checks that SSE `items` carry exactly `want` (the posted lines, in order): each
/// `data:` byte-identical, `event:` its type, `id:` naming the Event's position,
/// `{session}:{epoch}:{seq}` (read by [`parse_event_id`]).
fn expect_sse_lines(items: &[SseItem], want: &[&String]) -> Result<(), Verdict> {
    let got = messages(items);
    for (i, line) in want.iter().enumerate() {
        let Some(&(event, id, data)) = got.get(i) else {
            return Err(Verdict::Fail(format!(
                "{} of {} expected messages arrived; missing {}",
                got.len(),
                want.len(),
                short(line)
            )));
        };
        let (ty, session, epoch, seq) = routing(line);
        ensure!(
            data == line.as_str(),
            "message {} is not the posted line byte for byte: got {}, posted {}",
            i + 1,
            short(data),
            short(line)
        );
        ensure!(
            event == Some(ty.as_str()),
            "message {} has event: {event:?}, expected {ty:?} (AEP-0003 §3.3 #2)",
            i + 1
        );
        let read = id.and_then(parse_event_id);
        ensure!(
            read.as_ref() == Some(&(session.clone(), epoch, seq)),
            "message {} has id: {id:?}, which names {read:?}, expected {session:?} at ({epoch}, {seq}) (AEP-0003 §3.3 #2)",
            i + 1
        );
    }
    ensure!(
        got.len() == want.len(),
        "{} messages arrived where {} were expected; the first extra one: {}",
        got.len(),
        want.len(),
        short(got[want.len()].2)
    );
    Ok(())
}

/// Checks a down-leveled delivery of `posted`: `capture` is `level`, none of
/// `forbidden` (free text the posted Event carried) appears anywhere in it, the
/// `kept` data paths are still there, and every member but `capture` and `data` is
/// unchanged (AEP-0001 §4.2).
fn expect_downleveled(
    posted: &str,
    delivered: &str,
    level: &str,
    forbidden: &[&str],
    kept: &[&str],
) -> Result<(), String> {
    let p: Value = serde_json::from_str(posted).map_err(|e| e.to_string())?;
    let d: Value = serde_json::from_str(delivered)
        .map_err(|e| format!("a delivered Event is not JSON ({e}): {}", short(delivered)))?;
    if d["capture"] != level {
        return Err(format!(
            "{} was delivered with capture {}, expected {level:?}",
            p["id"], d["capture"]
        ));
    }
    for f in forbidden {
        if delivered.contains(f) {
            return Err(format!(
                "{} reached the subscriber still carrying {f:?}: {}",
                p["id"],
                short(delivered)
            ));
        }
    }
    for path in kept {
        let mut v = &d["data"];
        for part in path.split('.') {
            v = &v[part];
        }
        if v.is_null() {
            return Err(format!(
                "{} lost data.{path}, which its ceiling allows: {}",
                p["id"],
                short(delivered)
            ));
        }
    }
    if level == "none" && !d["data"].is_null() {
        return Err(format!("{} kept data at capture none", p["id"]));
    }
    let strip = |v: &Value| -> Vec<(String, Value)> {
        v.as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| *k != "capture" && *k != "data")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    if strip(&p) != strip(&d) {
        return Err(format!(
            "{}: down-leveling changed envelope members other than capture and data (AEP-0001 §4.2)",
            p["id"]
        ));
    }
    Ok(())
}

/// The three Events the capture checks post to `session`: a `redacted` tool.failed with
/// a redacted-gated `error.message`, a `full` tool.completed with full- and
/// redacted-gated results, a `metadata` tool.completed.
fn capture_lines(session: &str) -> [String; 3] {
    [
        synth(
            session,
            0,
            1,
            "tool.failed",
            r#","capture":"redacted","data":{"tool":{"name":"Bash"},"error":{"type":"ExitError","message":"REDACTED-GATED free text"}}"#,
        ),
        synth(
            session,
            0,
            2,
            "tool.completed",
            r#","capture":"full","data":{"tool":{"name":"Bash"},"result":"FULL-GATED verbatim output","result_redacted":"REDACTED-GATED output","result_digest":"0123456789abcdef"}"#,
        ),
        synth(
            session,
            0,
            3,
            "tool.completed",
            r#","capture":"metadata","data":{"tool":{"name":"Bash"},"status":"success"}"#,
        ),
    ]
}

/// Checks the three capture Events as delivered at a `metadata` ceiling.
fn expect_metadata_ceiling(lines: &[String; 3], got: &[&str]) -> Result<(), String> {
    if got.len() != 3 {
        return Err(format!("{} of the 3 Events arrived", got.len()));
    }
    expect_downleveled(
        &lines[0],
        got[0],
        "metadata",
        &["REDACTED-GATED"],
        &["tool.name", "error.type"],
    )?;
    expect_downleveled(
        &lines[1],
        got[1],
        "metadata",
        &["FULL-GATED", "REDACTED-GATED"],
        &["tool.name", "result_digest"],
    )?;
    if got[2] != lines[2] {
        return Err(format!(
            "an Event already at the ceiling was not forwarded byte-identically: {}",
            short(got[2])
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The context

struct Ctx {
    opts: Options,
    target: Target,
    http: Http,
    /// The TLS client of an `https://` target (for `wss://` too).
    tls: Option<Client>,
    /// `live-{unix-ms}-{pid}`: the prefix of every session this run writes.
    run: String,
    events_ep: String,
    stream_ep: Option<String>,
    socket_ep: Option<String>,
    /// `capabilities` of the discovery document (`Null` when there was none).
    caps: Value,
    /// `capabilities` of the endpoint's WebSocket `hello` (`Null` before one was seen).
    hello_caps: Value,
    /// NDJSON lines per POST; halved on 413.
    batch: usize,
    /// The `--evict` flood: its session and lines (seq `i + 1` at index `i`).
    flood: Option<(String, Vec<String>)>,
    evict_sse: Option<(u64, u64)>,
    evict_ws: Option<(u64, u64)>,
}

impl Ctx {
    fn new(opts: &Options, target: Target, tls: Option<Client>) -> Ctx {
        let ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        Ctx {
            opts: opts.clone(),
            target,
            http: Http::new(opts.token.clone(), opts.timeout, tls.clone()),
            tls,
            run: format!("live-{ms}-{}", std::process::id()),
            events_ep: "/events".into(),
            stream_ep: Some("/stream".into()),
            socket_ep: None,
            caps: Value::Null,
            hello_caps: Value::Null,
            batch: 500,
            flood: None,
            evict_sse: None,
            evict_ws: None,
        }
    }

    fn check(&mut self, id: &str) -> Outcome {
        match id {
            "discovery" => self.discovery(),
            "version-gate" => self.version_gate(),
            "invalid-event" => self.invalid_event(),
            "batch-filtered-delivery" => self.batch_filtered_delivery(),
            "resume-sse" => self.resume_sse(),
            "capture-ceiling-sse" => self.capture_ceiling_sse(),
            "replay-all-sse" => self.replay_all_sse(),
            "ws-hello-first" => self.ws_hello_first(),
            "ws-version-refusal" => self.ws_version_refusal(),
            "ws-hello-reply" => self.ws_hello_reply(),
            "ws-ignore-unknown" => self.ws_ignore_unknown(),
            "ws-subscribe-refusals" => self.ws_subscribe_refusals(),
            "ws-resume" => self.ws_resume(),
            "ws-capture-ceiling" => self.ws_capture_ceiling(),
            "replay-all-ws" => self.replay_all_ws(),
            "roster" => self.roster(),
            "control-unauthenticated" => self.control_unauthenticated(),
            "control-no-route" => self.control_no_route(),
            "control-route" => self.control_route(),
            "control-ambiguous" => self.control_ambiguous(),
            "evict-sse" => self.evict_sse(),
            "evict-ws" => self.evict_ws(),
            "evict-agree" => self.evict_agree(),
            other => Err(Verdict::Fail(format!("no such check {other}"))),
        }
    }

    fn session(&self, purpose: &str) -> String {
        format!("{}-{purpose}", self.run)
    }

    fn events_url(&self) -> String {
        self.target.http(&self.events_ep)
    }

    fn stream_url(&self) -> Result<String, Verdict> {
        match &self.stream_ep {
            Some(ep) => Ok(self.target.http(ep)),
            None => skip("the discovery document advertises no stream endpoint (AEP-0003 §3.4)"),
        }
    }

    fn socket_url(&self) -> Result<String, Verdict> {
        match &self.socket_ep {
            Some(ep) => Ok(self.target.ws(ep)),
            None => skip(
                "the discovery document advertises no socket endpoint: no WebSocket binding to check (AEP-0003 §3.4)",
            ),
        }
    }

    /// Whether `capabilities` (discovery or `hello`) has `path`.
    fn advertises(&self, path: &[&str]) -> Option<&Value> {
        [&self.caps, &self.hello_caps].into_iter().find_map(|c| {
            let mut v = c;
            for p in path {
                v = v.get(p)?;
            }
            Some(v)
        })
    }

    fn replay_all_advertised(&self) -> bool {
        self.advertises(&["replay", "all"]) == Some(&Value::Bool(true))
    }

    /// The advertised replay buffer depth; `None` when the relay advertises none (it
    /// keeps no buffer: AEP-0003 §5 makes one OPTIONAL and its advertisement a MUST).
    fn buffer(&self) -> Option<u64> {
        self.advertises(&["replay", "buffer"])
            .and_then(Value::as_u64)
            .filter(|b| *b > 0)
    }

    /// `Err(Skip)` when the relay keeps no replay buffer.
    fn needs_buffer(&self) -> Result<u64, Verdict> {
        match self.buffer() {
            Some(b) => Ok(b),
            None => skip("the relay advertises no replay buffer (AEP-0003 §5: OPTIONAL), so there is nothing to replay"),
        }
    }

    /// Posts `lines` as NDJSON batches (halving a batch answered 413); every batch must
    /// be answered 202.
    fn post(&mut self, lines: &[String]) -> Result<(), Verdict> {
        let url = self.events_url();
        let mut i = 0;
        while i < lines.len() {
            let n = self.batch.min(lines.len() - i);
            let body = lines[i..i + n].join("\n") + "\n";
            let a = self
                .http
                .post(&url, "application/x-ndjson", Some("0.1"), &body)?;
            if a.status == 413 && n > 1 {
                self.batch = (n / 2).max(1);
                continue;
            }
            ensure!(
                a.status == 202,
                "POST {url} of {n} valid Event(s) answered {} (AEP-0003 §3.2 #3: 202)",
                a.show()
            );
            i += n;
        }
        Ok(())
    }

    /// Reads a replay-only stream (`live=0`) with `pairs` as the query, to its end (or
    /// the wait bound, for a relay that keeps it open).
    fn replay(
        &self,
        pairs: &[(&str, String)],
        headers: &[(&str, &str)],
    ) -> Result<Vec<SseItem>, Verdict> {
        let mut q: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        q.push(("live", "0"));
        let url = format!("{}?{}", self.stream_url()?, query(&q));
        let (items, _) = self.http.sse(&url, headers, |_| false)?;
        Ok(items)
    }

    /// Replays `session` strictly after `(epoch, seq)` with no filter.
    fn replay_after(&self, session: &str, epoch: u64, seq: u64) -> Result<Vec<SseItem>, Verdict> {
        self.replay(&[("from", from(session, epoch, seq).to_string())], &[])
    }

    fn ws(&self) -> Result<Ws, Verdict> {
        let url = self.socket_url()?;
        Ws::connect(
            &url,
            self.opts.token.as_deref(),
            self.opts.timeout,
            self.tls.as_ref(),
        )
        .map_err(|e| Verdict::Fail(format!("cannot open {url}: {e}")))
    }

    /// A connection that has completed the `hello` exchange as `role`.
    fn ws_hello(&mut self, role: &str, more: Value) -> Result<Ws, Verdict> {
        let mut ws = self.ws()?;
        let h = ws.hello(role, more)?;
        if self.hello_caps.is_null() {
            self.hello_caps = h["capabilities"].clone();
        }
        Ok(ws)
    }

    /// Subscribes `id` with `members` merged into the frame and waits for `subscribed`.
    fn subscribe(&self, ws: &mut Ws, id: &str, members: Value) -> Result<Vec<Incoming>, Verdict> {
        let mut frame = json!({ "type": "subscribe", "id": id });
        if let (Some(f), Some(m)) = (frame.as_object_mut(), members.as_object()) {
            for (k, v) in m {
                f.insert(k.clone(), v.clone());
            }
        }
        ws.send(&frame)?;
        let mut before = Vec::new();
        let reply = ws.expect(
            &format!("the answer to subscribe {id:?}"),
            &mut before,
            |m| {
                matches!(m, Incoming::Frame(v, _)
                if (v["type"] == "subscribed" || v["type"] == "error") && v["id"] == id)
            },
        )?;
        if let Incoming::Frame(v, _) = &reply {
            ensure!(
                v["type"] == "subscribed",
                "subscribe {id:?} was refused: {}",
                reply.show()
            );
        }
        Ok(before)
    }

    /// Reads `n` Events from `ws` (Events queued in `pending` first), failing on a
    /// `replay-exhausted` frame unless `marker` collects it.
    fn ws_events(
        &self,
        ws: &mut Ws,
        mut pending: Vec<Incoming>,
        n: usize,
        mut marker: Option<&mut Vec<(Value, usize)>>,
    ) -> Result<Vec<String>, Verdict> {
        let mut got = Vec::new();
        pending.reverse();
        let deadline_each = self.opts.timeout;
        while got.len() < n {
            let m = match pending.pop() {
                Some(m) => m,
                None => match ws.recv_until(Instant::now() + deadline_each)? {
                    Some(m) => m,
                    None => {
                        return Err(Verdict::Fail(format!(
                            "{} of {n} Events arrived within {deadline_each:?} of each other",
                            got.len()
                        )))
                    }
                },
            };
            match m {
                Incoming::Event(_, text) => got.push(text),
                Incoming::Frame(v, _) if v["type"] == "replay-exhausted" => match &mut marker {
                    Some(list) => list.push((v, got.len())),
                    None => {
                        return Err(Verdict::Fail(format!(
                            "an unexpected replay-exhausted frame: {v}"
                        )))
                    }
                },
                Incoming::Frame(v, _) if v["type"] == "error" => {
                    return Err(Verdict::Fail(format!(
                        "an error frame arrived while Events were expected: {v}"
                    )))
                }
                Incoming::Closed => {
                    return Err(Verdict::Fail(format!(
                        "the connection closed after {} of {n} Events",
                        got.len()
                    )))
                }
                _ => {}
            }
        }
        Ok(got)
    }

    // -----------------------------------------------------------------------------------
    // HTTP and SSE

    fn discovery(&mut self) -> Outcome {
        let url = self.target.http("/events");
        let a = self.http.get(&url, &[("Accept", "application/json")])?;
        ensure!(a.status == 200, "GET {url} answered {}", a.show());
        ensure!(
            a.content_type.starts_with("application/json"),
            "GET {url} answered Content-Type {:?}, not application/json",
            a.content_type
        );
        let Some(doc @ Value::Object(_)) = a.json() else {
            return Err(Verdict::Fail(format!(
                "GET {url} is not a JSON object: {}",
                a.show()
            )));
        };
        let versions = doc["aep"].as_array();
        ensure!(
            versions.is_some_and(|v| v.iter().any(|x| x == "0.1")),
            "`aep` must be an array of versions including \"0.1\", got {}",
            doc["aep"]
        );
        let eps = doc["endpoints"].as_object();
        ensure!(
            eps.is_some(),
            "`endpoints` (REQUIRED) is missing or not an object"
        );
        let eps = eps.cloned().unwrap_or_default();
        let ep = |k: &str| eps.get(k).and_then(Value::as_str).map(str::to_string);
        let events = ep("events");
        ensure!(
            events.is_some(),
            "`endpoints.events` is missing or not a string"
        );
        self.events_ep = events.unwrap_or_default();
        self.stream_ep = ep("stream");
        self.socket_ep = ep("socket");
        let caps = doc.get("capabilities").cloned().unwrap_or(Value::Null);
        ensure!(
            caps.is_null() || caps.is_object(),
            "`capabilities` is not an object: {caps}"
        );
        if let Some(f) = caps.get("filters") {
            ensure!(
                f.as_array()
                    .is_some_and(|a| a.iter().any(|x| x == "attr-match")),
                "`capabilities.filters` lacks attr-match, the REQUIRED dialect (AEP-0003 §6): {f}"
            );
        }
        if let Some(b) = caps.get("replay").and_then(|r| r.get("buffer")) {
            ensure!(
                b.is_u64(),
                "`capabilities.replay.buffer` must be a count of Events (AEP-0003 §5), got {b}"
            );
        }
        self.caps = caps;

        let mut notes = vec![format!(
            "aep {}; endpoints {}",
            doc["aep"],
            eps.keys().cloned().collect::<Vec<_>>().join(", ")
        )];
        if let Some(r) = self.caps.get("replay") {
            notes.push(format!("replay {r}"));
        }
        if self.caps.get("roster").is_some() {
            notes.push("roster".into());
        }
        if self.target.base_path.is_empty() {
            let wk = self.target.http("/.well-known/aep");
            let served = self
                .http
                .get(&wk, &[])
                .ok()
                .filter(|a| a.status == 200)
                .and_then(|a| a.json())
                .is_some_and(|v| v["aep"].is_array());
            notes.push(if served {
                "also at /.well-known/aep".into()
            } else {
                "not at /.well-known/aep (a SHOULD for origin-root deployments)".into()
            });
        }
        Ok(notes.join("; "))
    }

    fn version_gate(&mut self) -> Outcome {
        let s = self.session("version");
        let body = synth(&s, 0, 1, "tool.completed", "");
        let url = self.events_url();
        let a = self
            .http
            .post(&url, "application/json", Some("99.0"), &body)?;
        ensure!(
            a.status == 426,
            "POST with AEP-Version 99.0 answered {}, expected 426 Upgrade Required",
            a.show()
        );
        let v = a.json().unwrap_or_default();
        ensure!(
            v["versions"]
                .as_array()
                .is_some_and(|l| l.iter().any(|x| x == "0.1")),
            "the 426 body must be {{\"versions\": [\"0.1\", …]}}, got {}",
            a.show()
        );
        let without = self.http.post(&url, "application/json", None, &body)?;
        let note = if (200..300).contains(&without.status) {
            "; it accepted an Event without the REQUIRED AEP-Version header".to_string()
        } else {
            format!("; without the header: {}", without.status)
        };
        Ok(format!("426 {}{note}", v["versions"]))
    }

    fn invalid_event(&mut self) -> Outcome {
        let s = self.session("invalid");
        let url = self.events_url();
        let no_seq = synth(&s, 0, 1, "tool.completed", "").replace(r#","seq":1"#, "");
        let bad_type = synth(&s, 0, 2, "Tool.Done", "");
        let not_json = r#"{"aep":"0.1","id":"#.to_string();
        for (what, body) in [
            (
                "a session-scoped Event without seq (AEP-0001 §5.2)",
                &no_seq,
            ),
            ("a type outside the grammar (AEP-0001 §6)", &bad_type),
            ("a truncated JSON object", &not_json),
        ] {
            let a = self
                .http
                .post(&url, "application/json", Some("0.1"), body)?;
            ensure!(
                a.status == 400,
                "{what} was answered {}, expected 400",
                a.show()
            );
            let v = a.json().unwrap_or_default();
            ensure!(
                v["error"] == "invalid-event" && !v["detail"].is_null(),
                "{what}: the 400 body must be {{\"error\": \"invalid-event\", \"detail\": …}}, got {}",
                a.show()
            );
        }
        // A batch with one invalid line: rejected whole, or a per-line report. A live
        // watcher of the session tells which: after a 400 the batch's valid line must
        // never arrive; a sentinel posted next marks the end of the wait.
        let good = synth(&s, 0, 3, "tool.completed", "");
        let sentinel = synth(&s, 0, 4, "tool.completed", "");
        let q = query(&[
            ("filter", &json!({ "session": s }).to_string()),
            ("from", &from(&s, 0, 0).to_string()),
        ]);
        let mut watch = self
            .http
            .sse_open(&format!("{}?{q}", self.stream_url()?), &[])?;
        let batch = format!("{good}\n{no_seq}\n");
        let a = self
            .http
            .post(&url, "application/x-ndjson", Some("0.1"), &batch)?;
        let batch_note = match a.status {
            400 => {
                self.post(std::slice::from_ref(&sentinel))?;
                let sid = format!("\"id\":\"{s}-0-4\"");
                watch.read(|items| messages(items).iter().any(|(_, _, d)| d.contains(&sid)));
                let got = messages(&watch.items);
                ensure!(
                    got.iter().any(|(_, _, d)| *d == sentinel),
                    "the Event posted after the refused batch never reached a watcher of its session"
                );
                ensure!(
                    !got.iter().any(|(_, _, d)| *d == good),
                    "a batch answered 400 was partly ingested: its valid line was delivered"
                );
                "a batch with an invalid line is rejected whole (its valid line never delivered)"
            }
            207 => "a batch with an invalid line gets a per-line report (207)",
            _ => {
                return Err(Verdict::Fail(format!(
                    "a batch with an invalid second line was answered {}, expected 400 (or a 207 per-line report)",
                    a.show()
                )))
            }
        };
        drop(watch);
        Ok(format!(
            "400 invalid-event with a detail for 3 invalid Events; {batch_note}"
        ))
    }

    fn batch_filtered_delivery(&mut self) -> Outcome {
        let s = self.session("batch");
        let other = self.session("batch-other");
        let lines = vec![
            synth(
                &s,
                0,
                1,
                "tool.requested",
                r#","data":{"tool":{"name":"Bash"}}"#,
            ),
            synth(&s, 0, 2, "run.started", ""),
            synth(&other, 0, 1, "tool.completed", ""),
            synth(
                &s,
                0,
                3,
                "attention.requested",
                r#","severity":"notice","subject":"q-1","data":{"kind":"permission","prompt":"Allow?"}"#,
            ),
            synth(
                &s,
                0,
                4,
                "x.aep-live-check.tool.probe",
                r#","livecheck":"édition \u00fc ☃","data":{"deep":[[[{"n":9007199254740993,"e":1e2}]]]}"#,
            ),
            synth(&s, 0, 5, "progress.status", r#","severity":"debug""#),
            synth(&s, 1, 0, "tool.completed", ""),
            synth(
                &s,
                1,
                1,
                "tool.completed",
                r#","data":{"status":"success"}"#,
            ),
        ];
        let want: Vec<&String> = [0, 3, 4, 6, 7].iter().map(|&i| &lines[i]).collect();
        let filter = json!({
            "session": [s],
            "type": ["tool.*", "attention.*", "x.aep-live-check.*"],
        });
        // `from` makes the subscription race-free: whatever the relay ingests before the
        // subscription is live comes from replay, the rest live, never both.
        let q = query(&[
            ("filter", &filter.to_string()),
            ("from", &from(&s, 0, 0).to_string()),
        ]);
        let url = format!("{}?{q}", self.stream_url()?);
        let mut stream = self.http.sse_open(&url, &[])?;
        self.post(&lines)?;
        let last = format!("\"id\":\"{s}-1-1\"");
        let ended = stream.read(|items| {
            messages(items)
                .last()
                .is_some_and(|(_, _, d)| d.contains(&last))
        });
        let items = std::mem::take(&mut stream.items);
        drop(stream);
        if ended != Ended::Stopped {
            let n = messages(&items).len();
            return Err(Verdict::Fail(format!(
                "the last matching Event never arrived ({n} of 5 messages; the stream {})",
                if ended == Ended::Closed {
                    "ended"
                } else {
                    "timed out"
                }
            )));
        }
        ensure!(
            exhausted_comments(&items).is_empty(),
            "a replay-exhausted comment on a fresh session"
        );
        expect_sse_lines(&items, &want)?;
        Ok("8 Events in one NDJSON batch; the 5 matching session, type patterns (vendor type with '-' included) arrived byte-identical with event: and id:, (epoch, seq) ascending across an epoch bump; the 3 others did not".into())
    }

    fn resume_sse(&mut self) -> Outcome {
        self.stream_url()?;
        self.needs_buffer()?;
        let s = self.session("resume");
        let seqs = [1u64, 2, 3, 5, 8, 9];
        let lines: Vec<String> = seqs
            .iter()
            .map(|&q| synth(&s, 0, q, "tool.completed", ""))
            .collect();
        self.post(&lines)?;
        let after = |q: u64| -> Vec<&String> {
            seqs.iter()
                .zip(&lines)
                .filter(|(s, _)| **s > q)
                .map(|(_, l)| l)
                .collect()
        };
        let check = |items: &[SseItem], q: u64, how: &str| -> Result<(), Verdict> {
            ensure!(
                exhausted_comments(items).is_empty(),
                "{how}: replay-exhausted although the buffer holds everything"
            );
            expect_sse_lines(items, &after(q)).map_err(|v| match v {
                Verdict::Fail(d) => Verdict::Fail(format!("{how}: {d}")),
                other => other,
            })
        };
        let items = self.replay_after(&s, 0, 3)?;
        check(&items, 3, "from (0, 3)")?;
        // Resume as an EventSource does: send back the `id:` the relay wrote on the
        // message of seq 8 (`check` has read it as (0, 8)).
        let id = messages(&items)
            .into_iter()
            .find(|&(_, _, data)| data == lines[4].as_str())
            .and_then(|(_, id, _)| id)
            .map(str::to_string)
            .ok_or("from (0, 3): the message of seq 8 carries no id:")?;
        let items = self.replay(&[], &[("Last-Event-ID", &id)])?;
        check(&items, 8, "Last-Event-ID (0, 8)")?;
        let items = self.replay_after(&s, 0, 4)?;
        check(&items, 4, "from the gap position (0, 4)")?;
        // Redelivery of an Event the buffer holds: admission dedupes on (source, id).
        self.post(&lines[3..4])?;
        let items = self.replay_after(&s, 0, 3)?;
        check(&items, 3, "from (0, 3) after redelivering seq 5")?;
        Ok("from and Last-Event-ID deliver strictly after the position, across gaps, in (epoch, seq) order, no duplicate (also after a redelivery), no spurious replay-exhausted".into())
    }

    fn capture_ceiling_sse(&mut self) -> Outcome {
        let s = self.session("capture");
        let lines = capture_lines(&s);
        // Live subscriptions (with `from`, so a relay that answers the stream head early
        // loses nothing): the ceilings apply at fan-out, buffer or not.
        let mut streams = Vec::new();
        for ceiling in ["metadata", "redacted", "none"] {
            let q = query(&[
                ("filter", &json!({ "session": s }).to_string()),
                ("from", &from(&s, 0, 0).to_string()),
                ("capture", ceiling),
            ]);
            let url = format!("{}?{q}", self.stream_url()?);
            streams.push((ceiling, self.http.sse_open(&url, &[])?));
        }
        self.post(&lines)?;
        let mut got: Vec<Vec<String>> = Vec::new();
        for (ceiling, stream) in &mut streams {
            stream.read(|items| messages(items).len() >= 3);
            let g: Vec<String> = messages(&stream.items)
                .into_iter()
                .map(|(_, _, d)| d.to_string())
                .collect();
            ensure!(
                g.len() == 3,
                "ceiling {ceiling}: {} of 3 Events arrived",
                g.len()
            );
            got.push(g);
        }
        drop(streams);
        let refs: Vec<&str> = got[0].iter().map(String::as_str).collect();
        expect_metadata_ceiling(&lines, &refs).map_err(|e| format!("ceiling metadata: {e}"))?;

        let red = &got[1];
        ensure!(
            red[0] == lines[0],
            "ceiling redacted: a redacted-source Event must pass unchanged (AEP-0001 §8.2(e)), got {}",
            short(&red[0])
        );
        expect_downleveled(
            &lines[1],
            &red[1],
            "metadata",
            &["FULL-GATED", "REDACTED-GATED"],
            &["result_digest"],
        )
        .map_err(|e| {
            format!("ceiling redacted, full source (AEP-0001 §8.2(e): never mint redacted): {e}")
        })?;

        for (line, d) in lines.iter().zip(&got[2]) {
            expect_downleveled(line, d, "none", &["GATED"], &[])
                .map_err(|e| format!("ceiling none: {e}"))?;
        }
        Ok("metadata: gated free text never delivered, capture rewritten, structure kept, metadata Events byte-identical; redacted: redacted source unchanged, full source lands on metadata; none: envelope only".into())
    }

    fn replay_all_sse(&mut self) -> Outcome {
        if !self.replay_all_advertised() {
            return skip("replay.all is not advertised (AEP-0003 §5)");
        }
        self.needs_buffer()?;
        let (a, b) = (self.session("all-a"), self.session("all-b"));
        let lines = self.post_replay_all(&a, &b)?;
        let filter = json!({ "session": [a, b] });
        let items = self.replay(
            &[("from", "all".into()), ("filter", filter.to_string())],
            &[],
        )?;
        ensure!(
            exhausted_comments(&items).is_empty(),
            "replay-all sent replay-exhausted (AEP-0003 §5 honesty rule 2)"
        );
        let got: Vec<String> = messages(&items)
            .into_iter()
            .map(|(_, _, d)| d.to_string())
            .collect();
        expect_replay_all(&lines, &got)?;
        Ok(format!(
            "every held Event of 2 sessions ({}), each session in order, no replay-exhausted",
            got.len()
        ))
    }

    /// Posts the replay-all sessions: `a` with up to 3 Events, `b` with up to 2 (never
    /// more than the advertised buffer, so everything is held).
    fn post_replay_all(&mut self, a: &str, b: &str) -> Result<Vec<String>, Verdict> {
        let buffer = self.needs_buffer()?;
        let na = buffer.min(3);
        let nb = buffer.min(2);
        let mut lines: Vec<String> = (1..=na)
            .map(|q| synth(a, 0, q, "tool.completed", ""))
            .collect();
        lines.extend((1..=nb).map(|q| synth(b, 0, q, "run.started", "")));
        self.post(&lines)?;
        Ok(lines)
    }

    // -----------------------------------------------------------------------------------
    // WebSocket

    fn ws_hello_first(&mut self) -> Outcome {
        let mut ws = self.ws()?;
        ws.send(&json!({ "type": "subscribe", "id": "before-hello", "filter": {} }))?;
        let mut before = Vec::new();
        let err = ws.expect("an error frame", &mut before, |m| {
            m.frame_type() == Some("error")
        })?;
        let Incoming::Frame(v, _) = &err else {
            unreachable!()
        };
        ensure!(
            v["code"] == "hello-required",
            "the error frame's code is {}, expected hello-required",
            v["code"]
        );
        ensure!(
            before.is_empty(),
            "before the error the endpoint sent {}",
            before[0].show()
        );
        let mut after = Vec::new();
        ensure!(
            ws.closes(&mut after)?,
            "the endpoint did not close the connection after hello-required"
        );
        Ok("a subscribe before hello: error hello-required, then close".into())
    }

    fn ws_version_refusal(&mut self) -> Outcome {
        let mut ws = self.ws()?;
        ws.send(&json!({
            "type": "hello", "versions": ["99.0"], "role": "consumer",
            "identity": { "agent": "aep-relay-check" }
        }))?;
        let first = ws
            .recv()?
            .ok_or("no answer to a hello offering only 99.0")?;
        let Incoming::Frame(v, _) = &first else {
            return Err(Verdict::Fail(format!(
                "a hello offering only 99.0 was answered {}",
                first.show()
            )));
        };
        ensure!(
            v["type"] == "error" && v["code"] == "version-unsupported",
            "a hello offering only 99.0 was answered {v}, expected error version-unsupported"
        );
        ensure!(
            v["versions"]
                .as_array()
                .is_some_and(|l| l.iter().any(|x| x == "0.1")),
            "the version-unsupported error must list the supported versions: {v}"
        );
        let mut after = Vec::new();
        ensure!(
            ws.closes(&mut after)?,
            "the endpoint did not close the connection after version-unsupported"
        );
        Ok(format!(
            "error version-unsupported with versions {}, then close",
            v["versions"]
        ))
    }

    fn ws_hello_reply(&mut self) -> Outcome {
        let mut ws = self.ws()?;
        let h = ws.hello("consumer", json!({ "versions": ["99.0", "0.1"] }))?;
        ensure!(
            h["versions"] == json!(["0.1"]),
            "the endpoint's hello must select exactly one version from the intersection, got versions {}",
            h["versions"]
        );
        self.hello_caps = h["capabilities"].clone();
        ws.close();
        Ok(format!(
            "offered [\"99.0\", \"0.1\"]; the endpoint's first frame is hello with versions [\"0.1\"], role {}",
            h["role"]
        ))
    }

    fn ws_ignore_unknown(&mut self) -> Outcome {
        let more = json!({
            "capabilities": {
                "filters": ["attr-match"],
                "x-future-capability": { "nested": [1, { "a": null }] },
                "replay": { "unheard-of": true },
                "experimental": { "aep-relay-check": {} }
            },
            "future_member": { "x": 1 }
        });
        let mut ws = self.ws()?;
        ws.hello("consumer", more)
            .map_err(|e| format!("a hello with unknown capability keys was not accepted: {e}"))?;
        ws.send(&json!({ "type": "x-unknown-frame", "id": "u-1", "payload": { "a": 1 } }))?;
        ws.send(&json!({ "type": "frobnicate" }))?;
        ws.send(&json!({ "type": "ping", "t": 424242 }))?;
        let mut before = Vec::new();
        let pong = ws.expect("the pong", &mut before, |m| m.frame_type() == Some("pong"))?;
        if let Incoming::Frame(v, _) = &pong {
            ensure!(v["t"] == 424242, "the pong did not echo t: {v}");
        }
        if let Some(e) = before.iter().find(|m| m.frame_type() == Some("error")) {
            return Err(Verdict::Fail(format!(
                "an unknown frame type was answered with an error (it MUST be ignored): {}",
                e.show()
            )));
        }
        ws.close();
        Ok("a hello with unknown capability keys and members was accepted; two unknown frame types drew no answer; ping then got its pong".into())
    }

    fn ws_subscribe_refusals(&mut self) -> Outcome {
        let s = self.session("ws-refuse");
        let mut ws = self.ws_hello("consumer", json!({}))?;
        self.subscribe(&mut ws, "ok-1", json!({ "filter": { "session": s } }))?;
        let cases: [(&str, Value, Option<&str>); 6] = [
            (
                "bad-key",
                json!({ "filter": { "seq": 1 } }),
                Some("invalid-filter"),
            ),
            (
                "bad-glob",
                json!({ "filter": { "type": "*" } }),
                Some("invalid-filter"),
            ),
            (
                "bad-shape",
                json!({ "filter": ["tool.*"] }),
                Some("invalid-filter"),
            ),
            (
                "bad-from",
                json!({ "from": "yesterday" }),
                Some("invalid-filter"),
            ),
            (
                "bad-from-entry",
                json!({ "from": [{ "session": s, "seq": -1 }] }),
                Some("invalid-filter"),
            ),
            ("bad-capture", json!({ "capture": "everything" }), None),
        ];
        let mut codes = Vec::new();
        for (id, members, want) in cases {
            let mut frame = json!({ "type": "subscribe", "id": id });
            if let (Some(f), Some(m)) = (frame.as_object_mut(), members.as_object()) {
                f.extend(m.clone());
            }
            ws.send(&frame)?;
            let mut before = Vec::new();
            let reply = ws.expect(
                &format!("the answer to subscribe {id:?}"),
                &mut before,
                |m| matches!(m, Incoming::Frame(v, _) if v["id"] == id),
            )?;
            let Incoming::Frame(v, _) = &reply else {
                unreachable!()
            };
            ensure!(
                v["type"] == "error",
                "a malformed subscribe ({members}) was answered {v}, expected an error frame"
            );
            let code = v["code"].as_str().unwrap_or_default();
            ensure!(
                SUBSCRIBE_CODES.contains(&code),
                "subscribe {id:?}: code {code:?} is outside the closed set {SUBSCRIBE_CODES:?}"
            );
            if let Some(w) = want {
                ensure!(
                    code == w,
                    "subscribe {id:?} ({members}): code {code:?}, expected {w:?}"
                );
            }
            codes.push(format!("{id}: {code}"));
        }
        // The connection and its first subscription survived.
        let line = synth(&s, 0, 1, "tool.completed", "");
        self.post(std::slice::from_ref(&line))?;
        let got = self.ws_events(&mut ws, Vec::new(), 1, None)?;
        ensure!(
            got[0] == line,
            "after the refusals the surviving subscription delivered {} instead of the posted line",
            short(&got[0])
        );
        self.subscribe(&mut ws, "ok-2", json!({ "filter": { "session": s } }))?;
        ws.close();
        Ok(format!(
            "refused in-band with the id ({}); the connection and its earlier subscription kept working, and a new subscribe succeeded",
            codes.join(", ")
        ))
    }

    fn ws_resume(&mut self) -> Outcome {
        self.socket_url()?;
        self.needs_buffer()?;
        let s = self.session("ws-resume");
        let lines: Vec<String> = (1..=5)
            .map(|q| synth(&s, 0, q, "tool.completed", ""))
            .collect();
        self.post(&lines)?;
        let mut ws = self.ws_hello("consumer", json!({}))?;
        let pending = self.subscribe(
            &mut ws,
            "r-1",
            json!({ "filter": { "session": s }, "from": from(&s, 0, 2) }),
        )?;
        let got = self.ws_events(&mut ws, pending, 3, None)?;
        for (i, (g, w)) in got.iter().zip(&lines[2..]).enumerate() {
            ensure!(
                g == w,
                "replayed Event {} is not the posted line (seq {}): got {}",
                i + 1,
                i + 3,
                short(g)
            );
        }
        let live = synth(&s, 0, 6, "tool.completed", "");
        self.post(std::slice::from_ref(&live))?;
        let next = self.ws_events(&mut ws, Vec::new(), 1, None)?;
        ensure!(
            next[0] == live,
            "after the replay the next Event was {} instead of the live seq 6 (a duplicate?)",
            short(&next[0])
        );
        ws.close();
        Ok(
            "from (0, 2) replayed seq 3, 4, 5 byte-identical, then live seq 6, nothing twice"
                .into(),
        )
    }

    fn ws_capture_ceiling(&mut self) -> Outcome {
        let s = self.session("ws-capture");
        let lines = capture_lines(&s);
        // Subscribed first: the ceiling applies at fan-out, buffer or not.
        let mut ws = self.ws_hello("consumer", json!({}))?;
        let pending = self.subscribe(
            &mut ws,
            "c-1",
            json!({ "filter": { "session": s }, "from": from(&s, 0, 0), "capture": "metadata" }),
        )?;
        self.post(&lines)?;
        let got = self.ws_events(&mut ws, pending, 3, None)?;
        let refs: Vec<&str> = got.iter().map(String::as_str).collect();
        expect_metadata_ceiling(&lines, &refs)?;
        ws.close();
        Ok("ceiling metadata over WebSocket: gated free text never delivered, capture rewritten, a metadata Event byte-identical".into())
    }

    fn replay_all_ws(&mut self) -> Outcome {
        self.socket_url()?;
        if !self.replay_all_advertised() {
            return skip("replay.all is not advertised (AEP-0003 §5)");
        }
        self.needs_buffer()?;
        let (a, b) = (self.session("ws-all-a"), self.session("ws-all-b"));
        let lines = self.post_replay_all(&a, &b)?;
        let mut ws = self.ws_hello("consumer", json!({}))?;
        let pending = self.subscribe(
            &mut ws,
            "all-1",
            json!({ "filter": { "session": [a, b] }, "from": "all" }),
        )?;
        let got = self.ws_events(&mut ws, pending, lines.len(), None)?;
        expect_replay_all(&lines, &got)?;
        // Anything more (a duplicate, a marker) would arrive right behind.
        for m in ws.drain(Duration::from_millis(300))? {
            match m {
                Incoming::Event(_, t) => {
                    return Err(Verdict::Fail(format!(
                        "an extra Event after the replay: {}",
                        short(&t)
                    )))
                }
                Incoming::Frame(v, _) if v["type"] == "replay-exhausted" => {
                    return Err(Verdict::Fail(format!(
                        "replay-all sent replay-exhausted (AEP-0003 §5 honesty rule 2): {v}"
                    )))
                }
                _ => {}
            }
        }
        ws.close();
        Ok(format!(
            "subscribe from \"all\": every held Event of 2 sessions ({}), in session order, no replay-exhausted",
            got.len()
        ))
    }

    fn roster(&mut self) -> Outcome {
        self.socket_url()?;
        if self.advertises(&["roster"]).is_none() {
            return skip("roster is not advertised (AEP-0003 §4.1 rule 1)");
        }
        let l = self.session("roster");
        let mut c = self.ws_hello("consumer", json!({}))?;
        self.subscribe(&mut c, "ro-1", json!({ "filter": { "session": l } }))?;
        let control = json!({ "accepts": ["control.pause"], "ack_window_ms": 5000 });
        let instance = format!("aep-relay-check/roster-{}", std::process::id());
        let mut e = self.ws_hello(
            "emitter",
            json!({
                "identity": { "agent": "aep-relay-check", "instance": instance },
                "capabilities": { "control": control, "emits": ["tool"] }
            }),
        )?;
        let line = synth(&l, 0, 1, "tool.completed", "");
        e.send_text(&line)?;
        // The claim is live once the Event went through.
        let got = self.ws_events(&mut c, Vec::new(), 1, None)?;
        ensure!(
            got[0] == line,
            "the emitter's Event arrived altered: {}",
            short(&got[0])
        );

        let rid = format!("r-{}", self.run);
        c.send(&json!({ "type": "roster", "id": rid }))?;
        let mut before = Vec::new();
        let r = c.expect_reply("roster", "id", &rid, &mut before)?;
        let entries = r["entries"].as_array().cloned().unwrap_or_default();
        let mine: Vec<&Value> = entries
            .iter()
            .filter(|x| x["session"] == l.as_str())
            .collect();
        ensure!(
            mine.len() == 1,
            "the roster has {} entries for the claimed session (one live claim, one entry): {r}",
            mine.len()
        );
        let m = mine[0];
        ensure!(
            m["agent"] == "aep-relay-check" && m["instance"] == instance.as_str(),
            "the entry's agent/instance are not the claimant's hello identity: {m}"
        );
        ensure!(
            m["control"] == control,
            "the entry's control is not the declared block verbatim: {} vs {control}",
            m["control"]
        );
        ensure!(
            m["emits"] == json!(["tool"]),
            "the entry's emits is not the declared list: {}",
            m["emits"]
        );

        e.send(&json!({ "type": "roster", "id": "ro-e" }))?;
        let mut before = Vec::new();
        let refusal = e.expect_reply("error", "id", "ro-e", &mut before)?;
        ensure!(
            refusal["code"] == "unauthorized",
            "an emitter-role roster request got code {}, expected unauthorized (§4.1 rule 2)",
            refusal["code"]
        );
        e.send(&json!({ "type": "ping", "t": 7 }))?;
        e.expect("a pong after the refusal", &mut Vec::new(), |m| {
            m.frame_type() == Some("pong")
        })
        .map_err(|err| format!("the emitter's connection did not survive the refusal: {err}"))?;
        e.close();

        // Absence means no live route: once the claimant is gone, so is its entry.
        let deadline = Instant::now() + self.opts.timeout;
        let mut n = 0;
        loop {
            n += 1;
            let rid = format!("r-{}-{n}", self.run);
            c.send(&json!({ "type": "roster", "id": rid }))?;
            let r = c.expect_reply("roster", "id", &rid, &mut Vec::new())?;
            let gone = !r["entries"]
                .as_array()
                .is_some_and(|es| es.iter().any(|x| x["session"] == l.as_str()));
            if gone {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "the entry outlived its claimant's connection by {:?}",
                self.opts.timeout
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c.close();
        Ok("id echoed; one entry for the live claim with agent, instance, control and emits verbatim; an emitter's request refused unauthorized in-band; the entry gone once the claimant closed".into())
    }

    /// A live SSE watcher of `session` (opened with `from`, so nothing is lost to a race).
    fn watch(&self, session: &str) -> Result<super::client::SseStream, Verdict> {
        let q = query(&[
            ("filter", &json!({ "session": session }).to_string()),
            ("from", &from(session, 0, 0).to_string()),
        ]);
        Ok(self
            .http
            .sse_open(&format!("{}?{q}", self.stream_url()?), &[])?)
    }

    /// An emitter connection (with the token, when given) that claims `session` by
    /// sending one Event and declaring `accepts`; returns once `watch` saw that Event,
    /// so the claim is in place.
    fn claimant(
        &mut self,
        session: &str,
        seq: u64,
        accepts: &[&str],
        watch: &mut super::client::SseStream,
    ) -> Result<Ws, Verdict> {
        let mut e = self.ws_hello(
            "emitter",
            json!({
                "identity": { "agent": "aep-relay-check", "instance": format!("aep-relay-check/claimant-{}-{seq}", std::process::id()) },
                "capabilities": { "control": { "accepts": accepts }, "emits": ["tool"] }
            }),
        )?;
        let line = synth(session, 0, seq, "tool.completed", "");
        e.send_text(&line)?;
        watch.read(|items| messages(items).iter().any(|(_, _, d)| *d == line));
        ensure!(
            messages(&watch.items).iter().any(|(_, _, d)| *d == line),
            "the claimant's Event never reached a watcher of its session"
        );
        Ok(e)
    }

    fn control_unauthenticated(&mut self) -> Outcome {
        let url = self.socket_url()?;
        let k = self.session("ctl-open");
        let mut sender = match Ws::connect(&url, None, self.opts.timeout, self.tls.as_ref()) {
            Err(ConnectError::Refused(status)) => {
                return Ok(format!(
                    "the duplex binding refuses a connection without credentials ({status}), so no command can flow on one"
                ))
            }
            Err(e) => return Err(Verdict::Fail(format!("cannot open {url} without a token: {e}"))),
            Ok(ws) => ws,
        };
        let mut watch = self.watch(&k)?;
        let mut e = self.claimant(&k, 1, &["control.cancel"], &mut watch)?;
        sender.hello(
            "both",
            json!({ "identity": { "agent": "aep-relay-check-sender" } }),
        )?;
        let cmd_id = format!("{k}-cmd");
        let cmd = command(&k, &cmd_id, "control.cancel", r#"{"scope":"session"}"#);
        sender.send_text(&cmd)?;
        let mut before = Vec::new();
        let refusal = sender
            .expect_reply("error", "cause", &cmd_id, &mut before)
            .map_err(|e| format!("a command over an unauthenticated connection drew no cause-correlated error frame: {e}"))?;
        let code = refusal["code"].as_str().unwrap_or("?").to_string();
        for m in e.drain(Duration::from_millis(300))? {
            if let Incoming::Event(v, _) = &m {
                ensure!(
                    v["id"] != cmd_id.as_str(),
                    "the claimant received the command sent over an unauthenticated connection"
                );
            }
        }
        // Nor did it reach observers: a sentinel posted after it arrives first.
        let sentinel = synth(&k, 0, 2, "tool.completed", "");
        self.post(std::slice::from_ref(&sentinel))?;
        watch.read(|items| messages(items).iter().any(|(_, _, d)| *d == sentinel));
        let seen = messages(&watch.items);
        ensure!(
            seen.iter().any(|(_, _, d)| *d == sentinel),
            "an Event posted after the command never reached the session's watcher"
        );
        ensure!(
            !seen.iter().any(|(_, _, d)| d.contains(&cmd_id)),
            "the command sent over an unauthenticated connection was fanned out to observers"
        );
        let mut notes = "the live claimant never received it, nor did observers".to_string();
        if self.buffer().is_some() {
            let items = self.replay_after(&k, 0, 0)?;
            ensure!(
                !messages(&items).iter().any(|(_, _, d)| d.contains(&cmd_id)),
                "the refused command entered the session's history"
            );
            notes.push_str("; not in the session's replay");
        }
        e.close();
        sender.close();
        Ok(format!("refused with error {code} (cause echoed); {notes}"))
    }

    fn control_no_route(&mut self) -> Outcome {
        self.socket_url()?;
        if self.opts.token.is_none() {
            return skip(
                "needs --token: control needs an authenticated connection (AEP-0004 §4.1)",
            );
        }
        let n = self.session("ctl-noroute");
        let lines: Vec<String> = (1..=2)
            .map(|q| synth(&n, 0, q, "tool.completed", ""))
            .collect();
        self.post(&lines)?;
        let mut sender = self.ws_hello(
            "both",
            json!({ "identity": { "agent": "aep-relay-check-sender" } }),
        )?;
        let cmd_id = format!("{n}-cmd");
        sender.send_text(&command(&n, &cmd_id, "control.pause", "{}"))?;
        let mut before = Vec::new();
        let refusal = sender
            .expect_reply("error", "cause", &cmd_id, &mut before)
            .map_err(|e| format!("a command to a session without a live claimant: {e}"))?;
        ensure!(
            refusal["code"] != "unauthorized",
            "the command was refused as unauthorized: does the relay accept this token, with the control scope? ({refusal})"
        );
        ensure!(
            refusal["code"] == "no-route",
            "the refusal's code is {}, expected no-route: {refusal}",
            refusal["code"]
        );
        sender.close();
        if self.buffer().is_none() {
            return Ok("error no-route with the command's id as cause (the relay keeps no replay buffer to compare)".into());
        }
        let items = self.replay_after(&n, 0, 0)?;
        let refs: Vec<&String> = lines.iter().collect();
        expect_sse_lines(&items, &refs).map_err(|v| match v {
            Verdict::Fail(d) => Verdict::Fail(format!("the session's replay changed: {d}")),
            other => other,
        })?;
        Ok("error no-route with the command's id as cause; the session's replay is exactly its 2 Events".into())
    }

    fn control_route(&mut self) -> Outcome {
        self.socket_url()?;
        if self.opts.token.is_none() {
            return skip(
                "needs --token: control needs an authenticated connection (AEP-0004 §4.1)",
            );
        }
        let r = self.session("ctl-route");
        let mut watch = self.watch(&r)?;
        let mut e = self.claimant(&r, 1, &["control.cancel"], &mut watch)?;
        drop(watch);
        let mut sender = self.ws_hello(
            "both",
            json!({ "identity": { "agent": "aep-relay-check-sender" } }),
        )?;
        let cmd_id = format!("{r}-cmd");
        let cmd = command(
            &r,
            &cmd_id,
            "control.cancel",
            r#"{"scope":"run","reason":"aep-relay check"}"#,
        );
        sender.send_text(&cmd)?;
        let mut before = Vec::new();
        let got = e
            .expect(
                "the command",
                &mut before,
                |m| matches!(m, Incoming::Event(v, _) if v["id"] == cmd_id.as_str()),
            )
            .map_err(|err| format!("the live claimant did not receive the command: {err}"))?;
        if let Incoming::Event(_, text) = &got {
            ensure!(
                *text == cmd,
                "the command reached the claimant altered (AEP-0004 §4.4: byte-identical): {}",
                short(text)
            );
        }
        for m in sender.drain(Duration::from_millis(300))? {
            if let Incoming::Frame(v, _) = &m {
                ensure!(
                    !(v["type"] == "error" && v["cause"] == cmd_id.as_str()),
                    "the sender got a refusal although the command was delivered: {v}"
                );
            }
        }
        e.close();
        sender.close();
        Ok("the one live claimant received the command byte-identically; the sender got no refusal".into())
    }

    fn control_ambiguous(&mut self) -> Outcome {
        self.socket_url()?;
        if self.opts.token.is_none() {
            return skip(
                "needs --token: control needs an authenticated connection (AEP-0004 §4.1)",
            );
        }
        let a = self.session("ctl-ambiguous");
        let mut watch = self.watch(&a)?;
        let mut e1 = self.claimant(&a, 1, &["control.cancel"], &mut watch)?;
        let mut e2 = self.claimant(&a, 2, &["control.cancel"], &mut watch)?;
        drop(watch);
        let mut sender = self.ws_hello(
            "both",
            json!({ "identity": { "agent": "aep-relay-check-sender" } }),
        )?;
        let cmd_id = format!("{a}-cmd");
        sender.send_text(&command(
            &a,
            &cmd_id,
            "control.cancel",
            r#"{"scope":"session"}"#,
        ))?;
        let refusal = sender
            .expect_reply("error", "cause", &cmd_id, &mut Vec::new())
            .map_err(|e| format!("a command to a session with two live claimants: {e}"))?;
        ensure!(
            refusal["code"] == "ambiguous",
            "the refusal's code is {}, expected ambiguous: {refusal}",
            refusal["code"]
        );
        for (n, e) in [(1, &mut e1), (2, &mut e2)] {
            for m in e.drain(Duration::from_millis(300))? {
                if let Incoming::Event(v, _) = &m {
                    ensure!(
                        v["id"] != cmd_id.as_str(),
                        "claimant {n} received a command the relay could not route to one target"
                    );
                }
            }
        }
        e1.close();
        e2.close();
        sender.close();
        Ok("two live claimants of one session: error ambiguous with the command's id as cause; neither claimant received it".into())
    }

    // -----------------------------------------------------------------------------------
    // Eviction

    fn evict_sse(&mut self) -> Outcome {
        if !self.opts.evict {
            return skip(
                "needs --evict: floods a session past the advertised replay buffer (AEP-0003 §10)",
            );
        }
        let buffer = self.needs_buffer()?;
        if buffer > MAX_FLOOD {
            return skip(format!(
                "the advertised buffer ({buffer}) is too large to flood; run the relay with a small buffer for --evict"
            ));
        }
        let f = self.session("evict");
        let total = buffer + (buffer / 2).max(4);
        let lines: Vec<String> = (1..=total)
            .map(|q| {
                synth(
                    &f,
                    0,
                    q,
                    "tool.completed",
                    &format!(r#","data":{{"status":"success","n":{q}}}"#),
                )
            })
            .collect();
        self.post(&lines)?;
        self.flood = Some((f.clone(), lines));
        let items = self.replay_after(&f, 0, 1)?;
        let first_msg = items
            .iter()
            .position(|i| matches!(i, SseItem::Message { .. }))
            .unwrap_or(items.len());
        let marker = items[..first_msg].iter().find_map(|i| match i {
            SseItem::Comment(c) => c.strip_prefix("replay-exhausted "),
            _ => None,
        });
        let Some(marker) = marker else {
            let late = exhausted_comments(&items);
            return Err(Verdict::Fail(if late.is_empty() {
                format!("no `: replay-exhausted` comment after flooding {total} Events past a buffer of {buffer} and resuming from (0, 1)")
            } else {
                "the replay-exhausted comment came after delivery had begun".to_string()
            }));
        };
        let (session, pos) = marker.rsplit_once(' ').unwrap_or(("", marker));
        ensure!(
            session == f,
            "the marker names session {session:?}, expected {f:?}"
        );
        let earliest = pos
            .split_once(':')
            .and_then(|(e, q)| Some((e.parse::<u64>().ok()?, q.parse::<u64>().ok()?)))
            .ok_or_else(|| format!("the marker's position {pos:?} is not {{epoch}}:{{seq}}"))?;
        self.evict_sse = Some(earliest);
        let (_, lines) = self.flood.as_ref().expect("set above");
        ensure!(
            earliest.0 == 0 && earliest.1 > 2 && earliest.1 <= total,
            "the marker's earliest position {earliest:?} is not a held position above the resume point"
        );
        let want: Vec<&String> = lines[(earliest.1 - 1) as usize..].iter().collect();
        ensure!(
            want.len() as u64 <= buffer,
            "{} Events are held, more than the advertised buffer of {buffer}",
            want.len()
        );
        expect_sse_lines(&items[first_msg..], &want)?;
        Ok(format!(
            "flooded {total} Events past a buffer of {buffer}; from (0, 1): `: replay-exhausted {f} 0:{}` first, then the {} held Events, each the posted line byte for byte",
            earliest.1,
            want.len()
        ))
    }

    fn evict_ws(&mut self) -> Outcome {
        if !self.opts.evict {
            return skip("needs --evict");
        }
        self.socket_url()?;
        let Some((f, lines)) = self.flood.clone() else {
            return skip("no flood was posted (see evict-sse)");
        };
        let mut ws = self.ws_hello("consumer", json!({}))?;
        let pending = self.subscribe(
            &mut ws,
            "ev-1",
            json!({ "filter": { "session": f }, "from": from(&f, 0, 1) }),
        )?;
        // Everything from the marker's position on; read the marker first.
        let mut markers = Vec::new();
        let mut pending = pending;
        pending.reverse();
        let mut early = Vec::new();
        while markers.is_empty() {
            let m = match pending.pop() {
                Some(m) => m,
                None => ws.recv()?.ok_or_else(|| {
                    format!("no replay-exhausted frame within {:?}", self.opts.timeout)
                })?,
            };
            match m {
                Incoming::Frame(v, _) if v["type"] == "replay-exhausted" => markers.push(v),
                Incoming::Event(_, t) => early.push(t),
                Incoming::Closed => {
                    return Err(Verdict::Fail(
                        "the connection closed before the replay".into(),
                    ))
                }
                _ => {}
            }
        }
        ensure!(
            early.is_empty(),
            "{} Event(s) arrived before the replay-exhausted frame",
            early.len()
        );
        let v = &markers[0];
        ensure!(
            v["sub"] == "ev-1" && v["session"] == f.as_str(),
            "the replay-exhausted frame must name sub \"ev-1\" and the session: {v}"
        );
        let earliest = (
            v["earliest"]["epoch"].as_u64().unwrap_or(u64::MAX),
            v["earliest"]["seq"].as_u64().unwrap_or(u64::MAX),
        );
        ensure!(
            earliest.0 == 0 && earliest.1 >= 2 && earliest.1 <= lines.len() as u64,
            "the frame's earliest {} is not a held position",
            v["earliest"]
        );
        self.evict_ws = Some(earliest);
        let want = &lines[(earliest.1 - 1) as usize..];
        pending.reverse();
        let got = self.ws_events(&mut ws, pending, want.len(), None)?;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            ensure!(
                g == w,
                "replayed frame {} (seq {}) is not the posted line: {}",
                i + 1,
                earliest.1 + i as u64,
                short(g)
            );
        }
        ws.close();
        Ok(format!(
            "replay-exhausted {{sub, session, earliest 0:{}}} before delivery, then the {} held Events, each frame the posted line byte for byte",
            earliest.1,
            want.len()
        ))
    }

    fn evict_agree(&mut self) -> Outcome {
        if !self.opts.evict {
            return skip("needs --evict");
        }
        match (self.evict_sse, self.evict_ws) {
            (Some(a), Some(b)) => {
                ensure!(a == b, "SSE names the earliest held position {a:?}, WebSocket {b:?}");
                Ok(format!("both name ({}, {})", a.0, a.1))
            }
            (None, _) if self.flood.is_none() => skip("no flood was posted (see evict-sse)"),
            (_, None) if self.socket_ep.is_none() => {
                skip("no socket endpoint: one binding only (AEP-0003 §3.4)")
            }
            (a, b) => Err(Verdict::Fail(format!(
                "cannot compare: SSE earliest {a:?}, WebSocket earliest {b:?} (see evict-sse, evict-ws)"
            ))),
        }
    }
}

/// Checks a replay-all delivery: exactly the posted lines, each session's in order.
fn expect_replay_all(lines: &[String], got: &[String]) -> Result<(), Verdict> {
    let mut want_by: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for l in lines {
        want_by.entry(routing(l).1).or_default().push(l);
    }
    let mut got_by: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for g in got {
        got_by.entry(routing(g).1).or_default().push(g);
    }
    for (s, want) in &want_by {
        let have = got_by.get(s).cloned().unwrap_or_default();
        ensure!(
            have == *want,
            "session {s}: replay-all delivered {} Event(s) where {} are held, or not byte-identical, or out of order",
            have.len(),
            want.len()
        );
    }
    ensure!(
        got.len() == lines.len(),
        "replay-all delivered {} Events where {} match the filter",
        got.len(),
        lines.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_event_id;

    /// The examples of docs/consuming.md of how a session is written in `id:` (AEP-0003 §3.3 #2).
    #[test]
    fn event_ids_read_as_the_readme_writes_them() {
        let id = |s: &str, e, q| Some((s.to_string(), e, q));
        assert_eq!(parse_event_id("s_8f2c:0:187"), id("s_8f2c", 0, 187));
        assert_eq!(parse_event_id("a:b:0:3"), id("a:b", 0, 3));
        assert_eq!(parse_event_id("run 7:2:9"), id("run 7", 2, 9));
        assert_eq!(parse_event_id("50%25:0:3"), id("50%", 0, 3));
        assert_eq!(parse_event_id("s%C3%A9ance:0:3"), id("séance", 0, 3));
        assert_eq!(parse_event_id("s%c3%a9ance:0:3"), id("séance", 0, 3));
        assert_eq!(parse_event_id("a%0Ab:1:2"), id("a\nb", 1, 2));
        assert_eq!(parse_event_id("séance:0:3"), id("séance", 0, 3));
        assert_eq!(parse_event_id(":0:3"), id("", 0, 3));
    }

    #[test]
    fn malformed_event_ids_name_no_position() {
        for bad in [
            "", "s", "s:3", "s:x:3", "s:0:", "s:0:+3", "s:-1:3", "50%:0:3", "50%2:0:3", "5%zz:0:3",
            "%C3:0:3",
        ] {
            assert_eq!(parse_event_id(bad), None, "{bad:?}");
        }
    }
}
