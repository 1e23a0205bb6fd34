//! The replay store: bounded per-session replay buffers (AEP-0003 §5) serving the resume
//! contract (AEP-0003 §7) over the `(epoch, seq)` order of AEP-0001 §7.
//!
//! Pure data structure: no I/O, no clock, no logging. The caller decides what to do with
//! an [`Admission`] (live fan-out forwards every Event regardless, AEP-0003 §5) and turns
//! the `Option<Position>` that [`Store::replay_after`] returns into a `replay-exhausted`
//! frame or SSE comment (AEP-0003 §3.3 #3, §5).
//!
//! # Shape
//!
//! - Sessions are keyed by the bare `session` string, the key resume tokens carry
//!   (AEP-0001 §5.2, §7 #6). Distinct emitters that happen to share a session name share
//!   one buffer; their Events stay distinct through the `(source, id)` dedupe key, but a
//!   position both claim is reported as [`Admission::Conflict`] (the residual ambiguity
//!   AEP-0001 §5.2 accepts for 0.1).
//! - Each session holds at most `buffer_per_session` Events (the advertised
//!   `replay.buffer` depth is therefore a **per-session** count, AEP-0003 §5), in one total
//!   order:
//!   - *sequenced* Events by `(epoch, seq)`, lexicographically (AEP-0001 §7 #3), late
//!     backfill inserted in place (§7 #2);
//!   - *foreign* Events (session-scoped, no `seq`: commands, `attention.routed`,
//!     AEP-0001 §5.2) in arrival order, each **anchored** to the session's high-water
//!     position at arrival (the highest `(epoch, seq)` admitted to the session, which is
//!     the highest position held or, once the ring has evicted it, the anchor every held
//!     Event shares), or "before everything" when no sequenced Event has been admitted.
//!     A foreign Event sorts after its anchor, after earlier foreign Events with the same
//!     anchor, and before every higher position (including later backfill above the
//!     anchor).
//! - *Agent-scoped* Events (`agent.*`) are never buffered (AEP-0001 §5.2).
//! - When a session's ring is full, the lowest-ordered Event is evicted. The session
//!   remembers the highest order key it ever evicted (`evicted_high`), which makes the
//!   `replay-exhausted` decision exact.
//! - At `max_sessions` sessions, the first Event of a new session evicts the
//!   least-recently-*written* session entirely (written = an Event was
//!   [`Admission::Admitted`] to it; duplicates, conflicts and drops do not count). An
//!   evicted session is forgotten, including its `evicted_high` (AEP-0003 §5 replay-all
//!   honesty rule 1: wholly evicted sessions are absent).
//!
//! # Costs
//!
//! - `admit`: O(1) expected for the common case (a position above everything held, or
//!   any foreign Event: both append); backfill is O(log n) to find its place plus the
//!   `VecDeque` shift (distance to the nearer end). Dedupe is one keyed hash of
//!   `(source, id)`, computed once per admission and kept in the ring entry, so evicting
//!   an Event from the dedupe set never reads its (by then cold) bytes. Session eviction is O(1) (intrusive LRU list over a slab) plus
//!   dropping the evicted buffer.
//! - `replay_after`: O(log n) to find the start, then O(delivered).
//!
//! # Memory
//!
//! Per held Event the store adds: one 40-byte ring entry (an `Arc` pointer, a 24-byte
//! order key and the 8-byte dedupe hash); one 16-byte slot (the hash and an `Arc`
//! pointer) plus one control byte in the per-session dedupe hash set, whose bucket count
//! ends up at most 4× the items (power-of-two buckets at ≤ 7/8 load, and the steady
//! evict-then-insert churn leaves tombstones that make it grow once more), so ≤ 68
//! bytes; and the `Arc`'s 16-byte reference counts. That is ≤ 124 bytes, ≤ 1.21× the raw
//! bytes of a 600-byte Event, inside the 1.25× budget (the Event's own attribute struct is not counted: it is
//! shared with fan-out). Ring capacity grows by doubling but is clamped to
//! `buffer_per_session`, never beyond. Each session adds a fixed ~300 bytes (its struct,
//! its name twice, its index slot), which is noise for buffers of ~50 Events or more.
//! `tests/store_memory.rs` measures all of this with a counting allocator (about 72 to
//! 84 bytes per Event for buffers of 100 to 1024).
//!
//! # Duplicates, conflicts, eviction
//!
//! - Buffer admission dedupes on `(source, id)` within the session (AEP-0001 §7 #4,
//!   AEP-0003 §5). The dedupe set holds exactly the held Events: an evicted Event leaves
//!   it, so a redelivery of an evicted Event is treated as new. For a foreign Event that
//!   means it is admitted again (as a new arrival, appended); for a sequenced Event it
//!   means it is placed by its position again, which in a full ring is below everything
//!   held, so it is dropped on arrival ([`Admission::NotBuffered`]).
//! - Two different Events at one `(epoch, seq)` are an emitter fault (AEP-0001 §7 #2)
//!   that consumers SHOULD surface: the store keeps the first and reports
//!   [`Admission::Conflict`] for the second, which is not held (and so not in the dedupe
//!   set: resending it reports `Conflict` again).

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

use slab::Slab;

use crate::envelope::{Event, Scope};

/// A position `(epoch, seq)` in a session owner's stream (AEP-0001 §7). Ordered
/// lexicographically, which is the derived tuple order.
pub type Position = (u64, u64);

/// What the store needs to know about an Event. Implemented for [`Event`]; tests use
/// small stand-ins.
pub trait Stored {
    /// `session`, when present (AEP-0001 §5.1 #8).
    fn session(&self) -> Option<&str>;
    /// `(epoch, seq)` with the `epoch` default applied (AEP-0001 §5.1 #11, #12), for
    /// Events that carry `seq`; `None` otherwise. Only consulted for
    /// [`Scope::Sequenced`] Events.
    fn position(&self) -> Option<Position>;
    /// The dedupe key `(source, id)` (AEP-0001 §7 #4).
    fn dedupe_key(&self) -> (&str, &str);
    /// How the Event relates to session order (AEP-0001 §5.2).
    fn scope(&self) -> Scope;
    /// Size of the Event's raw bytes, for the buffered-bytes metric.
    fn byte_len(&self) -> usize;
}

impl Stored for Event {
    fn session(&self) -> Option<&str> {
        Event::session(self)
    }
    fn position(&self) -> Option<Position> {
        self.seq().map(|seq| (self.epoch(), seq))
    }
    fn dedupe_key(&self) -> (&str, &str) {
        (self.source(), self.id())
    }
    fn scope(&self) -> Scope {
        Event::scope(self)
    }
    /// The Event's bytes; what they retain once the relay made the Event keepable
    /// ([`Event::compact`], done on every ingest path before admission).
    fn byte_len(&self) -> usize {
        self.bytes().len()
    }
}

/// The outcome of [`Store::admit`]. Whatever it is, live fan-out still forwards the Event
/// as received (AEP-0003 §5: dedupe is the terminal consumer's duty).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Admission {
    /// The Event is now held in its session's buffer.
    Admitted,
    /// An Event with the same `(source, id)` is already held in this session
    /// (AEP-0001 §7 #4, AEP-0003 §5); nothing changed.
    Duplicate,
    /// A *different* Event (other `(source, id)`) already holds this `(epoch, seq)`: an
    /// emitter fault (AEP-0001 §7 #2) the caller SHOULD surface (log, metric). The first
    /// Event is kept; this one is not held.
    Conflict,
    /// Not held: an agent-scoped Event (AEP-0001 §5.2), a session-scoped Event lacking
    /// `session` (or a sequenced one lacking `seq`; only possible for unvalidated Events),
    /// a store configured with a zero bound, or a backfill ordered below everything a full
    /// buffer holds (it is evicted on arrival and counts toward `evicted_high`, so a
    /// resume from below it gets `replay-exhausted`).
    NotBuffered,
}

/// An opaque place in one session's order, returned by [`Store::replay_page`] to
/// continue a paged replay.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Cursor(Key);

/// Where a (paged) replay of one session starts.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReplayFrom {
    /// Strictly after a resume position (AEP-0003 §7), foreign Events anchored at it
    /// included.
    After(Position),
    /// From the earliest held Event (replay-all, AEP-0003 §5).
    Start,
    /// Strictly after the last Event of a previous page.
    Cursor(Cursor),
}

/// One page of a replay.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// `Some(earliest held position)` when a `replay-exhausted` marker is due before
    /// this page's Events.
    pub marker: Option<Position>,
    /// Where the next page starts; `None` when this page reached the newest Event.
    pub next: Option<Cursor>,
}

/// Bit that separates "before everything" foreign keys from keys at a position.
const AT: u64 = 1 << 63;

/// An Event's place in its session's total order.
///
/// - sequenced Event at `p`: `(p, AT)`;
/// - foreign Event number `n` (1-based, per session) anchored at `p`: `(p, AT + n)`;
/// - foreign Event number `n` anchored "before everything": `((0, 0), n)`, below every
///   position since `n < AT`.
///
/// The derived lexicographic order is the session order. 24 bytes, not 32 as an
/// `Option<Position>` anchor would take.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    epoch: u64,
    seq: u64,
    sub: u64,
}

impl Key {
    /// The key of a sequenced Event at `p`; also the replay bound "everything after `p`".
    fn at((epoch, seq): Position) -> Key {
        Key {
            epoch,
            seq,
            sub: AT,
        }
    }

    /// The key of the `n`-th foreign Event of a session (`n >= 1`).
    fn foreign(anchor: Option<Position>, n: u64) -> Key {
        // 2^63 foreign Events in one session cannot happen; keep the order sane anyway.
        let n = n.min(AT - 1);
        match anchor {
            Some((epoch, seq)) => Key {
                epoch,
                seq,
                sub: AT + n,
            },
            None => Key {
                epoch: 0,
                seq: 0,
                sub: n,
            },
        }
    }

    /// The position this key is at (sequenced) or follows (foreign); `None` for "before
    /// everything".
    fn anchor(self) -> Option<Position> {
        (self.sub >= AT).then_some((self.epoch, self.seq))
    }

    /// The position of a sequenced Event's key.
    fn position(self) -> Option<Position> {
        (self.sub == AT).then_some((self.epoch, self.seq))
    }
}

/// One held Event.
struct Entry<E> {
    key: Key,
    /// The Event's dedupe hash, as in its [`ByKey`]: eviction finds the set slot without
    /// touching the evicted (long cold) Event's bytes.
    hash: u64,
    ev: Arc<E>,
}

/// A held Event viewed through its dedupe key `(source, id)`: the dedupe set stores the
/// Events themselves (one pointer each) rather than copies of their keys, with the key's
/// hash computed once at admission by the store's keyed SipHash ([`Store::hasher`]).
///
/// Equal keys have equal hashes (one hasher per store), so comparing `hash` first is
/// exact; the same `Arc` is equal without reading its key, which is how eviction removes
/// an Event from the set without a cache miss on its bytes.
struct ByKey<E> {
    hash: u64,
    ev: Arc<E>,
}

impl<E> Hash for ByKey<E> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl<E: Stored> PartialEq for ByKey<E> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && (Arc::ptr_eq(&self.ev, &other.ev) || self.ev.dedupe_key() == other.ev.dedupe_key())
    }
}

impl<E: Stored> Eq for ByKey<E> {}

/// The dedupe set's hasher: the element already is a keyed SipHash, so it is used as is.
#[derive(Default)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is ever called (ByKey::hash); fold anything else anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type DedupeSet<E> = HashSet<ByKey<E>, BuildHasherDefault<PreHashed>>;

/// Sentinel for the LRU list links.
const NIL: usize = usize::MAX;

/// One session's buffer.
struct Session<E> {
    name: Box<str>,
    /// Held Events, strictly increasing by key.
    ring: VecDeque<Entry<E>>,
    /// Exactly the held Events, by `(source, id)`.
    ids: DedupeSet<E>,
    /// Highest position ever admitted (held or since evicted): the anchor of the next
    /// foreign Event.
    high: Option<Position>,
    /// Foreign Events admitted so far (the next one is `foreign_n + 1`).
    foreign_n: u64,
    /// Highest key ever evicted (or dropped on arrival). Every held key is above it.
    evicted_high: Option<Key>,
    /// Sum of `byte_len()` of the held Events.
    bytes: usize,
    /// Neighbours in the LRU list (towards least / most recently written).
    prev: usize,
    next: usize,
}

impl<E> Session<E> {
    fn new(name: &str) -> Session<E> {
        Session {
            name: name.into(),
            ring: VecDeque::new(),
            ids: DedupeSet::default(),
            high: None,
            foreign_n: 0,
            evicted_high: None,
            bytes: 0,
            prev: NIL,
            next: NIL,
        }
    }

    /// Lowest held sequenced position.
    fn earliest(&self) -> Option<Position> {
        self.ring.iter().find_map(|e| e.key.position())
    }

    /// Highest held sequenced position.
    fn latest(&self) -> Option<Position> {
        self.ring.iter().rev().find_map(|e| e.key.position())
    }

    /// The `earliest` a `replay-exhausted` marker names, given the session's
    /// `evicted_high` key `h`: the lowest held position or, when only foreign Events are
    /// held, their anchor. Every held key is above `h` and `h` is above the replay bound,
    /// so the front's anchor exists; the fallbacks only keep this total.
    fn exhausted_earliest(&self, h: Key, after: Position) -> Position {
        self.earliest()
            .or_else(|| self.ring.front().and_then(|e| e.key.anchor()))
            .or_else(|| h.anchor())
            .unwrap_or(after)
    }

    fn info(&self) -> SessionInfo<'_> {
        SessionInfo {
            name: &self.name,
            events: self.ring.len(),
            bytes: self.bytes,
            earliest: self.earliest(),
            latest: self.latest(),
            high_water: self.high,
            evicted_high: self.evicted_high.and_then(Key::anchor),
        }
    }
}

/// Metrics view of one held session, from [`Store::sessions`] / [`Store::session`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo<'a> {
    /// The `session` value.
    pub name: &'a str,
    /// Number of Events held (≥ 1).
    pub events: usize,
    /// Sum of the held Events' raw byte lengths.
    pub bytes: usize,
    /// Lowest held `(epoch, seq)`; `None` when only foreign Events are held.
    pub earliest: Option<Position>,
    /// Highest held `(epoch, seq)`; `None` when only foreign Events are held.
    pub latest: Option<Position>,
    /// Highest `(epoch, seq)` ever admitted to this session, held or not (the anchor of
    /// the next foreign Event).
    pub high_water: Option<Position>,
    /// Highest position ever evicted from this session: the position of the highest
    /// evicted Event, or the anchor of an evicted foreign Event. `None` when nothing was
    /// evicted (or only foreign Events anchored "before everything").
    pub evicted_high: Option<Position>,
}

/// Bounded per-session replay buffers (AEP-0003 §5). See the [module docs](self) for the
/// order, eviction and cost model.
pub struct Store<E> {
    buffer_per_session: usize,
    max_sessions: usize,
    index: HashMap<Box<str>, usize>,
    slots: Slab<Session<E>>,
    /// Least recently written session, or `NIL`.
    head: usize,
    /// Most recently written session, or `NIL`.
    tail: usize,
    events: usize,
    bytes: usize,
    /// Keys the dedupe hashes (randomly per store, so `(source, id)` values chosen by a
    /// client cannot collide on purpose).
    hasher: RandomState,
}

impl<E> fmt::Debug for Store<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("buffer_per_session", &self.buffer_per_session)
            .field("max_sessions", &self.max_sessions)
            .field("sessions", &self.slots.len())
            .field("events", &self.events)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl<E: Stored> Store<E> {
    /// A store keeping at most `buffer_per_session` Events in each of at most
    /// `max_sessions` sessions. Either bound at `0` makes a store that buffers nothing
    /// (every admission is [`Admission::NotBuffered`]). Allocates nothing up front.
    pub fn new(buffer_per_session: usize, max_sessions: usize) -> Store<E> {
        Store {
            buffer_per_session,
            max_sessions,
            index: HashMap::new(),
            slots: Slab::new(),
            head: NIL,
            tail: NIL,
            events: 0,
            bytes: 0,
            hasher: RandomState::new(),
        }
    }

    /// The per-session depth, as advertised in `replay.buffer` (AEP-0003 §5: a count of
    /// Events per session).
    pub fn buffer_per_session(&self) -> usize {
        self.buffer_per_session
    }

    /// The maximum number of sessions held at once.
    pub fn max_sessions(&self) -> usize {
        self.max_sessions
    }

    /// Offers an Event to its session's buffer. See [`Admission`] for the outcomes and
    /// the module docs for ordering, anchoring and eviction. Never fails, never panics on
    /// malformed input (an Event lacking what its scope requires is `NotBuffered`).
    pub fn admit(&mut self, ev: &Arc<E>) -> Admission {
        if self.buffer_per_session == 0 || self.max_sessions == 0 {
            return Admission::NotBuffered;
        }
        let pos = match ev.scope() {
            Scope::Agent => return Admission::NotBuffered,
            Scope::Sequenced => match ev.position() {
                Some(p) => Some(p),
                None => return Admission::NotBuffered,
            },
            Scope::Foreign => None,
        };
        let Some(name) = ev.session() else {
            return Admission::NotBuffered;
        };
        let sid = match self.index.get(name) {
            Some(&sid) => sid,
            None => self.create(name),
        };
        let cap = self.buffer_per_session;
        let s = &mut self.slots[sid];

        // AEP-0001 §7 #4, AEP-0003 §5: buffer admission dedupes on (source, id).
        let probe = ByKey {
            hash: self.hasher.hash_one(ev.dedupe_key()),
            ev: Arc::clone(ev),
        };
        if s.ids.contains(&probe) {
            return Admission::Duplicate;
        }

        let key = match pos {
            Some(p) => Key::at(p),
            None => Key::foreign(s.high, s.foreign_n + 1),
        };
        // Common case first: above everything held (every foreign Event lands here).
        let mut idx = match s.ring.back() {
            None => 0,
            Some(last) if last.key < key => s.ring.len(),
            Some(_) => match s.ring.binary_search_by(|e| e.key.cmp(&key)) {
                // AEP-0001 §7 #2: two Events at one position; keep the first.
                Ok(_) => return Admission::Conflict,
                // Backfill (AEP-0001 §7 #2): in place.
                Err(i) => i,
            },
        };

        if s.ring.len() >= cap {
            if idx == 0 {
                // Ordered below everything a full ring holds: it would be the Event
                // evicted, so it is evicted on arrival. A resume from below it must still
                // learn it missed something.
                s.evicted_high = s.evicted_high.max(Some(key));
                return Admission::NotBuffered;
            }
            if let Some(old) = s.ring.pop_front() {
                // The front is the lowest key held, and every held key is above
                // `evicted_high`, so the front becomes the new `evicted_high`.
                s.evicted_high = Some(old.key);
                s.bytes -= old.ev.byte_len();
                self.bytes -= old.ev.byte_len();
                self.events -= 1;
                s.ids.remove(&ByKey {
                    hash: old.hash,
                    ev: old.ev,
                });
                idx -= 1;
            }
        }

        match pos {
            Some(p) => s.high = s.high.max(Some(p)),
            None => s.foreign_n += 1,
        }
        if s.ring.len() == s.ring.capacity() {
            // Double, but never past the bound.
            let want = (s.ring.capacity() * 2).max(4).min(cap);
            s.ring
                .reserve_exact(want.saturating_sub(s.ring.len()).max(1));
        }
        let len = ev.byte_len();
        s.ring.insert(
            idx,
            Entry {
                key,
                hash: probe.hash,
                ev: Arc::clone(ev),
            },
        );
        s.ids.insert(probe);
        s.bytes += len;
        self.bytes += len;
        self.events += 1;
        self.touch(sid);
        Admission::Admitted
    }

    /// Replays `session` for a consumer resuming from `after` (AEP-0003 §7: "delivers
    /// strictly after that position"): calls `out` for every held Event ordered after
    /// `after`, in session order.
    ///
    /// Foreign Events anchored **at** `after` are included: they arrived after `after`
    /// was the session's high-water, and a consumer that last saw `after` may or may not
    /// have seen them; delivery is at-least-once (AEP-0001 §7 #4), so they are redelivered
    /// rather than risk a loss.
    ///
    /// Returns `Some(earliest)` when a `replay-exhausted` marker is due (AEP-0003 §5,
    /// §3.3 #3): something this replay would have delivered was evicted, i.e. an evicted
    /// sequenced Event at a position `> after` or an evicted foreign Event anchored at or
    /// after `after`. Then every held Event is delivered (all are above what was
    /// evicted), and `earliest` is the lowest held `(epoch, seq)`, or, when the session
    /// holds only foreign Events, the position they are anchored to. `None` otherwise,
    /// including when `session` is not held (never seen, or wholly evicted: the caller
    /// decides what an unknown session means for its binding).
    pub fn replay_after(
        &self,
        session: &str,
        after: Position,
        out: &mut impl FnMut(&Arc<E>),
    ) -> Option<Position> {
        let s = self.get(session)?;
        let bound = Key::at(after);
        let start = s.ring.partition_point(|e| e.key <= bound);
        let marker = match s.evicted_high {
            Some(h) if bound < h => Some(s.exhausted_earliest(h, after)),
            _ => None,
        };
        for e in s.ring.range(start..) {
            out(&e.ev);
        }
        marker
    }

    /// Replays one page of `session`: at most `max` held Events strictly after `from`, in
    /// session order. Paging lets a consumer's replay advance only as fast as it reads
    /// (bounded memory per consumer however large the store is).
    ///
    /// - [`ReplayFrom::After`] behaves like [`Store::replay_after`] for its first page.
    /// - [`ReplayFrom::Start`] starts at the earliest held Event, with no marker.
    /// - [`ReplayFrom::Cursor`] continues a previous page. Its marker is `Some` when Events
    ///   after the cursor were evicted between pages (the consumer fell behind the ring),
    ///   so even a paged replay never hides a gap.
    ///
    /// Returns `None` when the session is not held, otherwise the [`Page`]: the marker (as
    /// for [`Store::replay_after`]) and the cursor to continue from (`None` when the
    /// page reached the session's newest Event).
    pub fn replay_page(
        &self,
        session: &str,
        from: ReplayFrom,
        max: usize,
        out: &mut impl FnMut(&Arc<E>),
    ) -> Option<Page> {
        let s = self.get(session)?;
        let (start, marker) = match from {
            ReplayFrom::Start => (0, None),
            ReplayFrom::After(after) => {
                let bound = Key::at(after);
                let marker = match s.evicted_high {
                    Some(h) if bound < h => Some(s.exhausted_earliest(h, after)),
                    _ => None,
                };
                (s.ring.partition_point(|e| e.key <= bound), marker)
            }
            ReplayFrom::Cursor(Cursor(bound)) => {
                let marker = match s.evicted_high {
                    Some(h) if bound < h => {
                        Some(s.exhausted_earliest(h, bound.anchor().unwrap_or((0, 0))))
                    }
                    _ => None,
                };
                (s.ring.partition_point(|e| e.key <= bound), marker)
            }
        };
        let end = start.saturating_add(max).min(s.ring.len());
        let mut last = None;
        for e in s.ring.range(start..end) {
            out(&e.ev);
            last = Some(e.key);
        }
        let next = if end < s.ring.len() {
            last.map(Cursor)
        } else {
            None
        };
        Some(Page { marker, next })
    }

    /// The names of every held session, in the [`Store::replay_all`] order.
    pub fn session_names(&self) -> Vec<Box<str>> {
        self.iter_lru().map(|s| s.name.clone()).collect()
    }

    /// Replays everything held for `session`, from its earliest held Event, in session
    /// order, with no marker (the request names no position). Returns the number of
    /// Events delivered (0 when the session is not held).
    pub fn replay_session_from_start(&self, session: &str, out: &mut impl FnMut(&Arc<E>)) -> usize {
        let Some(s) = self.get(session) else {
            return 0;
        };
        for e in &s.ring {
            out(&e.ev);
        }
        s.ring.len()
    }

    /// Replay-all (AEP-0003 §5, `from: "all"`): every held session from its earliest held
    /// Event, no `replay-exhausted` (honesty rule 2). Sessions come
    /// **least-recently-written first**, so the most recently active session is replayed
    /// last, next to the live tail that follows; within a session, session order.
    /// Wholly evicted sessions are absent (honesty rule 1). Returns the number of Events
    /// delivered.
    pub fn replay_all(&self, out: &mut impl FnMut(&Arc<E>)) -> usize {
        let mut n = 0;
        for s in self.iter_lru() {
            for e in &s.ring {
                out(&e.ev);
            }
            n += s.ring.len();
        }
        n
    }

    /// Whether an Event with `ev`'s `(source, id)` is held in `ev`'s session, i.e. whether
    /// [`Store::admit`] would answer [`Admission::Duplicate`] (AEP-0001 §7 #4). Read-only;
    /// the durable history uses it so a redelivered Event is not written twice.
    pub fn holds(&self, ev: &Arc<E>) -> bool {
        ev.session()
            .and_then(|name| self.get(name))
            .is_some_and(|s| {
                s.ids.contains(&ByKey {
                    hash: self.hasher.hash_one(ev.dedupe_key()),
                    ev: Arc::clone(ev),
                })
            })
    }

    /// Number of sessions held.
    pub fn session_count(&self) -> usize {
        self.slots.len()
    }

    /// Total Events held across sessions.
    pub fn len(&self) -> usize {
        self.events
    }

    /// Whether no Event is held.
    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// Total raw bytes of the held Events (sum of [`Stored::byte_len`]).
    pub fn byte_len(&self) -> usize {
        self.bytes
    }

    /// Every held session, least-recently-written first (the [`Store::replay_all`] order).
    pub fn sessions(&self) -> impl Iterator<Item = SessionInfo<'_>> + '_ {
        self.iter_lru().map(Session::info)
    }

    /// One held session's metrics view.
    pub fn session(&self, name: &str) -> Option<SessionInfo<'_>> {
        self.get(name).map(Session::info)
    }

    fn get(&self, name: &str) -> Option<&Session<E>> {
        self.index.get(name).map(|&sid| &self.slots[sid])
    }

    fn iter_lru(&self) -> impl Iterator<Item = &Session<E>> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let s = &self.slots[at];
            at = s.next;
            Some(s)
        })
    }

    /// Creates an empty session at the most-recent end, first evicting the
    /// least-recently-written session when at `max_sessions`.
    fn create(&mut self, name: &str) -> usize {
        if self.slots.len() >= self.max_sessions && self.head != NIL {
            self.evict_session(self.head);
        }
        let sid = self.slots.insert(Session::new(name));
        self.index.insert(name.into(), sid);
        self.link_tail(sid);
        sid
    }

    fn evict_session(&mut self, sid: usize) {
        self.unlink(sid);
        let s = self.slots.remove(sid);
        self.index.remove(&s.name);
        self.events -= s.ring.len();
        self.bytes -= s.bytes;
    }

    /// Marks `sid` most recently written.
    fn touch(&mut self, sid: usize) {
        if self.tail != sid {
            self.unlink(sid);
            self.link_tail(sid);
        }
    }

    fn unlink(&mut self, sid: usize) {
        let (prev, next) = {
            let s = &self.slots[sid];
            (s.prev, s.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.slots[p].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slots[n].prev = prev,
        }
        let s = &mut self.slots[sid];
        s.prev = NIL;
        s.next = NIL;
    }

    fn link_tail(&mut self, sid: usize) {
        let old = self.tail;
        {
            let s = &mut self.slots[sid];
            s.prev = old;
            s.next = NIL;
        }
        match old {
            NIL => self.head = sid,
            t => self.slots[t].next = sid,
        }
        self.tail = sid;
    }

    /// Checks every internal invariant; panics on a violation (tests only).
    #[cfg(test)]
    fn check(&self) {
        let mut events = 0;
        let mut bytes = 0;
        let mut seen = 0;
        let mut prev = NIL;
        let mut at = self.head;
        while at != NIL {
            let s = &self.slots[at];
            assert_eq!(s.prev, prev, "LRU back link");
            assert_eq!(self.index.get(&s.name), Some(&at), "index");
            assert!(!s.ring.is_empty(), "held sessions are non-empty");
            assert!(s.ring.len() <= self.buffer_per_session, "ring bound");
            assert!(
                s.ring.capacity() <= self.buffer_per_session,
                "ring capacity"
            );
            assert_eq!(s.ids.len(), s.ring.len(), "dedupe set mirrors the ring");
            for w in s.ring.iter().collect::<Vec<_>>().windows(2) {
                assert!(w[0].key < w[1].key, "strict order");
            }
            for e in &s.ring {
                let probe = ByKey {
                    hash: self.hasher.hash_one(e.ev.dedupe_key()),
                    ev: Arc::clone(&e.ev),
                };
                assert_eq!(probe.hash, e.hash, "entry hash");
                assert!(s.ids.contains(&probe), "held id in set");
                assert!(Some(e.key) > s.evicted_high, "held above evicted_high");
                if let Some(p) = e.key.anchor() {
                    assert!(Some(p) <= s.high, "high-water");
                }
            }
            let b: usize = s.ring.iter().map(|e| e.ev.byte_len()).sum();
            assert_eq!(b, s.bytes, "session bytes");
            events += s.ring.len();
            bytes += b;
            seen += 1;
            prev = at;
            at = s.next;
        }
        assert_eq!(self.tail, prev, "LRU tail");
        assert_eq!(seen, self.slots.len(), "every session linked");
        assert_eq!(self.index.len(), self.slots.len(), "index size");
        assert!(self.slots.len() <= self.max_sessions, "session bound");
        assert_eq!(events, self.events, "event total");
        assert_eq!(bytes, self.bytes, "byte total");
    }
}

#[cfg(test)]
mod tests;
