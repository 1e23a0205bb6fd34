//! Fan-out: subscriptions, the index that finds the ones an Event matches, and delivery
//! of shared wire frames into connection queues (AEP-0003 §6, §8.4).
//!
//! Per Event, each wire frame (SSE message, WS text frame) is built at most once per
//! capture level and shared by every subscriber: fan-out to N subscribers is never N
//! copies and never N serializations.
//!
//! **Coalescing.** The frames of one *ingest unit* (an NDJSON body, the WebSocket
//! messages read in one wake, a JSONL chunk) are laid out back to back in one buffer per
//! binding and capture level (an *arena*, held by the crate-private `Unit`). A connection
//! that takes a run of consecutive frames of an arena gets one reference-counted slice
//! for the whole run, so queue entries, refcounts and iovecs cost per run, not per
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

pub mod index;

use crate::capture;
use crate::core::conn::{Conn, OutQueue};
use crate::core::ConnId;
use crate::envelope::Scope;
use crate::envelope::{Capture, Event, Severity};
use crate::filter::Filter;
use crate::sse;
use crate::store::StreamId;
use crate::ws::deflate::{self, Deflater};
use crate::ws::{self, Delivered};
use bytes::{Bytes, BytesMut};
use index::SubscriptionIndex;
use slab::Slab;
use std::sync::Arc;

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

/// A live subscription's key in the [`Hub`]: the SSE stream's one subscription, or one
/// of a WebSocket's (AEP-0003 §6.5). Keys of removed subscriptions are reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubId(usize);

impl SubId {
    /// The slot number (for logs and metrics labels).
    pub fn index(self) -> usize {
        self.0
    }
}

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
const ARENAS: usize = 15;
/// The capacity an arena starts with, and grows by at least: frames of many small
/// units share one allocation.
const ARENA_CHUNK: usize = 64 * 1024;

/// One connection's run of consecutive frames in one arena, not yet queued.
#[derive(Debug, Clone, Copy)]
struct Run {
    conn: ConnId,
    arena: usize,
    start: usize,
    end: usize,
    /// Goes to the connection's replay backlog rather than its output queue.
    backlog: bool,
}

/// The frames of one ingest unit and the runs connections take of them (see the module
/// docs). Runs are queued when the unit ends ([`Hub::end_unit`]), or earlier when a
/// connection's queue must be offered to its socket.
///
/// Memory: arenas keep their spare capacity between units (an allocation of at least
/// [`ARENA_CHUNK`] bytes is made only when a frame does not fit); `runs` keeps its
/// capacity. Neither allocates per delivery.
#[derive(Debug, Default)]
pub(crate) struct Unit {
    arenas: [BytesMut; ARENAS],
    runs: Vec<Run>,
    /// Bumped each time the unit's runs are queued: frames placed before are no longer
    /// in the (now emptied) arenas, and a connection's `unit_generation` older than
    /// this has no open run.
    generation: u64,
    /// Whether a caller opened a unit ([`Hub::begin_unit`]); otherwise each fan-out is a
    /// unit of its own.
    open: bool,
}

impl Unit {
    fn arena(ws: bool, slot: usize) -> usize {
        usize::from(ws) * 5 + slot
    }

    /// The arena of compressed WS frames (RFC 7692) for payload `slot`.
    fn deflate_arena(slot: usize) -> usize {
        10 + slot
    }

    /// Queues the pending runs and starts a new arena generation.
    fn queue_runs(&mut self, conns: &mut Slab<Conn>) {
        // Frames placed for an Event whose fan-out paused are dropped with the arena's
        // split; only runs are queued.
        let unit = self;
        if unit.runs.is_empty() {
            return;
        }
        let mut frozen: [Option<Bytes>; ARENAS] = Default::default();
        for (a, arena) in unit.arenas.iter_mut().enumerate() {
            if !arena.is_empty() {
                frozen[a] = Some(arena.split().freeze());
            }
        }
        for run in unit.runs.drain(..) {
            let Some(conn) = conns.get_mut(run.conn.0) else {
                continue;
            };
            if conn.unit_generation != unit.generation {
                continue; // the slot was reused by another connection
            }
            conn.unit_pending = 0;
            let Some(bytes) = &frozen[run.arena] else {
                continue;
            };
            let slice = bytes.slice(run.start..run.end);
            if run.backlog {
                conn.backlog.push(slice);
            } else {
                conn.out.push(slice);
            }
        }
        unit.generation += 1;
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
    /// `permessage-deflate` window `window` (0: not negotiated, see `Conn::deflate_window`):
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
        if arena.capacity() - arena.len() < z.len() + 16 {
            arena.reserve(ARENA_CHUNK.max(z.len() + 16));
        }
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
    /// target with `deflate` (its `Conn::deflate_window`, 0 for none) gets the shared
    /// compressed frame when there is one for it ([`Frames::place_deflated`]).
    fn place(
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
        if arena.capacity() - arena.len() < payload.len() + 128 {
            arena.reserve(ARENA_CHUNK.max(payload.len() + 128));
        }
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

/// The wider of two ceilings (`None`, as received, is the widest): a connection whose
/// subscriptions matched an Event at several ceilings gets it once, at the highest.
fn wider(a: Option<Capture>, b: Option<Capture>) -> Option<Capture> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        _ => None,
    }
}

/// One connection an Event goes to, during one fan-out.
#[derive(Debug, Clone, Copy)]
struct Target {
    conn: ConnId,
    ws: bool,
    /// The connection's `permessage-deflate` window (`Conn::deflate_window`).
    deflate: u8,
    ceiling: Option<Capture>,
    queued: bool,
}

/// Counters the hub keeps (read by `/metrics`).
#[derive(Debug, Default, Clone)]
pub struct FanoutStats {
    /// Frames queued to subscribers.
    pub deliveries: u64,
    /// Of `deliveries`, those to WebSocket connections.
    pub deliveries_ws: u64,
    /// `debug`/`info` Events not delivered to a slow consumer (AEP-0003 §8.4).
    pub dropped: u64,
    /// Consumers disconnected because a `notice`+ Event could not be queued.
    pub backpressure_disconnects: u64,
}

/// Subscriptions and their index.
#[derive(Debug, Default)]
pub struct Hub {
    subs: Slab<Subscription>,
    index: SubscriptionIndex,
    matched: Vec<usize>,
    /// Per fan-out scratch: one entry per connection reached (`Conn::fan_slot` indexes it).
    targets: Vec<Target>,
    serial: u64,
    /// A connection the next fan-outs skip: the claimant a command was just forwarded to
    /// directly, which must not get it a second time (set and cleared by the caller).
    pub(crate) except: Option<ConnId>,
    /// The ingest unit being laid out (frames and pending runs).
    unit: Unit,
    /// The one `permessage-deflate` compressor (RFC 7692, `server_no_context_takeover`),
    /// created when a compressing subscriber first takes an Event; replay uses it too.
    pub(crate) deflater: Option<Box<Deflater>>,
    /// Counters.
    pub stats: FanoutStats,
}

/// How one Event's fan-out ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Fanned {
    /// Delivered (or dropped, or doomed) to every target.
    Done,
    /// Nothing was delivered: this connection's queue cannot take the Event and its
    /// socket was not offered everything queued. The caller lets the reactor write, then
    /// fans the Event out again (AEP-0003 §8.4: a consumer is slow only when it does not
    /// read).
    Paused(ConnId),
}

/// What happened to one delivery attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queued {
    /// The frame is queued.
    Yes,
    /// Dropped (`debug`/`info` toward a full queue), counted.
    Dropped,
    /// The consumer must be disconnected (`notice`+ toward a full queue).
    Disconnect,
}

/// Whether a frame of `len` bytes fits `q` of `conn` under `max_output` (an empty queue
/// takes anything: one frame larger than the bound still goes).
fn fits(q: &OutQueue, pending: usize, len: usize, max_output: usize) -> bool {
    q.len() + pending + len <= max_output || (q.is_empty() && pending == 0)
}

impl Hub {
    /// Number of live subscriptions.
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// Adds a live subscription; returns its key.
    pub fn insert(&mut self, sub: Subscription) -> SubId {
        let filter = sub.filter.clone();
        let key = self.subs.insert(sub);
        self.index.insert(key, filter);
        SubId(key)
    }

    /// Removes a subscription (no-op for an unknown key).
    pub fn remove(&mut self, key: SubId) {
        if self.subs.contains(key.0) {
            self.subs.remove(key.0);
            self.index.remove(key.0);
        }
    }

    /// The subscription with key `key`.
    pub fn get(&self, key: SubId) -> Option<&Subscription> {
        self.subs.get(key.0)
    }

    /// The subscription with key `key`, mutably.
    pub fn get_mut(&mut self, key: SubId) -> Option<&mut Subscription> {
        self.subs.get_mut(key.0)
    }

    /// Opens an ingest unit: the frames of every Event fanned out until
    /// [`Hub::end_unit`] are coalesced (module docs). While it is open, nothing else may
    /// be queued on a connection that has frames pending in it (`Conn::send` checks this
    /// in debug builds); callers end the unit before any other output.
    pub(crate) fn begin_unit(&mut self) {
        self.unit.open = true;
    }

    /// Whether a caller opened an ingest unit that is not ended yet.
    pub(crate) fn unit_open(&self) -> bool {
        self.unit.open
    }

    /// Ends the ingest unit, if any: queues every pending run on its connection, in
    /// order, as one slice of its arena. Cheap when nothing is pending.
    pub(crate) fn end_unit(&mut self, conns: &mut Slab<Conn>) {
        self.unit.open = false;
        self.unit.queue_runs(conns);
    }

    /// Fans `ev` out to every matching subscription, at most once per connection,
    /// placing its frames in the ingest unit (module docs). Connections that received
    /// output are appended to `dirty`; connections that must be dropped for backpressure
    /// to `doomed`.
    ///
    /// Fan-out never writes to a socket. A target whose queue cannot take the Event and
    /// got frames since its socket was last offered the queue (`Conn::offered`) pauses
    /// the fan-out before anything is delivered: [`Fanned::Paused`], with the unit's
    /// pending runs queued. Once the reactor wrote, the caller fans the same Event out
    /// again, and a target that still cannot take it is then a slow consumer (dropped
    /// or disconnected, AEP-0003 §8.4).
    ///
    /// Subscriptions are a disjunction (AEP-0003 §6.5): when several subscriptions of
    /// one connection match, the Event is delivered once, at the widest of their
    /// ceilings, and every one of them records the position as delivered.
    ///
    /// `placed` are the replay streams the store just placed `ev` in
    /// (`Store::last_placed`): a subscription whose replay still has one of them to go is
    /// skipped, its replay delivers the Event in order.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fanout(
        &mut self,
        ev: &Event,
        placed: &[StreamId],
        publication: u64,
        conns: &mut Slab<Conn>,
        max_output: usize,
        dirty: &mut Vec<usize>,
        doomed: &mut Vec<usize>,
    ) -> Fanned {
        self.matched.clear();
        self.index.matching(ev, &mut self.matched);
        if self.matched.is_empty() {
            return Fanned::Done;
        }
        self.serial += 1;
        let serial = self.serial;
        self.targets.clear();
        let mut any_ws = false;
        for &key in &self.matched {
            let Some(sub) = self.subs.get(key) else {
                continue;
            };
            if self.except == Some(sub.conn) {
                continue;
            }
            let Some(conn) = conns.get_mut(sub.conn.0) else {
                continue;
            };
            if conn.doomed || conn.replay_covers(SubId(key), placed) || conn.decided == publication
            {
                // Disconnected for backpressure already; or its replay delivers it; or
                // a paused attempt at this same Event already decided for this
                // connection.
                continue;
            }
            if conn.mark == serial {
                let t = &mut self.targets[conn.fan_slot];
                t.ceiling = wider(t.ceiling, sub.ceiling);
                continue;
            }
            conn.mark = serial;
            conn.fan_slot = self.targets.len();
            let ws = matches!(sub.binding, Binding::Ws(_));
            any_ws |= ws;
            self.targets.push(Target {
                conn: sub.conn,
                ws,
                deflate: conn.deflate_window,
                ceiling: sub.ceiling,
                queued: false,
            });
        }
        let severity = ev.severity();
        let mut frames = Frames::default();
        for ti in 0..self.targets.len() {
            let t = self.targets[ti];
            let Some(conn) = conns.get_mut(t.conn.0) else {
                continue;
            };
            let (arena, start, end) = frames.place(
                &mut self.unit,
                ev,
                t.ws,
                t.ceiling,
                t.deflate,
                &mut self.deflater,
            );
            let len = end - start;
            let pending = if conn.unit_generation == self.unit.generation {
                conn.unit_pending
            } else {
                0
            };
            // Behind a replay, and until what it held back has all moved on, live frames
            // wait in the backlog: they never overtake it.
            let backlog = !conn.replay.is_empty() || !conn.backlog.is_empty();
            // A consumer that cannot take the Event, and got frames since its socket was
            // last offered the queue, pauses the publication here: the targets decided so
            // far keep what they got (`Conn::decided`), the rest get the Event when it is
            // fanned out again, once the reactor wrote.
            let fresh = pending > 0 || conn.offered != conn.out.pushed();
            if !backlog && fresh && !fits(&conn.out, pending, len, max_output) {
                let paused = t.conn;
                self.unit.queue_runs(conns);
                self.note_positions(ev, placed, conns, serial, any_ws);
                return Fanned::Paused(paused);
            }
            let q = if backlog { &conn.backlog } else { &conn.out };
            let verdict = if !fits(q, pending, len, max_output) {
                if severity <= Severity::Info {
                    conn.dropped += 1;
                    Queued::Dropped
                } else {
                    Queued::Disconnect
                }
            } else {
                Queued::Yes
            };
            conn.decided = publication;
            match verdict {
                Queued::Yes => {
                    let unit = &mut self.unit;
                    let open = conn.unit_generation == unit.generation && pending > 0;
                    match unit.runs.get_mut(conn.unit_run) {
                        Some(r)
                            if open
                                && r.conn == t.conn
                                && r.arena == arena
                                && r.end == start
                                && r.backlog == backlog =>
                        {
                            r.end = end;
                        }
                        _ => {
                            conn.unit_run = unit.runs.len();
                            unit.runs.push(Run {
                                conn: t.conn,
                                arena,
                                start,
                                end,
                                backlog,
                            });
                        }
                    }
                    conn.unit_generation = unit.generation;
                    conn.unit_pending = pending + len;
                    self.targets[ti].queued = true;
                    self.stats.deliveries += 1;
                    self.stats.deliveries_ws += u64::from(t.ws);
                    if !conn.dirty {
                        conn.dirty = true;
                        dirty.push(t.conn.0);
                    }
                }
                Queued::Dropped => self.stats.dropped += 1,
                Queued::Disconnect => {
                    // Once per consumer (`aep_backpressure_disconnects_total`): the
                    // connection is skipped by every later fan-out until it is closed.
                    conn.doomed = true;
                    self.stats.backpressure_disconnects += 1;
                    doomed.push(t.conn.0);
                }
            }
        }
        if !self.unit.open {
            self.unit.queue_runs(conns);
        }
        self.note_positions(ev, placed, conns, serial, any_ws);
        Fanned::Done
    }

    /// WS subscriptions remember the last position they delivered (for `closing`): every
    /// target of fan-out `serial` that had `ev` queued.
    fn note_positions(
        &mut self,
        ev: &Event,
        placed: &[StreamId],
        conns: &Slab<Conn>,
        serial: u64,
        any_ws: bool,
    ) {
        let position = match (ev.scope(), ev.session(), ev.seq()) {
            (Scope::Sequenced, Some(s), Some(q)) if any_ws => Some((s, (ev.epoch(), q))),
            _ => None,
        };
        if let Some((session, pos)) = position {
            for &key in &self.matched {
                let Some(sub) = self.subs.get_mut(key) else {
                    continue;
                };
                let Binding::Ws(delivered) = &mut sub.binding else {
                    continue;
                };
                let queued = conns
                    .get(sub.conn.0)
                    .is_some_and(|c| c.mark == serial && self.targets[c.fan_slot].queued);
                if queued {
                    delivered.note(placed.first().copied(), ev.source(), session, pos);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
