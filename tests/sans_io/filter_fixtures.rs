//! The attr-match golden corpus (AEP-0003 §6, §10): every `match` case gives the
//! expected verdict and every `invalid` filter is rejected (fail closed, §6.2 rule 1,
//! §6.5 `invalid-filter`).
//!
//! Fixture events are partial envelopes, so they are read with [`Event::scan`] (JSON and
//! per-attribute value rules, without the presence rules of `Event::parse`): the same
//! scanner and accessors the relay matches live Events with.

use crate::support;
use support::fixture_json;

use aep_relay::filter::Filter;
use aep_relay::wire::envelope::Event;
use bytes::Bytes;
use serde_json::Value;

/// The corpus (the tests that read it are ignored when the shared fixtures are absent).
fn load() -> Value {
    fixture_json("aep-fixtures/attr-match/cases.json")
}

fn cases<'a>(corpus: &'a Value, section: &str) -> &'a [Value] {
    corpus[section]
        .as_array()
        .unwrap_or_else(|| panic!("cases.json: `{section}` is not an array"))
}

#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn attr_match_match_cases() {
    let corpus = load();
    let cases = cases(&corpus, "match");
    assert!(!cases.is_empty());
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let filter = Filter::compile(&case["filter"])
            .unwrap_or_else(|e| panic!("{name}: valid filter rejected: {e}"));
        let bytes = Bytes::from(serde_json::to_vec(&case["event"]).unwrap());
        let event = Event::scan(bytes).unwrap_or_else(|e| panic!("{name}: event: {e}"));
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
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn attr_match_invalid_cases() {
    let corpus = load();
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
