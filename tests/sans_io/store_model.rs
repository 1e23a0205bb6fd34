//! Differential test of the replay store against a naive reference model
//! (AEP-0001 §5.2, §7; AEP-0003 §5, §7).
//!
//! The model keeps every stream, `(source, session)` (AEP-0001 §5.2: distinct emitters
//! sharing a session name are distinct sessions), as an unsorted `Vec` with the obvious
//! order key `(anchor: Option<(epoch, seq)>, rank)` (rank 0 for a sequenced Event, the
//! stream's foreign arrival counter otherwise), sorts on demand, scans linearly for
//! duplicates and conflicts, and remembers *every* evicted key. A foreign Event joins
//! every owning stream of its name, or a foreign-only stream (source `None`) that the
//! first owner of the name adopts. A resume position names a bare session and applies to
//! each stream of that name. A `replay-exhausted` marker is due for a stream when any of
//! its evicted keys is one `replay_after` would have delivered: that is the definition the
//! store's `evicted_high` shortcut must match exactly.

use std::sync::Arc;

use aep_relay::envelope::Scope;
use aep_relay::store::{Admission, Position, Store};

#[path = "../../src/store/stand_in.rs"]
mod stand_in;
use stand_in::{sealed, T};

type Key = (Option<Position>, u64);

struct MSession {
    name: String,
    /// The owner; `None` for a foreign-only stream.
    source: Option<String>,
    /// Creation serial (streams of one name are listed in creation order).
    born: u64,
    held: Vec<(Key, Arc<T>)>,
    evicted: Vec<Key>,
    high: Option<Position>,
    foreign_n: u64,
}

struct Model {
    cap: usize,
    max: usize,
    born: u64,
    /// Least recently written first.
    lru: Vec<MSession>,
}

impl Model {
    fn create(&mut self, name: &str, source: Option<&str>) -> usize {
        if self.lru.len() == self.max {
            self.lru.remove(0);
        }
        self.born += 1;
        self.lru.push(MSession {
            name: name.into(),
            source: source.map(Into::into),
            born: self.born,
            held: Vec::new(),
            evicted: Vec::new(),
            high: None,
            foreign_n: 0,
        });
        self.lru.len() - 1
    }

    fn admit(&mut self, ev: &Arc<T>) -> Admission {
        if ev.scope == Scope::Agent {
            return Admission::NotBuffered;
        }
        let name = ev.session.clone().unwrap();
        let targets: Vec<u64> = match ev.pos {
            Some(_) => {
                let own = self
                    .lru
                    .iter()
                    .position(|s| s.name == name && s.source.as_deref() == Some(&ev.source));
                let foreign_only = self
                    .lru
                    .iter()
                    .position(|s| s.name == name && s.source.is_none());
                let i = match (own, foreign_only) {
                    (Some(i), _) => i,
                    (None, Some(i)) => {
                        self.lru[i].source = Some(ev.source.clone());
                        i
                    }
                    (None, None) => self.create(&name, Some(&ev.source)),
                };
                vec![self.lru[i].born]
            }
            None => {
                // Every stream of the name, in creation order (each one it joins becomes
                // the most recently written in turn).
                let mut named: Vec<u64> = self.named(&name).iter().map(|s| s.born).collect();
                if named.is_empty() {
                    let i = self.create(&name, None);
                    named.push(self.lru[i].born);
                }
                named
            }
        };
        let mut out = match ev.pos {
            Some(_) => None,
            None => Some(Admission::Duplicate),
        };
        for born in targets {
            let a = self.admit_into(born, ev);
            out = match (out, a) {
                (None, a) => Some(a),
                (_, Admission::Admitted) => Some(Admission::Admitted),
                (o, _) => o,
            };
        }
        out.unwrap()
    }

    fn admit_into(&mut self, born: u64, ev: &Arc<T>) -> Admission {
        let i = self.lru.iter().position(|s| s.born == born).unwrap();
        let s = &mut self.lru[i];
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

    /// The streams of a bare name, in creation order.
    fn named(&self, name: &str) -> Vec<&MSession> {
        let mut v: Vec<&MSession> = self.lru.iter().filter(|s| s.name == name).collect();
        v.sort_by_key(|s| s.born);
        v
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
/// A second emitter using the same session names (AEP-0001 §5.2).
const OTHER: &str = "aep://other";

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
        // Another emitter with the same session names and the owner's id scheme: its
        // own stream, same positions and ids as the owner's, never a conflict with it.
        6..=8 => {
            let p = (r.below(3), r.below(40));
            (
                Some(p),
                OTHER.to_string(),
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
    sealed(T {
        session: (scope != Scope::Agent).then_some(session),
        pos,
        source,
        id,
        scope,
        len: 1 + r.below(700) as usize,
        raw: Vec::new(),
    })
}

fn keys(evs: &[Arc<T>]) -> Vec<(String, String)> {
    evs.iter()
        .map(|e| (e.source.clone(), e.id.clone()))
        .collect()
}

fn compare(st: &Store<T>, m: &Model, ctx: &str) {
    let streams: Vec<(&str, Option<&str>)> = st.sessions().map(|s| (s.name, s.source)).collect();
    let mstreams: Vec<(&str, Option<&str>)> = m
        .lru
        .iter()
        .map(|s| (s.name.as_str(), s.source.as_deref()))
        .collect();
    assert_eq!(streams, mstreams, "{ctx}: stream LRU order");
    let total: usize = m.lru.iter().map(|s| s.held.len()).sum();
    let bytes: usize = m
        .lru
        .iter()
        .flat_map(|s| s.held.iter().map(|(_, e)| e.len))
        .sum();
    assert_eq!((st.len(), st.byte_len()), (total, bytes), "{ctx}: totals");

    let mut all = Vec::new();
    st.replay_all(&mut |e| all.push(Arc::new(e)));
    let mall: Vec<Arc<T>> = m
        .lru
        .iter()
        .flat_map(|s| s.held.iter().map(|(_, e)| Arc::clone(e)))
        .collect();
    assert_eq!(keys(&all), keys(&mall), "{ctx}: replay_all");

    for s in 0..6 {
        let name = format!("s{s}");
        let named = m.named(&name);
        let sources: Vec<Option<&str>> = st.streams(&name).map(|i| i.source).collect();
        let msources: Vec<Option<&str>> = named.iter().map(|s| s.source.as_deref()).collect();
        assert_eq!(sources, msources, "{ctx}: streams({name})");
        for epoch in 0..3 {
            for seq in [0, 1, 5, 10, 15, 20, 25, 30, 35, 39, 40] {
                let after = (epoch, seq);
                let mut got = Vec::new();
                let markers = st.replay_after(&name, after, &mut |e| got.push(Arc::new(e)));
                let markers: Vec<(Option<&str>, Position)> = markers
                    .iter()
                    .map(|x| (st.stream(x.stream).unwrap().source, x.earliest))
                    .collect();
                let bound: Key = (Some(after), 0);
                let mut want: Vec<Arc<T>> = Vec::new();
                let mut want_markers = Vec::new();
                for ms in &named {
                    want.extend(
                        ms.held
                            .iter()
                            .filter(|(k, _)| *k > bound)
                            .map(|(_, e)| Arc::clone(e)),
                    );
                    if ms.evicted.iter().any(|k| *k > bound) {
                        let earliest = ms
                            .held
                            .iter()
                            .find(|(k, _)| k.1 == 0)
                            .map(|(k, _)| k.0.unwrap())
                            .or_else(|| ms.held.first().and_then(|(k, _)| k.0));
                        if let Some(e) = earliest {
                            want_markers.push((ms.source.as_deref(), e));
                        }
                    }
                }
                assert_eq!(
                    keys(&got),
                    keys(&want),
                    "{ctx}: replay_after({name}, {after:?})"
                );
                assert_eq!(markers, want_markers, "{ctx}: markers({name}, {after:?})");
            }
        }
    }
}

/// The store and the naive model agree on every admission, every replay and every
/// marker over random workloads with two emitters sharing session names, backfill,
/// redelivery, conflicts, foreign Events, ring eviction and stream eviction.
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
            born: 0,
            lru: Vec::new(),
        };
        let mut serial = 0;
        for step in 0..400 {
            let ev = random_event(&mut r, &mut serial);
            let ctx = format!("seed {seed} step {step} cap {cap} max {max} ev {ev:?}");
            let (a, b) = (st.admit(&ev), m.admit(&ev));
            assert_eq!(a, b, "{ctx}: admission");
            if step % 10 == 0 || step == 399 {
                compare(&st, &m, &ctx);
            }
        }
    }
}
