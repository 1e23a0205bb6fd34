//! Capture down-leveling (`capture::downlevel`), every scanned Event under every ceiling.
//!
//! Invariants asserted, for each of the four ceilings:
//! 1. `downlevel` never panics, and returns `None` exactly when the ceiling is at or
//!    above the Event's (defaulted) `capture` (AEP-0003 §6.4: "as stored/received", never
//!    up-level).
//! 2. Otherwise the copy is one valid JSON object that `Event::scan` accepts again, and
//!    its `capture` is at most the ceiling and strictly below the source's, and never
//!    `redacted` (AEP-0001 §8.2(e): a mechanical hop cannot mint the claim; a `full`
//!    Event under a `redacted` ceiling lands on `metadata`).
//! 3. No payload member above the new level survives, checked recursively against
//!    `capture::schema` (AEP-0002 §5.1 rules 1 and 3; unlisted members default to
//!    `metadata`, rule 4); at `none`, and for a type without a schema, `data` is gone.
//!    The `[metadata*]` exceptions hold only structural content: a synthesized prompt
//!    from envelope values and a closed `kind` (AEP-0003 §9.2), a label replaced by its
//!    sibling `id` or 1-based position, `values` entries that are numbers or booleans
//!    (AEP-0006).
//! 4. Nothing is invented: every payload member in the copy was in the original, with
//!    the same value (numbers within one rounding), except the exceptions of 3.
//! 5. Every envelope member other than `capture` and `data` keeps its value and its
//!    position, and the routing attributes scanned from the copy equal the original's.
//! 6. If the original passes `Event::parse` (full AEP-0001 validation), so does the copy.
#![no_main]

use aep_relay::capture::{downlevel, schema, target_level, Field, Gate, Shape};
use aep_relay::wire::envelope::{Attr, Capture, Event};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

/// `attention.requested.kind` values (AEP-0002 §5.3, AEP-0006).
const KINDS: [&str; 6] = ["permission", "input", "auth", "review", "form", "other"];

/// Two JSON values are the same, numbers compared as `f64` within a relative 1e-15
/// (serde_json's default float parser may round a re-serialized float one ULP apart).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if x == y {
                return true;
            }
            match (x.as_f64(), y.as_f64()) {
                (Some(p), Some(q)) => (p - q).abs() <= p.abs().max(q.abs()) * 1e-15,
                _ => false,
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kp, p), (kq, q))| kp == kq && same(p, q))
        }
        _ => a == b,
    }
}

struct Env<'a> {
    agent: Option<&'a str>,
    subject: Option<&'a str>,
}

/// Checks one pruned payload object `out` against its original `orig` and the annotated
/// `fields`, at `level` (invariants 3 and 4). `position` is the 0-based index of the
/// object in its array, if it is an element.
fn check_object(
    out: &Map<String, Value>,
    orig: &Map<String, Value>,
    fields: &[Field],
    level: Capture,
    env: &Env<'_>,
    position: Option<usize>,
    path: &str,
) {
    // Members keep their relative order: `out`'s keys are a subsequence of `orig`'s.
    let mut keys = orig.keys();
    for k in out.keys() {
        assert!(keys.any(|o| o == k), "{path}.{k}: invented or reordered");
    }
    for (name, value) in out {
        let path = format!("{path}.{name}");
        let before = &orig[name];
        let Some(field) = fields.iter().find(|f| f.name == name) else {
            // AEP-0002 §5.1 rule 4: unlisted members are `metadata`.
            assert!(level >= Capture::Metadata, "{path}: kept at {level:?}");
            assert!(same(value, before), "{path}: changed");
            continue;
        };
        assert!(
            field.level <= level,
            "{path}: annotated {:?} survives at {level:?}",
            field.level
        );
        match field.shape {
            Shape::Object(children) => {
                let (Value::Object(o), Value::Object(b)) = (value, before) else {
                    panic!("{path}: not an object on both sides");
                };
                check_object(o, b, children, level, env, None, &path);
            }
            Shape::Array(children) => {
                let (Value::Array(o), Value::Array(b)) = (value, before) else {
                    panic!("{path}: not an array on both sides");
                };
                // Non-object elements are dropped; the rest keep their order.
                let objects: Vec<(usize, &Map<String, Value>)> = b
                    .iter()
                    .enumerate()
                    .filter_map(|(i, v)| v.as_object().map(|m| (i, m)))
                    .collect();
                assert_eq!(o.len(), objects.len(), "{path}: element count");
                for (el, (i, bm)) in o.iter().zip(objects) {
                    let om = el.as_object().expect("pruned element is an object");
                    check_object(
                        om,
                        bm,
                        children,
                        level,
                        env,
                        Some(i),
                        &format!("{path}[{i}]"),
                    );
                }
            }
            Shape::Leaf if level >= Capture::Redacted || field.gate == Gate::Plain => {
                assert!(same(value, before), "{path}: changed");
            }
            Shape::Leaf => match field.gate {
                Gate::Synthesize => {
                    // AEP-0003 §9.2: "{agent} requests {kind}: {subject}", structural only.
                    let agent = env.agent.unwrap_or("agent");
                    let ok = KINDS.iter().any(|kind| {
                        let base = format!("{agent} requests {kind}");
                        let with = env.subject.map(|s| format!("{base}: {s}"));
                        value.as_str() == Some(with.as_deref().unwrap_or(&base))
                    });
                    assert!(ok, "{path}: {value} is not a synthesized prompt");
                }
                Gate::Placeholder => {
                    let id = orig.get("id").and_then(Value::as_str).map(str::to_owned);
                    let want = id.or_else(|| position.map(|i| (i + 1).to_string()));
                    assert_eq!(value.as_str(), want.as_deref(), "{path}: placeholder");
                }
                Gate::StructuralEntries => {
                    let (Value::Object(o), Value::Object(b)) = (value, before) else {
                        panic!("{path}: values not an object on both sides");
                    };
                    for (k, v) in o {
                        assert!(v.is_number() || v.is_boolean(), "{path}.{k}: free text");
                        assert!(b.get(k).is_some_and(|w| same(v, w)), "{path}.{k}: changed");
                    }
                }
                Gate::Plain => unreachable!(),
            },
        }
    }
}

fn check(ev: &Event, orig: &Map<String, Value>, ceiling: Capture, valid: bool) {
    let source = ev.capture();
    let copy = downlevel(ev, ceiling);
    let Some(target) = target_level(source, ceiling) else {
        assert!(
            copy.is_none(),
            "{ceiling:?} >= {source:?} must pass unchanged"
        );
        return;
    };
    let copy = copy.expect("a ceiling below the Event's capture rewrites it");
    let out: Map<String, Value> = serde_json::from_slice(&copy).unwrap_or_else(|e| {
        panic!(
            "copy is not a JSON object ({e}): {:?}",
            String::from_utf8_lossy(&copy)
        )
    });

    // 2: the level.
    let level = out
        .get("capture")
        .and_then(Value::as_str)
        .and_then(Capture::parse)
        .expect("the copy declares a capture level");
    assert_eq!(level, target);
    assert!(level <= ceiling && level < source && level != Capture::Redacted);

    // 5: the envelope, in order.
    let kept: Vec<(&String, &Value)> = orig
        .iter()
        .filter(|(k, _)| *k != "capture" && *k != "data")
        .collect();
    let after: Vec<(&String, &Value)> = out
        .iter()
        .filter(|(k, _)| *k != "capture" && *k != "data")
        .collect();
    assert_eq!(kept.len(), after.len(), "envelope members added or lost");
    for ((k, v), (k2, v2)) in kept.iter().zip(&after) {
        assert_eq!(k, k2, "envelope member order");
        assert!(same(v, v2), "envelope member {k} changed");
    }
    let again = Event::scan(Bytes::from(copy.to_vec())).unwrap_or_else(|e| {
        panic!(
            "the scanner refuses the copy ({e}): {:?}",
            String::from_utf8_lossy(&copy)
        )
    });
    for a in Attr::ALL {
        assert_eq!(again.attr(a), ev.attr(a), "{a:?}");
    }
    assert_eq!(again.seq(), ev.seq());
    assert_eq!(again.epoch_declared(), ev.epoch_declared());
    assert_eq!(again.severity_declared(), ev.severity_declared());
    assert!(again.extensions().eq(ev.extensions()), "extensions changed");
    assert_eq!(again.capture(), level);

    // 6
    if valid {
        if let Err(e) = Event::parse(Bytes::from(copy.to_vec())) {
            panic!(
                "a valid Event's copy is invalid ({e}): {:?}",
                String::from_utf8_lossy(&copy)
            );
        }
    }

    // 3, 4: the payload.
    let fields = ev.attr(Attr::Type).and_then(schema);
    match (out.get("data"), orig.get("data"), fields) {
        (None, _, _) => {}
        (Some(_), _, _) if level == Capture::None => panic!("`data` survives at none"),
        (Some(_), _, None) => panic!("`data` of an unregistered type survives"),
        (Some(Value::Object(o)), Some(Value::Object(b)), Some(fields)) => {
            let env = Env {
                agent: ev.attr(Attr::Agent),
                subject: ev.attr(Attr::Subject),
            };
            check_object(o, b, fields, level, &env, None, "data");
        }
        (Some(d), _, _) => panic!("`data` became {d}"),
    }
}

fuzz_target!(|input: &[u8]| {
    let Ok(ev) = Event::scan(Bytes::copy_from_slice(input)) else {
        return;
    };
    let orig: Map<String, Value> =
        serde_json::from_slice(input).expect("a scanned Event is a serde_json object");
    let valid = Event::parse(Bytes::copy_from_slice(input)).is_ok();
    for ceiling in Capture::ALL {
        check(&ev, &orig, ceiling, valid);
    }
});
