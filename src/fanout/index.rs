//! The subscription index: finds the subscriptions whose `attr-match` filter
//! (AEP-0003 §6) matches an Event without evaluating every filter.
//!
//! Each filter is placed by its most selective pin ([`Filter::pins`]): `session` if it
//! pins one, else `agent`, else exact `type` values, else the unpinned list. A pinned
//! filter sits in one bucket per pinned value of a hash map keyed by that value; since
//! an Event carries one value per attribute it reaches at most one bucket per map, so
//! no key is seen twice. A filter whose chosen pin is empty (it can never match, e.g.
//! `{"session": 5}`) sits in no bucket at all.
//!
//! Matching an Event looks up its `session`, `agent` and `type` in the three maps with
//! borrowed `&str` keys and fully evaluates only those buckets' filters plus the
//! unpinned ones. Every bucket and the unpinned list are kept sorted by key and merged,
//! so results come out in **ascending key order** with no sort and no allocation.
//!
//! Cost per Event: three hash lookups plus one evaluation per candidate. 100k
//! subscriptions pinned to distinct sessions cost about what 100 do; unpinned
//! subscriptions (`{}`, `{"type": "tool.*"}`, ...) are always evaluated.

use std::collections::HashMap;
use std::sync::Arc;

use crate::filter::{Attributes, Filter};
use crate::wire::envelope::Attr;

/// A caller-chosen subscription key (a slab key).
pub type SubKey = usize;

/// Filters sorted by ascending key.
type Bucket = Vec<(SubKey, Arc<Filter>)>;

/// Which pin a filter was placed by.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Placement {
    Session,
    Agent,
    Type,
    Unpinned,
}

/// Many `(SubKey, Arc<Filter>)` pairs, indexed for [`SubscriptionIndex::matching`].
#[derive(Debug, Default)]
pub struct SubscriptionIndex {
    filters: HashMap<SubKey, (Arc<Filter>, Placement)>,
    by_session: HashMap<Box<str>, Bucket>,
    by_agent: HashMap<Box<str>, Bucket>,
    by_type: HashMap<Box<str>, Bucket>,
    unpinned: Bucket,
}

/// Inserts into a sorted bucket (appending is the common case for growing slab keys).
fn bucket_insert(b: &mut Bucket, key: SubKey, filter: &Arc<Filter>) {
    match b.last() {
        Some((last, _)) if *last >= key => {
            let at = b.partition_point(|(k, _)| *k < key);
            b.insert(at, (key, Arc::clone(filter)));
        }
        _ => b.push((key, Arc::clone(filter))),
    }
}

fn bucket_remove(b: &mut Bucket, key: SubKey) {
    if let Ok(at) = b.binary_search_by_key(&key, |(k, _)| *k) {
        b.remove(at);
    }
}

/// The bucket of `map` for `value`, empty when there is none.
#[inline]
fn lookup<'a>(
    map: &'a HashMap<Box<str>, Bucket>,
    value: Option<&str>,
) -> &'a [(SubKey, Arc<Filter>)] {
    if map.is_empty() {
        return &[];
    }
    match value.and_then(|v| map.get(v)) {
        Some(b) => b,
        None => &[],
    }
}

impl SubscriptionIndex {
    /// An empty index.
    pub fn new() -> SubscriptionIndex {
        SubscriptionIndex::default()
    }

    /// Number of subscriptions held.
    pub fn len(&self) -> usize {
        self.filters.len()
    }

    /// Whether no subscription is held.
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// The filter held for `key`.
    pub fn get(&self, key: SubKey) -> Option<&Arc<Filter>> {
        self.filters.get(&key).map(|(f, _)| f)
    }

    /// Adds subscription `key` with `filter`, replacing any filter already held for
    /// `key`.
    pub fn insert(&mut self, key: SubKey, filter: Arc<Filter>) {
        self.remove(key);
        let pins = filter.pins();
        let (placement, values, map) = if let Some(v) = pins.session {
            (Placement::Session, v, &mut self.by_session)
        } else if let Some(v) = pins.agent {
            (Placement::Agent, v, &mut self.by_agent)
        } else if let Some(v) = pins.types {
            (Placement::Type, v, &mut self.by_type)
        } else {
            bucket_insert(&mut self.unpinned, key, &filter);
            self.filters.insert(key, (filter, Placement::Unpinned));
            return;
        };
        // `values` is deduplicated (Filter::pins), so `key` lands in each bucket once.
        for v in values {
            match map.get_mut(&**v) {
                Some(b) => bucket_insert(b, key, &filter),
                None => {
                    map.insert(v.clone(), vec![(key, Arc::clone(&filter))]);
                }
            }
        }
        self.filters.insert(key, (filter, placement));
    }

    /// Removes subscription `key`, returning its filter.
    pub fn remove(&mut self, key: SubKey) -> Option<Arc<Filter>> {
        let (filter, placement) = self.filters.remove(&key)?;
        let pins = filter.pins();
        let (values, map) = match placement {
            Placement::Session => (pins.session, &mut self.by_session),
            Placement::Agent => (pins.agent, &mut self.by_agent),
            Placement::Type => (pins.types, &mut self.by_type),
            Placement::Unpinned => {
                bucket_remove(&mut self.unpinned, key);
                return Some(filter);
            }
        };
        for v in values.unwrap_or_default() {
            if let Some(b) = map.get_mut(&**v) {
                bucket_remove(b, key);
                if b.is_empty() {
                    // Do not keep a bucket per departed session.
                    map.remove(&**v);
                }
            }
        }
        Some(filter)
    }

    /// Appends to `out` every key whose filter matches `ev` (each key once, ascending).
    /// Does not allocate when `out` has room for the matches.
    pub fn matching<A: Attributes + ?Sized>(&self, ev: &A, out: &mut Vec<SubKey>) {
        let mut lists: [&[(SubKey, Arc<Filter>)]; 4] = [
            lookup(&self.by_session, ev.text(Attr::Session)),
            lookup(&self.by_agent, ev.text(Attr::Agent)),
            lookup(&self.by_type, ev.text(Attr::Type)),
            &self.unpinned,
        ];
        // The common case is a single kind of candidate (say, only unpinned filters):
        // no merge needed, it is already ascending.
        let mut nonempty = lists.iter().filter(|l| !l.is_empty());
        if let (Some(only), None) = (nonempty.next(), nonempty.next()) {
            for (key, filter) in *only {
                if filter.matches(ev) {
                    out.push(*key);
                }
            }
            return;
        }
        // Merge the four sorted candidate lists. The lists are disjoint: a key is placed
        // under one pin kind only, and in one bucket per Event value.
        loop {
            let mut best: Option<(usize, SubKey)> = None;
            for (i, l) in lists.iter().enumerate() {
                if let Some((k, _)) = l.first() {
                    if best.is_none_or(|(_, b)| *k < b) {
                        best = Some((i, *k));
                    }
                }
            }
            let Some((i, _)) = best else { break };
            let (key, filter) = &lists[i][0];
            lists[i] = &lists[i][1..];
            if filter.matches(ev) {
                out.push(*key);
            }
        }
    }

    /// How many filters [`SubscriptionIndex::matching`] would evaluate for `ev`.
    #[cfg(test)]
    fn candidates<A: Attributes + ?Sized>(&self, ev: &A) -> usize {
        lookup(&self.by_session, ev.text(Attr::Session)).len()
            + lookup(&self.by_agent, ev.text(Attr::Agent)).len()
            + lookup(&self.by_type, ev.text(Attr::Type)).len()
            + self.unpinned.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::test_support::{ev, JsonEvent};
    use serde_json::{json, Value};

    fn flt(v: Value) -> Arc<Filter> {
        Arc::new(Filter::compile(&v).unwrap())
    }

    fn linear(subs: &[(SubKey, Arc<Filter>)], e: &JsonEvent) -> Vec<SubKey> {
        let mut v: Vec<SubKey> = subs
            .iter()
            .filter(|(_, f)| f.matches(e))
            .map(|(k, _)| *k)
            .collect();
        v.sort_unstable();
        v
    }

    fn run(idx: &SubscriptionIndex, e: &JsonEvent) -> Vec<SubKey> {
        let mut out = Vec::new();
        idx.matching(e, &mut out);
        out
    }

    #[test]
    fn pinned_and_unpinned_mix() {
        let mut idx = SubscriptionIndex::new();
        idx.insert(1, flt(json!({"session": "s1"})));
        idx.insert(2, flt(json!({"session": "s2"})));
        idx.insert(3, flt(json!({"agent": "cc"})));
        idx.insert(4, flt(json!({"type": "tool.completed"})));
        idx.insert(5, flt(json!({})));
        idx.insert(6, flt(json!({"type": "tool.*"})));
        idx.insert(
            7,
            flt(json!({"session": "s1", "agent": "cc", "severity": {"gte": "error"}})),
        );
        idx.insert(
            8,
            flt(json!({"agent": ["cc", "codex"], "type": "tool.completed"})),
        );
        assert_eq!(idx.len(), 8);

        let e = ev(json!({"type": "tool.completed", "session": "s1", "agent": "cc"}));
        assert_eq!(run(&idx, &e), vec![1, 3, 4, 5, 6, 8]);
        let e = ev(
            json!({"type": "tool.completed", "session": "s1", "agent": "cc", "severity": "critical"}),
        );
        assert_eq!(run(&idx, &e), vec![1, 3, 4, 5, 6, 7, 8]);
        let e = ev(json!({"type": "agent.heartbeat", "agent": "codex"}));
        assert_eq!(run(&idx, &e), vec![5]);
        let e = ev(json!({}));
        assert_eq!(run(&idx, &e), vec![5]);
    }

    #[test]
    fn selects_most_selective_pin() {
        let mut idx = SubscriptionIndex::new();
        idx.insert(
            1,
            flt(json!({"type": "t.a", "agent": "cc", "session": "s"})),
        );
        idx.insert(2, flt(json!({"type": "t.a", "agent": "cc"})));
        idx.insert(3, flt(json!({"type": ["t.a", "t.b"]})));
        idx.insert(4, flt(json!({"type": ["t.a", "t.*"], "run": "r"})));
        assert_eq!(idx.filters[&1].1, Placement::Session);
        assert_eq!(idx.filters[&2].1, Placement::Agent);
        assert_eq!(idx.filters[&3].1, Placement::Type);
        assert_eq!(idx.filters[&4].1, Placement::Unpinned);
        assert_eq!(idx.by_type.len(), 2);
    }

    #[test]
    fn removal_and_replacement() {
        let mut idx = SubscriptionIndex::new();
        idx.insert(10, flt(json!({"session": ["s1", "s2"]})));
        idx.insert(11, flt(json!({"session": "s1"})));
        idx.insert(12, flt(json!({})));
        let e1 = ev(json!({"session": "s1"}));
        let e2 = ev(json!({"session": "s2"}));
        assert_eq!(run(&idx, &e1), vec![10, 11, 12]);
        assert_eq!(run(&idx, &e2), vec![10, 12]);

        assert!(idx.remove(10).is_some());
        assert!(idx.remove(10).is_none());
        assert_eq!(run(&idx, &e1), vec![11, 12]);
        assert_eq!(run(&idx, &e2), vec![12]);
        assert!(
            !idx.by_session.contains_key("s2"),
            "empty buckets are dropped"
        );

        // Re-inserting a key replaces its filter.
        idx.insert(11, flt(json!({"session": "s2"})));
        assert_eq!(idx.len(), 2);
        assert_eq!(run(&idx, &e1), vec![12]);
        assert_eq!(run(&idx, &e2), vec![11, 12]);

        idx.remove(11);
        idx.remove(12);
        assert!(idx.is_empty());
        assert!(idx.by_session.is_empty() && idx.unpinned.is_empty());
    }

    #[test]
    fn each_key_at_most_once() {
        let mut idx = SubscriptionIndex::new();
        // Many pinned values incl. duplicates; the Event hits only one of them.
        idx.insert(1, flt(json!({"session": ["s1", "s1", "s2", "s3"]})));
        idx.insert(2, flt(json!({"agent": ["a", "b", "a"]})));
        idx.insert(3, flt(json!({"type": ["t.x", "t.y", "t.x"]})));
        let e = ev(json!({"session": "s1", "agent": "a", "type": "t.x"}));
        assert_eq!(run(&idx, &e), vec![1, 2, 3]);
    }

    #[test]
    fn unsatisfiable_pins_are_stored_nowhere() {
        let mut idx = SubscriptionIndex::new();
        idx.insert(1, flt(json!({"session": 5})));
        idx.insert(2, flt(json!({"agent": false})));
        assert_eq!(idx.len(), 2);
        assert!(idx.by_session.is_empty() && idx.by_agent.is_empty());
        assert!(idx.unpinned.is_empty());
        assert!(run(&idx, &ev(json!({"session": "5", "agent": "false"}))).is_empty());
        idx.remove(1);
        idx.remove(2);
        assert!(idx.is_empty());
    }

    #[test]
    fn appends_to_out_and_keeps_ascending_order_with_unordered_inserts() {
        let mut idx = SubscriptionIndex::new();
        for k in [9, 3, 7, 1, 5] {
            idx.insert(k, flt(json!({"session": "s"})));
        }
        for k in [8, 2, 6, 4, 0] {
            idx.insert(k, flt(json!({})));
        }
        let mut out = vec![100];
        idx.matching(&ev(json!({"session": "s"})), &mut out);
        assert_eq!(out, vec![100, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn sublinear_in_pinned_subscriptions() {
        let mut idx = SubscriptionIndex::new();
        for k in 0..100_000 {
            idx.insert(
                k,
                flt(json!({"session": format!("s{k}"), "type": "tool.*"})),
            );
        }
        for k in 100_000..100_010 {
            idx.insert(k, flt(json!({"type": "attention.*"})));
        }
        let e = ev(json!({"session": "s4242", "type": "tool.completed"}));
        assert_eq!(idx.candidates(&e), 11);
        assert_eq!(run(&idx, &e), vec![4242]);
        let e = ev(json!({"type": "attention.requested"}));
        assert_eq!(idx.candidates(&e), 10);
        assert_eq!(run(&idx, &e), (100_000..100_010).collect::<Vec<_>>());
    }

    /// SplitMix64: a small deterministic PRNG.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
            xs[self.below(xs.len())]
        }
        fn chance(&mut self, pct: u64) -> bool {
            self.next() % 100 < pct
        }
    }

    const SESSIONS: [&str; 6] = ["s0", "s1", "s2", "s3", "s4", "s5"];
    const AGENTS: [&str; 4] = ["cc", "codex", "gemini", "aider"];
    const TYPES: [&str; 7] = [
        "tool.completed",
        "tool.failed",
        "attention.requested",
        "run.started",
        "agent.heartbeat",
        "x.acme.foo.bar",
        "error.raised",
    ];
    const PATTERNS: [&str; 4] = ["tool.*", "attention.*", "x.acme.*", "run.*"];
    const LEVELS: [&str; 6] = ["debug", "info", "notice", "warning", "error", "critical"];
    const CAPTURES: [&str; 4] = ["none", "metadata", "redacted", "full"];

    fn one_or_many(r: &mut Rng, xs: &[&str]) -> Value {
        if r.chance(60) {
            json!(r.pick(xs))
        } else {
            let n = 1 + r.below(3);
            Value::Array((0..n).map(|_| json!(r.pick(xs))).collect())
        }
    }

    fn random_filter(r: &mut Rng) -> Value {
        let mut m = serde_json::Map::new();
        if r.chance(35) {
            m.insert("session".into(), one_or_many(r, &SESSIONS));
        }
        if r.chance(35) {
            m.insert("agent".into(), one_or_many(r, &AGENTS));
        }
        if r.chance(40) {
            let v = if r.chance(50) {
                one_or_many(r, &TYPES)
            } else {
                let mut all: Vec<&str> = TYPES.to_vec();
                all.extend(PATTERNS);
                one_or_many(r, &all)
            };
            m.insert("type".into(), v);
        }
        if r.chance(20) {
            let v = match r.below(4) {
                0 => json!({"gte": r.pick(&LEVELS)}),
                1 => json!({"lte": r.pick(&LEVELS)}),
                2 => json!({"gte": r.pick(&LEVELS), "lte": r.pick(&LEVELS)}),
                _ => one_or_many(r, &LEVELS),
            };
            m.insert("severity".into(), v);
        }
        if r.chance(10) {
            m.insert("capture".into(), one_or_many(r, &CAPTURES));
        }
        if r.chance(10) {
            m.insert("epoch".into(), json!(r.below(3)));
        }
        if r.chance(10) {
            m.insert("acmeregion".into(), one_or_many(r, &["eu", "us"]));
        }
        if r.chance(3) {
            m.insert("session".into(), json!(7)); // unsatisfiable pin
        }
        Value::Object(m)
    }

    fn random_event(r: &mut Rng) -> JsonEvent {
        let mut m = serde_json::Map::new();
        if r.chance(90) {
            m.insert("type".into(), json!(r.pick(&TYPES)));
        }
        if r.chance(80) {
            m.insert("session".into(), json!(r.pick(&SESSIONS)));
        }
        if r.chance(90) {
            m.insert("agent".into(), json!(r.pick(&AGENTS)));
        }
        if r.chance(60) {
            m.insert("severity".into(), json!(r.pick(&LEVELS)));
        }
        if r.chance(50) {
            m.insert("capture".into(), json!(r.pick(&CAPTURES)));
        }
        if r.chance(50) {
            m.insert("epoch".into(), json!(r.below(3)));
        }
        if r.chance(50) {
            m.insert("acmeregion".into(), json!(r.pick(&["eu", "us"])));
        }
        JsonEvent(m)
    }

    #[test]
    fn index_equals_linear_scan_over_random_filters_and_events() {
        let mut r = Rng(0x5EED_AE90_0003);
        let mut idx = SubscriptionIndex::new();
        let mut subs: Vec<(SubKey, Arc<Filter>)> = Vec::new();
        let mut out = Vec::with_capacity(4096);
        for round in 0..6 {
            // Insert a batch under scattered keys (some replacing existing ones).
            for _ in 0..500 {
                let key = r.below(4000);
                let f = flt(random_filter(&mut r));
                subs.retain(|(k, _)| *k != key);
                subs.push((key, Arc::clone(&f)));
                idx.insert(key, f);
            }
            // Remove some.
            for _ in 0..150 {
                let key = r.below(4000);
                let expected = subs.iter().position(|(k, _)| *k == key);
                let got = idx.remove(key);
                assert_eq!(got.is_some(), expected.is_some());
                if let Some(p) = expected {
                    subs.swap_remove(p);
                }
            }
            assert_eq!(idx.len(), subs.len());
            let mut nonempty = 0;
            for _ in 0..300 {
                let e = random_event(&mut r);
                out.clear();
                idx.matching(&e, &mut out);
                let want = linear(&subs, &e);
                assert_eq!(out, want, "round {round}, event {:?}", e.0);
                nonempty += usize::from(!want.is_empty());
            }
            assert!(nonempty > 100, "random corpus too sparse: {nonempty}");
        }
    }
}
