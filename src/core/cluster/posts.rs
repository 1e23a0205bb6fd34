//! The answers to `POST /events` requests waiting for the stream: the group of `POST`s
//! read in one reactor turn, answered once the stream acknowledged every message of it,
//! in each connection's request order.

use super::publish::{Outgoing, Post, Ticket};
use super::ClusterState;
use crate::cluster::ClusterConfig;
use crate::core::conn::{Answer, Conn};
use crate::core::Core;
use crate::ids::ConnId;
use std::time::Duration;

/// The `POST`s read in one reactor turn, published together: their Events that share a
/// subject travel as one stream message, as a single relay fans them out as one unit
/// (the engine's cost is per message, and so is every relay's fan-out write). Each
/// `POST` is answered once every message of its group is.
#[derive(Debug, Default)]
pub(super) struct Group {
    pub(super) posts: Vec<Post>,
    /// Messages not answered yet (none before the group is published).
    pub(super) remaining: usize,
    /// Messages whose publish failed, with their tickets (in the bodies' order once
    /// sorted: acks come in any order).
    pub(super) failed: Vec<(u64, Outgoing)>,
}

impl Core {
    /// Answers the `POST`s of a group whose every publish was answered: each with its
    /// own count, or all with the one refusal when what failed could not be kept
    /// locally either (the group's Events share stream messages, so they share that
    /// fate). Each connection then sends its answers in request order (those of the
    /// requests read behind its `POST`s included), and reads on; a connection gone
    /// meanwhile is not answered.
    pub(super) fn answer_posts(&mut self, serial: u64, group: Group, error: Option<String>) {
        let Group { posts, failed, .. } = group;
        let outcome = if failed.is_empty() {
            Ok(())
        } else {
            // Some did not reach the stream: kept locally, or refused.
            let e = error.unwrap_or_default();
            let events: usize = posts.iter().map(|p| p.accepted).sum();
            log::warn!(
                "cluster: {} stream messages of {events} Events not stored by the engine ({e})",
                failed.len()
            );
            let mut failed = failed;
            failed.sort_unstable_by_key(|(t, _)| *t);
            self.degraded_msgs(failed.into_iter().map(|(_, o)| o).collect())
                .map(|_| ())
        };
        let mut keys: Vec<ConnId> = Vec::new();
        for Post {
            key,
            close,
            accepted,
        } in posts
        {
            let Some(conn) = self
                .conns
                .get_mut(key)
                .filter(|c| c.request.awaiting == Some(serial))
            else {
                continue; // the connection is gone
            };
            // A peer that half-closed meanwhile gets its answer, then the close; so does
            // every peer once a shutdown began, as `reply` answers.
            let close = close || conn.peer_eof || self.shutdown_deadline.is_some();
            let resp = match &outcome {
                Ok(()) => {
                    self.metrics.ingested_http += accepted as u64;
                    crate::wire::http::accepted_response(accepted, close)
                }
                Err(r) => crate::core::refusal_answer(&mut self.metrics, Some(conn.peer), r, close),
            };
            if let Some(t) = conn.request.post_since.take() {
                self.metrics
                    .post_duration
                    .observe(self.now.saturating_duration_since(t));
            }
            // This `POST`'s place among the connection's answers.
            if let Some(slot) = conn
                .request
                .answers
                .iter_mut()
                .find(|a| matches!(a, Answer::Waiting(_)))
            {
                let Answer::Waiting(cors) = slot else {
                    unreachable!("matched")
                };
                let resp = match cors {
                    Some(origin) => crate::wire::http::insert_headers(
                        &resp,
                        &crate::wire::http::cors_lines(origin),
                    ),
                    None => resp,
                };
                *slot = Answer::Ready(resp, close);
            }
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        for key in keys {
            // Answers go out behind the fan-out frames already decided for this peer.
            self.end_unit();
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            conn.request.awaiting = None;
            conn.since = self.now;
            for a in std::mem::take(&mut conn.request.answers) {
                match a {
                    Answer::Ready(bytes, close) => {
                        conn.answer(bytes, close, self.now);
                        if close {
                            break;
                        }
                    }
                    Answer::Waiting(_) => {
                        debug_assert!(false, "a POST of another group on one connection");
                    }
                }
            }
            self.orders.mark_dirty(key, conn);
            // The requests read behind them, then the socket.
            self.process(key, true);
            self.finish(key);
        }
    }

    /// The serial of the open group of `POST`s (cluster mode), which pipelined
    /// `POST /events` read in the same turn may still join ([`may_join`]).
    pub(in crate::core) fn open_group(&self) -> Option<u64> {
        self.bus.as_ref().and_then(|b| b.open_group)
    }

    /// The group of `POST`s `serial` waited too long for the stream (the bridge answers every publish
    /// within its ack timeout; this only guards against a bridge that cannot).
    pub(in crate::core) fn post_expired(&mut self, serial: u64) {
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        let Some(group) = bus.posts.remove(&serial) else {
            return;
        };
        // Every Event of the group still unanswered counts as failed: kept locally (and retried from
        // the outbox: the stream's dedupe drops a copy that did get in) or refused.
        let mut unanswered = Vec::new();
        bus.tickets.retain(|n, t| match t {
            Ticket::Post(s, o) if *s == serial => {
                unanswered.push((*n, o.clone()));
                false
            }
            _ => true,
        });
        if !bus.stalled && bus.state != ClusterState::Degraded {
            log::warn!("cluster: the engine does not acknowledge in time; degraded until it does");
            bus.state = ClusterState::Degraded;
            bus.stalled = true;
        }
        let mut group = group;
        group.failed.extend(unanswered);
        self.answer_posts(serial, group, Some("no acknowledgement in time".into()));
    }
}

/// How long a `POST` may wait for the stream before the core gives up on the bridge.
pub(in crate::core) fn post_deadline(config: &ClusterConfig) -> Duration {
    config.ack_timeout * 2 + Duration::from_secs(1)
}

/// Whether the next request read on `conn`, which waits for the group of `POST`s
/// `awaiting`, may join that group: only while it is the open group (`open_group`,
/// [`Core::open_group`]), and only a pipelined `POST /events` read in the same turn (its
/// answer then waits in order behind the others, [`Request::answers`](crate::core::conn::Request::answers)).
pub(in crate::core) fn may_join(open_group: Option<u64>, conn: &Conn) -> bool {
    if open_group.is_none() || conn.request.awaiting != open_group {
        return false;
    }
    matches!(
        crate::wire::http::parse_head(&conn.rbuf),
        Ok(Some((head, _))) if head.method == "POST" && head.path == "/events"
    )
}
