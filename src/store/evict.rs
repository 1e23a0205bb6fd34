//! How Events and whole streams leave the store, and what they leave behind: stream
//! eviction at `max_sessions`, the memory budget's shed, the eviction counts, and the
//! eviction records that still owe a resume `replay-exhausted` once its stream is gone
//! (AEP-0003 §5). Its own file because it is the store's one policy for forgetting.

use std::collections::HashMap;

use bytes::BytesMut;
use smallvec::SmallVec;

use super::lane::{give_back, Key, Spare, DELTAS, FACTS};
use super::{Position, Store, Stored, NIL};

/// Cumulative eviction counts, in Events (`aep_evictions_total{reason}`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Evictions {
    /// Evicted because their stream's ring was full (or dropped on arrival to a full
    /// ring), AEP-0003 §5.
    pub ring: u64,
    /// Evicted with their stream when `max_sessions` streams were held and a new one
    /// began.
    pub sessions: u64,
    /// Evicted by [`Store::shed_to`] (the memory budget).
    pub memory: u64,
}

/// What one [`Store::shed_to`] evicted.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Shed {
    /// Events evicted, `debug` ones included.
    pub events: usize,
    /// Of `events`, the `debug` ones.
    pub debug_events: usize,
    /// Streams left empty and so evicted whole (each leaves an eviction record).
    pub streams: usize,
}

/// A stream the store no longer holds but remembers ([`Store::lost`]): a resume of its
/// session is still owed `replay-exhausted` (AEP-0003 §5).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Lost<'a> {
    /// The bare session name.
    pub name: &'a str,
    /// The evicted stream's owner (`None`: a foreign-only stream).
    pub source: Option<&'a str>,
    /// The highest position of a durable fact it held or had evicted (the anchor of a
    /// foreign one).
    pub high: Position,
    key: Key,
}

impl Lost<'_> {
    /// Whether a resume strictly after `after` lost a fact of this stream, and so is
    /// owed `replay-exhausted` (AEP-0003 §5).
    pub fn owes(&self, after: Position) -> bool {
        Key::at(after) < self.key
    }

    /// What its `replay-exhausted` names as the earliest position: the one after `high`
    /// (nothing of the stream is held; whatever of it comes later comes after that).
    pub fn earliest(&self) -> Position {
        (self.high.0, self.high.1.saturating_add(1))
    }
}

/// What the store remembers of the streams it evicted whole (by `max_sessions` or the
/// memory budget): per `(session, source)`, the highest key of a durable fact the stream
/// held or had evicted. A resume of that session then still gets `replay-exhausted`
/// (AEP-0003 §5), and a stream of the same `(session, source)` created later starts with
/// it as its facts lane's `evicted_high`. At most `cap` records; past that the oldest is
/// forgotten, and a resume of its session gets what a resume of a never-seen session
/// gets.
#[derive(Clone, Default)]
pub(super) struct Records {
    pub(super) cap: usize,
    /// Name → `(source, key, stamp)` per evicted stream of that name.
    pub(super) by_name: HashMap<Box<str>, SmallVec<[Record; 1]>>,
    /// Stamp → name, oldest first.
    pub(super) order: std::collections::BTreeMap<u64, Box<str>>,
    pub(super) stamp: u64,
    /// Heap bytes the records hold (counted in [`Store::memory_bytes`]).
    pub(super) bytes: usize,
}

/// One eviction record under its name: the stream's `source`, the key of its highest
/// fact, and its stamp (its place in [`Records::order`]).
type Record = (Option<Box<str>>, Key, u64);

/// What one record costs beyond its names: its bucket and inline slot in `by_name`
/// (about 80 bytes at the map's load), its entry in `order` (about 50), and the
/// allocator's overhead and rounding of its three boxed names (about 90).
const RECORD_COST: usize = 224;

impl Records {
    fn cost(name: &str, source: Option<&str>) -> usize {
        2 * name.len() + source.map_or(0, str::len) + RECORD_COST
    }

    /// Remembers that the stream `(name, source)` was evicted with facts up to `key`.
    fn put(&mut self, name: &str, source: Option<&str>, key: Key) {
        if self.cap == 0 {
            return;
        }
        self.take(name, source);
        while self.order.len() >= self.cap {
            let Some((stamp, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(v) = self.by_name.get_mut(&oldest) {
                if let Some(i) = v.iter().position(|r| r.2 == stamp) {
                    let (src, _, _) = v.remove(i);
                    self.bytes -= Records::cost(&oldest, src.as_deref());
                }
                if v.is_empty() {
                    self.by_name.remove(&oldest);
                }
            }
        }
        self.stamp += 1;
        self.order.insert(self.stamp, name.into());
        self.by_name.entry(name.into()).or_default().push((
            source.map(Into::into),
            key,
            self.stamp,
        ));
        self.bytes += Records::cost(name, source);
    }

    /// Forgets and returns the record of `(name, source)`.
    pub(super) fn take(&mut self, name: &str, source: Option<&str>) -> Option<Key> {
        let v = self.by_name.get_mut(name)?;
        let i = v.iter().position(|r| r.0.as_deref() == source)?;
        let (_, key, stamp) = v.remove(i);
        if v.is_empty() {
            self.by_name.remove(name);
        }
        self.order.remove(&stamp);
        self.bytes -= Records::cost(name, source);
        Some(key)
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }
}

/// Eviction records kept per stream the store may hold ([`Store::lost`]), and at least
/// [`MIN_RECORDS`].
pub const RECORDS_PER_STREAM: usize = 4;
/// The fewest eviction records a store keeps room for.
pub const MIN_RECORDS: usize = 1024;

impl<E: Stored> Store<E> {
    /// Evicts stream `sid` whole, leaving a record of the highest durable fact it held
    /// or had evicted ([`Records`]); returns the number of Events it held.
    pub(super) fn evict_session(&mut self, sid: usize) -> usize {
        self.unlink(sid);
        let s = self.slots.remove(sid);
        if let Some(named) = self.index.get_mut(&s.name) {
            named.retain(|&mut x| x != sid);
            if named.is_empty() {
                self.index.remove(&s.name);
            }
        }
        let facts = &s.lanes[FACTS];
        if let Some(high) = facts.evicted_high.max(facts.ring.back().map(|e| e.key)) {
            self.records.put(&s.name, s.source.as_deref(), high);
        }
        let n = s.len();
        self.events -= n;
        self.deltas -= s.lanes[DELTAS].ring.len();
        self.bytes -= s.bytes;
        self.heap -= s.heap();
        for lane in s.lanes {
            for (chunk, _) in lane.arena.chunks {
                give_back(chunk, &mut self.spare);
            }
        }
        n
    }

    /// Heap bytes the store holds, O(1): the streams' arenas (chunk capacities), ring
    /// entries (36 bytes each, by capacity), dedupe tables (5 bytes a bucket), names and
    /// fixed per-stream cost, the spare chunks, and the eviction records. What the
    /// memory budget counts as held Events and records.
    pub fn memory_bytes(&self) -> usize {
        self.heap + self.spare.iter().map(BytesMut::capacity).sum::<usize>() + self.records.bytes
    }

    /// Heap bytes of the eviction records alone (included in [`Store::memory_bytes`]).
    pub fn record_bytes(&self) -> usize {
        self.records.bytes
    }

    /// Eviction records held (at most the bound [`Store::new`] documents).
    pub fn record_count(&self) -> usize {
        self.records.len()
    }

    /// Cumulative eviction counts.
    pub fn evictions(&self) -> Evictions {
        self.evictions
    }

    /// Evicts held Events until [`Store::memory_bytes`] is at most `target` (or nothing
    /// is held): first `debug` Events, oldest first, least-recently-written streams
    /// first (AEP-0007 §5 item 1); then durable facts, oldest first, from the
    /// least-recently-written stream on. A stream left empty is evicted whole and leaves
    /// an eviction record, so every resume that lost a fact still gets
    /// `replay-exhausted` (AEP-0003 §5). The spare chunks are freed first. Counted in
    /// [`Evictions::memory`]. O(Events evicted + streams visited).
    pub fn shed_to(&mut self, target: usize) -> Shed {
        let mut shed = Shed::default();
        self.spare = Spare::new();
        // Chunks freed during the shed pass through `spare` and are freed at its end, so
        // they are not counted while it runs.
        let held = |st: &Store<E>| st.heap + st.records.bytes;
        let mut at = self.head;
        while self.deltas > 0 && at != NIL && held(self) > target {
            let sid = at;
            at = self.slots[sid].next;
            while held(self) > target && self.shed_one(sid, DELTAS) {
                shed.events += 1;
                shed.debug_events += 1;
            }
            if self.slots[sid].len() == 0 {
                self.evict_session(sid);
                shed.streams += 1;
            }
        }
        while self.head != NIL && held(self) > target {
            let sid = self.head;
            if self.shed_one(sid, DELTAS) {
                shed.debug_events += 1;
            } else if !self.shed_one(sid, FACTS) {
                break; // unreachable: held streams are non-empty
            }
            shed.events += 1;
            if self.slots[sid].len() == 0 {
                self.evict_session(sid);
                shed.streams += 1;
            }
        }
        self.spare = Spare::new();
        self.evictions.memory += shed.events as u64;
        shed
    }

    /// Evicts the oldest Event of `lane` of stream `sid` for the memory budget; whether
    /// there was one.
    fn shed_one(&mut self, sid: usize, lane: usize) -> bool {
        let s = &mut self.slots[sid];
        let before = s.heap();
        let Some(len) = s.evict_front(lane, &mut self.spare) else {
            return false;
        };
        s.lanes[lane].shrink();
        self.heap = self.heap + s.heap() - before;
        self.bytes -= len;
        self.events -= 1;
        self.deltas -= usize::from(lane == DELTAS);
        true
    }

    /// The streams of the bare name `session` the store evicted whole and still
    /// remembers, and holds no stream of the same owner again: each owes a resume of
    /// `session` from before its `high` a `replay-exhausted` marker (AEP-0003 §5), which
    /// can name no earliest held position (the caller names the one after `high`).
    pub fn lost<'a>(&'a self, session: &str) -> impl Iterator<Item = Lost<'a>> + 'a {
        self.records
            .by_name
            .get_key_value(session)
            .into_iter()
            .flat_map(|(name, v)| {
                v.iter().filter_map(move |(source, key, _)| {
                    Some(Lost {
                        name,
                        source: source.as_deref(),
                        high: key.anchor()?,
                        key: *key,
                    })
                })
            })
    }
}
