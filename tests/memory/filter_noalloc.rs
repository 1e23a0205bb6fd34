//! Filter evaluation and index matching do not allocate (the per-Event fan-out hot
//! path, AEP-0003 §6): counted per thread by the counting global allocator of
//! `tests/counting`.

use std::sync::Arc;

use aep_relay::fanout::index::SubscriptionIndex;
use aep_relay::filter::{Attributes, Filter};
use aep_relay::wire::envelope::{Attr, Capture, Scalar, Severity};

use crate::counting::{allocs_here as allocs, one_at_a_time};

/// A fixed, borrowed event: accessors allocate nothing themselves.
struct Ev {
    session: &'static str,
    agent: &'static str,
    ty: &'static str,
}

impl Attributes for Ev {
    fn text(&self, attr: Attr) -> Option<&str> {
        match attr {
            Attr::Session => Some(self.session),
            Attr::Agent => Some(self.agent),
            Attr::Type => Some(self.ty),
            _ => None,
        }
    }
    fn epoch(&self) -> u64 {
        0
    }
    fn severity(&self) -> Severity {
        Severity::Warning
    }
    fn capture(&self) -> Capture {
        Capture::Metadata
    }
    fn extension(&self, name: &str) -> Option<Scalar<'_>> {
        (name == "acmeregion").then_some(Scalar::Str("eu-1"))
    }
}

fn filter(json: &str) -> Filter {
    Filter::parse(json.as_bytes()).unwrap()
}

#[test]
fn matching_does_not_allocate() {
    // The filters built here would move the other tests' process-wide measure.
    let _one = one_at_a_time();
    let filters = [
        r#"{}"#,
        r#"{"type": ["attention.*", "tool.*", "x.acme.*"], "severity": {"gte": "notice"}}"#,
        r#"{"session": ["s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10"]}"#,
        r#"{"agent": "cc", "acmeregion": ["eu-1", "us-1"], "epoch": 0, "capture": "metadata"}"#,
        r#"{"type": "tool.completed", "run": "r1"}"#,
    ];
    let mut idx = SubscriptionIndex::new();
    for (k, f) in filters.iter().enumerate() {
        idx.insert(k, Arc::new(filter(f)));
    }
    for k in 0..1000 {
        idx.insert(
            100 + k,
            Arc::new(filter(&format!(r#"{{"session": "x{k}"}}"#))),
        );
    }
    let e = Ev {
        session: "s3",
        agent: "cc",
        ty: "tool.completed",
    };
    let f = filter(filters[1]);
    let mut out = Vec::with_capacity(64);

    let before = allocs();
    let hit = f.matches(&e);
    idx.matching(&e, &mut out);
    let after = allocs();

    // The counter is live: a boxed value is counted.
    let b = allocs();
    std::hint::black_box(Box::new(1u64));
    assert!(allocs() > b, "counting allocator not in effect");

    assert!(hit);
    assert_eq!(out, vec![0, 1, 2, 3]);
    assert_eq!(after - before, 0, "allocations during evaluation");
}
