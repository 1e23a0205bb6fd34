//! A graceful shutdown, and what holds a storm of connections: the accept gate's
//! answers, the SSE `retry:` jitter, and the streams' ends spread over the first half of
//! the shutdown deadline so that their consumers do not all reconnect at once.

use super::conn::Phase;
use super::storm::{self, Refused};
use super::{ConnId, Core};
use crate::refusal::Code;
use crate::wire::{http, sse};
use std::net::SocketAddr;
use std::time::Instant;

impl Core {
    /// Starts a graceful shutdown: no new connection; idle connections close, and those
    /// with answers still queued or a body still being discarded end once idle
    /// (`Core::finish`); requests in flight (a `POST` waiting for the stream, in cluster
    /// mode, included) finish with `Connection: close`; a replay-only stream (`live=0`)
    /// ends with `: shutting-down`. The live streams end spread evenly over the first half
    /// of `shutdown_deadline`, in an order drawn from the seed ([`Core::seed`]), the first
    /// at once: each SSE stream with `: shutting-down`, each WebSocket with `closing`
    /// (its positions, AEP-0003 §3.5 #4) and a close 1001, so that their consumers
    /// resume (AEP-0003 §7) spread out instead of all at once. [`super::Output::Stop`]
    /// comes once every connection is gone, or when `shutdown_deadline` passes.
    pub fn begin_shutdown(&mut self, now: Instant) {
        self.now = now;
        if self.shutdown_deadline.is_some() {
            return;
        }
        log::info!(
            "shutting down: {} connections to drain within {:?}",
            self.conns.len(),
            self.config.shutdown_deadline
        );
        self.shutdown_deadline = Some(now + self.config.shutdown_deadline);
        let outbox = self.outbox_len();
        if outbox > 0 {
            log::info!(
                "shutting down: waiting up to {:?} for the {outbox} Events of the cluster outbox to reach the stream",
                self.config.shutdown_deadline
            );
        }
        let mut streams = Vec::new();
        for key in self.conns.ids() {
            let conn = &mut self.conns[key];
            match conn.phase {
                Phase::Sse { .. } | Phase::Ws(_) => streams.push(key),
                // A `POST` waiting for the stream (cluster mode) is answered first, with
                // `Connection: close` (`answer_posts`).
                _ if conn.request.awaiting.is_some() => {}
                Phase::Head if conn.rbuf.is_empty() && conn.subscriber.out.is_empty() => {
                    self.close(key)
                }
                // A replay-only stream (`live=0`) still replaying: it ends now, with
                // what it has queued and `: shutting-down` (never `: replay-complete`:
                // the replay did not complete).
                Phase::Closing if conn.subscriber.replay.front().is_some_and(|j| j.end_after) => {
                    conn.subscriber.end_streaming();
                    conn.send(sse::SHUTTING_DOWN);
                    conn.close_after_flush = true;
                    conn.since = now;
                    self.orders.mark_dirty(key, conn);
                    self.orders.rearm(key, conn, &self.config);
                }
                Phase::Closing => {}
                _ => {
                    // Answered with Connection: close when it completes (see `reply`).
                }
            }
        }
        self.rng.shuffle(&mut streams);
        let window = self.config.shutdown_deadline / 2;
        log::info!(
            "shutting down: ending {} streams spread over {window:?}",
            streams.len()
        );
        let n = streams.len();
        self.shutdown_closes = storm::spread(now, window, n).zip(streams).collect();
        self.end_streams_due(now);
        self.check_drained();
    }

    /// Ends the streams whose turn has come in a graceful shutdown (`begin_shutdown`).
    pub(super) fn end_streams_due(&mut self, now: Instant) {
        while let Some(&(at, key)) = self.shutdown_closes.front() {
            if at > now {
                break;
            }
            self.shutdown_closes.pop_front();
            self.end_stream(key, now);
        }
        if self.shutdown_closes.is_empty() && self.shutdown_closes.capacity() > 64 {
            self.shutdown_closes.shrink_to(0);
        }
    }

    /// Ends one live stream for a shutdown: SSE with `: shutting-down` after what it has
    /// queued, a WebSocket with `closing` and a close 1001. A connection gone (or no
    /// longer streaming) meanwhile is left alone. A stream a request opens once the
    /// shutdown began (its head was still arriving then) is ended this way at once.
    pub(super) fn end_stream(&mut self, key: ConnId, now: Instant) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        match conn.phase {
            Phase::Sse { .. } => {
                log::debug!("shutting down: ending the SSE stream of {}", conn.peer);
                if let Some(sub) = conn.end_sse(sse::SHUTTING_DOWN, now) {
                    self.hub.remove(sub);
                }
                self.orders.mark_dirty(key, conn);
                self.orders.rearm(key, conn, &self.config);
            }
            Phase::Ws(_) => {
                log::debug!("shutting down: closing the WebSocket of {}", conn.peer);
                let going_away = crate::wire::ws::rfc6455::close_code::GOING_AWAY;
                self.ws_close(key, "shutting down", going_away);
            }
            _ => {}
        }
    }

    /// Replaces the seed of the relay's randomness: the SSE `retry:` jitter and the
    /// order in which a graceful shutdown ends the streams. [`Core::new`] seeds it from
    /// its `unix_ms`, so a test driving the core in virtual time gets the same draws for
    /// the same inputs; the reactor reseeds it from the operating system's randomness so
    /// that relays started together do not draw alike.
    pub fn seed(&mut self, seed: u64) {
        self.rng = storm::Rng::new(seed);
    }

    /// The reconnection delay for a new SSE stream's `retry:` field, in ms:
    /// `sse_retry` plus a uniform draw in `0..=sse_retry_jitter`.
    pub(super) fn sse_retry_ms(&mut self) -> u64 {
        let base = self.config.sse_retry.as_millis() as u64;
        let spread = self.config.sse_retry_jitter.as_millis() as u64;
        base + self.rng.up_to(spread)
    }

    /// The 503 answer of a connection the accept gate refused, counted and logged.
    pub(super) fn refuse_at_gate(&mut self, peer: SocketAddr, why: Refused) -> Vec<u8> {
        let (code, retry_after, detail) = match why {
            Refused::PerIp(open) => {
                self.metrics.refused_per_ip += 1;
                // One address can ask thousands of times: one line each only at debug
                // level (the counter says how many).
                log::debug!(
                    "refused connection from {peer}: {open} connections from its address are open (max_connections_per_ip)"
                );
                let d = format!("{open} connections from this address are open, the most one address may hold (AEP_MAX_CONNECTIONS_PER_IP); retry once one has closed");
                (Code::TooManyConnectionsPerIp, storm::PER_IP_RETRY_AFTER, d)
            }
            Refused::Rate(secs) => {
                self.metrics.refused_accept_rate += 1;
                // A storm refuses thousands: one line each only at debug level.
                log::debug!("refused connection from {peer}: accept rate (retry after {secs} s)");
                let d = "the relay is taking connections at its accept rate (AEP_ACCEPT_RATE); retry after Retry-After seconds".to_string();
                (Code::AcceptRateLimited, secs, d)
            }
        };
        self.metrics.reject(code.as_str());
        let after = retry_after.to_string();
        http::error_response(
            code.http_status(),
            code.as_str(),
            &detail,
            &[],
            &[("Retry-After", &after)],
            true,
        )
    }
}
