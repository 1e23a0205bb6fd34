//! The envelope scanner and validator against the upstream conformance corpus
//! (`../shared/aep-fixtures`): every golden Event parses and its routing attributes equal
//! what `serde_json` reads; every `invalid/cases.json` case is classified as an envelope
//! rule (the relay refuses it) or as a payload-schema / cross-event stream rule (not a
//! relay's to enforce, AEP-0001 §5: relays MUST NOT require parsing `data`).
//!
//! The fixtures are read in place; when `../shared` is absent the tests are ignored
//! (`cfg(no_fixtures)`, see build.rs), and under `CI=true` that absence fails.

use crate::support;
use support::shared;

use aep_relay::wire::envelope::{Attr, Capture, Event, Scalar, Severity};
use bytes::Bytes;
use serde_json::Value;

/// Asserts that `ev`'s extracted attributes equal `serde_json`'s reading of the same bytes.
fn assert_same_as_serde(ev: &Event, v: &Value, what: &str) {
    let obj = v.as_object().expect("an Event is an object");
    for a in Attr::ALL {
        assert_eq!(
            ev.attr(a),
            obj.get(a.name()).and_then(Value::as_str),
            "{what}: `{}`",
            a.name()
        );
    }
    assert_eq!(ev.id(), obj["id"].as_str().unwrap(), "{what}: id");
    assert_eq!(
        ev.event_type(),
        obj["type"].as_str().unwrap(),
        "{what}: type"
    );
    assert_eq!(
        ev.source(),
        obj["source"].as_str().unwrap(),
        "{what}: source"
    );
    assert_eq!(
        ev.session(),
        obj.get("session").and_then(Value::as_str),
        "{what}: session"
    );
    assert_eq!(
        ev.seq(),
        obj.get("seq").and_then(Value::as_u64),
        "{what}: seq"
    );
    assert_eq!(
        ev.epoch_declared(),
        obj.get("epoch").and_then(Value::as_u64),
        "{what}: epoch"
    );
    assert_eq!(
        ev.epoch(),
        obj.get("epoch").and_then(Value::as_u64).unwrap_or(0)
    );
    assert_eq!(
        ev.severity_declared(),
        obj.get("severity")
            .and_then(Value::as_str)
            .map(|s| Severity::parse(s).unwrap()),
        "{what}: severity"
    );
    assert_eq!(
        ev.capture_declared(),
        obj.get("capture")
            .and_then(Value::as_str)
            .map(|s| Capture::parse(s).unwrap()),
        "{what}: capture"
    );
    match (ev.data(), obj.get("data")) {
        (Some(raw), Some(d)) => {
            let reread: Value = serde_json::from_slice(raw).expect("data span is JSON");
            assert_eq!(&reread, d, "{what}: data");
        }
        (None, None) => {}
        (got, want) => panic!("{what}: data {got:?} vs {want:?}"),
    }
    let core = aep_relay::wire::envelope::CORE_NAMES;
    let want: Vec<(&str, Value)> = obj
        .iter()
        .filter(|(k, _)| !core.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let got: Vec<(&str, Value)> = ev
        .extensions()
        .map(|(k, v)| {
            let v = match v {
                Scalar::Str(s) => Value::from(s),
                Scalar::Bool(b) => Value::from(b),
                Scalar::Int(i) => match u64::try_from(i) {
                    Ok(u) => Value::from(u),
                    Err(_) => Value::from(i64::try_from(i).unwrap()),
                },
            };
            (k, v)
        })
        .collect();
    assert_eq!(got, want, "{what}: extensions");
    for (k, v) in &want {
        assert!(ev.extension(k).is_some(), "{what}: extension({k})");
        let _ = v;
    }
}

/// AEP-0001 §10: every golden Event is a conformant envelope; the relay accepts all 64,
/// and reads the same routing attributes `serde_json` does.
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn golden_events_parse_and_match_serde() {
    let path = shared("aep-fixtures/golden/golden.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let mut n = 0;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        n += 1;
        let what = format!("golden line {}", i + 1);
        let ev = Event::parse(Bytes::copy_from_slice(line.as_bytes()))
            .unwrap_or_else(|e| panic!("{what}: refused: {e}"));
        let v: Value = serde_json::from_str(line).unwrap();
        assert_same_as_serde(&ev, &v, &what);
        assert_eq!(
            &ev.bytes()[..],
            line.trim().as_bytes(),
            "{what}: bytes kept verbatim"
        );
    }
    assert_eq!(n, 64, "golden.jsonl holds 64 Events");
}

/// How a relay treats one `invalid/cases.json` case.
enum Class {
    /// An envelope rule (AEP-0001 §5, §5.2, §5.4, §6, §8; AEP-0004 §2.2): `Event::parse`
    /// refuses it, and the detail contains this text (the attribute or section violated).
    Envelope(&'static str),
    /// A payload-schema rule (AEP-0002 §5, AEP-0006): needs `data` parsed against a type
    /// schema, which a relay MUST NOT require (AEP-0001 §5). The envelope is valid, so
    /// `Event::parse` accepts it.
    Payload,
    /// A cross-event stream rule (terminal exclusivity, ack uniqueness, seq/epoch
    /// regression, id collision, form answer vs request): a property of a history, checked
    /// by stream validators, not of one envelope. Each Event alone is a valid envelope, so
    /// `Event::parse` accepts every one. (The relay's store dedupes on `(source, id)`,
    /// AEP-0001 §7.4, which is admission, not validation.)
    Stream,
}

/// Every case by name. A case not listed here fails the test: classify it before it can
/// be ignored.
const CASES: &[(&str, Class)] = &[
    (
        "session-scoped without session",
        Class::Envelope("`session` is REQUIRED"),
    ),
    (
        "session-scoped without seq",
        Class::Envelope("`seq` is REQUIRED"),
    ),
    (
        "agent-scoped with session",
        Class::Envelope("`session` must be omitted on agent-scoped"),
    ),
    (
        "agent-scoped with seq",
        Class::Envelope("`seq` must be omitted on agent-scoped"),
    ),
    ("command with seq", Class::Envelope("AEP-0004 §2.2")),
    (
        "attention.routed with seq",
        Class::Envelope("`seq` must be omitted on attention.routed"),
    ),
    ("single-segment type", Class::Envelope("AEP-0001 §6")),
    ("unknown category", Class::Envelope("AEP-0002 §3")),
    ("uppercase in type", Class::Envelope("AEP-0001 §6")),
    (
        "vendor type too short (x.vendor.verb)",
        Class::Envelope("AEP-0001 §6"),
    ),
    (
        "extension attribute name over 20 chars",
        Class::Envelope("AEP-0001 §5.4"),
    ),
    (
        "extension attribute with object value",
        Class::Envelope("AEP-0001 §5.4"),
    ),
    (
        "extension attribute name with illegal charset",
        Class::Envelope("AEP-0001 §5.4"),
    ),
    ("unknown severity", Class::Envelope("AEP-0001 §5.1 #15")),
    (
        "malformed traceparent",
        Class::Envelope("AEP-0001 §5.1 #14"),
    ),
    (
        "unsupported envelope version",
        Class::Envelope("AEP-0001 §5.1 #1"),
    ),
    ("negative seq", Class::Envelope("AEP-0001 §5.1 #11")),
    ("form select field without choices", Class::Payload),
    ("agent.presence with an unregistered state", Class::Payload),
    ("agent.presence missing the required state", Class::Payload),
    ("agent.health with an unregistered status", Class::Payload),
    (
        "session.compacted with a non-integer token count",
        Class::Payload,
    ),
    ("state.delta with a non-array delta", Class::Payload),
    (
        "run.finished cost missing the required currency",
        Class::Payload,
    ),
    (
        "tool.completed cost total is a string (amounts are numbers, not bare-float strings)",
        Class::Payload,
    ),
    (
        "form answered with a non-choice string for a select without other:true",
        Class::Stream,
    ),
    (
        "second run terminal (finished then cancelled)",
        Class::Stream,
    ),
    (
        "run terminal repeated (failed twice, distinct events)",
        Class::Stream,
    ),
    (
        "session ends with a dangling attention request",
        Class::Stream,
    ),
    (
        "id collision within one emitter (same (source,id), different content)",
        Class::Stream,
    ),
    ("seq regression without an epoch bump", Class::Stream),
    ("epoch regression", Class::Stream),
    (
        "second ack for one command (accepted twice, distinct events)",
        Class::Stream,
    ),
    (
        "conflicting ack decisions for one command (accepted then rejected)",
        Class::Stream,
    ),
    (
        "second session.ended for one session (distinct events)",
        Class::Stream,
    ),
];

fn parse_value(v: &Value) -> Result<Event, aep_relay::wire::envelope::InvalidEvent> {
    Event::parse(Bytes::from(serde_json::to_vec(v).unwrap()))
}

#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn invalid_cases_are_classified_and_envelope_ones_refused() {
    let path = shared("aep-fixtures/invalid/cases.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = doc["cases"].as_array().expect("cases array");
    let mut unknown = Vec::new();
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for case in cases {
        let name = case["name"].as_str().expect("case name");
        seen.push(name);
        let Some((_, class)) = CASES.iter().find(|(n, _)| *n == name) else {
            unknown.push(name.to_owned());
            continue;
        };
        match class {
            Class::Envelope(needle) => {
                let ev = case.get("event").expect("an envelope case has one event");
                match parse_value(ev) {
                    Ok(_) => failures.push(format!("{name}: accepted, must be refused")),
                    Err(e) if !e.detail.contains(needle) => {
                        failures.push(format!("{name}: detail {:?} lacks {needle:?}", e.detail))
                    }
                    Err(_) => {}
                }
            }
            Class::Payload | Class::Stream => {
                let events: Vec<&Value> = match (case.get("event"), case.get("events")) {
                    (Some(e), None) => vec![e],
                    (None, Some(Value::Array(es))) => es.iter().collect(),
                    _ => panic!("{name}: neither event nor events"),
                };
                if matches!(class, Class::Stream) {
                    assert!(events.len() > 1, "{name}: a stream case has several events");
                }
                for (i, ev) in events.iter().enumerate() {
                    if let Err(e) = parse_value(ev) {
                        failures.push(format!(
                            "{name} (event {i}): refused ({e}), but it is a valid envelope"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "unclassified invalid cases (add them to CASES with a reason): {unknown:#?}"
    );
    assert!(failures.is_empty(), "{failures:#?}");
    for (name, _) in CASES {
        if !seen.contains(name) {
            eprintln!("note: classified case {name:?} is no longer in invalid/cases.json");
        }
    }
}

/// CI has `../shared` (and runs with `CI=true`): there no fixture test may be ignored, so
/// a build that set `cfg(no_fixtures)` fails here instead of reporting them as ignored.
#[test]
fn ci_never_ignores_the_fixture_tests() {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    assert!(
        !(ci && cfg!(no_fixtures)),
        "CI=true, but the upstream fixtures are absent at {} (build.rs set cfg(no_fixtures)): \
         every test that reads them would be ignored",
        env!("AEP_SHARED_DIR")
    );
}
