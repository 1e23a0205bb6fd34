//! Fan-out: subscriptions, the index that finds the ones an Event matches, and delivery
//! of shared wire frames into connection queues (AEP-0003 §6, §8.4).
//!
//! Per Event, each wire frame (SSE message, WS text frame) is built at most once per
//! capture level and shared by every subscriber as a reference-counted [`Bytes`]: fan-out
//! to N subscribers is N queue pushes, not N copies and never N serializations.

pub mod index;

use crate::capture;
use crate::conn::Conn;
use crate::envelope::{Capture, Event, Severity};
use crate::filter::Filter;
use crate::sse;
use bytes::Bytes;
use index::SubscriptionIndex;
use slab::Slab;
use std::sync::Arc;

/// The binding a subscription delivers on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// An SSE stream (one subscription per connection).
    Sse,
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
}

/// Counters the hub keeps (read by `/metrics`).
#[derive(Debug, Default, Clone)]
pub struct FanoutStats {
    /// Frames queued to subscribers.
    pub deliveries: u64,
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
    serial: u64,
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
    if conn.out.len() + frame.len() > max_output && !conn.out.is_empty() {
        if severity <= Severity::Info {
            conn.dropped += 1;
            return Queued::Dropped;
        }
        return Queued::Disconnect;
    }
    conn.out.push(frame);
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

    /// Fans `ev` out to every matching subscription, at most once per connection,
    /// pushing shared frames into the connections' queues. Connections that received
    /// output are appended to `dirty`; connections that must be dropped for backpressure
    /// to `doomed`.
    pub(crate) fn fanout(
        &mut self,
        ev: &Event,
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
        let severity = ev.severity();
        let mut frames = Frames::default();
        for &key in &self.matched {
            let Some(sub) = self.subs.get(key) else {
                continue;
            };
            let Some(conn) = conns.get_mut(sub.conn) else {
                continue;
            };
            if conn.mark == serial {
                continue;
            }
            conn.mark = serial;
            let frame = match sub.binding {
                Binding::Sse => frames.sse(ev, sub.ceiling),
            };
            match queue(conn, frame, severity, max_output) {
                Queued::Yes => {
                    self.stats.deliveries += 1;
                    if !conn.dirty {
                        conn.dirty = true;
                        dirty.push(sub.conn);
                    }
                }
                Queued::Dropped => self.stats.dropped += 1,
                Queued::Disconnect => {
                    self.stats.backpressure_disconnects += 1;
                    doomed.push(sub.conn);
                }
            }
        }
    }
}
