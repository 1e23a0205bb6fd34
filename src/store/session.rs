//! One held stream ([`Session`]): its two lanes, its dedupe table, its high-water and
//! foreign count, and the per-stream operations admission, eviction and replay build on
//! (insert in place, evict the front, merge the lanes, the marker rule), with its
//! metrics view ([`SessionInfo`]). Its own file because it is the unit the store's
//! policies act on, and it reads without them.

use std::collections::VecDeque;

use hashbrown::HashTable;

use super::lane::{
    give_back, table_hash, Entry, Key, Lane, Merged, Spare, DELTAS, FACTS, LANE_BIT, PLACE,
};
use super::{Position, Stored, StreamId, NIL};
// Named by doc links only.
#[cfg(doc)]
use super::Store;

/// A stream's dedupe table: exactly its held Events, by `(source, id)`, each as its
/// place in the ring counted from the stream's `base` (4 bytes a slot), found by the
/// entry's [`Entry::hash`]. An entry's key is compared only when the full 64-bit keyed
/// hashes are equal, by reading the held Event back ([`Stored::reread`]): a duplicate,
/// or a collision an emitter cannot aim for.
type DedupeTable = HashTable<u32>;

/// One stream's buffer: an owning stream `(source, session)` or a foreign-only one.
#[derive(Clone)]
pub(super) struct Session {
    pub(super) name: Box<str>,
    /// The owning emitter's `source` (AEP-0001 §5.2); `None` for a foreign-only stream.
    pub(super) source: Option<Box<str>>,
    /// `agent` of the highest-placed sequenced Event admitted (AEP-0001 §5.1 #7).
    pub(super) agent: Option<Box<str>>,
    /// Distinguishes this stream from earlier ones in the same slot ([`StreamId`]).
    pub(super) serial: u64,
    /// The stream's durable facts and its `debug` Events ([`FACTS`], [`DELTAS`]).
    pub(super) lanes: [Lane; 2],
    /// Exactly the held Events, by `(source, id)`: each value is the entry's lane
    /// ([`LANE_BIT`]) and its place in that lane.
    pub(super) ids: DedupeTable,
    /// Highest position ever admitted (held or since evicted): the anchor of the next
    /// foreign Event.
    pub(super) high: Option<Position>,
    /// Foreign Events admitted so far (the next one is `foreign_n + 1`).
    pub(super) foreign_n: u64,
    /// Sum of the held Events' byte lengths.
    pub(super) bytes: usize,
    /// Neighbours in the LRU list (towards least / most recently written).
    pub(super) prev: usize,
    pub(super) next: usize,
}

impl Session {
    pub(super) fn new(name: &str, source: Option<&str>, serial: u64) -> Session {
        Session {
            name: name.into(),
            source: source.map(Into::into),
            agent: None,
            serial,
            lanes: Default::default(),
            ids: DedupeTable::new(),
            high: None,
            foreign_n: 0,
            bytes: 0,
            prev: NIL,
            next: NIL,
        }
    }

    /// Number of Events held, both lanes.
    pub(super) fn len(&self) -> usize {
        self.lanes[FACTS].ring.len() + self.lanes[DELTAS].ring.len()
    }

    /// Heap bytes the stream holds: its lanes, its dedupe table (a 4-byte slot and a
    /// control byte per bucket), its names, and the fixed cost of its struct and slots.
    pub(super) fn heap(&self) -> usize {
        self.lanes[FACTS].heap()
            + self.lanes[DELTAS].heap()
            + self.ids.capacity() * 5
            + self.name.len() * 2
            + self.source.as_deref().map_or(0, str::len)
            + self.agent.as_deref().map_or(0, str::len)
            + STREAM_COST
    }

    /// The dedupe-table value of `lanes[lane].ring[i]`.
    pub(super) fn place(&self, lane: usize, i: usize) -> u32 {
        let n = self.lanes[lane].base.wrapping_add(i as u32) & PLACE;
        if lane == DELTAS {
            n | LANE_BIT
        } else {
            n
        }
    }

    /// The `(lane, ring index)` a dedupe-table value names.
    pub(super) fn index(&self, place: u32) -> (usize, usize) {
        let lane = if place & LANE_BIT == 0 { FACTS } else { DELTAS };
        let i = (place & PLACE).wrapping_sub(self.lanes[lane].base) & PLACE;
        (lane, i as usize)
    }

    /// Whether an Event with dedupe hash `hash` (the full keyed hash) and key `key` is
    /// held.
    pub(super) fn holds<E: Stored>(&self, hash: u64, key: (&str, &str)) -> bool {
        let h = hash as u32;
        self.ids
            .find(table_hash(h), |&p| {
                let (lane, i) = self.index(p);
                let e = &self.lanes[lane].ring[i];
                e.hash == h
                    && self
                        .reread::<E>(lane, e)
                        .is_some_and(|held| held.dedupe_key() == key)
            })
            .is_some()
    }

    /// The held Event of entry `e` of `lane`, read back from its bytes.
    pub(super) fn reread<E: Stored>(&self, lane: usize, e: &Entry) -> Option<E> {
        E::reread(self.lanes[lane].arena.bytes(e))
    }

    /// Whether some held Event of either lane has key `key`.
    pub(super) fn has_key(&self, key: Key) -> bool {
        self.lanes.iter().any(|l| {
            l.ring.back().is_some_and(|last| last.key >= key)
                && l.ring.binary_search_by(|e| e.key.cmp(&key)).is_ok()
        })
    }

    /// Evicts the front (lowest key) of `lane`: forgets its dedupe slot and its bytes,
    /// and raises the lane's `evicted_high` to it. Returns its byte length.
    pub(super) fn evict_front(&mut self, lane: usize, spare: &mut Spare) -> Option<usize> {
        let place = self.place(lane, 0);
        let l = &mut self.lanes[lane];
        let e = l.ring.pop_front()?;
        if let Ok(slot) = self.ids.find_entry(table_hash(e.hash), |&p| p == place) {
            slot.remove();
        }
        l.arena.release_entry(&e, spare);
        if l.ring.is_empty() {
            // Nothing of the lane is held: its chunk being filled goes too (a lane
            // emptied by a shed keeps no room for Events it may never get).
            for (chunk, _) in l.arena.chunks.drain(..) {
                l.arena.held -= give_back(chunk, spare);
            }
            l.arena.first = 0;
        }
        // Usually the front is above everything evicted before; not after a shed let
        // the lane take a backfill below that, or after it took over a record.
        l.base = l.base.wrapping_add(1) & PLACE;
        l.evicted_high = l.evicted_high.max(Some(e.key));
        self.bytes -= e.len as usize;
        Some(e.len as usize)
    }

    /// Inserts `entry` at ring index `idx` of `lane`, renumbering the dedupe slots of the
    /// entries it moves up (backfill: those above it, highest first so no two slots ever
    /// hold one value).
    pub(super) fn insert(&mut self, lane: usize, idx: usize, entry: Entry) {
        let hash = table_hash(entry.hash);
        let ring = &mut self.lanes[lane].ring;
        if idx == ring.len() {
            // The usual case: the lane's newest key.
            ring.push_back(entry);
        } else {
            ring.insert(idx, entry);
        }
        for j in (idx + 1..self.lanes[lane].ring.len()).rev() {
            let (h, old, new) = (
                self.lanes[lane].ring[j].hash,
                self.place(lane, j - 1),
                self.place(lane, j),
            );
            if let Some(p) = self.ids.find_mut(table_hash(h), |&p| p == old) {
                *p = new;
            }
        }
        let place = self.place(lane, idx);
        let Session { lanes, ids, .. } = self;
        let bases = [lanes[FACTS].base, lanes[DELTAS].base];
        ids.insert_unique(hash, place, |&p| {
            let l = if p & LANE_BIT == 0 { FACTS } else { DELTAS };
            let i = (p & PLACE).wrapping_sub(bases[l]) & PLACE;
            table_hash(lanes[l].ring[i as usize].hash)
        });
        let l = &self.lanes[lane];
        if l.arena.slots() > l.ring.len() + 16 {
            self.compact_arena(lane);
        }
    }

    /// Drops the slots of freed chunks that held chunks keep in place in `lane` (an
    /// Event that outlives the ones that arrived after it: backfill, a high position
    /// sent early), renumbering the entries, so the slots stay fewer than the entries
    /// plus 16.
    fn compact_arena(&mut self, lane: usize) {
        let l = &mut self.lanes[lane];
        let old_first = l.arena.first;
        let mut renumber = Vec::with_capacity(l.arena.chunks.len());
        let mut kept = VecDeque::with_capacity(l.arena.chunks.len());
        for slot in l.arena.chunks.drain(..) {
            renumber.push(kept.len() as u32);
            if slot.0.is_some() {
                kept.push_back(slot);
            }
        }
        l.arena.chunks = kept;
        l.arena.first = 0;
        for e in &mut l.ring {
            e.chunk = renumber[e.chunk.wrapping_sub(old_first) as usize];
        }
    }

    /// Both lanes' entries ordered after `bound` (`None`: all), in stream order.
    pub(super) fn merged(&self, bound: Option<Key>) -> Merged<'_> {
        fn range(
            l: &Lane,
            bound: Option<Key>,
        ) -> std::iter::Peekable<std::collections::vec_deque::Iter<'_, Entry>> {
            let start = bound.map_or(0, |b| l.after(b));
            l.ring.range(start..).peekable()
        }
        Merged {
            facts: range(&self.lanes[FACTS], bound),
            deltas: range(&self.lanes[DELTAS], bound),
        }
    }

    /// Lowest held sequenced position, either lane.
    fn earliest(&self) -> Option<Position> {
        match (self.lanes[FACTS].earliest(), self.lanes[DELTAS].earliest()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Highest held sequenced position, either lane.
    fn latest(&self) -> Option<Position> {
        self.lanes[FACTS].latest().max(self.lanes[DELTAS].latest())
    }

    /// The `earliest` a `replay-exhausted` marker names, given the facts lane's
    /// `evicted_high` key `h`: the lowest held position or, when only foreign Events are
    /// held, the anchor of the first of them. The fallbacks only keep this total.
    fn exhausted_earliest(&self, h: Key, after: Position) -> Position {
        self.earliest()
            .or_else(|| self.merged(None).next().and_then(|(_, e)| e.key.anchor()))
            .or_else(|| h.anchor())
            .unwrap_or(after)
    }

    /// `Some(earliest)` when a replay strictly after `bound` is owed a `replay-exhausted`
    /// marker: a durable fact it would have delivered was evicted (AEP-0003 §5). An
    /// evicted `debug` Event owes none (AEP-0007 §5 item 1: no correctness property
    /// depends on a consumer having seen every delta).
    pub(super) fn marker_after(&self, bound: Key, after: Position) -> Option<Position> {
        match self.lanes[FACTS].evicted_high {
            Some(h) if bound < h => Some(self.exhausted_earliest(h, after)),
            _ => None,
        }
    }

    pub(super) fn info(&self, slot: usize) -> SessionInfo<'_> {
        let earliest = self.earliest();
        SessionInfo {
            id: StreamId {
                slot,
                serial: self.serial,
            },
            name: &self.name,
            source: self.source.as_deref(),
            agent: earliest.and(self.agent.as_deref()),
            events: self.len(),
            bytes: self.bytes,
            earliest,
            latest: self.latest(),
            high_water: self.high,
            evicted_high: self.lanes[FACTS]
                .evicted_high
                .max(self.lanes[DELTAS].evicted_high)
                .and_then(Key::anchor),
        }
    }
}

/// What a stream costs beyond its lanes, table and names: its struct, its slab slot, its
/// entry in the name index.
const STREAM_COST: usize = std::mem::size_of::<Session>() + 64;

/// Metrics view of one held stream, from [`Store::sessions`], [`Store::streams`],
/// [`Store::stream`] or [`Store::session`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo<'a> {
    /// The stream's id.
    pub id: StreamId,
    /// The `session` value (the bare name, AEP-0001 §5.1 #8).
    pub name: &'a str,
    /// The owning emitter's `source` (AEP-0001 §5.1 #6, §5.2); `None` for a foreign-only
    /// stream (only foreign Events of a name no owning stream of which is held).
    pub source: Option<&'a str>,
    /// `agent` of the newest held sequenced Event (AEP-0001 §5.1 #7); `None` when none is
    /// held or [`Stored::agent`] says nothing.
    pub agent: Option<&'a str>,
    /// Number of Events held (≥ 1).
    pub events: usize,
    /// Sum of the held Events' raw byte lengths.
    pub bytes: usize,
    /// Lowest held `(epoch, seq)`; `None` when only foreign Events are held.
    pub earliest: Option<Position>,
    /// Highest held `(epoch, seq)`; `None` when only foreign Events are held.
    pub latest: Option<Position>,
    /// Highest `(epoch, seq)` ever admitted to this stream, held or not (the anchor of
    /// the next foreign Event).
    pub high_water: Option<Position>,
    /// Highest position ever evicted from this stream: the position of the highest
    /// evicted Event, or the anchor of an evicted foreign Event. `None` when nothing was
    /// evicted (or only foreign Events anchored "before everything").
    pub evicted_high: Option<Position>,
}
