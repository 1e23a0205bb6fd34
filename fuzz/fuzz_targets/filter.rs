//! `attr-match` filters (AEP-0003 §6), against a reference written from the spec text.
//!
//! The input is split into lines (at most 12). Every line is tried both as a filter
//! (`Filter::parse`) and as an Event (`Event::scan`), and every filter is evaluated
//! against every Event, so the fuzzer needs no framing to produce either.
//!
//! Invariants asserted:
//! 1. `Filter::parse` never panics, and accepts a line iff the reference grammar check
//!    below does (AEP-0003 §6.1 grammar, §6.2 rule 1 keys, plus the decisions documented
//!    in `src/filter/mod.rs` where §6 leaves room).
//! 2. For every accepted filter and every scanned Event, `Filter::matches` equals the
//!    reference verdict, computed over the Event's `serde_json` reading (§6.1 conjunction,
//!    §6.2 rules 2-5).
//! 3. The subscription index (`fanout::index`) returns a filter's key for an Event iff
//!    the filter matches it, in ascending key order, each key once.
//! 4. `Filter::pins` is sound: a matching Event's `session` / `agent` / `type` is among
//!    the pinned values whenever the filter pins that attribute.
#![no_main]

use std::sync::Arc;

use aep_relay::fanout::index::SubscriptionIndex;
use aep_relay::filter::Filter;
use aep_relay::wire::envelope::Event;
use aep_relay_fuzz::{is_integer, legal_extension_name, lines, strict};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

const LEVELS: [&str; 6] = ["debug", "info", "notice", "warning", "error", "critical"];

/// §6.2 rule 1: the filterable core attributes.
const FILTERABLE: [&str; 12] = [
    "id", "type", "subject", "source", "agent", "session", "run", "step", "epoch", "cause",
    "severity", "capture",
];

/// §6.1 `Scalar`: a JSON string, integer or boolean.
fn is_scalar(v: &Value) -> bool {
    v.is_string() || v.is_boolean() || is_integer(v)
}

/// §6.1 `TypePattern` with a `*`: `prefix ".*"`, the prefix non-empty and without `*`
/// (§6.2 rule 3: `*` alone is not a pattern).
fn is_type_pattern(s: &str) -> bool {
    match s.strip_suffix(".*") {
        Some(p) => !p.is_empty() && !p.contains('*'),
        None => false,
    }
}

/// One operand of a predicate on `key` (a `Scalar`, or on `type` a `TypePattern`).
///
/// Decision of `src/filter/mod.rs` ("`*` outside `type`"): a string containing `*` is a
/// glob, and a glob is refused on any key but `type` (§6.2 rule 3: patterns apply only to
/// `type`), so a literal `*` cannot be matched there.
fn valid_operand(key: &str, v: &Value) -> bool {
    match v {
        Value::String(s) if s.contains('*') => key == "type" && is_type_pattern(s),
        _ => is_scalar(v),
    }
}

/// §6.1 `SeverityCmp`: `{gte}`, `{lte}` or both, each a `Level`.
fn valid_severity_cmp(m: &Map<String, Value>) -> bool {
    !m.is_empty()
        && m.iter().all(|(op, level)| {
            (op == "gte" || op == "lte") && level.as_str().is_some_and(|l| LEVELS.contains(&l))
        })
}

/// The reference grammar check (AEP-0003 §6.1, §6.2 rule 1). Reading the JSON refuses
/// duplicate member names at any depth (decision of `src/filter/mod.rs`: they would
/// otherwise be resolved silently).
fn reference_filter(line: &[u8]) -> Option<Map<String, Value>> {
    let Ok(Value::Object(filter)) = strict(line) else {
        return None;
    };
    for (key, pred) in &filter {
        let key_ok = FILTERABLE.contains(&key.as_str()) || legal_extension_name(key);
        if !key_ok {
            return None;
        }
        let ok = match pred {
            Value::Object(m) => key == "severity" && valid_severity_cmp(m),
            // `[ Scalar+ ]`: non-empty, no nested arrays or objects.
            Value::Array(items) => !items.is_empty() && items.iter().all(|i| valid_operand(key, i)),
            v => valid_operand(key, v),
        };
        if !ok {
            return None;
        }
    }
    Some(filter)
}

/// The value an Event has for a filter key, with the AEP-0001 §5.1 defaults that §6.2
/// rule 5 applies (`epoch` 0, `severity` info, `capture` metadata).
fn event_value(ev: &Map<String, Value>, key: &str) -> Option<Value> {
    let got = ev.get(key).cloned();
    match key {
        "epoch" => got.or(Some(Value::from(0u64))),
        "severity" => got.or(Some(Value::from("info"))),
        "capture" => got.or(Some(Value::from("metadata"))),
        _ => got,
    }
}

/// One operand against the Event's value for `key` (§6.2 rules 2 and 3).
fn operand_matches(key: &str, op: &Value, have: &Value) -> bool {
    if key == "type" {
        if let (Some(p), Some(t)) = (op.as_str(), have.as_str()) {
            if let Some(prefix) = p.strip_suffix(".*").filter(|_| p.contains('*')) {
                // "strictly beginning with p followed by a dot"
                return t.starts_with(prefix) && t[prefix.len()..].starts_with('.');
            }
        }
    }
    // Exact JSON equality, no coercion ("5" != 5, 1 != true).
    op == have
}

/// The reference verdict (AEP-0003 §6.1: conjunction; §6.2 rules 2-5).
fn reference_matches(filter: &Map<String, Value>, ev: &Map<String, Value>) -> bool {
    filter.iter().all(|(key, pred)| {
        let Some(have) = event_value(ev, key) else {
            return false; // rule 5: absent attribute, no default
        };
        match pred {
            Value::Object(cmp) => {
                // rule 4: the AEP-0001 §8.1 total order, inclusive bounds.
                let rank = |v: &Value| v.as_str().and_then(|s| LEVELS.iter().position(|l| *l == s));
                let Some(r) = rank(&have) else { return false };
                cmp.iter()
                    .all(|(op, level)| match (op.as_str(), rank(level)) {
                        ("gte", Some(l)) => r >= l,
                        ("lte", Some(l)) => r <= l,
                        _ => false,
                    })
            }
            Value::Array(items) => items.iter().any(|op| operand_matches(key, op, &have)),
            op => operand_matches(key, op, &have),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let lines = lines(data, 12);
    let mut filters: Vec<(Filter, Map<String, Value>)> = Vec::new();
    let mut events: Vec<(Event, Map<String, Value>)> = Vec::new();
    for line in &lines {
        let got = Filter::parse(line);
        let want = reference_filter(line);
        match (got, want) {
            (Ok(f), Some(r)) => filters.push((f, r)),
            (Err(_), None) => {}
            (Ok(f), None) => panic!(
                "Filter::parse accepted what the reference refuses: {:?} -> {f:?}",
                String::from_utf8_lossy(line)
            ),
            (Err(e), Some(_)) => panic!(
                "Filter::parse refused ({e}) what the reference accepts: {:?}",
                String::from_utf8_lossy(line)
            ),
        }
        if let Ok(ev) = Event::scan(Bytes::copy_from_slice(line)) {
            // A scanned Event is one JSON object without duplicate top-level members
            // (the `envelope` target holds the scanner to that).
            let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(line) else {
                panic!(
                    "scanned Event is not a serde_json object: {:?}",
                    String::from_utf8_lossy(line)
                );
            };
            events.push((ev, m));
        }
    }

    let mut index = SubscriptionIndex::new();
    for (key, (f, _)) in filters.iter().enumerate() {
        index.insert(key, Arc::new(f.clone()));
    }
    let mut out = Vec::new();
    for (ev, evm) in &events {
        let mut want_keys = Vec::new();
        for (key, (f, r)) in filters.iter().enumerate() {
            let got = f.matches(ev);
            let want = reference_matches(r, evm);
            assert_eq!(
                got, want,
                "verdict differs: filter {r:?} ({f:?}) on Event {evm:?}"
            );
            if got {
                want_keys.push(key);
                let pins = f.pins();
                for (pinned, value) in [
                    (pins.session, ev.session()),
                    (pins.agent, ev.attr(aep_relay::wire::envelope::Attr::Agent)),
                    (pins.types, ev.attr(aep_relay::wire::envelope::Attr::Type)),
                ] {
                    if let Some(values) = pinned {
                        let v = value.expect("a pinned attribute is present on a match");
                        assert!(values.iter().any(|p| **p == *v), "pins miss {v:?}");
                    }
                }
            }
        }
        out.clear();
        index.matching(ev, &mut out);
        assert_eq!(
            out, want_keys,
            "index disagrees with the filters on {evm:?}"
        );
    }
});
