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
//! - Buffers are kept per **owning stream**, `(source, session)`: session identity is
//!   scoped to the emitter (AEP-0001 §5.2: "distinct emitters carrying the same `session`
//!   string are distinct sessions that happen to share a name"; consumers "key per-session
//!   state by `(source, session)`"). `source` is the Event's `source` attribute, compared
//!   verbatim (AEP-0001 §5.1 #6: it identifies the emitter; the spec gives no other
//!   emitter identity). A [`StreamId`] names one held stream. Two emitters sharing a
//!   session name therefore never meet in one buffer: a position conflict
//!   ([`Admission::Conflict`]) is an emitter fault within one stream only.
//! - Resume positions name a **bare** session (AEP-0001 §7 #6, AEP-0003 §7), so the
//!   replay surfaces ([`Store::streams`], [`Store::replay_after`]) address every owning
//!   stream of that name, each strictly after the position in its own order. Several
//!   streams of one name are listed in the order they were created.
//! - Each stream holds at most `buffer_per_session` Events (the advertised
//!   `replay.buffer` depth is therefore a count **per owning stream**, AEP-0003 §5), in one
//!   total order:
//!   - *sequenced* Events by `(epoch, seq)`, lexicographically (AEP-0001 §7 #3), late
//!     backfill inserted in place (§7 #2);
//!   - *foreign* Events (session-scoped, no `seq`: commands, `attention.routed`,
//!     AEP-0001 §5.2) in arrival order, each **anchored** to the stream's high-water
//!     position at arrival (the highest `(epoch, seq)` admitted to the stream, which is
//!     the highest position held or, once the ring has evicted it, the anchor every held
//!     Event shares), or "before everything" when no sequenced Event has been admitted.
//!     A foreign Event sorts after its anchor, after earlier foreign Events with the same
//!     anchor, and before every higher position (including later backfill above the
//!     anchor).
//! - **Which stream a foreign Event joins.** A foreign Event is emitted by another party
//!   than the session owner (its `source` is the sender's, AEP-0004 §2.2) and addresses
//!   the session by bare name, which cannot say which of several owners it means. So it is
//!   held in **every** owning stream of its name present at arrival, anchored in each at
//!   that stream's own high-water. A resume from a position `P` of that name then still
//!   delivers it whenever any stream it joined had reached `P` when it arrived, which is
//!   what at-least-once needs (AEP-0001 §7 #4); when several streams share the name a
//!   replay may carry it once per stream (consumers dedupe on `(source, id)`). With no
//!   owning stream of the name held, it starts a *foreign-only* stream (no `source`,
//!   [`SessionInfo::source`] `None`), which the first owning stream of that name then
//!   adopts, so a session's early commands stay at the front of its owner's buffer as
//!   before. A name has either one foreign-only stream or only owning streams.
//! - *Agent-scoped* Events (`agent.*`) are never buffered (AEP-0001 §5.2).
//! - **Two lanes per stream** (AEP-0007 §5 item 1: deltas are a live view that buffers
//!   MAY evict first; a runaway stream cannot displace durable facts): its `debug`
//!   Events ([`Stored::delta`]) in one, everything else, the durable facts, in the
//!   other, each in key order with its own arena. Replay merges the two by key, so a
//!   consumer sees one stream order.
//! - When a stream is full (`buffer_per_session` Events in its two lanes), it evicts
//!   the lowest-ordered `debug` Event; only when it holds none does it evict its
//!   lowest-ordered fact. A `debug` Event arriving at a stream full of facts is not held
//!   (it would be the one evicted), nor is an Event ordered below everything its lane
//!   holds when it would be that lane's victim. Each lane remembers the highest key it
//!   ever evicted (`evicted_high`). A `replay-exhausted` marker is owed exactly when a
//!   fact after the resume position was evicted (the facts lane's `evicted_high` is
//!   above it); a resume that lost only `debug` Events is owed none.
//! - At `max_sessions` streams (owning and foreign-only streams count alike), the first
//!   Event of a new stream evicts the least-recently-*written* stream entirely (written =
//!   an Event was [`Admission::Admitted`] to it; duplicates, conflicts and drops do not
//!   count). Other streams of the same name are unaffected. The evicted stream leaves an
//!   **eviction record**: `(session, source)` and the highest key of a fact it held or
//!   had evicted, in a table of at most `max(RECORDS_PER_STREAM × max_sessions,
//!   MIN_RECORDS)` records, oldest forgotten first. [`Store::lost`] lists a name's
//!   records, which owe a resume from before their fact `replay-exhausted`; a stream of
//!   the same `(session, source)` created later takes its record over as its facts
//!   lane's `evicted_high`. Replay-all never lists them (AEP-0003 §5 honesty rule 1:
//!   wholly evicted sessions are absent).
//! - **The memory budget** ([`Store::memory_bytes`], [`Store::shed_to`]): what the
//!   store holds on the heap is counted as it changes, O(1) to read. A shed evicts
//!   `debug` Events first (least-recently-written streams first), then the oldest facts
//!   of the least-recently-written stream, and evicts a stream it empties whole,
//!   leaving its record.

//! # Costs
//!
//! - `admit`: O(1) expected for the common case (a position above everything held, or
//!   any foreign Event: both append); backfill is O(log n) to find its place plus the
//!   `VecDeque` shift (distance to the nearer end) and one dedupe-slot renumbering per
//!   entry it moves up. Dedupe is one keyed hash of `(source, id)`, computed once per
//!   admission and kept in the ring entry, so evicting an Event from the dedupe table
//!   never reads its (by then cold) bytes; the held Event is read back
//!   ([`Stored::reread`]) only when a lookup finds an equal 64-bit hash (a duplicate).
//!   Keeping it copies its bytes into the stream's arena (no allocation but one per
//!   new chunk, at most one per 16 KiB, none when a spare chunk is reused). Finding the stream is one hash of the bare name plus a
//!   compare of `source` per stream of that name (almost always one). A foreign Event
//!   costs one append per owning stream of its name. Stream eviction is O(1) (intrusive
//!   LRU list over a slab) plus dropping the evicted buffer.
//! - `replay_after`: O(log n) per stream of the name to find the start, then
//!   O(delivered), each delivered Event read back from a copy of its bytes
//!   ([`Stored::reread`]: for [`Event`], one scan without validation).
//!
//! # Memory
//!
//! A held Event is its bytes, in its lane's arena, plus: one 36-byte ring entry (a
//! 20-byte order key, 4 bytes of the dedupe hash, and where its bytes are: chunk, offset,
//! length); one 4-byte slot plus one control byte in the stream's dedupe table, whose
//! bucket count is at most about 4× the items (power-of-two buckets at ≤ 7/8 load, and
//! evict-then-insert churn may leave tombstones); and its share of the arena's slack:
//! the unfilled rest of the stream's newest chunk and the unused end of each full one,
//! chunks being at most 16 KiB and at most 1/32 of what the stream may hold. Nothing of
//! the request or message the Event arrived in is kept. Ring capacity grows by doubling
//! but is clamped to `buffer_per_session`, never beyond. Each stream adds a fixed ~400
//! bytes (its struct, its name twice, its `source` and `agent`, its index slot), which
//! is noise for buffers of ~50 Events or more; the store keeps at most 8 spare chunks.
//! `tests/memory/store_memory.rs` measures all of this with a counting allocator (about 80 to
//! 120 bytes per Event beyond its own bytes, for buffers of 1 000 to 100 Events of 600
//! bytes, in steady churn); `cargo bench --bench ingest_alloc` prints it for 1 000
//! streams of 1 000 Events of 580 bytes (about 58 bytes).
//!
//! # Duplicates, conflicts, eviction
//!
//! - Buffer admission dedupes on `(source, id)` within the stream (AEP-0001 §7 #4,
//!   AEP-0003 §5). The dedupe set holds exactly the held Events: an evicted Event leaves
//!   it, so a redelivery of an evicted Event is treated as new. For a foreign Event that
//!   means it is admitted again (as a new arrival, appended); for a sequenced Event it
//!   means it is placed by its position again, which in a full ring is below everything
//!   held, so it is dropped on arrival ([`Admission::NotBuffered`]).
//! - Two different Events at one `(epoch, seq)` of one stream are an emitter fault
//!   (AEP-0001 §7 #2) that consumers SHOULD surface: the store keeps the first and reports
//!   [`Admission::Conflict`] for the second, which is not held (and so not in the dedupe
//!   set: resending it reports `Conflict` again).

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;

use bytes::Bytes;
use slab::Slab;
use smallvec::{smallvec, SmallVec};

use crate::wire::envelope::{Event, Scope};

#[cfg(test)]
mod check;
mod evict;
mod lane;
mod replay;
mod session;

pub use evict::{Evictions, Lost, Shed, MIN_RECORDS, RECORDS_PER_STREAM};
pub use replay::{Cursor, Exhausted, Page, ReplayFrom};
pub use session::SessionInfo;

use evict::Records;
use lane::{Entry, Key, Spare, DELTAS, FACTS};
use session::Session;

/// A position `(epoch, seq)` in a session owner's stream (AEP-0001 §7). Ordered
/// lexicographically, which is the derived tuple order.
pub type Position = (u64, u64);

/// What the store needs to know about an Event. Implemented for [`Event`]; tests use
/// small stand-ins.
///
/// The store keeps an admitted Event as its bytes only ([`Stored::bytes`], copied into
/// the stream's arena) and reads it back with [`Stored::reread`] when it replays it or
/// must compare it, so a held Event costs its bytes plus a small fixed entry, never the
/// scanned form the live path uses.
pub trait Stored: Sized {
    /// `session`, when present (AEP-0001 §5.1 #8).
    fn session(&self) -> Option<&str>;
    /// `(epoch, seq)` with the `epoch` default applied (AEP-0001 §5.1 #11, #12), for
    /// Events that carry `seq`; `None` otherwise. Only consulted for
    /// [`Scope::Sequenced`] Events.
    fn position(&self) -> Option<Position>;
    /// The dedupe key `(source, id)` (AEP-0001 §7 #4).
    fn dedupe_key(&self) -> (&str, &str);
    /// `source`, the emitter's identity (AEP-0001 §5.1 #6): with `session` it names the
    /// owning stream a sequenced Event belongs to (AEP-0001 §5.2). Defaults to the first
    /// half of [`Stored::dedupe_key`].
    fn source(&self) -> &str {
        self.dedupe_key().0
    }
    /// `agent` (AEP-0001 §5.1 #7), shown per stream in [`SessionInfo::agent`]; `None`
    /// by default.
    fn agent(&self) -> Option<&str> {
        None
    }
    /// How the Event relates to session order (AEP-0001 §5.2).
    fn scope(&self) -> Scope;
    /// Whether the Event is a `debug` Event (AEP-0001 §5.1 #15): part of the live view,
    /// which a full buffer evicts before any durable fact (AEP-0007 §5 item 1). `false`
    /// by default.
    fn delta(&self) -> bool {
        false
    }
    /// The Event's bytes: what a buffer keeps (their length is what
    /// [`Store::byte_len`] counts) and what [`Stored::reread`] gets back.
    fn bytes(&self) -> &[u8];
    /// The Event again, from the bytes [`Stored::bytes`] gave at admission (a slice of
    /// the stream's arena). `None` when they do not read back, which bytes of an admitted
    /// Event always do; the store then skips the entry.
    fn reread(bytes: Bytes) -> Option<Self>;
}

impl Stored for Event {
    fn session(&self) -> Option<&str> {
        Event::session(self)
    }
    fn position(&self) -> Option<Position> {
        self.seq().map(|seq| (self.epoch(), seq))
    }
    fn dedupe_key(&self) -> (&str, &str) {
        (Event::source(self), self.id())
    }
    fn source(&self) -> &str {
        Event::source(self)
    }
    fn agent(&self) -> Option<&str> {
        self.attr(crate::wire::envelope::Attr::Agent)
    }
    fn scope(&self) -> Scope {
        Event::scope(self)
    }
    fn delta(&self) -> bool {
        self.severity() == crate::wire::envelope::Severity::Debug
    }
    fn bytes(&self) -> &[u8] {
        Event::bytes(self)
    }
    /// Scans the held bytes again ([`Event::scan`]): they were validated when the Event
    /// was admitted, so only the attributes are read back.
    fn reread(bytes: Bytes) -> Option<Event> {
        Event::scan(bytes).ok()
    }
}

/// The outcome of [`Store::admit`]. Whatever it is, live fan-out still forwards the Event
/// as received (AEP-0003 §5: dedupe is the terminal consumer's duty).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Admission {
    /// The Event is now held in its stream's buffer (a foreign Event: in at least one of
    /// the streams of its name; [`Store::last_placed`] says which).
    Admitted,
    /// An Event with the same `(source, id)` is already held in this stream (a foreign
    /// Event: in every stream of its name) (AEP-0001 §7 #4, AEP-0003 §5); nothing changed.
    Duplicate,
    /// A *different* Event (other `(source, id)`) already holds this `(epoch, seq)` in the
    /// same owning stream `(source, session)`: an emitter fault (AEP-0001 §7 #2) the caller
    /// SHOULD surface (log, metric). The first Event is kept; this one is not held. Another
    /// emitter's Event at the same position of a same-named session is no conflict: it is
    /// another stream (AEP-0001 §5.2).
    Conflict,
    /// Not held: an agent-scoped Event (AEP-0001 §5.2), a session-scoped Event lacking
    /// `session` (or a sequenced one lacking `seq`; only possible for unvalidated Events),
    /// a store configured with a zero bound, or a backfill ordered below everything a full
    /// buffer holds (it is evicted on arrival and counts toward `evicted_high`, so a
    /// resume from below it gets `replay-exhausted`).
    NotBuffered,
}

/// One held stream: the buffer of one owning emitter's session `(source, session)`
/// (AEP-0001 §5.2), or a name's foreign-only buffer (see the [module docs](self#shape)).
/// Copyable and cheap to compare; valid while the stream is held. An id is never reused
/// for another stream: once its stream is evicted every lookup with it answers `None`.
/// An id means something only to the store that issued it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct StreamId {
    slot: usize,
    serial: u64,
}

/// Sentinel for the LRU list links.
const NIL: usize = usize::MAX;

/// The slots of the streams held under one bare name, in creation order.
type Named = SmallVec<[usize; 1]>;

/// Bounded per-stream replay buffers (AEP-0003 §5) of Events of type `E`. See the
/// [module docs](self) for the order, eviction and cost model. A clone shares every held
/// Event's bytes and copies only the rings and indexes: O(Events held), none of their
/// bytes.
pub struct Store<E> {
    buffer_per_session: usize,
    max_sessions: usize,
    /// Bare session name → its streams.
    index: HashMap<Box<str>, Named>,
    slots: Slab<Session>,
    /// Least recently written stream, or `NIL`.
    head: usize,
    /// Most recently written stream, or `NIL`.
    tail: usize,
    events: usize,
    /// Of `events`, those in [`DELTAS`] lanes.
    deltas: usize,
    bytes: usize,
    /// Sum of the held streams' [`Session::heap`].
    heap: usize,
    /// Streams created so far (the next one's [`StreamId`] serial).
    serial: u64,
    /// The streams the last [`Store::admit`] placed its Event in.
    placed: SmallVec<[StreamId; 2]>,
    /// Keys the dedupe hashes (randomly per store, so `(source, id)` values chosen by a
    /// client cannot collide on purpose).
    hasher: ahash::RandomState,
    /// Chunks the streams' arenas gave back, for their next chunks.
    spare: Spare,
    /// The streams evicted whole, remembered for `replay-exhausted`.
    records: Records,
    evictions: Evictions,
    /// What is held: `E`, read back from its bytes.
    held: PhantomData<fn() -> E>,
}

impl<E> Clone for Store<E> {
    fn clone(&self) -> Store<E> {
        Store {
            buffer_per_session: self.buffer_per_session,
            max_sessions: self.max_sessions,
            index: self.index.clone(),
            slots: self.slots.clone(),
            head: self.head,
            tail: self.tail,
            events: self.events,
            deltas: self.deltas,
            bytes: self.bytes,
            heap: self.heap,
            serial: self.serial,
            placed: self.placed.clone(),
            hasher: self.hasher.clone(),
            spare: Spare::new(),
            records: self.records.clone(),
            evictions: self.evictions,
            held: PhantomData,
        }
    }
}

impl<E> fmt::Debug for Store<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("buffer_per_session", &self.buffer_per_session)
            .field("max_sessions", &self.max_sessions)
            .field("streams", &self.slots.len())
            .field("events", &self.events)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl<E: Stored> Store<E> {
    /// A store keeping at most `buffer_per_session` Events in each of at most
    /// `max_sessions` streams. Either bound at `0` makes a store that buffers nothing
    /// (every admission is [`Admission::NotBuffered`]). Allocates nothing up front. It
    /// remembers up to `max(RECORDS_PER_STREAM × max_sessions, MIN_RECORDS)` streams it
    /// evicted whole ([`Store::lost`]).
    /// `buffer_per_session` is capped at 2^31 Events (a stream numbers its held Events
    /// in 32 bits).
    pub fn new(buffer_per_session: usize, max_sessions: usize) -> Store<E> {
        Store {
            buffer_per_session: buffer_per_session.min(1 << 31),
            max_sessions,
            index: HashMap::new(),
            slots: Slab::new(),
            head: NIL,
            tail: NIL,
            events: 0,
            deltas: 0,
            bytes: 0,
            heap: 0,
            serial: 0,
            placed: SmallVec::new(),
            hasher: ahash::RandomState::new(),
            spare: Spare::new(),
            records: Records {
                cap: max_sessions
                    .saturating_mul(RECORDS_PER_STREAM)
                    .max(MIN_RECORDS),
                ..Records::default()
            },
            evictions: Evictions::default(),
            held: PhantomData,
        }
    }

    /// The per-stream depth, as advertised in `replay.buffer` (AEP-0003 §5: a count of
    /// Events per session, i.e. per owning stream `(source, session)`).
    pub fn buffer_per_session(&self) -> usize {
        self.buffer_per_session
    }

    /// The maximum number of streams held at once.
    pub fn max_sessions(&self) -> usize {
        self.max_sessions
    }

    /// Offers an Event to its stream's buffer: a sequenced Event to the owning stream
    /// `(source, session)` (created when new), a foreign Event to every stream of its
    /// bare `session` (AEP-0001 §5.2; see the [module docs](self#shape)). See
    /// [`Admission`] for the outcomes and the module docs for ordering, anchoring and
    /// eviction; [`Store::last_placed`] then names the streams it went to. Never fails,
    /// never panics on malformed input (an Event lacking what its scope requires is
    /// `NotBuffered`).
    pub fn admit(&mut self, ev: &E) -> Admission {
        self.placed.clear();
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
        // AEP-0001 §7 #4, AEP-0003 §5: buffer admission dedupes on (source, id).
        let hash = self.hasher.hash_one(ev.dedupe_key());
        match pos {
            Some(p) => {
                let sid = self.owning_stream(name, ev.source());
                self.admit_into(sid, ev, hash, Some(p))
            }
            None => {
                let targets: Named = match self.index.get(name) {
                    Some(named) => named.clone(),
                    None => smallvec![self.create(name, None)],
                };
                let mut out = Admission::Duplicate;
                for sid in targets {
                    if self.admit_into(sid, ev, hash, None) == Admission::Admitted {
                        out = Admission::Admitted;
                    }
                }
                out
            }
        }
    }

    /// The streams the most recent [`Store::admit`] placed its Event in: one for an
    /// admitted sequenced Event, one per stream it joined for a foreign Event, none
    /// unless it answered [`Admission::Admitted`].
    pub fn last_placed(&self) -> &[StreamId] {
        &self.placed
    }

    /// The slot of the owning stream `(source, name)`: held, adopted from the name's
    /// foreign-only stream, or created.
    fn owning_stream(&mut self, name: &str, source: &str) -> usize {
        if let Some(named) = self.index.get(name) {
            if let Some(&sid) = named
                .iter()
                .find(|&&sid| self.slots[sid].source.as_deref() == Some(source))
            {
                return sid;
            }
            if let [sid] = named[..] {
                if self.slots[sid].source.is_none() {
                    // The name's foreign Events so far become the front of its owner's
                    // buffer, anchored "before everything" as they were.
                    // An earlier stream of this owner evicted whole passes its record
                    // on, as to a stream created for it.
                    let record = self.records.take(name, Some(source));
                    let s = &mut self.slots[sid];
                    s.source = Some(source.into());
                    let facts = &mut s.lanes[FACTS];
                    facts.evicted_high = facts.evicted_high.max(record);
                    self.heap += source.len();
                    return sid;
                }
            }
        }
        self.create(name, Some(source))
    }

    /// Admits `ev` (dedupe hash `hash`, position `pos`, `None` for foreign) to stream
    /// `sid`: to its facts lane, or to its deltas lane when it is `debug`
    /// ([`Stored::delta`]). A full stream evicts its oldest `debug` Event first, and a
    /// durable fact only when it holds no `debug` Event (AEP-0007 §5 item 1); a `debug`
    /// Event arriving at a stream full of facts is not held.
    fn admit_into(&mut self, sid: usize, ev: &E, hash: u64, pos: Option<Position>) -> Admission {
        let cap = self.buffer_per_session;
        let lane = if ev.delta() { DELTAS } else { FACTS };
        let s = &mut self.slots[sid];
        if s.holds::<E>(hash, ev.dedupe_key()) {
            return Admission::Duplicate;
        }
        let before = s.heap();

        let key = match pos {
            Some(p) => Key::at(p),
            None => Key::foreign(s.high, s.foreign_n + 1),
        };
        // Common case first: above everything held (every foreign Event lands here).
        let l = &s.lanes[lane];
        let mut idx = match l.ring.back() {
            None => 0,
            Some(last) if last.key < key => l.ring.len(),
            Some(_) => match l.ring.binary_search_by(|e| e.key.cmp(&key)) {
                // AEP-0001 §7 #2: two Events at one position of one stream; keep the first.
                Ok(_) => return Admission::Conflict,
                // Backfill (AEP-0001 §7 #2): in place.
                Err(i) => i,
            },
        };
        if s.lanes[1 - lane]
            .ring
            .back()
            .is_some_and(|last| last.key >= key)
            && s.has_key(key)
        {
            return Admission::Conflict;
        }

        if s.len() >= cap {
            let victim = if s.lanes[DELTAS].ring.is_empty() {
                FACTS
            } else {
                DELTAS
            };
            if (lane == DELTAS && victim == FACTS) || (lane == victim && idx == 0) {
                // It would be the Event evicted (a `debug` Event among facts only, or one
                // ordered below everything its lane holds), so it is evicted on arrival.
                // A resume from below it must still learn it missed a fact.
                let l = &mut s.lanes[lane];
                l.evicted_high = l.evicted_high.max(Some(key));
                self.evictions.ring += 1;
                return Admission::NotBuffered;
            }
            if let Some(len) = s.evict_front(victim, &mut self.spare) {
                self.bytes -= len;
                self.events -= 1;
                self.deltas -= usize::from(victim == DELTAS);
                self.evictions.ring += 1;
                if victim == lane {
                    idx -= 1;
                }
                s.lanes[victim].shrink();
            }
        }

        match pos {
            Some(p) => {
                if Some(p) > s.high {
                    // The newest position: its `agent` is the stream's (kept only when
                    // it changes, which it rarely does).
                    let agent = ev.agent();
                    if s.agent.as_deref() != agent {
                        s.agent = agent.map(Into::into);
                    }
                    s.high = Some(p);
                }
            }
            None => s.foreign_n += 1,
        }
        let ring = &mut s.lanes[lane].ring;
        if ring.len() == ring.capacity() {
            // Double, but never past the bound.
            let want = (ring.capacity() * 2).max(4).min(cap);
            ring.reserve_exact(want.saturating_sub(ring.len()).max(1));
        }
        let bytes = ev.bytes();
        let len = bytes.len();
        let (chunk, off) = s.lanes[lane].arena.keep(bytes, cap, &mut self.spare);
        let entry = Entry {
            key,
            hash: hash as u32,
            chunk,
            off,
            len: len as u32,
        };
        s.insert(lane, idx, entry);
        s.bytes += len;
        let serial = s.serial;
        self.heap = self.heap + s.heap() - before;
        self.bytes += len;
        self.events += 1;
        self.deltas += usize::from(lane == DELTAS);
        self.placed.push(StreamId { slot: sid, serial });
        self.touch(sid);
        Admission::Admitted
    }

    /// Whether an Event with `ev`'s `(source, id)` is held where `ev` would go (its owning
    /// stream; for a foreign Event, any stream of its name), so that admitting it would
    /// add no new Event to the store's history (AEP-0001 §7 #4). Read-only; the durable
    /// history uses it so a redelivered Event is not written twice.
    pub fn holds(&self, ev: &E) -> bool {
        let Some(name) = ev.session() else {
            return false;
        };
        let hash = self.hasher.hash_one(ev.dedupe_key());
        let sequenced = ev.scope() == Scope::Sequenced;
        self.index.get(name).into_iter().flatten().any(|&sid| {
            let s = &self.slots[sid];
            (!sequenced || s.source.as_deref() == Some(ev.source()))
                && s.holds::<E>(hash, ev.dedupe_key())
        })
    }

    /// Number of streams held (owning and foreign-only; what `max_sessions` bounds).
    pub fn session_count(&self) -> usize {
        self.slots.len()
    }

    /// Total Events held across streams (a foreign Event held in several streams counts
    /// once per stream).
    pub fn len(&self) -> usize {
        self.events
    }

    /// Whether no Event is held.
    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// Total raw bytes of the held Events (sum of their [`Stored::bytes`] lengths).
    pub fn byte_len(&self) -> usize {
        self.bytes
    }

    /// Number of `debug` Events held.
    pub fn debug_len(&self) -> usize {
        self.deltas
    }

    /// Every held stream, least-recently-written first (the [`Store::replay_all`] order).
    pub fn sessions(&self) -> impl Iterator<Item = SessionInfo<'_>> + '_ {
        self.iter_lru().map(|(sid, s)| s.info(sid))
    }

    /// The first-created stream held under the bare name `name` (the only one unless
    /// several emitters share the name; [`Store::streams`] lists them all).
    pub fn session(&self, name: &str) -> Option<SessionInfo<'_>> {
        self.streams(name).next()
    }

    fn get(&self, id: StreamId) -> Option<&Session> {
        self.slots.get(id.slot).filter(|s| s.serial == id.serial)
    }

    fn iter_lru(&self) -> impl Iterator<Item = (usize, &Session)> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let sid = at;
            let s = &self.slots[at];
            at = s.next;
            Some((sid, s))
        })
    }

    /// Creates an empty stream at the most-recent end, first evicting the
    /// least-recently-written stream when at `max_sessions`.
    /// A stream of the same `(name, source)` evicted earlier passes on its record: the
    /// new stream owes a resume from before it `replay-exhausted`.
    fn create(&mut self, name: &str, source: Option<&str>) -> usize {
        if self.slots.len() >= self.max_sessions && self.head != NIL {
            let n = self.evict_session(self.head);
            self.evictions.sessions += n as u64;
        }
        self.serial += 1;
        let mut session = Session::new(name, source, self.serial);
        session.lanes[FACTS].evicted_high = self.records.take(name, source);
        self.heap += session.heap();
        let sid = self.slots.insert(session);
        match self.index.get_mut(name) {
            Some(named) => named.push(sid),
            None => {
                self.index.insert(name.into(), smallvec![sid]);
            }
        }
        self.link_tail(sid);
        sid
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
}

#[cfg(test)]
mod tests;
