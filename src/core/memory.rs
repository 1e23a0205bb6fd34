//! The memory budget (`--max-memory`): what the relay holds, counted in O(1) as it
//! changes, and the shed that brings it back under the budget.
//!
//! # What is counted
//!
//! - **events** and **records**: the store's own count ([`Store::memory_bytes`](crate::store::Store::memory_bytes),
//!   [`Store::record_bytes`](crate::store::Store::record_bytes)): held Events' arenas, ring entries, dedupe tables, the
//!   streams' fixed cost, eviction records.
//! - **queues**: the frames output queues keep alive. A unit's frames in one arena are
//!   one chunk, counted once however many queues hold slices of it, until the last slice
//!   is written or discarded (`conn::Chunks`); a queue's own buffers (replay pages,
//!   answers, `closing`) count for it alone; so do the hub's arenas (their room not yet
//!   handed out) and the sealed TLS records a transport holds.
//! - **connections**: each connection's struct, read buffer, request body, WebSocket
//!   decoder buffers, an estimate of what it costs outside the core
//!   ([`OUTSIDE_CONN_BYTES`]), and the core's spare body buffer.
//! - **tls**, **deflate**: estimates per connection ([`TLS_CONN_BYTES`],
//!   [`INFLATER_BYTES`]) and for the one shared compressor ([`DEFLATER_BYTES`]).
//!
//! A connection's part is recomputed (O(1)) whenever the core finishes with it: after
//! its input, after a write. The total is a sum of a few counters, so checking it costs
//! one compare at the end of each call that ingests or writes; nothing is walked while
//! the relay is under its budget.
//!
//! # The shed
//!
//! Over the budget, the relay sheds down to a low-water mark an eighth below it (so a
//! relay that stays full sheds once per eighth of the budget ingested, not per Event):
//!
//! 1. When output queues hold over half the budget, they are the cause: the consumers
//!    whose queues hold the most are dropped, largest first, until the queues hold a
//!    quarter of it. What each had queued and not yet begun to write is discarded. A
//!    WebSocket gets `closing` with resume positions that still deliver every discarded
//!    Event, then a close 1013 (AEP-0003 §3.5 #4, §8.4); an SSE stream ends after the
//!    last whole Event it was sent, so its `Last-Event-ID` resumes exactly.
//! 2. Held Events are evicted ([`Store::shed_to`](crate::store::Store::shed_to): debug Events first, then the oldest
//!    of the least recently written sessions) until everything fits under the mark.
//!
//! Valid ingest is never refused for memory: a body in flight is counted, and room is
//! made for it by evicting.

use super::conn::{Charge, Conn, Phase};
use super::Core;
use crate::ids::ConnId;
use crate::store::Position;
use crate::wire::envelope::Event;
use crate::wire::ws::rfc6455::{self, server_frame};
use bytes::Bytes;
use std::collections::HashMap;
use std::mem::size_of;
use std::net::SocketAddr;

/// Estimated heap bytes of what one connection costs outside the core's `Conn`: the
/// reactor's socket and transport, a subscription and its filter, its timer entry, the
/// allocator's rounding (an idle SSE or WebSocket subscriber costs the release build
/// about 2.2 to 2.8 KB of resident memory in all, docs/operating.md).
pub(crate) const OUTSIDE_CONN_BYTES: usize = 2 << 10;
/// Estimated heap bytes of one TLS connection's state (rustls: its record buffers and
/// handshake state, with buffers at their usual 16 KiB record size).
pub(crate) const TLS_CONN_BYTES: usize = 40 << 10;
/// Estimated heap bytes of one connection's inflater (a client that sends compressed
/// messages): zlib's inflate state and its 32 KiB window.
pub(crate) const INFLATER_BYTES: usize = 48 << 10;
/// Estimated heap bytes of the relay's one compressor (level 6, 15-bit window, memory
/// level 8): zlib's 256 KiB of tables and window, and its state.
pub(crate) const DEFLATER_BYTES: usize = 272 << 10;

/// The budget and its counters.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// Bytes the relay may hold; `None`: no budget.
    pub(crate) budget: Option<usize>,
    /// The sum of every open connection's [`Charge`].
    pub(crate) conns: Charge,
    /// Consumers dropped because their queues held the most (`aep_memory_dropped_consumers_total`).
    pub(crate) dropped_consumers: u64,
    /// Sheds run so far.
    pub(crate) sheds: u64,
}

/// The memory used, by part (`aep_memory_used_bytes{part}`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Used {
    pub(crate) events: usize,
    pub(crate) records: usize,
    pub(crate) queues: usize,
    pub(crate) connections: usize,
    pub(crate) tls: usize,
    pub(crate) deflate: usize,
}

impl Used {
    pub(crate) fn total(&self) -> usize {
        self.events + self.records + self.queues + self.connections + self.tls + self.deflate
    }

    /// `(part label, bytes)`, in the order `/metrics` lists them.
    pub(crate) fn parts(&self) -> [(&'static str, usize); 6] {
        [
            ("events", self.events),
            ("records", self.records),
            ("queues", self.queues),
            ("connections", self.connections),
            ("tls", self.tls),
            ("deflate", self.deflate),
        ]
    }
}

impl Ledger {
    /// Counts `conn`'s share again ([`Charge`], from its buffers: O(1)) in place of the
    /// one last counted.
    pub(super) fn recount(&mut self, conn: &mut Conn, tls: bool) {
        let now = charge_of(conn, tls);
        let old = std::mem::replace(&mut conn.charged, now);
        self.conns.sub(old);
        self.conns.add(now);
    }
}

/// Connection `conn`'s share, recomputed from its buffers (O(1)).
fn charge_of(conn: &Conn, tls: bool) -> Charge {
    let mut c = Charge {
        conn: size_of::<Conn>() + OUTSIDE_CONN_BYTES + conn.rbuf.capacity(),
        queues: conn.subscriber.out.own()
            + conn.subscriber.out.held()
            + conn.subscriber.backlog.own(),
        tls: if tls { TLS_CONN_BYTES } else { 0 },
        deflate: 0,
    };
    match &conn.phase {
        Phase::Body { body, .. } => c.conn += body.capacity(),
        Phase::Ws(ws) => {
            let (bufs, inflating) = ws.decoder.heap_bytes();
            c.conn += size_of::<super::conn::websocket::WsState>() + bufs;
            if inflating {
                c.deflate = INFLATER_BYTES;
            }
        }
        _ => {}
    }
    c
}

/// Where the frame being written at `off` of `b` ends: `b`'s SSE messages end with a
/// blank line.
fn sse_frame_end(b: &[u8], off: usize) -> usize {
    if off >= 2 && &b[off - 2..off] == b"\n\n" {
        return off;
    }
    let from = off.saturating_sub(1);
    memchr::memmem::find(&b[from..], b"\n\n").map_or(b.len(), |i| from + i + 2)
}

/// Where the frame being written at `off` of `b` ends: `b` is whole WebSocket frames.
fn ws_frame_end(b: &[u8], off: usize) -> usize {
    let mut at = 0;
    while at < off {
        match server_frame(&b[at..]) {
            Some((_, head, len)) => at += head + len,
            None => return b.len(),
        }
    }
    at
}

/// Notes, per owning stream `(session, source)`, the lowest position among the Events
/// of the WebSocket frames in `b` (whole frames as the relay wrote them; compressed ones
/// inflated).
fn note_discarded(b: &[u8], lowest: &mut HashMap<(Box<str>, Box<str>), Position>) {
    let mut at = 0;
    while let Some((b0, head, len)) = server_frame(&b[at..]) {
        let Some(payload) = b.get(at + head..at + head + len) else {
            break;
        };
        at += head + len;
        if b0 & 0x0f != 0x1 {
            continue;
        }
        let text = if b0 & 0x40 != 0 {
            match crate::wire::ws::deflate::inflate_own(payload, 64 << 20) {
                Some(t) => Bytes::from(t),
                None => continue,
            }
        } else {
            Bytes::copy_from_slice(payload)
        };
        let Ok(ev) = Event::scan(text) else {
            continue;
        };
        if let (Some(session), Some(seq)) = (ev.session(), ev.seq()) {
            let p = (ev.epoch(), seq);
            lowest
                .entry((session.into(), ev.source().into()))
                .and_modify(|l| *l = (*l).min(p))
                .or_insert(p);
        }
    }
}

/// The position just before `p`, from which a resume delivers `p` again; `None` for
/// `(0, 0)`, which nothing precedes.
pub(crate) fn before((epoch, seq): Position) -> Option<Position> {
    match (epoch, seq) {
        (0, 0) => None,
        (e, 0) => Some((e - 1, u64::MAX)),
        (e, s) => Some((e, s - 1)),
    }
}

impl Core {
    /// The memory used, by part (O(1)).
    pub(crate) fn memory_used(&self) -> Used {
        let c = &self.ledger.conns;
        let records = self.store.record_bytes();
        let deflater = if self.hub.deflater.is_some() {
            DEFLATER_BYTES
        } else {
            0
        };
        Used {
            events: self.store.memory_bytes().saturating_sub(records),
            records,
            queues: c.queues + self.hub.chunks.bytes() + self.hub.arena_bytes(),
            connections: c.conn
                + self.spare_body.capacity()
                + self.body_events.capacity() * size_of::<Event>(),
            tls: c.tls,
            deflate: c.deflate + deflater,
        }
    }

    /// Forgets a closed connection's share: its queued slices and its charge.
    pub(super) fn unaccount(&mut self, conn: &mut Conn) {
        conn.subscriber.out.release_all(&mut self.hub.chunks);
        conn.subscriber.backlog.release_all(&mut self.hub.chunks);
        self.ledger.conns.sub(conn.charged);
        conn.charged = Charge::default();
    }

    /// Sheds when over the budget: one compare while under it.
    pub(super) fn enforce(&mut self) {
        if let Some(budget) = self.ledger.budget {
            if self.memory_used().total() > budget && !self.hub.unit_open() {
                self.shed(budget);
            }
        }
    }

    /// Brings the memory used down to the low-water mark (module docs).
    fn shed(&mut self, budget: usize) {
        let low = budget - budget / 8;
        let before = self.memory_used();
        let queues = |core: &Core| core.memory_used().queues;
        let mut dropped = 0;
        if before.queues > budget / 2 {
            let mut holders: Vec<(usize, ConnId, SocketAddr)> = self
                .conns
                .iter()
                .filter(|(_, c)| matches!(c.phase, Phase::Sse { .. } | Phase::Ws(_)))
                .map(|(k, c)| {
                    (
                        c.subscriber.out.len() + c.subscriber.backlog.len(),
                        k,
                        c.peer,
                    )
                })
                .filter(|&(held, ..)| held > 0)
                .collect();
            holders.sort_unstable_by_key(|&(held, key, _)| std::cmp::Reverse((held, key)));
            for (held, key, peer) in holders {
                if queues(self) <= budget / 4 {
                    break;
                }
                log::warn!(
                    "memory budget: dropping consumer {peer} ({held} bytes queued; {} of {} bytes used)",
                    self.memory_used().total(),
                    budget
                );
                self.drop_consumer(key);
                dropped += 1;
            }
        }
        let used = self.memory_used().total();
        let store = self.store.memory_bytes();
        let target = low.saturating_sub(used - store);
        let shed = if store > target {
            self.store.shed_to(target)
        } else {
            Default::default()
        };
        self.ledger.sheds += 1;
        let after = self.memory_used().total();
        let say = format!(
            "memory budget {budget} bytes: {} bytes used; evicted {} Events ({} debug, {} whole sessions), dropped {dropped} consumers; {after} bytes used now",
            before.total(),
            shed.events,
            shed.debug_events,
            shed.streams
        );
        if self.ledger.sheds == 1 {
            log::warn!("{say} (later sheds are logged at debug level)");
        } else {
            log::debug!("{say}");
        }
    }

    /// Drops consumer `key` for the memory budget: discards what it has queued and not
    /// begun to write, then ends it (module docs).
    fn drop_consumer(&mut self, key: ConnId) {
        self.end_unit();
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let chunks = &mut self.hub.chunks;
        match conn.phase {
            Phase::Sse { sub, .. } => {
                conn.subscriber.replay.clear();
                conn.subscriber.backlog.release_all(chunks);
                conn.subscriber
                    .out
                    .discard_unwritten(chunks, sse_frame_end, |_| {});
                conn.send(crate::wire::sse::MEMORY_BUDGET);
                conn.enter(Phase::Closing);
                conn.close_after_flush = true;
                conn.since = self.now;
                self.hub.remove(sub);
                self.orders.mark_dirty(key, conn);
            }
            Phase::Ws(_) => {
                let mut lowest = HashMap::new();
                let mut note = |b: &[u8]| note_discarded(b, &mut lowest);
                conn.subscriber.replay.clear();
                conn.subscriber
                    .backlog
                    .discard_unwritten(chunks, |_, _| 0, &mut note);
                conn.subscriber
                    .out
                    .discard_unwritten(chunks, ws_frame_end, &mut note);
                let reason = "memory: the relay's memory budget is spent on this consumer's queue";
                let code = rfc6455::close_code::TRY_AGAIN;
                self.ws_close_rolled_back(key, reason, code, &lowest);
            }
            _ => return,
        }
        self.ledger.dropped_consumers += 1;
        self.finish(key);
    }
}

/// Panics when connection `key` (`conn`) breaks what the comments promise of it: its queues'
/// counts (`OutQueue`), its SSE subscription naming it back, its armed deadline's
/// generation not ahead of the timer's. Debug builds run it from [`Core::finish`],
/// after each input, body read, write and budget drop of the connection (one that
/// fan-out alone reached is checked at its next write); O(its queue length).
#[cfg(debug_assertions)]
pub(super) fn check_conn(
    conn: &Conn,
    key: ConnId,
    hub: &super::hub::Hub,
    timers: &super::timer::Timers,
) {
    conn.subscriber.out.check();
    conn.subscriber.backlog.check();
    if let Phase::Sse { sub, .. } = conn.phase {
        let back = hub.get(sub).map(|s| s.conn);
        assert_eq!(back, Some(key), "an SSE connection's subscription names it");
    }
    if let Some((_, generation)) = conn.armed {
        assert!(
            generation <= timers.generation(),
            "an armed deadline's generation"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_ends() {
        let sse = b"id: a\ndata: 1\n\nid: b\ndata: 2\n\n";
        assert_eq!(sse_frame_end(sse, 3), 15);
        assert_eq!(sse_frame_end(sse, 14), 15);
        assert_eq!(sse_frame_end(sse, 15), 15);
        assert_eq!(sse_frame_end(sse, 16), sse.len());
        let mut ws = bytes::BytesMut::new();
        rfc6455::write_text(&[b'a'; 10], &mut ws);
        rfc6455::write_text(&[b'b'; 300], &mut ws);
        assert_eq!(ws_frame_end(&ws, 1), 12);
        assert_eq!(ws_frame_end(&ws, 12), 12);
        assert_eq!(ws_frame_end(&ws, 13), ws.len());
    }

    #[test]
    fn before_a_position() {
        assert_eq!(before((2, 5)), Some((2, 4)));
        assert_eq!(before((2, 0)), Some((1, u64::MAX)));
        assert_eq!(before((0, 0)), None);
    }
}
