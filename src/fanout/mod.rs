//! Fan-out's building blocks: subscriptions, the index that finds the ones an Event
//! matches ([`index`]), and the shared wire frames of an ingest unit (AEP-0003 §6, §8.4).
//! None of it knows a connection: the delivery of frames into connection queues, which
//! walks the core's connections, is the core's hub (`core::hub`).
//!
//! Per Event, each wire frame (SSE message, WS text frame) is built at most once per
//! capture level and shared by every subscriber: fan-out to N subscribers is never N
//! copies and never N serializations.
//!
//! **Coalescing.** The frames of one *ingest unit* (an NDJSON body, the WebSocket
//! messages read in one wake, a JSONL chunk) are laid out back to back in one buffer per
//! binding and capture level (an *arena*, held by the crate-private `Unit`). A connection
//! that takes a run of consecutive frames of an arena gets one reference-counted slice
//! for the whole run (a `Run`, queued by the core's hub), so queue entries, refcounts and iovecs cost per run, not per
//! delivery, and a subscriber that matches everything gets one contiguous write per
//! batch. Filters and ceilings still select exactly: a run breaks where a subscriber's
//! selection does (a frame it does not take sits between two it does). The bytes are
//! those ingested. Nothing is held back to wait for more: a unit ends when its input is
//! consumed.
//!
//! **Compression.** A WebSocket that negotiated `permessage-deflate` (RFC 7692, with
//! `server_no_context_takeover`: `ws::deflate`) takes an Event's frame compressed, RSV1
//! set. That frame too is built at most once per Event and capture level, lazily (only
//! when a compressing target takes the Event), by the hub's one [`Deflater`], into an
//! arena of its own; every compressing subscriber gets the same bytes, by reference. An
//! Event that does not shrink (or is short, `ws::deflate::MIN_COMPRESS`) goes to them as
//! the plain frame, from the plain arena (RFC 7692 §6: compression is per message).

mod delivered;
pub mod index;

use crate::capture;
use crate::filter::Filter;
use crate::ids::ConnId;
use crate::wire::envelope::{Capture, Event};
use crate::wire::sse;
use crate::wire::ws;
use crate::wire::ws::deflate::{self, Deflater};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

pub use delivered::Delivered;

/// The binding a subscription delivers on.
#[derive(Debug)]
pub enum Binding {
    /// An SSE stream (one subscription per connection).
    Sse,
    /// One of the subscriptions multiplexed on a WebSocket (AEP-0003 §6.5), with the
    /// last position delivered per owning stream `(source, session)` for its `closing`
    /// frame (§3.5 #4).
    Ws(Delivered),
}

pub use crate::ids::SubId;

/// One live subscription.
#[derive(Debug)]
pub struct Subscription {
    /// The connection it delivers to.
    pub conn: ConnId,
    /// Its compiled filter.
    pub filter: Arc<Filter>,
    /// Its capture ceiling; `None` delivers as received.
    pub ceiling: Option<Capture>,
    /// How frames are framed.
    pub binding: Binding,
}

/// Frames of one Event, built lazily: index 0 is the Event as received, index
/// `1 + level` its down-leveled form for a ceiling of that level.
#[derive(Default)]
pub(crate) struct Frames {
    sse: [Option<Bytes>; 5],
    ws: [Option<Bytes>; 5],
    payload: [Option<Bytes>; 4],
    /// Per payload slot, what compressing it gave: [`Zip::Unknown`] until a compressing
    /// target asks, then whether the compressed frame is in the deflate arena.
    zip: [Zip; 5],
    /// Per payload slot, the payload's length, once `zip` is known (a client that
    /// limits the relay's window takes the compressed frame only up to that length).
    zip_len: [usize; 5],
    /// Where this Event's frames lie in the unit's arenas (index: [`Unit::arena`]), valid
    /// while the unit's generation is `generation`.
    placed: [Option<(usize, usize)>; ARENAS],
    generation: u64,
}

/// Whether one payload slot's compressed frame exists (see [`Frames::zip`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Zip {
    #[default]
    Unknown,
    /// It does not shrink (or is too short to try): compressing targets take the plain
    /// frame.
    Plain,
    /// Placed in the deflate arena of this slot.
    Compressed,
}

/// Arenas of a unit: one per frame kind (SSE, WS, compressed WS) and payload slot (as
/// received, or one of the four capture levels).
pub(crate) const ARENAS: usize = 15;
/// The capacity an arena starts with, and grows by at least: frames of many small
/// units share one allocation.
const ARENA_CHUNK: usize = 64 * 1024;
/// The most an empty arena reserves up front for a unit's announced size
/// (`Unit::hint`): beyond it, arenas grow by doubling as frames are placed.
const ARENA_HINT_MAX: usize = 1024 * 1024;

/// Makes room in `arena` for a frame of `need` bytes.
///
/// An empty arena (a unit's first frame) gets room for the unit's whole announced size
/// up front (`hint`, bounded by [`ARENA_HINT_MAX`]; at least [`ARENA_CHUNK`] when it
/// must find room at all), so the unit's frames are placed without growing it midway: a
/// growth copies the frames placed so far. The allocation that earlier units' frames
/// were split from is taken back when all of them were written and dropped
/// (`try_reclaim`, no allocation); otherwise a fresh one is made. It is never grown in
/// place: that would copy frames already sent. A non-empty arena doubles.
fn make_room(arena: &mut BytesMut, need: usize, hint: usize) {
    if arena.is_empty() {
        let want = need.max(hint.min(ARENA_HINT_MAX));
        crate::buf::reclaim_or_fresh(arena, want, ARENA_CHUNK.max(want));
    } else if arena.capacity() - arena.len() < need {
        arena.reserve(ARENA_CHUNK.max(need).max(arena.len()));
    }
}

/// One connection's run of consecutive frames in one arena, not yet queued.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) conn: ConnId,
    pub(crate) arena: usize,
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// Goes to the connection's replay backlog rather than its output queue.
    pub(crate) backlog: bool,
    /// Bytes queued just ahead of the run (the core's drop notice, AEP-0003 §8.4):
    /// `Unit::notices[notice - 1]`; 0 for none. A run with a notice is never extended
    /// backwards over it: it starts where the notice goes.
    pub(crate) notice: u32,
}

/// The frames of one ingest unit and the runs connections take of them (see the module
/// docs). The core's hub queues the runs when the unit ends (`Hub::end_unit`), or
/// earlier when a connection's queue must be offered to its socket.
///
/// Memory: arenas keep their spare capacity between units (an allocation of at least
/// [`ARENA_CHUNK`] bytes is made only when a frame does not fit); `runs` keeps its
/// capacity. Neither allocates per delivery.
#[derive(Debug, Default)]
pub(crate) struct Unit {
    arenas: [BytesMut; ARENAS],
    pub(crate) runs: Vec<Run>,
    /// What runs queue ahead of themselves ([`Run::notice`]); empty unless a consumer
    /// had Events dropped, so it allocates nothing otherwise.
    pub(crate) notices: Vec<Bytes>,
    /// Bumped each time the unit's runs are queued: frames placed before are no longer
    /// in the (now emptied) arenas, and a connection's `unit_generation` older than
    /// this has no open run.
    pub(crate) generation: u64,
    /// Whether a caller opened a unit (`Hub::begin_unit`); otherwise each fan-out is a
    /// unit of its own.
    pub(crate) open: bool,
    /// The bytes the unit's frames are expected to take in an arena (its Events' sizes
    /// plus framing), announced by its caller (`Hub::size_unit`); 0 when unknown.
    pub(crate) hint: usize,
}

impl Unit {
    /// Heap bytes the unit keeps: its arenas' room not yet handed out, and its runs.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.arenas.iter().map(BytesMut::capacity).sum::<usize>()
            + self.runs.capacity() * std::mem::size_of::<Run>()
    }

    fn arena(ws: bool, slot: usize) -> usize {
        usize::from(ws) * 5 + slot
    }

    /// The arena of compressed WS frames (RFC 7692) for payload `slot`.
    fn deflate_arena(slot: usize) -> usize {
        10 + slot
    }

    /// Hands every pending run, in order, to `queue` with the unit's generation, the
    /// frozen bytes of its arena (`None` when the arena is empty: its frames were dropped
    /// with a paused fan-out) and its notice, then starts a new arena generation. `queue`
    /// slices the run out of the bytes (`start..end`) into its connection's queue, after
    /// the notice.
    pub(crate) fn drain_runs(
        &mut self,
        mut queue: impl FnMut(&Run, u64, Option<&Bytes>, Option<&Bytes>),
    ) {
        // Frames placed for an Event whose fan-out paused are dropped with the arena's
        // split; only runs are queued.
        if self.runs.is_empty() {
            return;
        }
        let mut frozen: [Option<Bytes>; ARENAS] = Default::default();
        for (a, arena) in self.arenas.iter_mut().enumerate() {
            if !arena.is_empty() {
                frozen[a] = Some(arena.split().freeze());
            }
        }
        for run in self.runs.drain(..) {
            let notice = (run.notice as usize)
                .checked_sub(1)
                .and_then(|i| self.notices.get(i));
            queue(&run, self.generation, frozen[run.arena].as_ref(), notice);
        }
        self.notices.clear();
        self.generation += 1;
    }
}

impl Frames {
    /// The payload for a subscriber with `ceiling`: the original bytes unless the ceiling
    /// is below the Event's capture (AEP-0003 §6.4), then the cached down-leveled copy.
    fn payload_slot(ev: &Event, ceiling: Option<Capture>) -> usize {
        match ceiling {
            Some(c)
                if c < ev.capture()
                    || (c == Capture::Redacted && ev.capture() == Capture::Full) =>
            {
                1 + c as usize
            }
            _ => 0,
        }
    }

    fn payload(&mut self, ev: &Event, slot: usize) -> Bytes {
        if slot == 0 {
            return ev.bytes().clone();
        }
        let level = Capture::ALL[slot - 1];
        self.payload[slot - 1]
            .get_or_insert_with(|| {
                capture::downlevel(ev, level).unwrap_or_else(|| ev.bytes().clone())
            })
            .clone()
    }

    /// The SSE message for a subscriber with `ceiling`.
    pub(crate) fn sse(&mut self, ev: &Event, ceiling: Option<Capture>) -> Bytes {
        let slot = Self::payload_slot(ev, ceiling);
        if let Some(b) = &self.sse[slot] {
            return b.clone();
        }
        let payload = self.payload(ev, slot);
        let m = sse::message(ev, &payload);
        self.sse[slot] = Some(m.clone());
        m
    }

    /// The WebSocket text frame for a subscriber with `ceiling`: header and payload
    /// (the original bytes, or the down-leveled copy) in one buffer. Server frames are
    /// unmasked, so it is the same bytes for every subscriber (AEP-0003 §3.5 #2).
    pub(crate) fn ws(&mut self, ev: &Event, ceiling: Option<Capture>) -> Bytes {
        let slot = Self::payload_slot(ev, ceiling);
        if let Some(b) = &self.ws[slot] {
            return b.clone();
        }
        let payload = self.payload(ev, slot);
        let f = ws::rfc6455::text(&payload);
        self.ws[slot] = Some(f.clone());
        f
    }

    /// The WebSocket frame for a subscriber with `ceiling` on a connection with
    /// `permessage-deflate` window `window` (0: not negotiated, see `Subscriber::deflate_window`):
    /// the compressed frame (RSV1, RFC 7692 §7.2.1) when compressing pays and the
    /// message fits the window, else [`Frames::ws`]. For replay, which frames per
    /// connection; live fan-out places frames with [`Frames::place`].
    pub(crate) fn ws_for(
        &mut self,
        ev: &Event,
        ceiling: Option<Capture>,
        window: u8,
        deflater: &mut Option<Box<Deflater>>,
    ) -> Bytes {
        if window > 0 {
            let slot = Self::payload_slot(ev, ceiling);
            let payload = self.payload(ev, slot);
            if fits_window(payload.len(), window) {
                let d = deflater.get_or_insert_with(Box::default);
                if let Some(z) = d.message(&payload) {
                    let mut f = BytesMut::new();
                    deflate::write_compressed_text(z, &mut f);
                    return f.freeze();
                }
            }
        }
        self.ws(ev, ceiling)
    }

    /// Places the compressed WS frame for payload `slot` in `unit`'s deflate arena (once
    /// per Event, slot and unit generation) for a target with window `window`; `None`
    /// when that target takes the plain frame instead (it does not shrink, or does not
    /// fit the window the client allowed, RFC 7692 §7.1.2.1).
    fn place_deflated(
        &mut self,
        unit: &mut Unit,
        ev: &Event,
        slot: usize,
        window: u8,
        deflater: &mut Option<Box<Deflater>>,
    ) -> Option<(usize, usize, usize)> {
        let a = Unit::deflate_arena(slot);
        match self.zip[slot] {
            Zip::Plain => return None,
            Zip::Compressed => {
                if !fits_window(self.zip_len[slot], window) {
                    return None;
                }
                if let Some((start, end)) = self.placed[a] {
                    return Some((a, start, end));
                }
            }
            Zip::Unknown => {}
        }
        let payload = self.payload(ev, slot);
        self.zip_len[slot] = payload.len();
        if !fits_window(payload.len(), window) {
            // Another target, with a wider window, may still take it compressed.
            return None;
        }
        let d = deflater.get_or_insert_with(Box::default);
        let Some(z) = d.message(&payload) else {
            self.zip[slot] = Zip::Plain;
            return None;
        };
        let arena = &mut unit.arenas[a];
        make_room(arena, z.len() + 16, unit.hint);
        let start = arena.len();
        deflate::write_compressed_text(z, arena);
        let end = arena.len();
        self.zip[slot] = Zip::Compressed;
        self.placed[a] = Some((start, end));
        Some((a, start, end))
    }
}

/// Whether a message of `len` bytes, compressed without context, may go to a client
/// that allowed the relay a window of `window` bits: it never refers further back than
/// its own length (see `ws::deflate`).
fn fits_window(len: usize, window: u8) -> bool {
    window >= 15 || len <= 1usize << window
}

impl Frames {
    /// Places the frame for a subscriber with `ceiling` on `ws` or SSE in `unit`'s arena
    /// (once per Event, arena and unit generation); returns `(arena, start, end)`. A WS
    /// target with `deflate` (its `Subscriber::deflate_window`, 0 for none) gets the shared
    /// compressed frame when there is one for it ([`Frames::place_deflated`]).
    pub(crate) fn place(
        &mut self,
        unit: &mut Unit,
        ev: &Event,
        ws: bool,
        ceiling: Option<Capture>,
        deflate: u8,
        deflater: &mut Option<Box<Deflater>>,
    ) -> (usize, usize, usize) {
        if self.generation != unit.generation {
            self.generation = unit.generation;
            self.placed = [None; ARENAS];
        }
        let slot = Self::payload_slot(ev, ceiling);
        if ws && deflate > 0 {
            if let Some(placed) = self.place_deflated(unit, ev, slot, deflate, deflater) {
                return placed;
            }
        }
        let a = Unit::arena(ws, slot);
        if let Some((start, end)) = self.placed[a] {
            return (a, start, end);
        }
        let payload = self.payload(ev, slot);
        let arena = &mut unit.arenas[a];
        make_room(arena, payload.len() + 128, unit.hint);
        let start = arena.len();
        if ws {
            ws::rfc6455::write_text(&payload, arena);
        } else {
            sse::write_message(ev, &payload, arena);
        }
        let end = arena.len();
        self.placed[a] = Some((start, end));
        (a, start, end)
    }
}
