//! The envelope scanner, differentially against `serde_json`.
//!
//! Invariants asserted, for every input:
//! 1. `Event::scan` accepts iff the oracle does. The oracle is `serde_json::from_slice`
//!    reading exactly one JSON object (whitespace around it allowed, nothing else), plus:
//!    no top-level member name repeats (AEP-0001 §5; DESIGN.md: "a duplicated top-level
//!    member is an invalid Event"), and each top-level value obeys the value rules of
//!    AEP-0001 §5.1 (string attributes are non-empty strings, `seq`/`epoch` integers >= 0,
//!    `severity` one of §8.1, `capture` one of §8.2, `data` an object, no `null`) and §5.4
//!    (extension names `[a-z0-9]{1,20}` not core, values string / integer / boolean).
//! 2. When both accept, every routing attribute the scanner extracts equals serde_json's
//!    decoding of it (escapes, surrogate pairs, integers exactly, in `i64 ∪ u64`), the
//!    extensions come out in wire order, `data` is a span that re-reads to serde_json's
//!    `data`, and `Event::bytes` is the input without the surrounding JSON whitespace.
//! 3. When the scanner refuses, its error detail is non-empty and its byte offset (if
//!    any) lies within the input.
//! 4. `Event::parse` never panics, accepts only what `Event::scan` accepts, and what it
//!    accepts carries the REQUIRED attributes of AEP-0001 §5.1 and the version `0.1`.
//! 5. `has_line_breaks()` is true iff the Event's bytes hold a CR or LF.
//! 6. The derived accessors agree with the attributes: `scope()` (AEP-0001 §5.2),
//!    `is_command()` (AEP-0004 §2), the defaults of `epoch`, `severity`, `capture`
//!    (AEP-0001 §5.1 #12, #15, #16).
#![no_main]

use aep_relay::wire::envelope::{
    is_command_type, Attr, Capture, Event, Scalar, Scope, Severity, CORE_NAMES,
};
use aep_relay_fuzz::{is_integer, legal_extension_name, members};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// What the oracle expects the scanner to extract.
#[derive(Debug, PartialEq)]
struct Expected {
    text: Vec<Option<String>>,
    seq: Option<u64>,
    epoch: Option<u64>,
    severity: Option<Severity>,
    capture: Option<Capture>,
    extensions: Vec<(String, Value)>,
    data: Option<Value>,
}

/// The oracle: serde_json plus the value rules, written from AEP-0001 §5.1 / §5.4.
fn oracle(bytes: &[u8]) -> Result<Expected, String> {
    let members = members(bytes)?;
    let mut exp = Expected {
        text: vec![None; Attr::COUNT],
        seq: None,
        epoch: None,
        severity: None,
        capture: None,
        extensions: Vec::new(),
        data: None,
    };
    let mut seen = std::collections::HashSet::new();
    for (k, v) in members {
        if !seen.insert(k.clone()) {
            return Err(format!("duplicate top-level member {k:?} (AEP-0001 §5)"));
        }
        // §5.1: absent attributes are omitted, never null (extensions: scalars only).
        if v.is_null() {
            return Err(format!("{k:?} is null"));
        }
        match k.as_str() {
            "seq" | "epoch" => {
                let n = v
                    .as_u64()
                    .ok_or_else(|| format!("{k} not an integer >= 0"))?;
                if k == "seq" {
                    exp.seq = Some(n);
                } else {
                    exp.epoch = Some(n);
                }
            }
            "severity" => {
                let s = v.as_str().and_then(Severity::parse);
                exp.severity = Some(s.ok_or("severity outside §8.1")?);
            }
            "capture" => {
                let c = v.as_str().and_then(Capture::parse);
                exp.capture = Some(c.ok_or("capture outside §8.2")?);
            }
            "data" => {
                if !v.is_object() {
                    return Err("data not an object (§5.1 #17)".into());
                }
                exp.data = Some(v);
            }
            name => match Attr::from_name(name) {
                Some(a) => match v.as_str() {
                    Some(s) if !s.is_empty() => exp.text[a as usize] = Some(s.to_owned()),
                    _ => return Err(format!("{name} not a non-empty string")),
                },
                None => {
                    if !legal_extension_name(name) {
                        return Err(format!("illegal extension name {name:?} (§5.4)"));
                    }
                    if !(v.is_string() || v.is_boolean() || is_integer(&v)) {
                        return Err(format!("extension {name} not a scalar (§5.4)"));
                    }
                    exp.extensions.push((k, v));
                }
            },
        }
    }
    Ok(exp)
}

fn scalar_value(s: Scalar<'_>) -> Value {
    match s {
        Scalar::Str(s) => Value::from(s),
        Scalar::Bool(b) => Value::from(b),
        Scalar::Int(i) => match (u64::try_from(i), i64::try_from(i)) {
            (Ok(u), _) => Value::from(u),
            (_, Ok(n)) => Value::from(n),
            _ => panic!("extension integer {i} outside i64 ∪ u64"),
        },
    }
}

fn extracted(ev: &Event) -> Expected {
    Expected {
        text: Attr::ALL
            .iter()
            .map(|&a| ev.attr(a).map(str::to_owned))
            .collect(),
        seq: ev.seq(),
        epoch: ev.epoch_declared(),
        severity: ev.severity_declared(),
        capture: ev.capture_declared(),
        extensions: ev
            .extensions()
            .map(|(k, v)| (k.to_owned(), scalar_value(v)))
            .collect(),
        data: ev.data().map(|raw| {
            serde_json::from_slice(raw).unwrap_or_else(|e| {
                panic!(
                    "data span {:?} is not JSON: {e}",
                    String::from_utf8_lossy(raw)
                )
            })
        }),
    }
}

fn is_json_ws(b: &u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn check_accessors(ev: &Event) {
    assert_eq!(ev.epoch(), ev.epoch_declared().unwrap_or(0));
    assert_eq!(
        ev.severity(),
        ev.severity_declared().unwrap_or(Severity::Info)
    );
    assert_eq!(
        ev.capture(),
        ev.capture_declared().unwrap_or(Capture::Metadata)
    );
    assert_eq!(ev.id(), ev.attr(Attr::Id).unwrap_or_default());
    assert_eq!(ev.event_type(), ev.attr(Attr::Type).unwrap_or_default());
    assert_eq!(ev.source(), ev.attr(Attr::Source).unwrap_or_default());
    assert_eq!(ev.session(), ev.attr(Attr::Session));
    let t = ev.event_type();
    let scope = if t.starts_with("agent.") {
        Scope::Agent
    } else if ev.seq().is_some() {
        Scope::Sequenced
    } else {
        Scope::Foreign
    };
    assert_eq!(ev.scope(), scope);
    assert_eq!(ev.is_command(), is_command_type(t));
    for (name, v) in ev.extensions() {
        assert!(!CORE_NAMES.contains(&name));
        assert_eq!(ev.extension(name), Some(v));
    }
}

fuzz_target!(|input: &[u8]| {
    let want = oracle(input);
    let got = Event::scan(Bytes::copy_from_slice(input));
    let shown = || String::from_utf8_lossy(input).into_owned();
    match (&want, &got) {
        (Ok(want), Ok(ev)) => {
            assert_eq!(&extracted(ev), want, "attributes differ for {:?}", shown());
            let start = input.iter().position(|b| !is_json_ws(b)).unwrap();
            let end = input.iter().rposition(|b| !is_json_ws(b)).unwrap() + 1;
            assert_eq!(&ev.bytes()[..], &input[start..end]);
            // SSE and the history skip the line-break rewrite on this flag alone.
            let breaks = ev.bytes().iter().any(|b| matches!(b, b'\n' | b'\r'));
            assert_eq!(ev.has_line_breaks(), breaks, "line breaks of {:?}", shown());
            check_accessors(ev);
        }
        (Err(_), Err(e)) => {
            assert!(!e.detail.is_empty());
            if let Some(at) = e.at {
                assert!(at <= input.len(), "offset {at} beyond {:?}", shown());
            }
        }
        (Ok(_), Err(e)) => panic!("scan refused ({e}) what the oracle accepts: {:?}", shown()),
        (Err(why), Ok(_)) => panic!(
            "scan accepted what the oracle refuses ({why}): {:?}",
            shown()
        ),
    }

    match Event::parse(Bytes::copy_from_slice(input)) {
        Ok(ev) => {
            assert!(
                got.is_ok(),
                "parse accepted what scan refused: {:?}",
                shown()
            );
            for a in [
                Attr::Aep,
                Attr::Id,
                Attr::Type,
                Attr::Time,
                Attr::Source,
                Attr::Agent,
            ] {
                assert!(ev.attr(a).is_some(), "parse accepted without {a:?}");
            }
            assert_eq!(ev.attr(Attr::Aep), Some("0.1"));
            check_accessors(&ev);
        }
        Err(e) => assert!(!e.detail.is_empty()),
    }
});
