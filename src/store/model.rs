//! A naive reference model of the replay store (AEP-0001 §5.2, §7; AEP-0003 §5, §7;
//! AEP-0007 §5), shared by the differential test (`tests/sans_io/store_model.rs`) and the
//! `store` fuzz target. Not part of the library: its includer declares the sibling module
//! `stand_in` (`src/store/stand_in.rs`).
//!
//! The model keeps every stream, `(source, session)` (AEP-0001 §5.2: distinct emitters
//! sharing a session name are distinct sessions), as an unsorted `Vec` with the obvious
//! order key `(anchor: Option<(epoch, seq)>, rank)` (rank 0 for a sequenced Event, the
//! stream's foreign arrival counter otherwise), sorts on demand, scans linearly for
//! duplicates and conflicts, and remembers *every* evicted durable fact. A full stream
//! evicts its lowest `debug` Event when it holds one (the arriving Event included), else
//! its lowest Event. A foreign Event joins every owning stream of its name, or a
//! foreign-only stream (source `None`) that the first owner of the name adopts. A stream
//! evicted whole leaves a record of its highest fact, held or evicted, which a stream of
//! the same `(session, source)` created later takes over. A resume position names a bare
//! session and applies to each stream of that name. A `replay-exhausted` marker is due
//! for a stream when any of its evicted facts is one `replay_after` would have
//! delivered: that is the definition the store's `evicted_high` shortcut must match
//! exactly.

use std::collections::HashMap;
use std::sync::Arc;

use aep_relay::store::{Admission, Position, Shed, Store};
use aep_relay::wire::envelope::Scope;

use super::stand_in::{sealed, T};

/// A place in a stream's order: `(anchor, rank)`.
pub type Key = (Option<Position>, u64);

/// One stream of the model.
pub struct MSession {
    pub name: String,
    /// The owner; `None` for a foreign-only stream.
    pub source: Option<String>,
    /// Creation serial (streams of one name are listed in creation order).
    pub born: u64,
    pub held: Vec<(Key, Arc<T>)>,
    /// Every durable fact evicted (or dropped on arrival), and a taken-over record.
    pub evicted: Vec<Key>,
    pub high: Option<Position>,
    pub foreign_n: u64,
}

/// The model store.
pub struct Model {
    pub cap: usize,
    pub max: usize,
    pub born: u64,
    /// Least recently written first.
    pub lru: Vec<MSession>,
    /// `(name, source)` → the highest fact of a stream evicted whole.
    pub records: HashMap<(String, Option<String>), Key>,
}

impl Model {
    pub fn new(cap: usize, max: usize) -> Model {
        Model {
            cap,
            max,
            born: 0,
            lru: Vec::new(),
            records: HashMap::new(),
        }
    }

    fn create(&mut self, name: &str, source: Option<&str>) -> usize {
        if self.lru.len() == self.max {
            self.evict_stream(0);
        }
        self.born += 1;
        let record = self
            .records
            .remove(&(name.to_string(), source.map(String::from)));
        self.lru.push(MSession {
            name: name.into(),
            source: source.map(Into::into),
            born: self.born,
            held: Vec::new(),
            evicted: record.into_iter().collect(),
            high: None,
            foreign_n: 0,
        });
        self.lru.len() - 1
    }

    /// Evicts `lru[i]` whole, leaving its record.
    fn evict_stream(&mut self, i: usize) {
        let s = self.lru.remove(i);
        let facts = s
            .held
            .iter()
            .filter(|(_, e)| !e.debug)
            .map(|(k, _)| *k)
            .chain(s.evicted.iter().copied());
        if let Some(high) = facts.max() {
            self.records.insert((s.name, s.source), high);
        }
    }

    pub fn admit(&mut self, ev: &Arc<T>) -> Admission {
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
                        let record = self
                            .records
                            .remove(&(name.clone(), Some(ev.source.clone())));
                        self.lru[i].source = Some(ev.source.clone());
                        self.lru[i].evicted.extend(record);
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
            // AEP-0007 §5 item 1: the lowest debug Event goes first.
            let victim = s.held.iter().position(|(_, e)| e.debug).unwrap_or(0);
            let (k, e) = s.held.remove(victim);
            if !e.debug {
                s.evicted.push(k);
            }
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

    /// Replays what [`Store::shed_to`] reported evicting, in the order it documents:
    /// `debug` Events first (least-recently-written streams first, lowest first), then
    /// facts from the least-recently-written stream, lowest first; a stream left empty
    /// is evicted whole.
    pub fn shed(&mut self, shed: Shed) {
        let mut deltas = shed.debug_events;
        let mut facts = shed.events - shed.debug_events;
        let mut i = 0;
        while deltas > 0 && i < self.lru.len() {
            let s = &mut self.lru[i];
            while deltas > 0 {
                let Some(j) = s.held.iter().position(|(_, e)| e.debug) else {
                    break;
                };
                s.held.remove(j);
                deltas -= 1;
            }
            if self.lru[i].held.is_empty() {
                self.evict_stream(i);
            } else {
                i += 1;
            }
        }
        assert_eq!(
            deltas, 0,
            "the store shed more debug Events than the model holds"
        );
        while facts > 0 {
            let s = &mut self.lru[0];
            let (k, e) = s.held.remove(0);
            assert!(!e.debug, "a fact is shed while a debug Event is held");
            s.evicted.push(k);
            facts -= 1;
            if self.lru[0].held.is_empty() {
                self.evict_stream(0);
            }
        }
    }

    /// The streams of a bare name, in creation order.
    pub fn named(&self, name: &str) -> Vec<&MSession> {
        let mut v: Vec<&MSession> = self.lru.iter().filter(|s| s.name == name).collect();
        v.sort_by_key(|s| s.born);
        v
    }
}

/// The bytes an Event is drawn from: a seeded generator in the test, the fuzzer's input
/// in the fuzz target.
pub trait Draw {
    /// A number below `n` (`n >= 1`).
    fn below(&mut self, n: u64) -> u64;
}

pub const OWNER: &str = "aep://h/agent/a/session/s";
/// A second emitter using the same session names (AEP-0001 §5.2).
pub const OTHER: &str = "aep://other";

/// A random Event over five session names, two emitters, a few epochs and 40 seqs:
/// agent-scoped, foreign (redelivered from a small pool of ids), conflicting, and the
/// owners' sequenced Events (id by position, so resending is a redelivery); about a
/// third of them `debug`.
pub fn random_event(r: &mut impl Draw, serial: &mut u64) -> Arc<T> {
    *serial += 1;
    let session = format!("s{}", r.below(5));
    let (pos, source, id, scope) = match r.below(20) {
        0 => (
            None,
            OWNER.to_string(),
            format!("agent{serial}"),
            Scope::Agent,
        ),
        1..=4 => (
            None,
            "aep://h/consumer".to_string(),
            format!("f{}", r.below(12)),
            Scope::Foreign,
        ),
        5 => {
            let p = (r.below(3), r.below(40));
            (
                Some(p),
                OWNER.to_string(),
                format!("x{serial}"),
                Scope::Sequenced,
            )
        }
        6..=8 => {
            let p = (r.below(3), r.below(40));
            (
                Some(p),
                OTHER.to_string(),
                format!("{}.{}", p.0, p.1),
                Scope::Sequenced,
            )
        }
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
    // A redelivery carries the same severity as the Event it repeats: severity follows
    // the id (foreign, owner) or the position (the other emitter).
    let debug = match (&pos, id.starts_with('x')) {
        // A conflicting Event: either severity, so conflicts span the two lanes.
        (_, true) => serial.is_multiple_of(2),
        (Some((e, s)), false) => (e * 40 + s) % 3 == 0,
        (None, false) => id.len() % 3 == 0,
    };
    sealed(T {
        session: (scope != Scope::Agent).then_some(session),
        pos,
        source,
        id,
        scope,
        debug,
        len: 1 + r.below(700) as usize,
        raw: Vec::new(),
    })
}

fn keys(evs: &[Arc<T>]) -> Vec<(String, String)> {
    evs.iter()
        .map(|e| (e.source.clone(), e.id.clone()))
        .collect()
}

/// Asserts that the store and the model agree on streams, totals, replay-all, and every
/// resume (Events and markers) of every name at a grid of positions; and that no stream
/// holds a fact evicted while it holds a `debug` Event.
pub fn compare(st: &Store<T>, m: &Model, ctx: &str) {
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
    let deltas = m
        .lru
        .iter()
        .flat_map(|s| &s.held)
        .filter(|(_, e)| e.debug)
        .count();
    assert_eq!(
        (st.len(), st.byte_len(), st.debug_len()),
        (total, bytes, deltas),
        "{ctx}: totals"
    );

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
        let mut lost: Vec<(Option<String>, Position)> = st
            .lost(&name)
            .map(|l| (l.source.map(String::from), l.high))
            .collect();
        lost.sort();
        let mut mlost: Vec<(Option<String>, Position)> = m
            .records
            .iter()
            .filter(|((n, _), _)| *n == name)
            .filter_map(|((_, src), k)| Some((src.clone(), k.0?)))
            .collect();
        mlost.sort();
        assert_eq!(lost, mlost, "{ctx}: lost({name})");
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
                            .or_else(|| ms.held.first().and_then(|(k, _)| k.0))
                            .or_else(|| ms.evicted.iter().max().and_then(|k| k.0));
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
