//! The conformance corpora against the relay's own modules (AEP-0001 §10, AEP-0003 §10).
//!
//! Two corpora run here:
//!
//! - **The project's own**, `conformance/fixtures/*.json` (its shape is documented in
//!   `conformance/README.md`): envelope validity (through [`Event::parse`] and over
//!   `POST /events`), attr-match verdicts and fail-closed filters (through the scanner
//!   and [`Filter::parse`]), capture down-leveling (through [`downlevel_value`] and
//!   [`downlevel`]), and resume (through [`Store`] and over `GET /stream`). It is part of
//!   the repository, so these tests always run.
//! - **The upstream one**, `../shared/aep-fixtures`: `attr-match/`, `downlevel/`,
//!   `golden/`, the envelope-level cases of `invalid/`, and the types the reference
//!   adapters emit (`mappings/`, over `POST /events`). Each test is ignored
//!   (`cfg(no_fixtures)`, see build.rs) when `../shared` is absent.
//!
//! A failing case is reported by name with what was expected and what happened; all
//! failures of a corpus are collected before the test fails, so one run shows them all.

use crate::support;

use std::path::Path;

use aep_relay::capture::{downlevel, downlevel_value, target_level};
use aep_relay::filter::Filter;
use aep_relay::store::Store;
use aep_relay::wire::envelope::{is_command_type, Attr, Capture, Event, Scalar};
use bytes::Bytes;
use serde_json::{Map, Value};
use support::{enc, fixture_json, shared, Endpoint, TestRelay};

// ---------------------------------------------------------------------------------------
// Loading

/// `conformance/fixtures/<name>` of this repository, parsed.
fn project(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("conformance/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

fn upstream(rel: &str) -> Value {
    fixture_json(&format!("aep-fixtures/{rel}"))
}

fn array<'a>(doc: &'a Value, key: &str) -> &'a [Value] {
    doc[key]
        .as_array()
        .unwrap_or_else(|| panic!("corpus member `{key}` is not an array"))
}

fn name(case: &Value) -> &str {
    case["name"].as_str().unwrap_or("(unnamed)")
}

/// `event` merged over `base` (a `null` member removes it), as an object whose member
/// order is `base`'s followed by the new members.
fn merged(base: &Value, event: &Value) -> Map<String, Value> {
    let mut out = base.as_object().cloned().unwrap_or_default();
    for (k, v) in event.as_object().expect("`event` is an object") {
        if v.is_null() {
            out.shift_remove(k);
        } else if let Some(slot) = out.get_mut(k) {
            *slot = v.clone();
        } else {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

/// The exact bytes of a case's Event: `raw`, or `event` merged over `base`.
fn event_bytes(base: &Value, case: &Value) -> Vec<u8> {
    match (&case["raw"], &case["event"]) {
        (Value::String(raw), _) => raw.as_bytes().to_vec(),
        (_, ev @ Value::Object(_)) => serde_json::to_vec(&merged(base, ev)).unwrap(),
        _ => panic!("{}: neither `raw` nor `event`", name(case)),
    }
}

/// The exact bytes of a case's filter: `filter_raw`, or `filter` serialized.
fn filter_bytes(case: &Value) -> Vec<u8> {
    match &case["filter_raw"] {
        Value::String(raw) => raw.as_bytes().to_vec(),
        _ => serde_json::to_vec(&case["filter"]).unwrap(),
    }
}

/// Fails the test with every collected failure, one per line.
fn report(corpus: &str, ran: usize, failures: Vec<String>) {
    assert!(ran > 0, "{corpus}: no case ran");
    assert!(
        failures.is_empty(),
        "{corpus}: {} of {ran} cases failed:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
    eprintln!("{corpus}: {ran} cases passed");
}

// ---------------------------------------------------------------------------------------
// Envelope (conformance/fixtures/envelope.json)

/// An extension attribute's value as JSON, for comparison with a corpus `expect`.
fn scalar_json(v: Scalar<'_>) -> Value {
    match v {
        Scalar::Str(s) => Value::from(s),
        Scalar::Bool(b) => Value::from(b),
        Scalar::Int(i) => match u64::try_from(i) {
            Ok(u) => Value::from(u),
            Err(_) => Value::from(i64::try_from(i).expect("Int is within i64 ∪ u64")),
        },
    }
}

/// Compares the routing attributes `ev` decoded with a case's `expect` object.
fn check_expect(ev: &Event, expect: &Map<String, Value>) -> Result<(), String> {
    for (k, want) in expect {
        let got = match k.as_str() {
            "seq" => ev.seq().map(Value::from).unwrap_or(Value::Null),
            "epoch" => ev.epoch_declared().map(Value::from).unwrap_or(Value::Null),
            "severity" => Value::from(ev.severity().as_str()),
            "capture" => Value::from(ev.capture().as_str()),
            "extensions" => Value::Object(
                ev.extensions()
                    .map(|(n, v)| (n.to_owned(), scalar_json(v)))
                    .collect(),
            ),
            other => match Attr::from_name(other) {
                Some(a) => ev.attr(a).map(Value::from).unwrap_or(Value::Null),
                None => return Err(format!("`expect` names an unknown attribute `{other}`")),
            },
        };
        if &got != want {
            return Err(format!("`{k}` decoded as {got}, expected {want}"));
        }
    }
    Ok(())
}

#[test]
fn project_envelope_cases() {
    let doc = project("envelope.json");
    let base = &doc["base"];
    let mut failures = Vec::new();
    let cases = array(&doc, "cases");
    for case in cases {
        let n = name(case);
        let valid = case["valid"]
            .as_bool()
            .unwrap_or_else(|| panic!("{n}: `valid` is not a boolean"));
        assert!(case["rule"].is_string(), "{n}: every case names its rule");
        let bytes = event_bytes(base, case);
        match (Event::parse(Bytes::from(bytes)), valid) {
            (Ok(ev), true) => {
                if let Some(expect) = case["expect"].as_object() {
                    if let Err(e) = check_expect(&ev, expect) {
                        failures.push(format!("{n}: {e}"));
                    }
                }
            }
            (Ok(_), false) => failures.push(format!("{n}: accepted, must be refused")),
            (Err(e), true) => failures.push(format!("{n}: refused ({e}), must be accepted")),
            (Err(e), false) => {
                if let Some(needle) = case["detail"].as_str() {
                    if !e.detail.contains(needle) {
                        failures.push(format!("{n}: refusal {:?} lacks {needle:?}", e.detail));
                    }
                }
            }
        }
    }
    report("envelope.json", cases.len(), failures);
}

/// The same verdicts over the wire: `POST /events` answers 202 for a valid Event, 400
/// `invalid-event` for an invalid one, and 403 for a valid command (control flows only on
/// an authenticated duplex binding, AEP-0004 §4.1).
#[test]
fn project_envelope_cases_over_http() {
    let doc = project("envelope.json");
    let base = &doc["base"];
    let relay = TestRelay::start();
    let mut failures = Vec::new();
    let cases = array(&doc, "cases");
    for case in cases {
        let n = name(case);
        let valid = case["valid"].as_bool().unwrap();
        let bytes = event_bytes(base, case);
        let body = String::from_utf8(bytes).expect("corpus Events are UTF-8");
        let (status, answer) = relay.post("application/json", &body);
        let command = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["type"].as_str().map(is_command_type))
            .unwrap_or(false);
        let want = match (valid, command) {
            (true, true) => 403,
            (true, false) => 202,
            (false, _) => 400,
        };
        if status != want {
            failures.push(format!(
                "{n}: POST answered {status} {answer}, expected {want}"
            ));
        } else if !valid && answer["error"] != "invalid-event" {
            failures.push(format!("{n}: 400 body {answer} is not invalid-event"));
        }
    }
    report("envelope.json over POST /events", cases.len(), failures);
}

// ---------------------------------------------------------------------------------------
// attr-match (conformance/fixtures/attr-match.json)

#[test]
fn project_attr_match_cases() {
    let doc = project("attr-match.json");
    let base = &doc["base"];
    let mut failures = Vec::new();
    let matches = array(&doc, "match");
    for case in matches {
        let n = name(case);
        let want = case["match"].as_bool().expect("`match` is a boolean");
        let ev = match Event::parse(Bytes::from(event_bytes(base, case))) {
            Ok(ev) => ev,
            Err(e) => {
                failures.push(format!("{n}: the case's Event is invalid ({e})"));
                continue;
            }
        };
        check_verdict(case, &ev, want, n, &mut failures);
    }
    let invalid = array(&doc, "invalid");
    for case in invalid {
        let n = name(case);
        assert!(case["rule"].is_string(), "{n}: every case names its rule");
        if let Ok(f) = Filter::parse(&filter_bytes(case)) {
            failures.push(format!("{n}: accepted as {f:?}, must fail closed"));
        }
        // The JSON form must also fail through the compiled-value entry point (WS
        // `subscribe` frames arrive as parsed JSON).
        if !case["filter"].is_null() || case["filter_raw"].is_null() {
            if let Ok(f) = Filter::compile(&case["filter"]) {
                failures.push(format!("{n}: compile accepted {f:?}"));
            }
        }
    }
    report("attr-match.json", matches.len() + invalid.len(), failures);
}

// ---------------------------------------------------------------------------------------
// Down-leveling (project and upstream share one checker)

/// Checks one down-leveled Event object against a case: `capture` (defaulted) equals
/// `expect_capture`, `data` equals `expect_data` (`null`: absent), every other member kept
/// with its value and position.
fn check_downlevel(
    input: &Map<String, Value>,
    out: &Map<String, Value>,
    case: &Value,
) -> Result<(), String> {
    let capture = out
        .get("capture")
        .and_then(Value::as_str)
        .unwrap_or("metadata");
    if capture != case["expect_capture"] {
        return Err(format!(
            "capture {capture}, expected {}",
            case["expect_capture"]
        ));
    }
    match (&case["expect_data"], out.get("data")) {
        (Value::Null, None) => {}
        (Value::Null, Some(d)) => return Err(format!("data must be gone, got {d}")),
        (want, Some(got)) if got == want => {
            // Member order too (serde_json with `preserve_order`).
            let text = |v: &Value| serde_json::to_string(v).unwrap();
            if text(got) != text(want) {
                return Err(format!(
                    "data member order {} differs from {}",
                    text(got),
                    text(want)
                ));
            }
        }
        (want, got) => return Err(format!("data {got:?}, expected {want}")),
    }
    let others = |m: &Map<String, Value>| -> Vec<(String, Value)> {
        m.iter()
            .filter(|(k, _)| *k != "capture" && *k != "data")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    if others(out) != others(input) {
        return Err("envelope members other than capture and data changed".into());
    }
    Ok(())
}

/// Runs a down-level corpus (`cases` with `ceiling`, `event`, `expect_capture`,
/// `expect_data`) through both entry points of `aep_relay::capture`.
fn run_downlevel(corpus: &str, base: Option<&Value>, cases: &[Value]) {
    let mut failures = Vec::new();
    for case in cases {
        let n = name(case);
        let ceiling = Capture::parse(case["ceiling"].as_str().expect("ceiling"))
            .unwrap_or_else(|| panic!("{n}: unknown ceiling"));
        let input = match base {
            Some(b) => merged(b, &case["event"]),
            None => case["event"].as_object().expect("event").clone(),
        };

        // The serde_json core.
        let mut out = input.clone();
        let changed = downlevel_value(&mut out, ceiling);
        if let Err(e) = check_downlevel(&input, &out, case) {
            failures.push(format!("{n} (downlevel_value): {e}"));
        }
        if !changed && out != input {
            failures.push(format!("{n}: reported unchanged but rewrote the Event"));
        }

        // The wrapper the fan-out path calls: `None` means the original bytes go out.
        let bytes = serde_json::to_vec(&input).unwrap();
        let ev = match Event::parse(Bytes::from(bytes.clone())) {
            Ok(ev) => ev,
            Err(e) => {
                failures.push(format!("{n}: the case's Event is invalid ({e})"));
                continue;
            }
        };
        let out = match downlevel(&ev, ceiling) {
            None => {
                if target_level(ev.capture(), ceiling).is_some() {
                    failures.push(format!("{n}: downlevel passed an Event above the ceiling"));
                }
                input.clone()
            }
            Some(copy) => serde_json::from_slice(&copy).expect("a down-leveled copy is JSON"),
        };
        if let Err(e) = check_downlevel(&input, &out, case) {
            failures.push(format!("{n} (downlevel): {e}"));
        }
    }
    report(corpus, cases.len(), failures);
}

#[test]
fn project_downlevel_cases() {
    let doc = project("downlevel.json");
    run_downlevel("downlevel.json", Some(&doc["base"]), array(&doc, "cases"));
}

// ---------------------------------------------------------------------------------------
// Resume (conformance/fixtures/resume.json)

/// The full Event a resume-corpus spec stands for, as one JSON line.
fn resume_event(spec: &Value) -> String {
    let s = spec.as_object().expect("an Event spec is an object");
    let id = s["id"].as_str().expect("an Event spec has an id");
    let session = s.get("session").and_then(Value::as_str);
    let seq = s.get("seq");
    let ty = s.get("type").and_then(Value::as_str).unwrap_or(match seq {
        Some(_) => "tool.completed",
        None => "attention.routed",
    });
    let source = match s.get("source").and_then(Value::as_str) {
        Some(src) => src.to_owned(),
        None => format!(
            "aep://conformance/agent/conf/session/{}",
            enc(session.unwrap_or("none"))
        ),
    };
    let mut ev = Map::new();
    ev.insert("aep".into(), "0.1".into());
    ev.insert("id".into(), id.into());
    ev.insert("type".into(), ty.into());
    ev.insert("time".into(), "2026-07-03T10:00:00Z".into());
    ev.insert("source".into(), source.into());
    ev.insert("agent".into(), "conf".into());
    if let Some(session) = session {
        ev.insert("session".into(), session.into());
    }
    if let Some(seq) = seq {
        ev.insert("seq".into(), seq.clone());
    }
    if let Some(epoch) = s.get("epoch") {
        ev.insert("epoch".into(), epoch.clone());
    }
    serde_json::to_string(&ev).unwrap()
}

/// A resume position of the corpus: `(session, epoch, seq)`.
fn positions(from: &Value) -> Option<Vec<(String, u64, u64)>> {
    let list = from.as_array()?;
    Some(
        list.iter()
            .map(|p| {
                (
                    p["session"].as_str().expect("session").to_owned(),
                    p["epoch"].as_u64().expect("epoch"),
                    p["seq"].as_u64().expect("seq"),
                )
            })
            .collect(),
    )
}

/// What a consumer saw: Event ids in order, and markers `(session, epoch, seq)` with the
/// index into the ids at which each arrived.
#[derive(Debug, Default, PartialEq)]
struct Seen {
    ids: Vec<String>,
    markers: Vec<(String, u64, u64, usize)>,
}

/// Compares what a consumer saw with a case's `expect`: the ids in order, the markers
/// (as a set), and each marker ahead of every Event of its session.
fn check_seen(seen: &Seen, sessions: &[Option<String>], case: &Value) -> Result<(), String> {
    let want_ids: Vec<&str> = case["expect"]["delivered"]
        .as_array()
        .expect("expect.delivered")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    if seen.ids != want_ids {
        return Err(format!("delivered {:?}, expected {want_ids:?}", seen.ids));
    }
    let mut want_markers: Vec<(String, u64, u64)> = case["expect"]["exhausted"]
        .as_array()
        .expect("expect.exhausted")
        .iter()
        .map(|m| {
            (
                m["session"].as_str().unwrap().to_owned(),
                m["epoch"].as_u64().unwrap(),
                m["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut got: Vec<(String, u64, u64)> = seen
        .markers
        .iter()
        .map(|(s, e, q, _)| (s.clone(), *e, *q))
        .collect();
    want_markers.sort();
    got.sort();
    if got != want_markers {
        return Err(format!(
            "replay-exhausted markers {got:?}, expected {want_markers:?}"
        ));
    }
    for (s, _, _, at) in &seen.markers {
        let first = sessions
            .iter()
            .position(|x| x.as_deref() == Some(s.as_str()));
        if let Some(first) = first {
            if first < *at {
                return Err(format!(
                    "the marker for {s:?} arrived after an Event of that session"
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn project_resume_cases_against_the_store() {
    let doc = project("resume.json");
    let mut failures = Vec::new();
    let cases = array(&doc, "cases");
    for case in cases {
        let n = name(case);
        let buffer = case["buffer"].as_u64().expect("buffer") as usize;
        let mut store: Store<Event> = Store::new(buffer, 64);
        for spec in case["events"].as_array().expect("events") {
            let line = resume_event(spec);
            let ev = Event::parse(Bytes::from(line)).unwrap_or_else(|e| panic!("{n}: {e}"));
            store.admit(&ev);
        }
        let mut seen = Seen::default();
        let mut sessions = Vec::new();
        let take = |ev: &Event, seen: &mut Seen, sessions: &mut Vec<Option<String>>| {
            seen.ids.push(ev.id().to_owned());
            sessions.push(ev.session().map(str::to_owned));
        };
        match positions(&case["from"]) {
            Some(ps) => {
                for (s, e, q) in ps {
                    let mut held = Vec::new();
                    let markers = store.replay_after(&s, (e, q), &mut |ev| held.push(ev));
                    for m in markers {
                        let (me, mq) = m.earliest;
                        seen.markers.push((s.clone(), me, mq, seen.ids.len()));
                    }
                    for ev in &held {
                        take(ev, &mut seen, &mut sessions);
                    }
                }
            }
            None => {
                assert_eq!(case["from"], "all", "{n}: from");
                let mut held = Vec::new();
                store.replay_all(&mut |ev| held.push(ev));
                for ev in &held {
                    take(ev, &mut seen, &mut sessions);
                }
            }
        }
        if let Err(e) = check_seen(&seen, &sessions, case) {
            failures.push(format!("{n}: {e}"));
        }
    }
    report("resume.json (store)", cases.len(), failures);
}

/// The resume corpus over the wire: a relay with the case's buffer, the Events posted as
/// one NDJSON batch, then `GET /stream?from=…&live=0` read to its end.
#[test]
fn project_resume_cases_over_sse() {
    let doc = project("resume.json");
    let mut failures = Vec::new();
    let cases = array(&doc, "cases");
    for case in cases {
        let n = name(case);
        let buffer = case["buffer"].as_u64().expect("buffer") as usize;
        let relay = TestRelay::with(|c| c.buffer_per_session = buffer);
        let lines: Vec<String> = case["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(resume_event)
            .collect();
        let (status, answer) = relay.post("application/x-ndjson", &(lines.join("\n") + "\n"));
        if status != 202 {
            failures.push(format!("{n}: POST answered {status} {answer}"));
            continue;
        }
        let from = match &case["from"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let url = format!("{}?from={}&live=0", relay.url("/stream"), enc(&from));
        let body = match support::agent().get(&url).call() {
            Ok(r) => r.into_string().expect("stream body"),
            Err(e) => {
                failures.push(format!("{n}: GET /stream failed: {e}"));
                continue;
            }
        };
        let mut seen = Seen::default();
        let mut sessions = Vec::new();
        for line in body.lines() {
            if let Some(rest) = line.strip_prefix(": replay-exhausted ") {
                // `{session} {epoch}:{seq}`; the session may contain spaces.
                let (s, pos) = rest.rsplit_once(' ').expect("marker shape");
                let (e, q) = pos.split_once(':').expect("marker position");
                seen.markers.push((
                    s.to_owned(),
                    e.parse().unwrap(),
                    q.parse().unwrap(),
                    seen.ids.len(),
                ));
            } else if let Some(data) = line.strip_prefix("data: ") {
                let v: Value = serde_json::from_str(data).expect("data is an Event");
                seen.ids.push(v["id"].as_str().unwrap().to_owned());
                sessions.push(v["session"].as_str().map(str::to_owned));
            }
        }
        if let Err(e) = check_seen(&seen, &sessions, case) {
            failures.push(format!("{n}: {e}"));
        }
    }
    report("resume.json (SSE)", cases.len(), failures);
}

// ---------------------------------------------------------------------------------------
// The upstream corpus (../shared/aep-fixtures)

/// attr-match/cases.json: fixture Events are partial envelopes, so they go through
/// [`Event::scan`] (JSON and value types, no presence rules), the same scanner as ingest.
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn upstream_attr_match() {
    let doc = upstream("attr-match/cases.json");
    let mut failures = Vec::new();
    let matches = array(&doc, "match");
    for case in matches {
        let n = name(case);
        let want = case["match"].as_bool().expect("match");
        let bytes = serde_json::to_vec(&case["event"]).unwrap();
        let ev = match Event::scan(Bytes::from(bytes)) {
            Ok(ev) => ev,
            Err(e) => {
                failures.push(format!("{n}: scanner refused the fixture Event: {e}"));
                continue;
            }
        };
        check_verdict(case, &ev, want, n, &mut failures);
    }
    let invalid = array(&doc, "invalid");
    for case in invalid {
        let n = name(case);
        if Filter::parse(&filter_bytes(case)).is_ok() || Filter::compile(&case["filter"]).is_ok() {
            failures.push(format!("{n}: accepted, must fail closed"));
        }
    }
    report(
        "upstream attr-match",
        matches.len() + invalid.len(),
        failures,
    );
}

#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn upstream_downlevel() {
    let doc = upstream("downlevel/cases.json");
    run_downlevel("upstream downlevel", None, array(&doc, "cases"));
}

/// golden/golden.jsonl: every line is a valid Event kept byte for byte, matched by `{}`,
/// and never above its own capture level after any ceiling.
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn upstream_golden() {
    let path = shared("aep-fixtures/golden/golden.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let all = Filter::parse(b"{}").unwrap();
    let mut failures = Vec::new();
    let mut n = 0;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        n += 1;
        let what = format!("golden line {}", i + 1);
        let ev = match Event::parse(Bytes::copy_from_slice(line.as_bytes())) {
            Ok(ev) => ev,
            Err(e) => {
                failures.push(format!("{what}: refused: {e}"));
                continue;
            }
        };
        if &ev.bytes()[..] != line.trim().as_bytes() {
            failures.push(format!("{what}: bytes not kept verbatim"));
        }
        if !all.matches(&ev) {
            failures.push(format!("{what}: {{}} does not match"));
        }
        for ceiling in Capture::ALL {
            if let Some(copy) = downlevel(&ev, ceiling) {
                let v: Value = serde_json::from_slice(&copy).unwrap();
                let level = Capture::parse(v["capture"].as_str().unwrap()).unwrap();
                if level > ceiling || level >= ev.capture() {
                    failures.push(format!(
                        "{what}: at ceiling {ceiling:?} it became {level:?}"
                    ));
                }
            }
        }
    }
    report("upstream golden", n, failures);
    assert_eq!(n, 64, "golden.jsonl holds 64 Events");
}

/// invalid/cases.json, envelope-level cases: refused by [`Event::parse`]. A case whose
/// rule is a payload schema (AEP-0002 §5, AEP-0006) or a cross-event stream rule (a case
/// with several `events`) is not a relay's to enforce (AEP-0001 §5: relays MUST NOT
/// require parsing `data`); each of its Events must be accepted as an envelope.
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn upstream_invalid_envelope_level() {
    let doc = upstream("invalid/cases.json");
    let mut failures = Vec::new();
    let mut envelope_level = 0;
    let cases = array(&doc, "cases");
    for case in cases {
        let n = name(case);
        let rule = case["rule"].as_str().unwrap_or_default();
        let payload = rule.contains("payload schema") || rule.contains("field_spec");
        let parse = |v: &Value| Event::parse(Bytes::from(serde_json::to_vec(v).unwrap()));
        match (&case["event"], &case["events"]) {
            (ev @ Value::Object(_), _) if !payload => {
                envelope_level += 1;
                if parse(ev).is_ok() {
                    failures.push(format!("{n} ({rule}): accepted, must be refused"));
                }
            }
            (ev @ Value::Object(_), _) => {
                if let Err(e) = parse(ev) {
                    failures.push(format!(
                        "{n}: a payload-rule case refused as an envelope: {e}"
                    ));
                }
            }
            (_, Value::Array(events)) => {
                for (i, ev) in events.iter().enumerate() {
                    if let Err(e) = parse(ev) {
                        failures.push(format!("{n} (event {i}): refused as an envelope: {e}"));
                    }
                }
            }
            _ => failures.push(format!("{n}: neither event nor events")),
        }
    }
    assert!(
        envelope_level >= 17,
        "only {envelope_level} envelope-level cases"
    );
    report("upstream invalid", cases.len(), failures);
}

/// Every `type` the reference adapters emit, by the mapping fixtures
/// (`mappings/*.json`): the `type` members of their expected Events, wherever a file
/// nests them (`expected`, `deltas_expected`, `companion`, `primary`, the modes), and
/// not those of the vendor input (`input`) or of payloads (`data`, `expected_data*`).
/// Sorted, without repeats.
fn mapping_types() -> Vec<String> {
    fn walk(v: &Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("input" | "data" | "expected_data" | "expected_data_metadata", _) => {}
                        ("type", Value::String(t)) => {
                            out.insert(t.clone());
                        }
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let dir = shared("aep-fixtures/mappings");
    let mut types = std::collections::BTreeSet::new();
    let mut files = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            files += 1;
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            walk(&upstream(&format!("mappings/{name}")), &mut types);
        }
    }
    assert!(files >= 12, "only {files} mapping files");
    types.into_iter().collect()
}

/// A valid Event of type `t` at `seq` in session `maps`, scoped as the envelope schema
/// scopes it (AEP-0001 §5.2): an `agent.*` type carries neither `session` nor `seq`, a
/// foreign-emitter type (a command, `attention.routed`) `session` without `seq`.
fn mapping_event(t: &str, seq: usize) -> String {
    let mut ev = serde_json::json!({
        "aep": "0.1",
        "id": format!("map-{seq}"),
        "type": t,
        "time": "2026-07-03T10:00:00Z",
        "source": "aep://conformance/agent/mappings/session/maps",
        "agent": "mappings",
        "session": "maps",
        "seq": seq,
        "data": {},
    });
    let m = ev.as_object_mut().unwrap();
    if t.starts_with("agent.") {
        m.shift_remove("session");
        m.shift_remove("seq");
    } else if is_command_type(t) || t == "attention.routed" {
        m.shift_remove("seq");
    }
    ev.to_string()
}

/// What the reference adapters emit passes the relay (AEP-0001 §6: the vendor form is
/// the envelope schema's `x.{vendor}.{token}.{rest}`, any token third; consumers MUST
/// tolerate unknown types): every type of the mapping fixtures, each in a valid Event, in
/// ONE NDJSON batch with valid core Events, is accepted whole (a batch is all or none,
/// AEP-0003 §3.2) and replays byte for byte. The envelope-level cases of
/// `invalid/cases.json` stay refused over the wire, alone and as one line of that batch.
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn upstream_mapping_types_over_http() {
    let types = mapping_types();
    let vendor: Vec<&String> = types.iter().filter(|t| t.starts_with("x.")).collect();
    assert_eq!(
        (types.len(), vendor.len()),
        (140, 115),
        "the mapping fixtures pin 140 types, 115 of them vendor types: {types:?}"
    );
    let offcategory = vendor
        .iter()
        .filter(|t| !aep_relay::wire::envelope::is_category(t.split('.').nth(2).unwrap()))
        .count();
    assert_eq!(
        offcategory, 78,
        "vendor types whose third token is no category"
    );
    let commands: Vec<&String> = types.iter().filter(|t| is_command_type(t)).collect();
    assert!(
        commands.is_empty(),
        "a command cannot be posted (AEP-0004 §4.1): {commands:?}"
    );

    let mut batch = vec![support::ev("a", "core", 0)];
    for (i, t) in types.iter().enumerate() {
        batch.push(mapping_event(t, i));
        if i == types.len() / 2 {
            batch.push(support::ev("a", "core", 1));
        }
    }
    batch.push(support::ev("a", "core", 2));

    let relay = TestRelay::start();
    let (status, answer) = relay.post_lines(&batch);
    assert_eq!(
        (status, answer["accepted"].as_u64()),
        (202, Some(batch.len() as u64)),
        "{} Events ({} mapping types) answered {status} {answer}",
        batch.len(),
        types.len()
    );
    let mut replayed = relay.replay_all();
    replayed.sort();
    let mut posted = batch.clone();
    posted.sort();
    assert_eq!(replayed, posted, "the replay is not the posted batch");

    // The envelope-level invalid cases: refused alone, and each refuses the whole batch
    // it is a line of, naming that line.
    let doc = upstream("invalid/cases.json");
    let mut failures = Vec::new();
    let mut refused = 0;
    for case in array(&doc, "cases") {
        let rule = case["rule"].as_str().unwrap_or_default();
        let Value::Object(ev) = &case["event"] else {
            continue; // a stream case
        };
        if rule.contains("payload schema") || rule.contains("field_spec") {
            continue; // not a relay's to enforce (AEP-0001 §5)
        }
        refused += 1;
        let n = name(case);
        let line = serde_json::to_string(ev).unwrap();
        let (status, answer) = relay.post("application/json", &line);
        if (status, answer["error"].as_str()) != (400, Some("invalid-event")) {
            failures.push(format!("{n}: alone, answered {status} {answer}"));
        }
        let mut with = batch.clone();
        with.insert(batch.len() / 2, line);
        let (status, answer) = relay.post_lines(&with);
        let want = (400, Some("invalid-event"), Some(batch.len() as u64 / 2 + 1));
        let got = (status, answer["error"].as_str(), answer["line"].as_u64());
        if got != want {
            failures.push(format!("{n}: in the batch, answered {status} {answer}"));
        }
    }
    assert_eq!(refused, 17, "envelope-level cases of invalid/cases.json");
    report("upstream invalid over POST /events", refused, failures);
}

/// The corpora themselves: every project case names a rule, and names are unique (a
/// failure report must point at exactly one case).
#[test]
fn project_corpus_shape() {
    for (file, sections) in [
        ("envelope.json", &["cases"][..]),
        ("attr-match.json", &["match", "invalid"][..]),
        ("downlevel.json", &["cases"][..]),
        ("resume.json", &["cases"][..]),
    ] {
        let doc = project(file);
        assert!(doc["$comment"].is_string(), "{file}: $comment");
        let mut names = std::collections::HashSet::new();
        for s in sections {
            for case in array(&doc, s) {
                let n = name(case);
                assert!(
                    names.insert(n.to_owned()),
                    "{file}: duplicate case name {n:?}"
                );
                assert!(case["rule"].is_string(), "{file}: {n}: no rule");
                if let Some(note) = case.get("note") {
                    assert!(note.is_string(), "{file}: {n}: note is not a string");
                }
            }
        }
    }
    // Every category of AEP-0002 §3 (the relay's one table of them) appears in the
    // envelope corpus, bare and vendored.
    let doc = project("envelope.json");
    let text = doc.to_string();
    for c in aep_relay::wire::envelope::CATEGORIES {
        assert!(text.contains(&format!("\"{c}.")), "no bare {c}.* case");
        assert!(
            text.contains(&format!(".{c}.")),
            "no vendor x.{{vendor}}.{c}.* case"
        );
    }
}

/// An attr-match case's verdict on `ev` (AEP-0003 §6.2): a mismatch or a refused valid
/// filter is recorded in `failures`.
fn check_verdict(case: &Value, ev: &Event, want: bool, n: &str, failures: &mut Vec<String>) {
    match Filter::parse(&filter_bytes(case)) {
        Ok(f) if f.matches(ev) == want => {}
        Ok(_) => failures.push(format!("{n}: verdict {}, expected {want}", !want)),
        Err(e) => failures.push(format!("{n}: valid filter refused: {e}")),
    }
}
