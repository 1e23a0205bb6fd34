//! A grant over time: the wall clock a JWT's `exp` and `nbf` are read against (the
//! driver's `unix_ms` at `Core::new`, moved on by its monotonic clock), and the close of
//! a streaming connection when its token expires. The expiry is the connection's
//! deadline (`Conn::deadline`), checked once when it comes, never per Event.

use super::conn::{Conn, Phase};
use super::hub::Hub;
use super::Core;
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
}

/// Streaming connection `conn`'s token expired (its JWT `exp`): an SSE stream ends
/// after its last whole Event with `: closing: token expired`, its subscription taken
/// out of `hub`. `true` when `conn` is a WebSocket instead, for the caller to close with
/// `closing` and a close 1008 whose reason says so (AEP-0003 §3.5 #4). The check is this
/// one deadline, never one per Event.
pub(super) fn token_expired(conn: &mut Conn, hub: &mut Hub, now: Instant) -> bool {
    conn.expires_at = None;
    log::info!("closing the stream of {}: its token expired", conn.peer);
    match conn.phase {
        Phase::Sse { .. } => {
            if let Some(sub) = conn.end_sse(sse::TOKEN_EXPIRED, now) {
                hub.remove(sub);
            }
            false
        }
        Phase::Ws(_) => true,
        _ => false,
    }
}
