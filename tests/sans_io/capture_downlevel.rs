//! Unit tests of mechanical down-leveling (`aep_relay::capture`) on hand-written Events,
//! independent of `../shared` (AEP-0001 §8.2, AEP-0002 §5.1, AEP-0003 §6.4).

use aep_relay::capture::{downlevel, downlevel_value};
use aep_relay::wire::envelope::Capture::{self, Full, Metadata, Redacted};
use aep_relay::wire::envelope::Event;
use bytes::Bytes;
use serde_json::{json, Map, Value};

/// An Event object with the usual envelope, `type`, `capture` and `data`.
fn event(ty: &str, capture: &str, data: Value) -> Map<String, Value> {
    let v = json!({
        "aep": "0.1", "id": "E1", "type": ty, "subject": "Bash",
        "time": "2026-07-03T10:00:00Z", "source": "aep://h/agent/a", "agent": "a",
        "session": "s1", "seq": 7, "capture": capture, "data": data
    });
    v.as_object().unwrap().clone()
}

fn down(mut ev: Map<String, Value>, ceiling: Capture) -> (bool, Map<String, Value>) {
    let changed = downlevel_value(&mut ev, ceiling);
    (changed, ev)
}

fn keys(m: &Map<String, Value>) -> Vec<&str> {
    m.keys().map(String::as_str).collect()
}

/// AEP-0002 §5.2 `error_info`: `error.message` is `redacted` inside a `metadata` object.
#[test]
fn nested_object_member_above_target_is_dropped() {
    let ev = event(
        "run.failed",
        "redacted",
        json!({"reason": "error", "error": {"type": "Boom", "message": "at /home/u/x"}, "duration_ms": 5}),
    );
    let (changed, out) = down(ev, Metadata);
    assert!(changed);
    assert_eq!(out["capture"], "metadata");
    assert_eq!(
        out["data"],
        json!({"reason": "error", "error": {"type": "Boom"}, "duration_ms": 5})
    );
}

/// AEP-0002 §5.2 `document` in `resource.retrieval.returned.documents[]`: each element is
/// pruned on its own; the open `metadata` object and unlisted members survive.
#[test]
fn array_of_objects_is_pruned_per_element() {
    let ev = event(
        "resource.retrieval.returned",
        "full",
        json!({"documents": [
            {"id": "d1", "content": "verbatim", "content_redacted": "r", "metadata": {"k": "v"}},
            {"id": "d2", "score": 0.5},
            {"content": "only content"}
        ], "count": 3}),
    );
    let (_, out) = down(ev, Metadata);
    assert_eq!(
        out["data"],
        json!({"documents": [{"id": "d1", "metadata": {"k": "v"}}, {"id": "d2", "score": 0.5}, {}], "count": 3})
    );
}

/// Members the schema does not list default to `metadata` (AEP-0002 §5.1 rule 4; §5.2
/// lets vendors add `cost` / `document` members): kept at `metadata`, gone at `none`.
#[test]
fn unannotated_members_default_to_metadata() {
    let data = json!({"duration_ms": 1, "x_vendor_note": "structural",
        "cost": {"currency": "USD", "total": 0.1, "x_tier": "batch"}, "summary": "prose"});
    let (_, out) = down(event("run.finished", "full", data.clone()), Metadata);
    assert_eq!(
        out["data"],
        json!({"duration_ms": 1, "x_vendor_note": "structural",
            "cost": {"currency": "USD", "total": 0.1, "x_tier": "batch"}})
    );
    let (_, out) = down(event("run.finished", "full", data), Capture::None);
    assert!(out.get("data").is_none());
}

/// A registered schema with no members (`control.pause`): its payload members are all
/// unannotated, so they stay at `metadata` (unlike an unknown type, whose `data` goes).
#[test]
fn registered_type_without_members_keeps_its_payload() {
    let (_, out) = down(
        event("control.pause", "redacted", json!({"note": 1})),
        Metadata,
    );
    assert_eq!(out["data"], json!({"note": 1}));
}

/// AEP-0001 §8.2 `none`: envelope only.
#[test]
fn none_ceiling_leaves_the_envelope_only() {
    for source in ["metadata", "redacted", "full"] {
        let ev = event("tool.completed", source, json!({"tool": {"name": "Bash"}}));
        let (changed, out) = down(ev.clone(), Capture::None);
        assert!(changed);
        assert_eq!(out["capture"], "none");
        assert!(out.get("data").is_none());
        let mut want = ev;
        want.shift_remove("data");
        want.insert("capture".into(), "none".into());
        assert_eq!(keys(&out), keys(&want));
        assert_eq!(out, want);
    }
}

/// A type without a registered schema (vendor `x.*`, reserved `message.*`) loses `data`
/// whole: nothing says which of its members are content.
#[test]
fn type_without_schema_loses_data() {
    for ty in ["x.acme.tool.trace", "message.user.submitted", "nonsense"] {
        let (changed, out) = down(event(ty, "redacted", json!({"n": 1})), Metadata);
        assert!(changed, "{ty}");
        assert_eq!(out["capture"], "metadata");
        assert!(out.get("data").is_none(), "{ty}");
    }
    let mut ev = event("x.acme.tool.trace", "full", json!({}));
    ev.shift_remove("type");
    let (_, out) = down(ev, Metadata);
    assert!(out.get("data").is_none(), "no type at all");
}

/// AEP-0001 §8.2(b): never up-level. A ceiling at or above the source changes nothing.
#[test]
fn never_up_levels() {
    let levels = ["none", "metadata", "redacted", "full"];
    for (si, source) in levels.iter().enumerate() {
        for ceiling in Capture::ALL.into_iter().skip(si) {
            let ev = event(
                "tool.requested",
                source,
                json!({"tool": {"name": "X"}, "args": {"a": 1}}),
            );
            let (changed, out) = down(ev.clone(), ceiling);
            assert!(!changed, "{source} under {ceiling:?}");
            assert_eq!(out, ev);
        }
    }
    // Absent `capture` is `metadata` (AEP-0001 §5.1 #16): passes a `metadata` ceiling.
    let mut ev = event("tool.requested", "metadata", json!({"tool": {"name": "X"}}));
    ev.shift_remove("capture");
    assert!(!down(ev.clone(), Metadata).0);
    // ... and under `none` it gains `capture: "none"`, appended.
    let (changed, out) = down(ev, Capture::None);
    assert!(changed);
    assert_eq!(keys(&out).last(), Some(&"capture"));
    assert_eq!(out["capture"], "none");
}

/// AEP-0001 §8.2(e): a `full` source under a `redacted` ceiling lands on `metadata`, even
/// for members that claim to be redacted already; a `redacted` source passes unchanged.
#[test]
fn redacted_ceiling_never_mints_redacted() {
    let data = json!({"tool": {"name": "Bash"}, "args_digest": "d", "args": {"cmd": "x"},
        "args_redacted": {"cmd": "[REDACTED:secret]"}});
    let (changed, out) = down(event("tool.requested", "full", data.clone()), Redacted);
    assert!(changed);
    assert_eq!(out["capture"], "metadata");
    assert_eq!(
        out["data"],
        json!({"tool": {"name": "Bash"}, "args_digest": "d"})
    );

    let (changed, out) = down(event("tool.requested", "redacted", data.clone()), Redacted);
    assert!(!changed);
    assert_eq!(out["data"], data);
}

/// The data member is not moved (with `preserve_order`, `Map::remove` would swap the last
/// member into its slot) and nested members keep their order.
#[test]
fn member_order_is_preserved() {
    let mut ev = Map::new();
    for (k, v) in [
        ("aep", json!("0.1")),
        ("capture", json!("full")),
        (
            "data",
            json!({"z": 1, "label": "t", "client": {"version": "1", "name": "c"}, "cwd": "/h", "a": 2}),
        ),
        ("type", json!("session.started")),
        ("id", json!("E")),
        ("agent", json!("a")),
        ("x_ext", json!(true)),
    ] {
        ev.insert(k.into(), v);
    }
    let (_, out) = down(ev.clone(), Metadata);
    assert_eq!(keys(&out), keys(&ev));
    assert_eq!(
        serde_json::to_string(&out["data"]).unwrap(),
        r#"{"z":1,"client":{"version":"1","name":"c"},"a":2}"#
    );
    // Dropping `data` keeps the order of everything after it.
    let (_, out) = down(ev, Capture::None);
    assert_eq!(
        keys(&out),
        ["aep", "capture", "type", "id", "agent", "x_ext"]
    );
}

/// Envelope members other than `capture` and `data` are never touched, extension
/// attributes and odd-but-legal values included.
#[test]
fn envelope_members_are_untouched() {
    let mut ev = event(
        "attention.answered",
        "redacted",
        json!({"answer": {"text": "x"}}),
    );
    ev.insert("epoch".into(), json!(u64::MAX));
    ev.insert("severity".into(), json!("warning"));
    ev.insert("x_team".into(), json!("café \u{2028} \"q\""));
    ev.insert("x_n".into(), json!(i64::MIN));
    ev.insert("cause".into(), json!("C0"));
    for ceiling in [Capture::None, Metadata] {
        let (_, out) = down(ev.clone(), ceiling);
        for (k, v) in &ev {
            if k != "capture" && k != "data" {
                assert_eq!(out.get(k), Some(v), "{k}");
            }
        }
        assert_eq!(out.len(), ev.len() - usize::from(ceiling == Capture::None));
    }
}

/// AEP-0003 §9.2 synthesis and AEP-0006 label placeholders at a hop, including the
/// fallbacks: no `subject`, a label without a string `id` (its 1-based position).
#[test]
fn metadata_star_fallbacks() {
    let mut ev = event(
        "attention.requested",
        "redacted",
        json!({"kind": "input", "prompt": "Which DB?", "options": [
            {"id": "pg", "label": "PostgreSQL"}, {"label": "SQLite"}, {"id": 9, "label": "Other"}]}),
    );
    ev.shift_remove("subject");
    let (_, out) = down(ev, Metadata);
    assert_eq!(
        out["data"],
        json!({"kind": "input", "prompt": "a requests input", "options": [
            {"id": "pg", "label": "pg"}, {"label": "2"}, {"id": 9, "label": "3"}]})
    );
}

/// `answer.values` below `redacted`: numbers and booleans only (AEP-0006); a non-object
/// `values` is dropped; `answer.option` stays.
#[test]
fn values_keep_structural_entries_only() {
    let ev = event(
        "attention.answered",
        "full",
        json!({"answer": {"option": "1", "values": {"s": "free", "n": 1.5, "b": false,
            "ids": ["1"], "o": {"x": 1}, "z": null}}}),
    );
    let (_, out) = down(ev, Redacted);
    assert_eq!(
        out["data"],
        json!({"answer": {"option": "1", "values": {"n": 1.5, "b": false}}})
    );

    let ev = event(
        "attention.answered",
        "redacted",
        json!({"answer": {"values": "free"}}),
    );
    let (_, out) = down(ev, Metadata);
    assert_eq!(out["data"], json!({"answer": {}}));
}

/// A value whose shape contradicts the schema cannot be gated member by member and is
/// dropped (AEP-0001 §8.2(b): dropping more is legal); so is a non-object `data`.
#[test]
fn shape_mismatches_are_dropped() {
    let ev = event(
        "attention.requested",
        "redacted",
        json!({"kind": "permission", "prompt": "p", "options": ["Allow", {"id": "deny", "label": "Deny"}],
            "fields": {"id": "1"}}),
    );
    let (_, out) = down(ev, Metadata);
    assert_eq!(
        out["data"],
        json!({"kind": "permission", "prompt": "a requests permission: Bash",
            "options": [{"id": "deny", "label": "deny"}]})
    );
    let (_, out) = down(
        event("tool.failed", "redacted", json!("free text")),
        Metadata,
    );
    assert!(out.get("data").is_none());
}

/// A `capture` that is not one of the four levels is treated as `full` (fail closed).
#[test]
fn unreadable_capture_is_treated_as_full() {
    let ev = event(
        "tool.requested",
        "bogus",
        json!({"tool": {"name": "X"}, "args": {}}),
    );
    let (changed, out) = down(ev, Redacted);
    assert!(changed);
    assert_eq!(out["capture"], "metadata");
    assert_eq!(out["data"], json!({"tool": {"name": "X"}}));
}

/// `downlevel` on a scanned Event: `None` when the ceiling is not lower, otherwise the
/// core's result serialized once.
#[test]
fn event_wrapper() {
    let ev = event(
        "tool.failed",
        "redacted",
        json!({"tool": {"name": "Bash"},
        "error": {"type": "E", "message": "m"}}),
    );
    let bytes = Bytes::from(serde_json::to_vec(&ev).unwrap());
    let scanned = Event::scan(bytes.clone()).unwrap_or_else(|e| panic!("scan: {e}"));
    assert!(downlevel(&scanned, Redacted).is_none());
    assert!(downlevel(&scanned, Full).is_none());
    let out = downlevel(&scanned, Metadata).expect("a copy");
    let mut want = ev.clone();
    downlevel_value(&mut want, Metadata);
    assert_eq!(&out[..], serde_json::to_vec(&want).unwrap().as_slice());
}
