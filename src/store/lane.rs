//! One lane of a stream's buffer and what it is made of: the order key ([`Key`]), the
//! ring entry ([`Entry`]), the arena holding the Events' bytes ([`Arena`]) with the
//! store's spare chunks, and the merge of a stream's two lanes into one order
//! ([`Merged`]). Its own file because it is the store's lowest layer: it knows nothing of
//! streams, names or eviction policy.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::Position;
// Named by doc links only.
#[cfg(doc)]
use super::Store;

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
pub(super) struct Key {
    epoch: Split,
    seq: Split,
    sub: u32,
}

impl Key {
    /// The key of a sequenced Event at `p`; also the replay bound "everything after `p`".
    pub(super) fn at((epoch, seq): Position) -> Key {
        Key {
            epoch: split(epoch),
            seq: split(seq),
            sub: AT,
        }
    }

    /// The key of the `n`-th foreign Event of a session (`n >= 1`).
    pub(super) fn foreign(anchor: Option<Position>, n: u64) -> Key {
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
    pub(super) fn anchor(self) -> Option<Position> {
        (self.sub >= AT).then_some((join(self.epoch), join(self.seq)))
    }

    /// The position of a sequenced Event's key.
    pub(super) fn position(self) -> Option<Position> {
        (self.sub == AT).then_some((join(self.epoch), join(self.seq)))
    }
}

/// One held Event: its place in the stream's order, its dedupe hash, and where its bytes
/// are in the stream's [`Arena`]. 36 bytes.
#[derive(Copy, Clone)]
pub(super) struct Entry {
    pub(super) key: Key,
    /// The low half of the keyed hash of the Event's `(source, id)` ([`Store::hasher`]):
    /// its slot in the stream's dedupe table ([`table_hash`]), found again at eviction
    /// without reading the (long cold) Event's bytes.
    pub(super) hash: u32,
    /// The arena chunk holding its bytes (numbered as [`Arena::first`] counts).
    pub(super) chunk: u32,
    /// Its bytes' offset in that chunk, and their length.
    pub(super) off: u32,
    pub(super) len: u32,
}

/// The dedupe table's hash of an entry with hash `h` (the low half of the keyed hash):
/// spread over 64 bits, as the table picks buckets from the low bits and tags from the
/// high ones.
pub(super) fn table_hash(h: u32) -> u64 {
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
pub(super) struct Arena {
    /// `chunks[i]` is chunk number `first + i` (wrapping), with the count of held Events
    /// in it; `None` once given back. The last one is being filled.
    pub(super) chunks: VecDeque<(Option<BytesMut>, u32)>,
    /// The number of `chunks[0]`.
    pub(super) first: u32,
    /// Capacity of the newest chunk (the next one doubles it).
    chunk: usize,
    /// Sum of the capacities of the chunks held (what [`Store::memory_bytes`] counts).
    pub(super) held: usize,
}

/// Chunks given back by the streams' arenas, reused for new chunks so that steady
/// churn allocates nothing: at most [`Arena::SPARE`] of them, store-wide.
pub(super) type Spare = Vec<BytesMut>;

impl Arena {
    const MIN_CHUNK: usize = 1 << 10;
    const MAX_CHUNK: usize = 16 << 10;
    const SPARE: usize = 8;

    /// Copies `bytes` into the arena of a stream holding at most `bound` Events; returns
    /// `(chunk, offset)`.
    pub(super) fn keep(&mut self, bytes: &[u8], bound: usize, spare: &mut Spare) -> (u32, u32) {
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
    pub(super) fn bytes(&self, e: &Entry) -> Bytes {
        Bytes::copy_from_slice(self.read(e))
    }

    /// Forgets entry `e`'s bytes; gives its chunk back when it held the chunk's last
    /// Event and is full.
    pub(super) fn release_entry(&mut self, e: &Entry, spare: &mut Spare) {
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
    pub(super) fn slots(&self) -> usize {
        self.chunks.len()
    }
}

/// Keeps `chunk` (emptied) among the store's spare chunks while there is room, or frees
/// it. Returns its capacity (0 for `None`).
pub(super) fn give_back(chunk: Option<BytesMut>, spare: &mut Spare) -> usize {
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

/// The lane of a stream that holds its durable facts: every Event of severity `info` or
/// above, and every foreign Event that is not `debug` (AEP-0007 §5 item 2).
pub(super) const FACTS: usize = 0;
/// The lane of a stream that holds its `debug` Events: the live view, evicted first
/// (AEP-0007 §5 item 1).
pub(super) const DELTAS: usize = 1;

/// The top bit of a dedupe-table value: which lane the entry is in.
pub(super) const LANE_BIT: u32 = 1 << 31;
/// The bits of a dedupe-table value that count places within a lane.
pub(super) const PLACE: u32 = LANE_BIT - 1;

/// One lane of a stream: its Events of one class ([`FACTS`] or [`DELTAS`]), in key
/// order, and their bytes. A lane evicts oldest-first, so its arena gives chunks back in
/// order and `evicted_high` is exact for it.
#[derive(Clone, Default)]
pub(super) struct Lane {
    /// Held Events, strictly increasing by key.
    pub(super) ring: VecDeque<Entry>,
    /// The place of `ring[0]` in the count the dedupe table uses (wrapping in 31 bits).
    pub(super) base: u32,
    /// The held Events' bytes.
    pub(super) arena: Arena,
    /// Highest key ever evicted from this lane (or dropped on arrival to it). Every key
    /// held in the lane is above it.
    pub(super) evicted_high: Option<Key>,
}

impl Lane {
    /// Lowest held sequenced position.
    pub(super) fn earliest(&self) -> Option<Position> {
        self.ring.iter().find_map(|e| e.key.position())
    }

    /// Highest held sequenced position.
    pub(super) fn latest(&self) -> Option<Position> {
        self.ring.iter().rev().find_map(|e| e.key.position())
    }

    /// The ring index of the first entry ordered after `bound`.
    pub(super) fn after(&self, bound: Key) -> usize {
        self.ring.partition_point(|e| e.key <= bound)
    }

    /// Gives back most of the ring's room once it holds under a quarter of it (a lane
    /// that emptied, as a deltas lane does once facts fill its stream, keeps no room
    /// for Events it no longer holds). Amortised O(1) per eviction.
    pub(super) fn shrink(&mut self) {
        let (len, cap) = (self.ring.len(), self.ring.capacity());
        if cap > 16 && len * 4 < cap {
            self.ring.shrink_to(len * 2);
        }
    }

    /// Heap bytes the lane holds: its ring's capacity and its arena's chunks.
    pub(super) fn heap(&self) -> usize {
        self.ring.capacity() * std::mem::size_of::<Entry>() + self.arena.held
    }
}

/// The entries of a stream's two lanes from given ring indexes, merged into the stream's
/// order (keys are unique across lanes, so the merge is exact). Yields `(lane, entry)`.
pub(super) struct Merged<'a> {
    pub(super) facts: std::iter::Peekable<std::collections::vec_deque::Iter<'a, Entry>>,
    pub(super) deltas: std::iter::Peekable<std::collections::vec_deque::Iter<'a, Entry>>,
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
