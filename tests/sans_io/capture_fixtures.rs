//! The upstream conformance corpus for capture down-leveling, run against
//! `aep_relay::capture`:
//!
//! - `downlevel/cases.json`: AEP-0001 §8.2 down-leveling at a fan-out hop, every case with
//!   exact `expect_capture` / `expect_data` (member order included), through the
//!   `serde_json` core and through the `Event` wrapper;
//! - `capture-gating/cases.json`: the AEP-0006 type-dependent gating of
//!   `attention.answered.answer.values`, mapped onto a hop (see
//!   [`capture_gating_cases_at_a_hop`] for what carries over and what does not);
//! - `golden/golden.jsonl`: invariants of every golden Event under every ceiling.
//!
//! Ignored (`cfg(no_fixtures)`, see build.rs) when `../shared` is absent.

use crate::support;
use support::{fixture_json, shared};

use aep_relay::capture::{downlevel, downlevel_value, schema, target_level, Field, Gate, Shape};
use aep_relay::wire::envelope::{Capture, Event};
use bytes::Bytes;
use serde_json::{Map, Value};

fn load(rel: &str) -> Value {
    fixture_json(&format!("aep-fixtures/{rel}"))
}

fn level(v: &Value) -> Capture {
    Capture::parse(v.as_str().expect("capture level is a string")).expect("capture level")
}

fn object(v: &Value) -> Map<String, Value> {
    v.as_object().expect("an object").clone()
}

/// Compact JSON: equal strings mean equal values *and* equal member order.
fn text(v: &Value) -> String {
    serde_json::to_string(v).unwrap()
}

/// Checks one down-level result against a `downlevel/cases.json` case.
fn check_downlevel_case(
    name: &str,
    input: &Map<String, Value>,
    out: &Map<String, Value>,
    case: &Value,
) {
    let expect_capture = level(&case["expect_capture"]);
    assert_eq!(
        out.get("capture").map(level).unwrap_or(Capture::Metadata),
        expect_capture,
        "{name}: capture"
    );
    // `expect_data: null` means envelope only: no `data` member at all.
    match (&case["expect_data"], out.get("data")) {
        (Value::Null, None) => {}
        (Value::Null, Some(d)) => panic!("{name}: data must be gone, got {d}"),
        (want, Some(got)) => assert_eq!(text(got), text(want), "{name}: data"),
        (want, None) => panic!("{name}: data missing, want {want}"),
    }
    // Every envelope member other than `capture` and `data` keeps its value and position.
    let strip = |m: &Map<String, Value>| -> Vec<(String, Value)> {
        m.iter()
            .filter(|(k, _)| *k != "capture" && *k != "data")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    assert_eq!(strip(out), strip(input), "{name}: envelope members");
    let order = |m: &Map<String, Value>| -> Vec<String> { m.keys().cloned().collect() };
    let mut want_order = order(input);
    if case["expect_data"].is_null() {
        want_order.retain(|k| k != "data");
    }
    assert_eq!(order(out), want_order, "{name}: member order");
}

/// AEP-0001 §8.2, AEP-0002 §5.1, AEP-0003 §6.4, AEP-0006: every case of
/// `downlevel/cases.json` through [`downlevel_value`].
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn downlevel_cases_value_core() {
    let corpus = load("downlevel/cases.json");
    let cases = corpus["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let input = object(&case["event"]);
        let ceiling = level(&case["ceiling"]);
        let mut out = input.clone();
        let changed = downlevel_value(&mut out, ceiling);
        check_downlevel_case(name, &input, &out, case);
        // `false` exactly when the Event passes unchanged (never up-level, §8.2(b)).
        assert_eq!(changed, out != input, "{name}: return value");
        let source = input.get("capture").map(level).unwrap_or(Capture::Metadata);
        assert_eq!(changed, target_level(source, ceiling).is_some(), "{name}");
        // A down-leveled copy is stable: a second hop at the same ceiling passes it.
        assert!(
            !downlevel_value(&mut out.clone(), ceiling),
            "{name}: idempotent"
        );
    }
    eprintln!("downlevel/cases.json: {} cases", cases.len());
}

/// The same cases through [`downlevel`] on a scanned [`Event`]: `None` exactly when the
/// case expects the Event unchanged, otherwise bytes that parse to the expected Event.
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn downlevel_cases_event_wrapper() {
    let corpus = load("downlevel/cases.json");
    let cases = corpus["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let input = object(&case["event"]);
        let bytes = Bytes::from(serde_json::to_vec(&input).unwrap());
        let ev = Event::scan(bytes.clone()).unwrap_or_else(|e| panic!("{name}: scan: {e}"));
        let ceiling = level(&case["ceiling"]);
        match downlevel(&ev, ceiling) {
            None => {
                assert_eq!(
                    case["event"],
                    case_event_after(case),
                    "{name}: expected a rewrite"
                );
            }
            Some(out) => {
                let out: Map<String, Value> = serde_json::from_slice(&out).expect("output is JSON");
                check_downlevel_case(name, &input, &out, case);
            }
        }
    }
}

/// The case's event with `expect_capture` / `expect_data` applied.
fn case_event_after(case: &Value) -> Value {
    let mut ev = object(&case["event"]);
    if ev.contains_key("capture") || case["expect_capture"] != "metadata" {
        ev.insert("capture".into(), case["expect_capture"].clone());
    }
    match &case["expect_data"] {
        Value::Null => {
            ev.shift_remove("data");
        }
        d => {
            ev.insert("data".into(), d.clone());
        }
    }
    Value::Object(ev)
}

/// `capture-gating/cases.json` pins the *emitter-side* gating of `answer.values`
/// (AEP-0006, AEP-0002 §5.3): the emitter holds the request's `field_spec`s, so it keeps a
/// closed-select id (`"db": "2"`, `"regions": ["1", "3"]`) at `metadata` and drops keys no
/// `field_spec` declares. A hop has no `field_spec` (it is on another Event), so AEP-0006
/// (Security considerations) has it degrade `values` to "structural entries only". Each
/// case is mapped onto a hop as the down-level of an `attention.answered` carrying the
/// case's `values`:
///
/// - ceiling `metadata`: a `redacted` source (and a `full` one, which lands on `metadata`
///   too, AEP-0001 §8.2(e)) must come out with `values` ⊆ the emitter's `expect` (a hop
///   never keeps what the emitter would drop: the free text of `string` and `other`
///   answers goes) and exactly the number/boolean entries (closed-select ids are strings a
///   hop cannot tell from free text, and dropping more is legal, §8.2(b));
/// - ceiling `redacted`: a `redacted` source passes unchanged (its claim was minted at the
///   source). Where `expect` equals the input this is the case itself; the "keys without a
///   matching field_spec" case is the emitter validating against the request's contract,
///   which a hop cannot do, so for it only the pass-through is asserted;
/// - ceiling `none`: the case's own `$comment` says the whole `data` is gone at `none`;
///   that is asserted.
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn capture_gating_cases_at_a_hop() {
    let corpus = load("capture-gating/cases.json");
    let cases = corpus["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let values = object(&case["values"]);
        let expect = object(&case["expect"]);
        let ceiling = level(&case["ceiling"]);
        for source in [Capture::Redacted, Capture::Full] {
            let input = serde_json::json!({
                "aep": "0.1", "id": "CG", "type": "attention.answered", "subject": "R1",
                "time": "2026-07-03T10:00:00Z", "source": "aep://h/agent/a", "agent": "a",
                "session": "s1", "seq": 0, "capture": source.as_str(),
                "data": {"answer": {"values": values}, "via": "control"}
            });
            let mut out = object(&input);
            let changed = downlevel_value(&mut out, ceiling);
            let got = out.get("data").map(|d| object(&d["answer"]["values"]));
            match ceiling {
                Capture::Metadata => {
                    let got = got.unwrap_or_else(|| panic!("{name}: values gone"));
                    for (k, v) in &got {
                        assert_eq!(
                            expect.get(k),
                            Some(v),
                            "{name}: hop kept {k} beyond the emitter"
                        );
                    }
                    let structural: Map<String, Value> = values
                        .iter()
                        .filter(|(_, v)| v.is_number() || v.is_boolean())
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    assert_eq!(
                        text(&Value::Object(got)),
                        text(&Value::Object(structural)),
                        "{name}"
                    );
                    assert_eq!(out["capture"], "metadata", "{name}");
                }
                Capture::Redacted if source == Capture::Redacted => {
                    assert!(!changed, "{name}: redacted passes redacted");
                    let got = got.unwrap();
                    assert_eq!(got, values, "{name}: pass-through");
                    if expect == values {
                        assert_eq!(got, expect, "{name}");
                    }
                }
                Capture::Redacted => {
                    // full under redacted: lands on metadata, structural entries only.
                    assert_eq!(out["capture"], "metadata", "{name}");
                    for (k, v) in &got.unwrap() {
                        assert!(
                            v.is_number() || v.is_boolean(),
                            "{name}: {k} kept at metadata"
                        );
                        assert_eq!(expect.get(k), Some(v), "{name}: {k}");
                    }
                }
                Capture::None => {
                    assert!(got.is_none(), "{name}: data must be gone at none");
                    assert_eq!(out["capture"], "none", "{name}");
                }
                Capture::Full => panic!("{name}: no case gates for full"),
            }
        }
    }
    eprintln!("capture-gating/cases.json: {} cases", cases.len());
}

/// Whether a down-leveled `data` honors `target` against the table: no member above it,
/// and below `redacted` every `[metadata*]` member already degraded.
fn honors(members: &Map<String, Value>, fields: &[Field], target: Capture, path: &str) {
    for (k, v) in members {
        let Some(f) = fields.iter().find(|f| f.name == k) else {
            continue;
        };
        assert!(
            f.level <= target,
            "{path}.{k} is {:?} above {target:?}",
            f.level
        );
        match (f.shape, v) {
            (Shape::Object(c), Value::Object(m)) => honors(m, c, target, &format!("{path}.{k}")),
            (Shape::Array(c), Value::Array(items)) => {
                for item in items {
                    honors(
                        item.as_object().expect("element object"),
                        c,
                        target,
                        &format!("{path}.{k}[]"),
                    );
                }
            }
            (Shape::Leaf, _) if f.gate == Gate::StructuralEntries && target < Capture::Redacted => {
                for (vk, vv) in v.as_object().expect("values object") {
                    assert!(vv.is_number() || vv.is_boolean(), "{path}.{k}.{vk} = {vv}");
                }
            }
            (Shape::Leaf, _) => {}
            (_, other) => panic!("{path}.{k}: shape mismatch kept: {other}"),
        }
    }
}

/// Every golden Event (AEP conformance `golden/golden.jsonl`) under every ceiling: never
/// up-leveled, lands where [`target_level`] says, honors the table (AEP-0002 §5.1 rule 1),
/// has no `data` at `none` or for a type without a schema, keeps its envelope, and a second
/// hop at the same ceiling changes nothing.
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn golden_events_honor_every_ceiling() {
    let path = shared("aep-fixtures/golden/golden.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let mut n = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let input: Map<String, Value> = serde_json::from_str(line).expect("golden line");
        let ty = input["type"].as_str().unwrap().to_owned();
        let source = input.get("capture").map(level).unwrap_or(Capture::Metadata);
        for ceiling in Capture::ALL {
            let mut out = input.clone();
            let changed = downlevel_value(&mut out, ceiling);
            match target_level(source, ceiling) {
                None => {
                    assert!(
                        !changed && out == input,
                        "{ty} at {ceiling:?}: must pass unchanged"
                    );
                    continue;
                }
                Some(target) => {
                    assert!(changed, "{ty}");
                    assert_eq!(out["capture"], target.as_str(), "{ty} at {ceiling:?}");
                    match (out.get("data"), schema(&ty)) {
                        (Some(_), _) if target == Capture::None => panic!("{ty}: data at none"),
                        (Some(_), None) => panic!("{ty}: data kept without a schema"),
                        (Some(d), Some(fields)) => {
                            honors(d.as_object().unwrap(), fields, target, &ty)
                        }
                        (None, _) => {}
                    }
                }
            }
            for (k, v) in &input {
                if k != "capture" && k != "data" {
                    assert_eq!(out.get(k), Some(v), "{ty}: envelope member {k}");
                }
            }
            assert!(
                !downlevel_value(&mut out.clone(), ceiling),
                "{ty}: idempotent"
            );
            n += 1;
        }
    }
    assert!(n > 0);
}
