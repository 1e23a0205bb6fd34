//! The WebSocket duplex binding, `GET /socket` (AEP-0003 §2, §3.5, §4, §4.1, §5, §6.5,
//! §7; AEP-0004 §2, §4).
//!
//! ```text
//! client bytes ─► Conn::rbuf ─► frame::Decoder (RFC 6455: unmask, reassemble, limits)
//!                                  ├─ ping ─► pong          ├─ close ─► close, done
//!                                  └─ text ─► hello first (frames::parse_hello)
//!                                             ├─ Event ─► Event::parse ─► publish (as HTTP)
//!                                             │          └─ command ─► control::route ─► one claimant
//!                                             └─ frame ─► subscribe / unsubscribe / roster / ping
//! fan-out ─► Frames::ws (header + original bytes, built once per Event and ceiling)
//!        ─► every matching connection's queue (shared Bytes, no copy)
//! ```
//!
//! The pieces here are sans-IO: [`frame`] (RFC 6455 codec), [`handshake`] (the upgrade),
//! [`frames`] (the AEP frame vocabulary). The reactor glue, which owns sockets, the
//! subscription hub, the store and the session claims, is `relay::socket`.
//!
//! A connection's life: upgrade (auth was checked on the request: 401 before it) →
//! client `hello` → relay `hello` → frames and Events in any order → close handshake
//! (either side), or a deliberate close by the relay with a `closing` frame carrying the
//! last delivered position per subscription (shutdown, backpressure, idle peer).

pub mod frame;
pub mod frames;
pub mod handshake;

use crate::auth::Grant;
use frames::Declaration;
use std::collections::HashMap;
use std::time::Instant;

/// The last position delivered per session on one subscription, for the `closing`
/// frame (AEP-0003 §3.5 #4). Updating an entry for a session already seen does not
/// allocate; a session's first delivery allocates its key once. At most `cap` sessions
/// are remembered (the relay holds no more than `max_sessions` anyway); past that an
/// arbitrary entry is forgotten, which only makes that session's resume start earlier.
#[derive(Debug, Default)]
pub struct Delivered {
    /// `(session, position)`; `index` maps a session to its slot here.
    entries: Vec<(Box<str>, (u64, u64))>,
    index: HashMap<Box<str>, usize>,
    /// Slot of the last session noted: consecutive deliveries of one session (the common
    /// case) update it with a string compare, no hashing.
    recent: usize,
    cap: usize,
}

impl Delivered {
    /// An empty record remembering at most `cap` sessions.
    pub fn new(cap: usize) -> Delivered {
        Delivered {
            cap: cap.max(1),
            ..Delivered::default()
        }
    }

    /// Records that `(epoch, seq)` of `session` was queued to the subscriber.
    pub fn note(&mut self, session: &str, pos: (u64, u64)) {
        if let Some(e) = self.entries.get_mut(self.recent) {
            if &*e.0 == session {
                e.1 = pos;
                return;
            }
        }
        if let Some(&i) = self.index.get(session) {
            self.entries[i].1 = pos;
            self.recent = i;
            return;
        }
        if self.entries.len() >= self.cap {
            // Forget the oldest-inserted session: slot 0 (moved into by the last).
            let (gone, _) = self.entries.swap_remove(0);
            self.index.remove(&gone);
            if let Some(moved) = self.entries.first() {
                self.index.insert(moved.0.clone(), 0);
            }
        }
        self.index.insert(session.into(), self.entries.len());
        self.recent = self.entries.len();
        self.entries.push((session.into(), pos));
    }

    /// `(session, (epoch, seq))` pairs, sorted by session.
    pub fn positions(&self) -> Vec<(&str, (u64, u64))> {
        let mut v: Vec<_> = self.entries.iter().map(|(s, p)| (&**s, *p)).collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod delivered_tests {
    use super::Delivered;

    #[test]
    fn note_keeps_the_last_position_per_session_within_the_cap() {
        let mut d = Delivered::new(2);
        d.note("a", (0, 1));
        d.note("a", (0, 2));
        d.note("b", (0, 5));
        d.note("a", (0, 3));
        assert_eq!(d.positions(), vec![("a", (0, 3)), ("b", (0, 5))]);
        d.note("c", (1, 0));
        assert_eq!(d.positions().len(), 2, "at most cap sessions");
        d.note("b", (0, 6));
        d.note("c", (1, 1));
        assert_eq!(
            d.positions(),
            vec![("b", (0, 6)), ("c", (1, 1))],
            "the oldest-inserted session was forgotten"
        );
    }
}

/// One live WebSocket connection's binding state (the `Phase::Ws` of its `Conn`).
#[derive(Debug)]
pub(crate) struct WsState {
    /// What the upgrade request's credentials allow (AEP-0003 §8.1, AEP-0004 §4.1).
    pub(crate) grant: Grant,
    /// The RFC 6455 decoder over the connection's read buffer.
    pub(crate) decoder: frame::Decoder,
    /// The client's `hello`; `None` until it arrives (every other first frame is
    /// refused with `hello-required`).
    pub(crate) hello: Option<Box<Declaration>>,
    /// Live subscriptions: (the client's `id`, the hub key), in subscribe order.
    pub(crate) subs: Vec<(Box<str>, usize)>,
    /// Sessions this connection claims (it sent a sequenced Event for each), in claim
    /// order; mirrored in `control::Claims`.
    pub(crate) claims: Vec<Box<str>>,
    /// When the peer last sent anything (idle timeout).
    pub(crate) last_read: Instant,
    /// When the relay last sent a `ping` frame.
    pub(crate) last_ping: Instant,
    /// Output queued when the latest replay was queued: replies to the peer may take the
    /// queue `max_output_bytes` past it before the peer counts as not reading (a replay
    /// may legitimately exceed the bound; the peer's next request must not be punished).
    pub(crate) reply_floor: usize,
}

impl WsState {
    pub(crate) fn new(grant: Grant, max_message: usize, now: Instant) -> WsState {
        WsState {
            grant,
            decoder: frame::Decoder::new(max_message),
            hello: None,
            subs: Vec::new(),
            claims: Vec::new(),
            last_read: now,
            last_ping: now,
            reply_floor: 0,
        }
    }

    /// The hub key of the subscription the client calls `id`.
    pub(crate) fn sub(&self, id: &str) -> Option<usize> {
        self.subs.iter().find(|(i, _)| &**i == id).map(|(_, k)| *k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivered_keeps_the_last_position_per_session_within_its_cap() {
        let mut d = Delivered::new(2);
        d.note("a", (0, 1));
        d.note("a", (0, 2));
        d.note("b", (1, 0));
        assert_eq!(d.positions(), vec![("a", (0, 2)), ("b", (1, 0))]);
        d.note("c", (0, 9));
        assert_eq!(d.positions().len(), 2);
        assert!(d.positions().contains(&("c", (0, 9))));
    }
}
