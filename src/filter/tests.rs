//! Unit tests for attr-match compilation and matching (AEP-0003 §6.1, §6.2).

use super::test_support::{ev, JsonEvent};
use super::*;
use serde_json::json;

fn f(v: Value) -> Filter {
    Filter::compile(&v).unwrap_or_else(|e| panic!("filter {v} rejected: {e}"))
}

fn rejected(v: Value) -> FilterError {
    match Filter::compile(&v) {
        Ok(flt) => panic!("filter {v} was accepted: {flt:?}"),
        Err(e) => e,
    }
}

fn hit(filter: Value, event: Value) -> bool {
    f(filter).matches(&ev(event))
}

fn base() -> Value {
    json!({
        "aep": "0.1", "id": "01J", "type": "tool.completed", "subject": "Bash",
        "time": "2026-07-03T10:15:04Z", "source": "aep://h/agent/cc/session/s1",
        "agent": "claude-code", "session": "s1", "run": "r1", "step": "turn-3",
        "seq": 7, "epoch": 2, "cause": "01I", "severity": "warning", "capture": "full",
        "traceparent": "00-abc-def-01", "acmeregion": "eu-1", "acmecount": 3,
        "acmeflag": true
    })
}

#[test]
fn event_implements_attributes() {
    fn takes<A: Attributes>() {}
    takes::<Event>();
}

// --- §6.1: empty filter, conjunction -------------------------------------------------

#[test]
fn empty_filter_matches_everything() {
    let flt = f(json!({}));
    assert!(flt.is_match_all());
    assert!(flt.matches(&ev(json!({}))));
    assert!(flt.matches(&ev(base())));
    assert_eq!(flt, Filter::match_all());
}

#[test]
fn and_matches_what_both_match_and_keeps_the_pins_of_either() {
    let grant = f(json!({"session": ["s1", "s2"], "type": "tool.*"}));
    let req = f(json!({"session": "s1", "severity": {"gte": "warning"}}));
    let both = req.and(&grant);
    assert!(both.matches(&ev(base())));
    for (k, v) in [
        ("session", json!("s2")),
        ("type", json!("run.started")),
        ("severity", json!("info")),
    ] {
        let mut e = base();
        e[k] = v;
        assert!(!both.matches(&ev(e.clone())), "{k}");
        assert_eq!(
            both.matches(&ev(e.clone())),
            req.matches(&ev(e.clone())) && grant.matches(&ev(e))
        );
    }
    let pinned = both.pins().session.unwrap();
    assert!(pinned == ["s1".into()] || pinned.len() == 2);
    assert_eq!(Filter::match_all().and(&grant), grant);
}

/// A stream is admitted only when the filter's members are all on `session` and
/// `agent` and admit it: any other member cannot be decided on a stream, and refuses.
#[test]
fn admits_stream_decides_on_session_and_agent_alone_and_refuses_the_rest() {
    let flt = f(json!({"session": ["s1", "s2"], "agent": "a"}));
    assert!(flt.admits_stream("s1", Some("a")));
    assert!(
        !f(json!({"session": "s1", "agent": "a", "type": "tool.*"})).admits_stream("s1", Some("a"))
    );
    assert!(!flt.admits_stream("s3", Some("a")));
    assert!(!flt.admits_stream("s1", Some("b")));
    assert!(!flt.admits_stream("s1", None));
    assert!(!f(json!({"type": "x.y"})).admits_stream("any", None));
    assert!(!f(json!({"source": "urn:b", "agent": "a"})).admits_stream("s1", Some("a")));
}

#[test]
fn conjunction_requires_every_member() {
    let filter = json!({"agent": "claude-code", "type": "tool.*", "severity": {"gte": "warning"}});
    assert!(hit(filter.clone(), base()));
    let mut e = base();
    e["agent"] = json!("codex");
    assert!(!hit(filter.clone(), e));
    let mut e = base();
    e["severity"] = json!("notice");
    assert!(!hit(filter, e));
}

// --- §6.2 rule 1: allowed keys ---------------------------------------------------------

#[test]
fn every_filterable_core_key_compiles_and_matches() {
    // AEP-0003 §6.2 rule 1: id type subject source agent session run step epoch cause
    // severity capture.
    let b = base();
    for key in [
        "id", "type", "subject", "source", "agent", "session", "run", "step", "epoch", "cause",
        "severity", "capture",
    ] {
        let filter = json!({ key: b[key].clone() });
        assert!(hit(filter, b.clone()), "{key}");
    }
}

#[test]
fn string_keys_compare_exactly() {
    for key in [
        "id", "subject", "source", "agent", "session", "run", "step", "cause",
    ] {
        assert!(!hit(json!({ key: "other" }), base()), "{key}");
        // Case-sensitive, no trimming.
        let v = base()[key].as_str().unwrap().to_owned();
        for other in [v.to_uppercase(), format!(" {v}"), format!("{v} ")] {
            if other != v {
                assert!(!hit(json!({ key: other }), base()), "{key}");
            }
        }
    }
}

#[test]
fn not_filterable_core_keys_rejected() {
    // AEP-0003 §6.2 rule 1: time, seq, aep, traceparent, data.
    for (key, v) in [
        ("time", json!("2026")),
        ("seq", json!(5)),
        ("aep", json!("0.1")),
        ("traceparent", json!("00-x")),
        ("data", json!({})),
        ("data", json!("x")),
    ] {
        let e = rejected(json!({ key: v }));
        assert!(e.detail.contains(&format!("`{key}`")), "{}", e.detail);
        assert!(e.detail.contains("§6.2 rule 1"), "{}", e.detail);
    }
}

#[test]
fn illegal_key_names_rejected() {
    // Neither core nor `[a-z0-9]{1,20}` (AEP-0001 §5.4): fail closed.
    for key in [
        "NotAnAttr",
        "Session",
        "acme-region",
        "acme_region",
        "acme.region",
        "",
        "abcdefghijklmnopqrstu", // 21 chars
        "région",
    ] {
        let e = rejected(json!({ key: "y" }));
        assert!(e.detail.contains("AEP-0001 §5.4"), "{key}: {}", e.detail);
    }
}

#[test]
fn legal_extension_keys_accepted_even_if_no_event_carries_them() {
    assert!(!hit(json!({"abcdefghijklmnopqrst": "x"}), base())); // 20 chars
    assert!(!hit(json!({"0": 1}), base()));
    assert!(hit(json!({"acmeregion": "eu-1"}), base()));
}

// --- §6.1: value shapes ----------------------------------------------------------------

#[test]
fn non_object_filter_rejected() {
    for v in [
        json!(null),
        json!([]),
        json!([{}]),
        json!("session"),
        json!(1),
        json!(true),
    ] {
        let e = rejected(v);
        assert!(e.detail.contains("must be a JSON object"), "{}", e.detail);
    }
}

#[test]
fn null_values_rejected() {
    for key in [
        "session",
        "type",
        "severity",
        "capture",
        "epoch",
        "acmeregion",
    ] {
        let e = rejected(json!({ key: null }));
        assert!(e.detail.contains(&format!("`{key}`")), "{}", e.detail);
        assert!(e.detail.contains("null"), "{}", e.detail);
        rejected(json!({ key: ["x", null] }));
    }
}

#[test]
fn floats_rejected() {
    for v in [json!(1.5), json!(1.0), json!(-0.0), json!(1e3)] {
        rejected(json!({ "epoch": v.clone() }));
        rejected(json!({ "acmecount": v.clone() }));
        rejected(json!({ "acmecount": [1, v] }));
    }
    // Beyond i64 ∪ u64 JSON parsers hold a float.
    let e = Filter::parse(br#"{"epoch": 18446744073709551616}"#).unwrap_err();
    assert!(e.detail.contains("`epoch`"), "{}", e.detail);
}

#[test]
fn nested_objects_rejected_except_severity_cmp() {
    for key in ["session", "type", "capture", "epoch", "acmeregion"] {
        let e = rejected(json!({ key: {"gte": "info"} }));
        assert!(e.detail.contains(&format!("`{key}`")), "{}", e.detail);
    }
    rejected(json!({"session": {}}));
    // A SeverityCmp is not a Scalar: not inside an inclusion array.
    let e = rejected(json!({"severity": [{"gte": "info"}]}));
    assert!(e.detail.contains("inclusion array"), "{}", e.detail);
}

#[test]
fn nested_arrays_rejected() {
    rejected(json!({"agent": [["a"]]}));
    rejected(json!({"type": [["tool.*"]]}));
    rejected(json!({"severity": [["info"]]}));
}

// --- §6.2 rule 2: equality and inclusion, no coercion ----------------------------------

#[test]
fn inclusion_is_any_of() {
    assert!(hit(json!({"agent": ["codex", "claude-code"]}), base()));
    assert!(!hit(json!({"agent": ["codex", "gemini"]}), base()));
    assert!(hit(
        json!({"agent": ["claude-code", "claude-code"]}),
        base()
    ));
}

#[test]
fn large_inclusion_sets_bisect_correctly() {
    let many: Vec<String> = (0..50).map(|i| format!("s{i}")).collect();
    let flt = f(json!({ "session": many }));
    for i in 0..50 {
        assert!(flt.matches(&ev(json!({"session": format!("s{i}")}))));
    }
    assert!(!flt.matches(&ev(json!({"session": "s50"}))));
    assert!(!flt.matches(&ev(json!({"session": "s"}))));
}

#[test]
fn empty_inclusion_array_rejected() {
    for key in [
        "agent",
        "type",
        "severity",
        "capture",
        "epoch",
        "acmeregion",
    ] {
        let e = rejected(json!({ key: [] }));
        assert!(e.detail.contains("at least one element"), "{}", e.detail);
        assert!(e.detail.contains(&format!("`{key}`")), "{}", e.detail);
    }
}

#[test]
fn no_coercion_between_json_types() {
    // Grammatical Scalars of the wrong JSON type are accepted and never match
    // (module docs: narrows, never widens).
    assert!(!hit(json!({"session": 1}), json!({"session": "1"})));
    assert!(!hit(json!({"session": true}), json!({"session": "true"})));
    assert!(!hit(json!({"epoch": "0"}), json!({})));
    assert!(!hit(json!({"epoch": "2"}), json!({"epoch": 2})));
    assert!(!hit(json!({"epoch": true}), json!({})));
    assert!(!hit(json!({"acmecount": "3"}), base()));
    assert!(!hit(json!({"acmeflag": "true"}), base()));
    assert!(!hit(json!({"acmeflag": 1}), base()));
    assert!(!hit(json!({"acmeregion": true}), base()));
    assert!(!hit(json!({"type": 5}), base()));
    // ...but they do not spoil the satisfiable members of an inclusion array.
    assert!(hit(json!({"session": [1, "s1", false]}), base()));
    assert!(hit(json!({"acmecount": ["3", 3]}), base()));
}

#[test]
fn epoch_compares_integers_with_default_zero() {
    // AEP-0003 §6.2 rule 5, AEP-0001 §5.1 #12.
    assert!(hit(json!({"epoch": 0}), json!({"type": "run.started"})));
    assert!(!hit(json!({"epoch": 1}), json!({"type": "run.started"})));
    assert!(hit(json!({"epoch": 2}), base()));
    assert!(hit(json!({"epoch": [0, 2]}), base()));
    assert!(!hit(json!({"epoch": 0}), base()));
    assert!(!hit(json!({"epoch": -1}), json!({})));
    let big = u64::MAX;
    assert!(hit(json!({ "epoch": big }), json!({ "epoch": big })));
}

#[test]
fn extension_scalars_compare_exactly() {
    // AEP-0001 §5.4: string, integer, boolean.
    assert!(hit(json!({"acmecount": 3}), base()));
    assert!(!hit(json!({"acmecount": 4}), base()));
    assert!(hit(json!({"acmeflag": true}), base()));
    assert!(!hit(json!({"acmeflag": false}), base()));
    assert!(hit(json!({"acmeflag": [false, true]}), base()));
    let e = json!({"acmebig": u64::MAX, "acmeneg": i64::MIN});
    assert!(hit(json!({"acmebig": u64::MAX}), e.clone()));
    assert!(hit(json!({"acmeneg": i64::MIN}), e.clone()));
    assert!(!hit(json!({"acmebig": -1}), e));
}

// --- §6.2 rule 3: type patterns --------------------------------------------------------

#[test]
fn type_pattern_is_strict_prefix_plus_dot() {
    let flt = f(json!({"type": "attention.*"}));
    assert!(flt.matches(&ev(json!({"type": "attention.requested"}))));
    assert!(flt.matches(&ev(json!({"type": "attention.a.b"}))));
    assert!(!flt.matches(&ev(json!({"type": "attention"}))));
    assert!(!flt.matches(&ev(json!({"type": "attentionx.requested"}))));
    assert!(!flt.matches(&ev(json!({"type": "tool.attention.requested"}))));
    assert!(!flt.matches(&ev(json!({}))));
}

#[test]
fn type_patterns_compose_with_inclusion_and_vendor_types() {
    let flt = f(json!({"type": ["attention.*", "error.*", "tool.completed", "x.acme.*"]}));
    for t in [
        "attention.requested",
        "error.raised",
        "tool.completed",
        "x.acme.foo.bar",
    ] {
        assert!(flt.matches(&ev(json!({ "type": t }))), "{t}");
    }
    for t in ["tool.failed", "x.acme", "x.other.foo.bar", "error"] {
        assert!(!flt.matches(&ev(json!({ "type": t }))), "{t}");
    }
    assert!(hit(
        json!({"type": "run.step.*"}),
        json!({"type": "run.step.started"})
    ));
    assert!(!hit(
        json!({"type": "run.step.*"}),
        json!({"type": "run.started"})
    ));
}

#[test]
fn exact_type_is_not_a_prefix() {
    assert!(!hit(
        json!({"type": "tool"}),
        json!({"type": "tool.completed"})
    ));
    assert!(!hit(
        json!({"type": "tool.completed"}),
        json!({"type": "tool.completed.x"})
    ));
}

#[test]
fn malformed_type_patterns_rejected() {
    let e = rejected(json!({"type": "*"}));
    assert!(e.detail.contains("alone is not a pattern"), "{}", e.detail);
    rejected(json!({"type": ["tool.*", "*"]}));
    for p in [
        ".*",
        "a*",
        "*.requested",
        "attention.*.x",
        "attention.**",
        "att*ntion.*",
        "attention*",
        "**",
    ] {
        let e = rejected(json!({ "type": p }));
        assert!(e.detail.contains("§6.2 rule 3"), "{p}: {}", e.detail);
        rejected(json!({ "type": ["tool.completed", p] }));
    }
}

#[test]
fn glob_on_non_type_key_rejected() {
    for (key, v) in [
        ("agent", "claude*"),
        ("session", "*"),
        ("subject", "*.rs"),
        ("source", "aep://*"),
        ("acmeregion", "eu-*"),
        ("capture", "*"),
        ("severity", "*"),
    ] {
        let e = rejected(json!({ key: v }));
        assert!(e.detail.contains("only to `type`"), "{key}: {}", e.detail);
        rejected(json!({ key: ["x", v] }));
    }
}

// --- §6.2 rules 4, 5: severity ---------------------------------------------------------

#[test]
fn severity_comparisons_use_the_total_order_inclusively() {
    // AEP-0001 §8.1: debug < info < notice < warning < error < critical.
    for (i, lvl) in Severity::ALL.iter().enumerate() {
        for (j, evl) in Severity::ALL.iter().enumerate() {
            let e = json!({"severity": evl.as_str()});
            assert_eq!(
                hit(json!({"severity": {"gte": lvl.as_str()}}), e.clone()),
                j >= i
            );
            assert_eq!(
                hit(json!({"severity": {"lte": lvl.as_str()}}), e.clone()),
                j <= i
            );
            assert_eq!(
                hit(
                    json!({"severity": {"gte": lvl.as_str(), "lte": "error"}}),
                    e.clone()
                ),
                j >= i && j <= 4
            );
            assert_eq!(hit(json!({"severity": lvl.as_str()}), e), i == j);
        }
    }
}

#[test]
fn severity_default_info_applies_before_matching() {
    let none = json!({"type": "tool.completed"});
    assert!(!hit(json!({"severity": {"gte": "notice"}}), none.clone()));
    assert!(hit(json!({"severity": {"gte": "info"}}), none.clone()));
    assert!(hit(json!({"severity": {"lte": "info"}}), none.clone()));
    assert!(hit(
        json!({"severity": {"gte": "debug", "lte": "info"}}),
        none.clone()
    ));
    assert!(hit(json!({"severity": "info"}), none.clone()));
    assert!(hit(json!({"severity": ["debug", "info"]}), none.clone()));
    assert!(!hit(json!({"severity": "debug"}), none));
}

#[test]
fn severity_equality_with_non_levels_never_matches() {
    // Grammatical Scalars (AEP-0003 §6.1) that are not levels: accepted, never match.
    for v in [json!("warn"), json!("INFO"), json!(1), json!(false)] {
        let flt = f(json!({ "severity": v }));
        for l in Severity::ALL {
            assert!(!flt.matches(&ev(json!({"severity": l.as_str()}))));
        }
        assert!(!flt.matches(&ev(json!({}))));
    }
    assert!(hit(json!({"severity": ["warn", "warning"]}), base()));
}

#[test]
fn inverted_severity_band_matches_nothing() {
    let flt = f(json!({"severity": {"gte": "error", "lte": "info"}}));
    for l in Severity::ALL {
        assert!(!flt.matches(&ev(json!({"severity": l.as_str()}))));
    }
}

#[test]
fn severity_cmp_errors() {
    let e = rejected(json!({"severity": {}}));
    assert!(
        e.detail.contains("needs `gte`, `lte` or both"),
        "{}",
        e.detail
    );
    for op in ["gt", "lt", "eq", "GTE", "ne"] {
        let e = rejected(json!({"severity": { op: "info" }}));
        assert!(e.detail.contains(&format!("`{op}`")), "{}", e.detail);
        assert!(
            e.detail.contains("not a comparison operator"),
            "{}",
            e.detail
        );
        rejected(json!({"severity": {"gte": "info", op: "info"}}));
    }
    for lvl in [json!("warn"), json!("Info"), json!("")] {
        let e = rejected(json!({"severity": {"gte": lvl}}));
        assert!(e.detail.contains("not a severity level"), "{}", e.detail);
    }
    for lvl in [
        json!(1),
        json!(null),
        json!(["info"]),
        json!({"gte": "info"}),
    ] {
        let e = rejected(json!({"severity": {"lte": lvl}}));
        assert!(e.detail.contains("takes a level string"), "{}", e.detail);
    }
}

// --- §6.2 rule 5: capture default, absent attributes -----------------------------------

#[test]
fn capture_default_metadata_applies_before_matching() {
    assert!(hit(json!({"capture": "metadata"}), json!({})));
    assert!(!hit(json!({"capture": "full"}), json!({})));
    assert!(hit(json!({"capture": ["none", "full"]}), base()));
    assert!(!hit(json!({"capture": "redacted"}), base()));
    assert!(!hit(json!({"capture": "everything"}), base()));
}

#[test]
fn absent_attributes_never_match() {
    let e = json!({"type": "agent.heartbeat", "agent": "cc"});
    for key in [
        "id",
        "subject",
        "source",
        "session",
        "run",
        "step",
        "cause",
        "acmeregion",
    ] {
        assert!(!hit(json!({ key: "x" }), e.clone()), "{key}");
        assert!(!hit(json!({ key: ["x", "y"] }), e.clone()), "{key}");
    }
    assert!(!hit(json!({"type": "agent.heartbeat"}), json!({})));
    assert!(!hit(json!({"type": "agent.*"}), json!({})));
}

// --- Filter::parse ---------------------------------------------------------------------

#[test]
fn parse_compiles_bytes() {
    let flt = Filter::parse(br#" { "type": ["attention.*"], "severity": { "gte": "notice" } } "#)
        .unwrap();
    assert!(flt.matches(&ev(
        json!({"type": "attention.requested", "severity": "error"})
    )));
    assert_eq!(
        flt,
        f(json!({"type": ["attention.*"], "severity": {"gte": "notice"}}))
    );
}

#[test]
fn parse_rejects_malformed_json() {
    for bad in [&b""[..], b"{", b"{\"a\":}", b"{} {}", b"\xff", b"{'a':1}"] {
        let e = Filter::parse(bad).unwrap_err();
        assert!(e.detail.contains("not valid JSON"), "{}", e.detail);
    }
}

#[test]
fn parse_rejects_duplicate_members() {
    for bad in [
        &br#"{"session": "a", "session": "b"}"#[..],
        br#"{"severity": {"gte": "info", "gte": "error"}}"#,
    ] {
        let e = Filter::parse(bad).unwrap_err();
        assert!(e.detail.contains("duplicate member"), "{}", e.detail);
    }
}

#[test]
fn parse_applies_compile_rules() {
    let e = Filter::parse(br#"{"seq": 5}"#).unwrap_err();
    assert!(e.detail.contains("`seq`"));
    let e = Filter::parse(b"[]").unwrap_err();
    assert!(e.detail.contains("JSON object"));
}

// --- pins ------------------------------------------------------------------------------

fn strs(v: Option<&[Box<str>]>) -> Option<Vec<&str>> {
    v.map(|s| s.iter().map(|x| &**x).collect())
}

#[test]
fn pins_report_exact_session_agent_and_type_values() {
    let flt = f(json!({"session": ["s2", "s1", "s2"], "agent": "cc", "type": "tool.completed"}));
    let p = flt.pins();
    assert_eq!(strs(p.session), Some(vec!["s1", "s2"]));
    assert_eq!(strs(p.agent), Some(vec!["cc"]));
    assert_eq!(strs(p.types), Some(vec!["tool.completed"]));

    let flt = f(json!({"type": ["tool.completed", "attention.*"], "run": "r"}));
    let p = flt.pins();
    assert_eq!(p.session, None);
    assert_eq!(p.agent, None);
    assert_eq!(p.types, None, "a pattern is not an exact pin");

    assert_eq!(f(json!({})).pins(), Pins::default());
}

#[test]
fn pins_of_unsatisfiable_predicates_are_empty() {
    let flt = f(json!({"session": 5, "agent": [true, "cc"]}));
    let p = flt.pins();
    assert_eq!(strs(p.session), Some(vec![]));
    assert_eq!(strs(p.agent), Some(vec!["cc"]));
}

#[test]
fn json_event_helper_applies_defaults() {
    let e: JsonEvent = ev(json!({}));
    assert_eq!(e.epoch(), 0);
    assert_eq!(e.severity(), Severity::Info);
    assert_eq!(e.capture(), Capture::Metadata);
    assert_eq!(e.text(Attr::Type), None);
    assert_eq!(e.extension("acme"), None);
}

/// A filter shown in attr-match form (`GET /connections`) compiles back to the same
/// filter, for every kind of member.
#[test]
fn to_json_compiles_back_to_the_same_filter() {
    for v in [
        json!({}),
        json!({"session": "s1"}),
        json!({"agent": ["a", "b"], "type": ["tool.completed", "attention.*"]}),
        json!({"severity": {"gte": "notice"}, "capture": ["full", "redacted"]}),
        json!({"epoch": [0, 3], "team": ["x", 7, true], "run": "r"}),
    ] {
        let filter = f(v.clone());
        let shown = filter.to_json();
        assert_eq!(f(shown.clone()), filter, "{v} shown as {shown}");
    }
    assert_eq!(
        f(json!({"type": "tool.*", "severity": "error"})).to_json(),
        json!({"type": ["tool.*"], "severity": ["error"]})
    );
}
