//! Differential test of the replay store against a naive reference model
//! (AEP-0001 §5.2, §7; AEP-0003 §5, §7).
//!
//! The model keeps every session as an unsorted `Vec` with the obvious order key
//! `(anchor: Option<(epoch, seq)>, rank)` (rank 0 for a sequenced Event, the foreign
//! arrival counter otherwise), sorts on demand, scans linearly for duplicates and
//! conflicts, and remembers *every* evicted key. A `replay-exhausted` marker is due when
//! any evicted key is one `replay_after` would have delivered: that is the definition the
//! store's `evicted_high` shortcut must match exactly.

use std::sync::Arc;

use aep_relay::envelope::Scope;
use aep_relay::store::{Admission, Position, Store, Stored};

#[derive(Debug)]
struct T {
    session: Option<String>,
    pos: Option<Position>,
    source: String,
    id: String,
    scope: Scope,
    len: usize,
}

impl Stored for T {
    fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }
    fn position(&self) -> Option<Position> {
        self.pos
    }
    fn dedupe_key(&self) -> (&str, &str) {
        (&self.source, &self.id)
    }
    fn scope(&self) -> Scope {
        self.scope
    }
    fn byte_len(&self) -> usize {
        self.len
    }
}

type Key = (Option<Position>, u64);

#[derive(Default)]
struct MSession {
    held: Vec<(Key, Arc<T>)>,
    evicted: Vec<Key>,
    high: Option<Position>,
    foreign_n: u64,
}

struct Model {
    cap: usize,
    max: usize,
    /// Least recently written first.
    lru: Vec<(String, MSession)>,
}

impl Model {
    fn admit(&mut self, ev: &Arc<T>) -> Admission {
        if ev.scope == Scope::Agent {
            return Admission::NotBuffered;
        }
        let name = ev.session.clone().unwrap();
        let i = match self.lru.iter().position(|(n, _)| *n == name) {
            Some(i) => i,
            None => {
                if self.lru.len() == self.max {
                    self.lru.remove(0);
                }
                self.lru.push((name, MSession::default()));
                self.lru.len() - 1
            }
        };
        let s = &mut self.lru[i].1;
        if s.held
            .iter()
            .any(|(_, h)| (&h.source, &h.id) == (&ev.source, &ev.id))
        {
            return Admission::Duplicate;
        }
        let key = match ev.pos {
            Some(p) => (Some(p), 0),
            None => (s.high, s.foreign_n + 1),
        };
        if s.held.iter().any(|(k, _)| *k == key) {
            return Admission::Conflict;
        }
        s.held.push((key, Arc::clone(ev)));
        s.held.sort_by_key(|(k, _)| *k);
        if s.held.len() > self.cap {
            let (k, _) = s.held.remove(0);
            s.evicted.push(k);
            if k == key {
                return Admission::NotBuffered;
            }
        }
        match ev.pos {
            Some(p) => s.high = s.high.max(Some(p)),
            None => s.foreign_n += 1,
        }
        let e = self.lru.remove(i);
        self.lru.push(e);
        Admission::Admitted
    }

    fn get(&self, name: &str) -> Option<&MSession> {
        self.lru.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const OWNER: &str = "aep://h/agent/a/session/s";

fn random_event(r: &mut Rng, serial: &mut u64) -> Arc<T> {
    *serial += 1;
    let session = format!("s{}", r.below(5));
    let (pos, source, id, scope) = match r.below(20) {
        // Agent-scoped.
        0 => (
            None,
            OWNER.to_string(),
            format!("agent{serial}"),
            Scope::Agent,
        ),
        // Foreign: ids from a small pool, so redeliveries (and re-admission after
        // eviction) happen.
        1..=4 => (
            None,
            "aep://h/consumer".to_string(),
            format!("f{}", r.below(12)),
            Scope::Foreign,
        ),
        // A different Event claiming some position: a conflict unless the position is
        // free.
        5 => {
            let p = (r.below(3), r.below(40));
            (
                Some(p),
                OWNER.to_string(),
                format!("x{serial}"),
                Scope::Sequenced,
            )
        }
        // Another emitter minting the owner's id for another position.
        6 => {
            let p = (r.below(3), r.below(40));
            (
                Some(p),
                "aep://other".to_string(),
                format!("{}.{}", p.0, p.1),
                Scope::Sequenced,
            )
        }
        // The owner's sequenced stream: id determined by position, so re-sending a
        // position is a redelivery.
        _ => {
            let p = (r.below(3), r.below(40));
            (
                Some(p),
                OWNER.to_string(),
                format!("{}.{}", p.0, p.1),
                Scope::Sequenced,
            )
        }
    };
    Arc::new(T {
        session: (scope != Scope::Agent).then_some(session),
        pos,
        source,
        id,
        scope,
        len: 1 + r.below(700) as usize,
    })
}

fn keys(evs: &[Arc<T>]) -> Vec<(String, String)> {
    evs.iter()
        .map(|e| (e.source.clone(), e.id.clone()))
        .collect()
}

fn compare(st: &Store<T>, m: &Model, ctx: &str) {
    let names: Vec<&str> = st.sessions().map(|s| s.name).collect();
    let mnames: Vec<&str> = m.lru.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, mnames, "{ctx}: session LRU order");
    let total: usize = m.lru.iter().map(|(_, s)| s.held.len()).sum();
    let bytes: usize = m
        .lru
        .iter()
        .flat_map(|(_, s)| s.held.iter().map(|(_, e)| e.len))
        .sum();
    assert_eq!((st.len(), st.byte_len()), (total, bytes), "{ctx}: totals");

    let mut all = Vec::new();
    st.replay_all(&mut |e| all.push(Arc::clone(e)));
    let mall: Vec<Arc<T>> = m
        .lru
        .iter()
        .flat_map(|(_, s)| s.held.iter().map(|(_, e)| Arc::clone(e)))
        .collect();
    assert_eq!(keys(&all), keys(&mall), "{ctx}: replay_all");

    for s in 0..6 {
        let name = format!("s{s}");
        let ms = m.get(&name);
        for epoch in 0..3 {
            for seq in [0, 1, 5, 10, 15, 20, 25, 30, 35, 39, 40] {
                let after = (epoch, seq);
                let mut got = Vec::new();
                let marker = st.replay_after(&name, after, &mut |e| got.push(Arc::clone(e)));
                let bound: Key = (Some(after), 0);
                let (want, want_marker) = match ms {
                    None => (vec![], None),
                    Some(ms) => {
                        let want: Vec<Arc<T>> = ms
                            .held
                            .iter()
                            .filter(|(k, _)| *k > bound)
                            .map(|(_, e)| Arc::clone(e))
                            .collect();
                        let due = ms.evicted.iter().any(|k| *k > bound);
                        let earliest = ms
                            .held
                            .iter()
                            .find(|(k, _)| k.1 == 0)
                            .map(|(k, _)| k.0.unwrap())
                            .or_else(|| ms.held.first().and_then(|(k, _)| k.0));
                        (want, if due { earliest } else { None })
                    }
                };
                assert_eq!(
                    keys(&got),
                    keys(&want),
                    "{ctx}: replay_after({name}, {after:?})"
                );
                assert_eq!(marker, want_marker, "{ctx}: marker({name}, {after:?})");
            }
        }
    }
}

/// The store and the naive model agree on every admission, every replay and every
/// marker over random workloads with backfill, redelivery, conflicts, foreign Events,
/// ring eviction and session eviction.
#[test]
fn store_matches_naive_model() {
    for seed in 1..=300u64 {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let cap = 1 + r.below(8) as usize;
        let max = 1 + r.below(4) as usize;
        let mut st: Store<T> = Store::new(cap, max);
        let mut m = Model {
            cap,
            max,
            lru: Vec::new(),
        };
        let mut serial = 0;
        for step in 0..400 {
            let ev = random_event(&mut r, &mut serial);
            let ctx = format!("seed {seed} step {step} cap {cap} max {max} ev {ev:?}");
            assert_eq!(st.admit(&ev), m.admit(&ev), "{ctx}: admission");
            if step % 10 == 0 || step == 399 {
                compare(&st, &m, &ctx);
            }
        }
    }
}
