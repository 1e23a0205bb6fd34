//! The attr-match golden corpus (AEP-0003 §6, §10): every `match` case gives the
//! expected verdict and every `invalid` filter is rejected (fail closed, §6.2 rule 1,
//! §6.5 `invalid-filter`).
//!
//! Fixture events are partial envelopes, so they are evaluated through a JSON-backed
//! [`Attributes`] implementation rather than the envelope scanner. This also checks that
//! a type outside the crate can implement [`Attributes`].

use std::path::{Path, PathBuf};

use aep_relay::envelope::{is_valid_extension_name, Attr, Capture, Scalar, Severity};
use aep_relay::filter::{Attributes, Filter};
use serde_json::{Map, Value};

/// A partial Event held as its JSON object; AEP-0001 §5.1 defaults for `epoch`,
/// `severity` and `capture`.
struct JsonEvent(Map<String, Value>);

impl Attributes for JsonEvent {
    fn text(&self, attr: Attr) -> Option<&str> {
        self.0.get(attr.name()).and_then(Value::as_str)
    }
    fn epoch(&self) -> u64 {
        self.0.get("epoch").and_then(Value::as_u64).unwrap_or(0)
    }
    fn severity(&self) -> Severity {
        self.0
            .get("severity")
            .and_then(Value::as_str)
            .and_then(Severity::parse)
            .unwrap_or(Severity::Info)
    }
    fn capture(&self) -> Capture {
        self.0
            .get("capture")
            .and_then(Value::as_str)
            .and_then(Capture::parse)
            .unwrap_or(Capture::Metadata)
    }
    fn extension(&self, name: &str) -> Option<Scalar<'_>> {
        if !is_valid_extension_name(name) {
            return None;
        }
        match self.0.get(name)? {
            Value::String(s) => Some(Scalar::Str(s)),
            Value::Bool(b) => Some(Scalar::Bool(*b)),
            Value::Number(n) => n
                .as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
                .map(Scalar::Int),
            _ => None,
        }
    }
}

fn cases_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/aep-fixtures/attr-match/cases.json")
}

/// The corpus, or `None` (and a note) when the shared fixtures are not checked out.
fn load() -> Option<Value> {
    let path = cases_path();
    match std::fs::read(&path) {
        Ok(bytes) => Some(serde_json::from_slice(&bytes).expect("cases.json is JSON")),
        Err(e) => {
            eprintln!("skipping: attr-match fixtures not found at {path:?}: {e}");
            None
        }
    }
}

fn cases<'a>(corpus: &'a Value, section: &str) -> &'a [Value] {
    corpus[section]
        .as_array()
        .unwrap_or_else(|| panic!("cases.json: `{section}` is not an array"))
}

#[test]
fn attr_match_match_cases() {
    let Some(corpus) = load() else { return };
    let cases = cases(&corpus, "match");
    assert!(!cases.is_empty());
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let filter = Filter::compile(&case["filter"])
            .unwrap_or_else(|e| panic!("{name}: valid filter rejected: {e}"));
        let event = match &case["event"] {
            Value::Object(m) => JsonEvent(m.clone()),
            other => panic!("{name}: event is not an object: {other}"),
        };
        let want = case["match"]
            .as_bool()
            .unwrap_or_else(|| panic!("{name}: `match` is not a boolean"));
        assert_eq!(filter.matches(&event), want, "{name}");

        // The same filter through the byte entry point (the SSE `filter` parameter).
        let bytes = serde_json::to_vec(&case["filter"]).unwrap();
        let parsed = Filter::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(parsed, filter, "{name}");
    }
}

#[test]
fn attr_match_invalid_cases() {
    let Some(corpus) = load() else { return };
    let cases = cases(&corpus, "invalid");
    assert!(!cases.is_empty());
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        match Filter::compile(&case["filter"]) {
            Ok(f) => panic!("{name}: invalid filter accepted as {f:?}"),
            Err(e) => assert!(!e.detail.is_empty(), "{name}: empty detail"),
        }
        let bytes = serde_json::to_vec(&case["filter"]).unwrap();
        assert!(Filter::parse(&bytes).is_err(), "{name}: parse accepted");
    }
}
