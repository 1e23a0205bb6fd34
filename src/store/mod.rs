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

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::marker::PhantomData;

use bytes::{Bytes, BytesMut};
use hashbrown::HashTable;
use slab::Slab;
use smallvec::{smallvec, SmallVec};

use crate::envelope::{Event, Scope};

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
        self.attr(crate::envelope::Attr::Agent)
    }
    fn scope(&self) -> Scope {
        Event::scope(self)
    }
    fn delta(&self) -> bool {
        self.severity() == crate::envelope::Severity::Debug
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

/// An opaque place in one stream's order, returned by [`Store::replay_page`] to
/// continue a paged replay.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Cursor(Key);

/// Where a (paged) replay of one stream starts.
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
const AT: u32 = 1 << 31;

/// A `u64` as two `u32` halves, high first: the same order under the derived
/// lexicographic comparison, at 4-byte alignment (so an [`Entry`] packs to 36 bytes).
type Split = [u32; 2];

fn split(v: u64) -> Split {
    [(v >> 32) as u32, v as u32]
}

fn join([hi, lo]: Split) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

/// An Event's place in its session's total order.
///
/// - sequenced Event at `p`: `(p, AT)`;
/// - foreign Event number `n` (1-based, per session) anchored at `p`: `(p, AT + n)`;
/// - foreign Event number `n` anchored "before everything": `((0, 0), n)`, below every
///   position since `n < AT`.
///
/// The derived lexicographic order is the session order. 20 bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    epoch: Split,
    seq: Split,
    sub: u32,
}

impl Key {
    /// The key of a sequenced Event at `p`; also the replay bound "everything after `p`".
    fn at((epoch, seq): Position) -> Key {
        Key {
            epoch: split(epoch),
            seq: split(seq),
            sub: AT,
        }
    }

    /// The key of the `n`-th foreign Event of a session (`n >= 1`).
    fn foreign(anchor: Option<Position>, n: u64) -> Key {
        // 2^31 foreign Events in one stream do not happen; past that they would share
        // one key (and the later ones be refused as conflicts), never break the order.
        let n = n.min(u64::from(AT - 1)) as u32;
        match anchor {
            Some(p) => Key {
                sub: AT + n,
                ..Key::at(p)
            },
            None => Key {
                epoch: [0; 2],
                seq: [0; 2],
                sub: n,
            },
        }
    }

    /// The position this key is at (sequenced) or follows (foreign); `None` for "before
    /// everything".
    fn anchor(self) -> Option<Position> {
        (self.sub >= AT).then_some((join(self.epoch), join(self.seq)))
    }

    /// The position of a sequenced Event's key.
    fn position(self) -> Option<Position> {
        (self.sub == AT).then_some((join(self.epoch), join(self.seq)))
    }
}

/// One held Event: its place in the stream's order, its dedupe hash, and where its bytes
/// are in the stream's [`Arena`]. 36 bytes.
#[derive(Copy, Clone)]
struct Entry {
    key: Key,
    /// The low half of the keyed hash of the Event's `(source, id)` ([`Store::hasher`]):
    /// its slot in the stream's dedupe table ([`table_hash`]), found again at eviction
    /// without reading the (long cold) Event's bytes.
    hash: u32,
    /// The arena chunk holding its bytes (numbered as [`Arena::first`] counts).
    chunk: u32,
    /// Its bytes' offset in that chunk, and their length.
    off: u32,
    len: u32,
}

/// The dedupe table's hash of an entry with hash `h` (the low half of the keyed hash):
/// spread over 64 bits, as the table picks buckets from the low bits and tags from the
/// high ones.
fn table_hash(h: u32) -> u64 {
    u64::from(h).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Where a stream keeps the bytes of its held Events: chunks filled one after another,
/// each Event a run of bytes in one chunk. A chunk is given back as soon as the last
/// Event in it is evicted (to the store's few spare chunks, [`Spare`], or freed); a
/// stream's Events leave in order, so what a stream retains is its held Events' bytes
/// plus the unfilled rest of its newest chunk (and the unused end of each full chunk,
/// less than one Event).
///
/// Chunks start at 1 KiB (or the Event's size) and double up to [`Arena::MAX_CHUNK`]
/// (or 16 Events' worth, when Events are larger), but never past 1/32 of what the
/// stream may hold (`buffer_per_session` Events of this size): a stream of a few Events
/// costs little, a long one allocates at most once per 16 KiB (never, in steady churn,
/// when evicted chunks are reused), and the slack a stream keeps stays a small share of
/// it.
#[derive(Clone, Default)]
struct Arena {
    /// `chunks[i]` is chunk number `first + i` (wrapping), with the count of held Events
    /// in it; `None` once given back. The last one is being filled.
    chunks: VecDeque<(Option<BytesMut>, u32)>,
    /// The number of `chunks[0]`.
    first: u32,
    /// Capacity of the newest chunk (the next one doubles it).
    chunk: usize,
    /// Sum of the capacities of the chunks held (what [`Store::memory_bytes`] counts).
    held: usize,
}

/// Chunks given back by the streams' arenas, reused for new chunks so that steady
/// churn allocates nothing: at most [`Arena::SPARE`] of them, store-wide.
type Spare = Vec<BytesMut>;

impl Arena {
    const MIN_CHUNK: usize = 1 << 10;
    const MAX_CHUNK: usize = 16 << 10;
    const SPARE: usize = 8;

    /// Copies `bytes` into the arena of a stream holding at most `bound` Events; returns
    /// `(chunk, offset)`.
    fn keep(&mut self, bytes: &[u8], bound: usize, spare: &mut Spare) -> (u32, u32) {
        let room = match self.chunks.back() {
            Some((Some(open), _)) => open.capacity() - open.len(),
            _ => 0,
        };
        if room < bytes.len() {
            if let Some((last, 0)) = self.chunks.back_mut() {
                // Full, and its Events already evicted.
                self.held -= give_back(last.take(), spare);
            }
            let max = Self::MAX_CHUNK
                .max(16 * bytes.len())
                .min(bound.saturating_mul(bytes.len()) / 32)
                .max(Self::MIN_CHUNK);
            self.chunk = (self.chunk * 2)
                .clamp(Self::MIN_CHUNK, max)
                .max(bytes.len());
            // A spare chunk of about the size wanted (a larger one would be slack).
            let fits = |c: &BytesMut| (self.chunk..=2 * self.chunk).contains(&c.capacity());
            let fresh = match spare.iter().position(fits) {
                Some(i) => spare.swap_remove(i),
                None => BytesMut::with_capacity(self.chunk),
            };
            self.held += fresh.capacity();
            self.chunks.push_back((Some(fresh), 0));
            self.release();
        }
        let n = self.chunks.len() - 1;
        let number = self.first.wrapping_add(n as u32);
        let (Some(open), live) = &mut self.chunks[n] else {
            unreachable!("the newest chunk is being filled");
        };
        let off = open.len() as u32;
        open.extend_from_slice(bytes);
        *live += 1;
        (number, off)
    }

    /// The bytes of entry `e`.
    fn read(&self, e: &Entry) -> &[u8] {
        let (s, len) = (e.off as usize, e.len as usize);
        match self.chunks.get(e.chunk.wrapping_sub(self.first) as usize) {
            Some((Some(b), _)) => b.get(s..s + len).unwrap_or_default(),
            _ => &[],
        }
    }

    /// A copy of entry `e`'s bytes, for reading the Event back (a replay).
    fn bytes(&self, e: &Entry) -> Bytes {
        Bytes::copy_from_slice(self.read(e))
    }

    /// Forgets entry `e`'s bytes; gives its chunk back when it held the chunk's last
    /// Event and is full.
    fn release_entry(&mut self, e: &Entry, spare: &mut Spare) {
        let i = e.chunk.wrapping_sub(self.first) as usize;
        let newest = i + 1 == self.chunks.len();
        if let Some((chunk, live)) = self.chunks.get_mut(i) {
            *live = live.saturating_sub(1);
            if *live == 0 && !newest {
                self.held -= give_back(chunk.take(), spare);
            }
        }
        self.release();
    }

    /// Drops the given-back chunks' slots at the front.
    fn release(&mut self) {
        while let Some((None, _)) = self.chunks.front() {
            self.chunks.pop_front();
            self.first = self.first.wrapping_add(1);
        }
    }

    /// Chunk slots kept (given-back ones included), for the compaction rule.
    fn slots(&self) -> usize {
        self.chunks.len()
    }
}

/// Keeps `chunk` (emptied) among the store's spare chunks while there is room, or frees
/// it. Returns its capacity (0 for `None`).
fn give_back(chunk: Option<BytesMut>, spare: &mut Spare) -> usize {
    let Some(mut c) = chunk else {
        return 0;
    };
    let cap = c.capacity();
    if spare.len() < Arena::SPARE && cap <= 4 * Arena::MAX_CHUNK {
        c.clear();
        spare.push(c);
    }
    cap
}

/// A stream's dedupe table: exactly its held Events, by `(source, id)`, each as its
/// place in the ring counted from the stream's `base` (4 bytes a slot), found by the
/// entry's [`Entry::hash`]. An entry's key is compared only when the full 64-bit keyed
/// hashes are equal, by reading the held Event back ([`Stored::reread`]): a duplicate,
/// or a collision an emitter cannot aim for.
type DedupeTable = HashTable<u32>;

/// Sentinel for the LRU list links.
const NIL: usize = usize::MAX;

/// The lane of a stream that holds its durable facts: every Event of severity `info` or
/// above, and every foreign Event that is not `debug` (AEP-0007 §5 item 2).
const FACTS: usize = 0;
/// The lane of a stream that holds its `debug` Events: the live view, evicted first
/// (AEP-0007 §5 item 1).
const DELTAS: usize = 1;

/// The top bit of a dedupe-table value: which lane the entry is in.
const LANE_BIT: u32 = 1 << 31;
/// The bits of a dedupe-table value that count places within a lane.
const PLACE: u32 = LANE_BIT - 1;

/// One lane of a stream: its Events of one class ([`FACTS`] or [`DELTAS`]), in key
/// order, and their bytes. A lane evicts oldest-first, so its arena gives chunks back in
/// order and `evicted_high` is exact for it.
#[derive(Clone, Default)]
struct Lane {
    /// Held Events, strictly increasing by key.
    ring: VecDeque<Entry>,
    /// The place of `ring[0]` in the count the dedupe table uses (wrapping in 31 bits).
    base: u32,
    /// The held Events' bytes.
    arena: Arena,
    /// Highest key ever evicted from this lane (or dropped on arrival to it). Every key
    /// held in the lane is above it.
    evicted_high: Option<Key>,
}

impl Lane {
    /// Lowest held sequenced position.
    fn earliest(&self) -> Option<Position> {
        self.ring.iter().find_map(|e| e.key.position())
    }

    /// Highest held sequenced position.
    fn latest(&self) -> Option<Position> {
        self.ring.iter().rev().find_map(|e| e.key.position())
    }

    /// The ring index of the first entry ordered after `bound`.
    fn after(&self, bound: Key) -> usize {
        self.ring.partition_point(|e| e.key <= bound)
    }

    /// Gives back most of the ring's room once it holds under a quarter of it (a lane
    /// that emptied, as a deltas lane does once facts fill its stream, keeps no room
    /// for Events it no longer holds). Amortised O(1) per eviction.
    fn shrink(&mut self) {
        let (len, cap) = (self.ring.len(), self.ring.capacity());
        if cap > 16 && len * 4 < cap {
            self.ring.shrink_to(len * 2);
        }
    }

    /// Heap bytes the lane holds: its ring's capacity and its arena's chunks.
    fn heap(&self) -> usize {
        self.ring.capacity() * std::mem::size_of::<Entry>() + self.arena.held
    }
}

/// The entries of a stream's two lanes from given ring indexes, merged into the stream's
/// order (keys are unique across lanes, so the merge is exact). Yields `(lane, entry)`.
struct Merged<'a> {
    facts: std::iter::Peekable<std::collections::vec_deque::Iter<'a, Entry>>,
    deltas: std::iter::Peekable<std::collections::vec_deque::Iter<'a, Entry>>,
}

impl<'a> Iterator for Merged<'a> {
    type Item = (usize, &'a Entry);

    fn next(&mut self) -> Option<(usize, &'a Entry)> {
        let facts_first = match (self.facts.peek(), self.deltas.peek()) {
            (Some(f), Some(d)) => f.key < d.key,
            (f, _) => f.is_some(),
        };
        if facts_first {
            self.facts.next().map(|e| (FACTS, e))
        } else {
            self.deltas.next().map(|e| (DELTAS, e))
        }
    }
}

/// One stream's buffer: an owning stream `(source, session)` or a foreign-only one.
#[derive(Clone)]
struct Session {
    name: Box<str>,
    /// The owning emitter's `source` (AEP-0001 §5.2); `None` for a foreign-only stream.
    source: Option<Box<str>>,
    /// `agent` of the highest-placed sequenced Event admitted (AEP-0001 §5.1 #7).
    agent: Option<Box<str>>,
    /// Distinguishes this stream from earlier ones in the same slot ([`StreamId`]).
    serial: u64,
    /// The stream's durable facts and its `debug` Events ([`FACTS`], [`DELTAS`]).
    lanes: [Lane; 2],
    /// Exactly the held Events, by `(source, id)`: each value is the entry's lane
    /// ([`LANE_BIT`]) and its place in that lane.
    ids: DedupeTable,
    /// Highest position ever admitted (held or since evicted): the anchor of the next
    /// foreign Event.
    high: Option<Position>,
    /// Foreign Events admitted so far (the next one is `foreign_n + 1`).
    foreign_n: u64,
    /// Sum of the held Events' byte lengths.
    bytes: usize,
    /// Neighbours in the LRU list (towards least / most recently written).
    prev: usize,
    next: usize,
}

impl Session {
    fn new(name: &str, source: Option<&str>, serial: u64) -> Session {
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
    fn len(&self) -> usize {
        self.lanes[FACTS].ring.len() + self.lanes[DELTAS].ring.len()
    }

    /// Heap bytes the stream holds: its lanes, its dedupe table (a 4-byte slot and a
    /// control byte per bucket), its names, and the fixed cost of its struct and slots.
    fn heap(&self) -> usize {
        self.lanes[FACTS].heap()
            + self.lanes[DELTAS].heap()
            + self.ids.capacity() * 5
            + self.name.len() * 2
            + self.source.as_deref().map_or(0, str::len)
            + self.agent.as_deref().map_or(0, str::len)
            + STREAM_COST
    }

    /// The dedupe-table value of `lanes[lane].ring[i]`.
    fn place(&self, lane: usize, i: usize) -> u32 {
        let n = self.lanes[lane].base.wrapping_add(i as u32) & PLACE;
        if lane == DELTAS {
            n | LANE_BIT
        } else {
            n
        }
    }

    /// The `(lane, ring index)` a dedupe-table value names.
    fn index(&self, place: u32) -> (usize, usize) {
        let lane = if place & LANE_BIT == 0 { FACTS } else { DELTAS };
        let i = (place & PLACE).wrapping_sub(self.lanes[lane].base) & PLACE;
        (lane, i as usize)
    }

    /// Whether an Event with dedupe hash `hash` (the full keyed hash) and key `key` is
    /// held.
    fn holds<E: Stored>(&self, hash: u64, key: (&str, &str)) -> bool {
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
    fn reread<E: Stored>(&self, lane: usize, e: &Entry) -> Option<E> {
        E::reread(self.lanes[lane].arena.bytes(e))
    }

    /// Whether some held Event of either lane has key `key`.
    fn has_key(&self, key: Key) -> bool {
        self.lanes.iter().any(|l| {
            l.ring.back().is_some_and(|last| last.key >= key)
                && l.ring.binary_search_by(|e| e.key.cmp(&key)).is_ok()
        })
    }

    /// Evicts the front (lowest key) of `lane`: forgets its dedupe slot and its bytes,
    /// and raises the lane's `evicted_high` to it. Returns its byte length.
    fn evict_front(&mut self, lane: usize, spare: &mut Spare) -> Option<usize> {
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
    fn insert(&mut self, lane: usize, idx: usize, entry: Entry) {
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
    fn merged(&self, bound: Option<Key>) -> Merged<'_> {
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
    fn marker_after(&self, bound: Key, after: Position) -> Option<Position> {
        match self.lanes[FACTS].evicted_high {
            Some(h) if bound < h => Some(self.exhausted_earliest(h, after)),
            _ => None,
        }
    }

    fn info(&self, slot: usize) -> SessionInfo<'_> {
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

/// A `replay-exhausted` marker due for one stream (AEP-0003 §5, §3.3 #3), from
/// [`Store::replay_after`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Exhausted {
    /// The stream that no longer reaches back to the requested position.
    pub stream: StreamId,
    /// Its earliest held position (what the marker names).
    pub earliest: Position,
}

/// The slots of the streams held under one bare name, in creation order.
type Named = SmallVec<[usize; 1]>;

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
struct Records {
    cap: usize,
    /// Name → `(source, key, stamp)` per evicted stream of that name.
    by_name: HashMap<Box<str>, SmallVec<[Record; 1]>>,
    /// Stamp → name, oldest first.
    order: std::collections::BTreeMap<u64, Box<str>>,
    stamp: u64,
    /// Heap bytes the records hold (counted in [`Store::memory_bytes`]).
    bytes: usize,
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
    fn take(&mut self, name: &str, source: Option<&str>) -> Option<Key> {
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

    fn len(&self) -> usize {
        self.order.len()
    }
}

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

/// Eviction records kept per stream the store may hold ([`Store::lost`]), and at least
/// [`MIN_RECORDS`].
pub const RECORDS_PER_STREAM: usize = 4;
/// The fewest eviction records a store keeps room for.
pub const MIN_RECORDS: usize = 1024;

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

    /// Replays every stream of the bare name `session` for a consumer resuming from
    /// `after` (AEP-0001 §7 #6: a resume position names a bare session; AEP-0003 §7:
    /// "delivers strictly after that position"): for each stream of that name in creation
    /// order, calls `out` for every held Event ordered after `after` in that stream, in
    /// stream order ([`Store::replay_stream_after`]).
    ///
    /// Returns one [`Exhausted`] per stream that is owed a `replay-exhausted` marker, in
    /// the same order; empty when none is, including when `session` is not held (never
    /// seen, or wholly evicted: the caller decides what an unknown session means for its
    /// binding).
    pub fn replay_after(
        &self,
        session: &str,
        after: Position,
        out: &mut impl FnMut(E),
    ) -> Vec<Exhausted> {
        let mut markers = Vec::new();
        for stream in self.streams(session) {
            if let Some(earliest) = self.replay_stream_after(stream.id, after, out) {
                markers.push(Exhausted {
                    stream: stream.id,
                    earliest,
                });
            }
        }
        markers
    }

    /// Replays one stream for a consumer resuming from `after`: calls `out` for every
    /// held Event of it ordered after `after`, in stream order.
    ///
    /// Foreign Events anchored **at** `after` are included: they arrived after `after`
    /// was the stream's high-water, and a consumer that last saw `after` may or may not
    /// have seen them; delivery is at-least-once (AEP-0001 §7 #4), so they are redelivered
    /// rather than risk a loss.
    ///
    /// Returns `Some(earliest)` when a `replay-exhausted` marker is due (AEP-0003 §5,
    /// §3.3 #3): something this replay would have delivered was evicted, i.e. an evicted
    /// sequenced Event at a position `> after` or an evicted foreign Event anchored at or
    /// after `after`. Then every held Event is delivered (all are above what was
    /// evicted), and `earliest` is the lowest held `(epoch, seq)`, or, when the stream
    /// holds only foreign Events, the position they are anchored to. `None` otherwise,
    /// including when the stream is no longer held.
    pub fn replay_stream_after(
        &self,
        stream: StreamId,
        after: Position,
        out: &mut impl FnMut(E),
    ) -> Option<Position> {
        let s = self.get(stream)?;
        let bound = Key::at(after);
        for ev in s
            .merged(Some(bound))
            .filter_map(|(l, e)| s.reread::<E>(l, e))
        {
            out(ev);
        }
        s.marker_after(bound, after)
    }

    /// Replays one page of one stream: at most `max` held Events strictly after `from`,
    /// in stream order, each handed to `out`; the page ends early after an Event for
    /// which `out` returns `false` (the consumer's byte budget is spent). Paging lets a
    /// consumer's replay advance only as fast as it reads (bounded memory per consumer
    /// however large the store is).
    ///
    /// - [`ReplayFrom::After`] behaves like [`Store::replay_stream_after`] for its first
    ///   page.
    /// - [`ReplayFrom::Start`] starts at the earliest held Event, with no marker.
    /// - [`ReplayFrom::Cursor`] continues a previous page. Its marker is `Some` when Events
    ///   after the cursor were evicted between pages (the consumer fell behind the ring),
    ///   so even a paged replay never hides a gap.
    ///
    /// Returns `None` when the stream is not held, otherwise the [`Page`]: the marker (as
    /// for [`Store::replay_stream_after`]) and the cursor to continue from (`None` when
    /// the page reached the stream's newest Event).
    pub fn replay_page(
        &self,
        stream: StreamId,
        from: ReplayFrom,
        max: usize,
        out: &mut impl FnMut(E) -> bool,
    ) -> Option<Page> {
        let s = self.get(stream)?;
        let (bound, marker) = match from {
            ReplayFrom::Start => (None, None),
            ReplayFrom::After(after) => {
                let bound = Key::at(after);
                (Some(bound), s.marker_after(bound, after))
            }
            ReplayFrom::Cursor(Cursor(bound)) => (
                Some(bound),
                s.marker_after(bound, bound.anchor().unwrap_or((0, 0))),
            ),
        };
        let mut entries = s.merged(bound);
        let mut last = None;
        let mut taken = 0;
        while taken < max {
            let Some((l, e)) = entries.next() else {
                break;
            };
            last = Some(e.key);
            taken += 1;
            if s.reread::<E>(l, e).is_some_and(|ev| !out(ev)) {
                break;
            }
        }
        let next = match entries.next() {
            Some(_) => last.map(Cursor),
            None => None,
        };
        Some(Page { marker, next })
    }

    /// Every held stream, in the [`Store::replay_all`] order (least-recently-written
    /// first).
    pub fn stream_ids(&self) -> Vec<StreamId> {
        self.iter_lru()
            .map(|(slot, s)| StreamId {
                slot,
                serial: s.serial,
            })
            .collect()
    }

    /// The streams held under the bare name `session`, in creation order: its owning
    /// streams, or its foreign-only stream. Empty when the name is not held.
    pub fn streams(&self, session: &str) -> impl Iterator<Item = SessionInfo<'_>> + '_ {
        self.index
            .get(session)
            .into_iter()
            .flatten()
            .map(|&sid| self.slots[sid].info(sid))
    }

    /// The owning stream `(source, session)`, when held.
    pub fn find(&self, source: &str, session: &str) -> Option<StreamId> {
        self.streams(session)
            .find(|s| s.source == Some(source))
            .map(|s| s.id)
    }

    /// One held stream's metrics view; `None` once it is no longer held.
    pub fn stream(&self, id: StreamId) -> Option<SessionInfo<'_>> {
        self.get(id).map(|s| s.info(id.slot))
    }

    /// Replays everything held under the bare name `session`, each stream from its
    /// earliest held Event, streams in creation order, with no marker (the request names
    /// no position). Returns the number of Events delivered (0 when the name is not held).
    pub fn replay_session_from_start(&self, session: &str, out: &mut impl FnMut(E)) -> usize {
        let mut n = 0;
        for &sid in self.index.get(session).into_iter().flatten() {
            let s = &self.slots[sid];
            for ev in s.merged(None).filter_map(|(l, e)| s.reread::<E>(l, e)) {
                out(ev);
            }
            n += s.len();
        }
        n
    }

    /// Replay-all (AEP-0003 §5, `from: "all"`): every held stream from its earliest held
    /// Event, no `replay-exhausted` (honesty rule 2). Streams come
    /// **least-recently-written first**, so the most recently active stream is replayed
    /// last, next to the live tail that follows; within a stream, stream order. Wholly
    /// evicted streams are absent (honesty rule 1). A foreign Event held in several
    /// streams of one name comes once per stream. Returns the number of Events delivered.
    pub fn replay_all(&self, out: &mut impl FnMut(E)) -> usize {
        let mut n = 0;
        for (_, s) in self.iter_lru() {
            for ev in s.merged(None).filter_map(|(l, e)| s.reread::<E>(l, e)) {
                out(ev);
            }
            n += s.len();
        }
        n
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

    /// Evicts stream `sid` whole, leaving a record of the highest durable fact it held
    /// or had evicted ([`Records`]); returns the number of Events it held.
    fn evict_session(&mut self, sid: usize) -> usize {
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

    /// Number of `debug` Events held.
    pub fn debug_len(&self) -> usize {
        self.deltas
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
        let mut deltas = 0;
        let mut heap = 0;
        let mut bytes = 0;
        let mut seen = 0;
        let mut prev = NIL;
        let mut at = self.head;
        while at != NIL {
            let s = &self.slots[at];
            assert_eq!(s.prev, prev, "LRU back link");
            let named = self.index.get(&s.name).expect("index");
            assert_eq!(
                named.iter().filter(|&&x| x == at).count(),
                1,
                "indexed once"
            );
            assert!(s.len() > 0, "held streams are non-empty");
            assert!(s.len() <= self.buffer_per_session, "ring bound");
            assert_eq!(s.ids.len(), s.len(), "dedupe set mirrors the lanes");
            let mut all = Vec::new();
            for (lane, l) in s.lanes.iter().enumerate() {
                assert!(
                    l.ring.capacity() <= self.buffer_per_session.max(4) * 2,
                    "ring capacity"
                );
                for w in l.ring.iter().collect::<Vec<_>>().windows(2) {
                    assert!(w[0].key < w[1].key, "strict order");
                }
                for (i, e) in l.ring.iter().enumerate() {
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
            deltas += s.lanes[DELTAS].ring.len();
            heap += s.heap();
            events += s.len();
            bytes += b;
            seen += 1;
            prev = at;
            at = s.next;
        }
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
            let distinct: std::collections::HashSet<_> = sources.iter().collect();
            assert_eq!(
                distinct.len(),
                sources.len(),
                "one stream per (source, session)"
            );
            let serials: Vec<_> = named.iter().map(|&sid| self.slots[sid].serial).collect();
            assert!(serials.windows(2).all(|w| w[0] < w[1]), "creation order");
        }
        assert_eq!(self.tail, prev, "LRU tail");
        assert_eq!(seen, self.slots.len(), "every stream linked");
        let indexed: usize = self.index.values().map(|v| v.len()).sum();
        assert_eq!(indexed, self.slots.len(), "index size");
        assert!(self.slots.len() <= self.max_sessions, "stream bound");
        assert_eq!(events, self.events, "event total");
        assert_eq!(deltas, self.deltas, "debug total");
        assert_eq!(heap, self.heap, "heap total");
        assert_eq!(bytes, self.bytes, "byte total");
        assert!(self.records.len() <= self.records.cap, "record bound");
        let recorded: usize = self.records.by_name.values().map(|v| v.len()).sum();
        assert_eq!(recorded, self.records.len(), "records indexed once");
    }
}

#[cfg(test)]
mod tests;
