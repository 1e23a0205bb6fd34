//! Fan-out: subscriptions, the index that finds the ones an Event matches, and delivery
//! of shared wire frames into connection queues (AEP-0003 §6, §8.4).
//!
//! Per Event, each wire frame (SSE message, WS text frame) is built at most once per
//! capture level and shared by every subscriber as a reference-counted [`Bytes`]: fan-out
//! to N subscribers is N queue pushes, not N copies and never N serializations.

pub mod index;

use crate::capture;
use crate::conn::Conn;
use crate::envelope::Scope;
use crate::envelope::{Capture, Event, Severity};
use crate::filter::Filter;
use crate::sse;
use crate::store::StreamId;
use crate::ws::{self, Delivered};
use bytes::Bytes;
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

/// One live subscription.
#[derive(Debug)]
pub struct Subscription {
    /// Slab key of the connection it delivers to.
    pub conn: usize,
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
        let f = ws::frame::text(&payload);
        self.ws[slot] = Some(f.clone());
        f
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
    conn: usize,
    ws: bool,
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
    pub(crate) except: Option<usize>,
    /// Counters.
    pub stats: FanoutStats,
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

/// Queues `frame` on `conn` under the backpressure rule of AEP-0003 §8.4: when the queue
/// is over `max_output`, `debug`/`info` are dropped and counted, and anything more severe
/// disconnects the consumer so it can resume exactly.
pub(crate) fn queue(
    conn: &mut Conn,
    frame: Bytes,
    severity: Severity,
    max_output: usize,
) -> Queued {
    let full = |q: &crate::conn::OutQueue| q.len() + frame.len() > max_output && !q.is_empty();
    if conn.replay.is_empty() && full(&conn.out) {
        // Before counting this consumer as slow, let its socket take what it can: a
        // large batch is fanned out before the reactor's next write, and a consumer that
        // keeps up must not lose Events to that (the socket is non-blocking; the
        // connection is already marked for a flush, which handles interest and errors).
        let _ = conn.out.flush(&mut conn.sock);
    }
    // While a replay is in progress, live frames wait behind it (same bound).
    let q = if conn.replay.is_empty() {
        &mut conn.out
    } else {
        &mut conn.backlog
    };
    if full(q) {
        if severity <= Severity::Info {
            conn.dropped += 1;
            return Queued::Dropped;
        }
        return Queued::Disconnect;
    }
    q.push(frame);
    Queued::Yes
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
    pub fn insert(&mut self, sub: Subscription) -> usize {
        let filter = sub.filter.clone();
        let key = self.subs.insert(sub);
        self.index.insert(key, filter);
        key
    }

    /// Removes a subscription (no-op for an unknown key).
    pub fn remove(&mut self, key: usize) {
        if self.subs.contains(key) {
            self.subs.remove(key);
            self.index.remove(key);
        }
    }

    /// The subscription with key `key`.
    pub fn get(&self, key: usize) -> Option<&Subscription> {
        self.subs.get(key)
    }

    /// The subscription with key `key`, mutably.
    pub fn get_mut(&mut self, key: usize) -> Option<&mut Subscription> {
        self.subs.get_mut(key)
    }

    /// Fans `ev` out to every matching subscription, at most once per connection,
    /// pushing shared frames into the connections' queues. Connections that received
    /// output are appended to `dirty`; connections that must be dropped for backpressure
    /// to `doomed`.
    ///
    /// Subscriptions are a disjunction (AEP-0003 §6.5): when several subscriptions of
    /// one connection match, the Event is delivered once, at the widest of their
    /// ceilings, and every one of them records the position as delivered.
    ///
    /// `placed` are the replay streams the store just placed `ev` in
    /// (`Store::last_placed`): a subscription whose replay still has one of them to go is
    /// skipped, its replay delivers the Event in order.
    pub(crate) fn fanout(
        &mut self,
        ev: &Event,
        placed: &[StreamId],
        conns: &mut Slab<Conn>,
        max_output: usize,
        dirty: &mut Vec<usize>,
        doomed: &mut Vec<usize>,
    ) {
        self.matched.clear();
        self.index.matching(ev, &mut self.matched);
        if self.matched.is_empty() {
            return;
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
            let Some(conn) = conns.get_mut(sub.conn) else {
                continue;
            };
            if conn.replay_covers(key, placed) {
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
                ceiling: sub.ceiling,
                queued: false,
            });
        }
        let severity = ev.severity();
        let mut frames = Frames::default();
        for t in &mut self.targets {
            let Some(conn) = conns.get_mut(t.conn) else {
                continue;
            };
            let frame = if t.ws {
                frames.ws(ev, t.ceiling)
            } else {
                frames.sse(ev, t.ceiling)
            };
            match queue(conn, frame, severity, max_output) {
                Queued::Yes => {
                    t.queued = true;
                    self.stats.deliveries += 1;
                    self.stats.deliveries_ws += u64::from(t.ws);
                    if !conn.dirty {
                        conn.dirty = true;
                        dirty.push(t.conn);
                    }
                }
                Queued::Dropped => self.stats.dropped += 1,
                Queued::Disconnect => {
                    self.stats.backpressure_disconnects += 1;
                    doomed.push(t.conn);
                }
            }
        }
        // WS subscriptions remember the last position they delivered (for `closing`).
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
                    .get(sub.conn)
                    .is_some_and(|c| c.mark == serial && self.targets[c.fan_slot].queued);
                if queued {
                    delivered.note(ev.source(), session, pos);
                }
            }
        }
    }
}
