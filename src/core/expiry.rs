//! A grant over time: the wall clock a JWT's `exp` and `nbf` are read against (the
//! driver's `unix_ms` at `Core::new`, moved on by its monotonic clock), and the close of
//! a streaming connection when its token expires. The expiry is the connection's
//! deadline (`Conn::deadline`), checked once when it comes, never per Event.

use super::conn::Phase;
use super::{ConnId, Core};
use crate::wire::sse;
use std::time::{Duration, Instant};

impl Core {
    /// The wall clock at `now`, in seconds since the Unix epoch: `unix_ms` at `Core::new`
    /// moved on by the monotonic clock since (JWT `exp` and `nbf`).
    pub(crate) fn unix_secs(&self) -> u64 {
        self.unix_ms_at(self.now) / 1000
    }

    /// The wall clock at `t`, in milliseconds since the Unix epoch.
    pub(super) fn unix_ms_at(&self, t: Instant) -> u64 {
        self.started_unix_ms + t.saturating_duration_since(self.started).as_millis() as u64
    }

    /// The monotonic instant at which the wall clock reads `unix_secs`; `None` when it
    /// lies past what the clock can represent (an `exp` centuries ahead: never).
    pub(crate) fn instant_at_unix(&self, unix_secs: u64) -> Option<Instant> {
        let ms = unix_secs
            .saturating_mul(1000)
            .saturating_sub(self.started_unix_ms);
        self.started.checked_add(Duration::from_millis(ms))
    }

    /// Streaming connection `key`'s token expired (its JWT `exp`): an SSE stream ends
    /// after its last whole Event with `: closing: token expired`, a WebSocket with
    /// `closing` and a close 1008 whose reason says so (AEP-0003 §3.5 #4). The check is
    /// this one deadline, never one per Event.
    pub(super) fn token_expired(&mut self, key: ConnId) {
        let now = self.now;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.expires_at = None;
        log::info!("closing the stream of {}: its token expired", conn.peer);
        match conn.phase {
            Phase::Sse { .. } => {
                if let Some(sub) = conn.end_sse(sse::TOKEN_EXPIRED, now) {
                    self.hub.remove(sub);
                }
                self.orders.mark_dirty(key, conn);
            }
            Phase::Ws(_) => {
                let policy = crate::wire::ws::rfc6455::close_code::POLICY;
                self.ws_close(key, "token expired", policy);
            }
            _ => {}
        }
    }
}
