//! The store's internal consistency check, run after every operation of the unit tests
//! (`tests.rs`): each held stream with its lanes and entries, the name index, and the
//! totals the store keeps. Its own file because it is test-only and reads every part of
//! the store.

use std::collections::HashSet;

use bytes::BytesMut;

use super::lane::{table_hash, Entry, Key, Lane, DELTAS};
use super::session::Session;
use super::{Store, Stored, NIL};

/// What the held streams add up to, compared with the store's running totals.
#[derive(Default)]
struct Totals {
    events: usize,
    deltas: usize,
    heap: usize,
    bytes: usize,
    seen: usize,
}

impl<E: Stored> Store<E> {
    /// Checks every internal invariant; panics on a violation (tests only).
    pub(super) fn check(&self) {
        let mut totals = Totals::default();
        let mut prev = NIL;
        let mut at = self.head;
        while at != NIL {
            let s = &self.slots[at];
            assert_eq!(s.prev, prev, "LRU back link");
            self.check_stream(at, s, &mut totals);
            prev = at;
            at = s.next;
        }
        self.check_index();
        assert_eq!(self.tail, prev, "LRU tail");
        assert_eq!(totals.seen, self.slots.len(), "every stream linked");
        let indexed: usize = self.index.values().map(|v| v.len()).sum();
        assert_eq!(indexed, self.slots.len(), "index size");
        assert!(self.slots.len() <= self.max_sessions, "stream bound");
        assert_eq!(totals.events, self.events, "event total");
        assert_eq!(totals.deltas, self.deltas, "debug total");
        assert_eq!(totals.heap, self.heap, "heap total");
        assert_eq!(totals.bytes, self.bytes, "byte total");
        assert!(self.records.len() <= self.records.cap, "record bound");
        let recorded: usize = self.records.by_name.values().map(|v| v.len()).sum();
        assert_eq!(recorded, self.records.len(), "records indexed once");
    }

    /// Checks held stream `s` (slot `sid`) and adds it to `totals`.
    fn check_stream(&self, sid: usize, s: &Session, totals: &mut Totals) {
        let named = self.index.get(&s.name).expect("index");
        assert_eq!(
            named.iter().filter(|&&x| x == sid).count(),
            1,
            "indexed once"
        );
        assert!(s.len() > 0, "held streams are non-empty");
        assert!(s.len() <= self.buffer_per_session, "ring bound");
        assert_eq!(s.ids.len(), s.len(), "dedupe set mirrors the lanes");
        let mut all = Vec::new();
        for (lane, l) in s.lanes.iter().enumerate() {
            self.check_lane(s, lane, l, &mut all);
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "keys unique across lanes");
        let merged: Vec<Key> = s.merged(None).map(|(_, e)| e.key).collect();
        assert_eq!(merged, all, "merge is the stream order");
        let b: usize = s
            .lanes
            .iter()
            .flat_map(|l| &l.ring)
            .map(|e| e.len as usize)
            .sum();
        assert_eq!(b, s.bytes, "session bytes");
        totals.deltas += s.lanes[DELTAS].ring.len();
        totals.heap += s.heap();
        totals.events += s.len();
        totals.bytes += b;
        totals.seen += 1;
    }

    /// Checks lane `l` (number `lane`) of stream `s`: its order, its entries and its
    /// arena; pushes its keys to `all`.
    fn check_lane(&self, s: &Session, lane: usize, l: &Lane, all: &mut Vec<Key>) {
        assert!(
            l.ring.capacity() <= self.buffer_per_session.max(4) * 2,
            "ring capacity"
        );
        for w in l.ring.iter().collect::<Vec<_>>().windows(2) {
            assert!(w[0].key < w[1].key, "strict order");
        }
        for (i, e) in l.ring.iter().enumerate() {
            self.check_entry(s, lane, i, e);
            all.push(e.key);
        }
        let live: u32 = l.arena.chunks.iter().map(|c| c.1).sum();
        assert_eq!(
            live as usize,
            l.ring.len(),
            "chunk counts add up to the lane"
        );
        assert!(l.arena.slots() <= l.ring.len() + 17, "chunk slots bounded");
        let held: usize = l
            .arena
            .chunks
            .iter()
            .flat_map(|c| &c.0)
            .map(BytesMut::capacity)
            .sum();
        assert_eq!(held, l.arena.held, "arena capacity tracked");
    }

    /// Checks entry `e`, ring index `i` of lane `lane` of stream `s`, against the Event
    /// its bytes read back as and the stream's dedupe table.
    fn check_entry(&self, s: &Session, lane: usize, i: usize, e: &Entry) {
        let ev: E = s.reread(lane, e).expect("held bytes read back");
        assert_eq!(ev.delta(), lane == DELTAS, "lane by severity");
        let hash = self.hasher.hash_one(ev.dedupe_key());
        assert_eq!(hash as u32, e.hash, "entry hash");
        assert!(s.holds::<E>(hash, ev.dedupe_key()), "held id in set");
        let place = s.place(lane, i);
        assert_eq!(s.index(place), (lane, i), "place round trip");
        assert!(
            s.ids.find(table_hash(e.hash), |&p| p == place).is_some(),
            "slot names its entry"
        );
        if let Some(p) = e.key.anchor() {
            assert!(Some(p) <= s.high, "high-water");
        }
        if e.key.position().is_some() {
            assert_eq!(
                s.source.as_deref(),
                Some(ev.source()),
                "a sequenced Event is held in its own (source, session) stream"
            );
        }
        assert_eq!(ev.session(), Some(&*s.name), "held under its name");
    }

    /// Checks the name index: each name lists its streams in creation order, one per
    /// owner, or its foreign-only stream alone.
    fn check_index(&self) {
        for (name, named) in &self.index {
            assert!(!named.is_empty(), "no empty index entry");
            let sources: Vec<_> = named
                .iter()
                .map(|&sid| {
                    assert_eq!(&self.slots[sid].name, name, "index name");
                    self.slots[sid].source.as_deref()
                })
                .collect();
            if sources.contains(&None) {
                assert_eq!(
                    sources.len(),
                    1,
                    "a foreign-only stream is alone under its name"
                );
            }
            let distinct: HashSet<_> = sources.iter().collect();
            assert_eq!(
                distinct.len(),
                sources.len(),
                "one stream per (source, session)"
            );
            let serials: Vec<_> = named.iter().map(|&sid| self.slots[sid].serial).collect();
            assert!(serials.windows(2).all(|w| w[0] < w[1]), "creation order");
        }
    }
}
