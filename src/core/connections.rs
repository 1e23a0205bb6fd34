//! `GET /connections` (scope `admin`): one row per connection, the most lagging consumer
//! first, so an operator sees which consumer falls behind, by how much, on what filter
//! and under which token's name (`aep-relay top` polls it; the status page shows the
//! first ten). Nothing here runs on the fan-out path: a row reads counters fan-out keeps
//! anyway (its queue, its drops, the publication it last decided) and one mark the core
//! moves per write.

use super::conn::{Conn, Phase};
use super::{ConnId, Core};
use crate::fanout::Subscription;
use crate::wire::envelope::Capture;
use serde::Serialize;
use std::net::SocketAddr;

/// One connection as `GET /connections` shows it.
#[derive(Debug, Serialize)]
pub(super) struct Row<'a> {
    /// The connection's number (its slot: reused once it closed).
    id: usize,
    /// `http` (requests), `sse`, `ws`, or `closing` (answered for the last time).
    binding: &'static str,
    peer: SocketAddr,
    /// The name of the token a stream or socket was opened with (the tokens file's
    /// `name=`, a JWT's `sub`); never the token. `null` when it has none, and for plain
    /// requests.
    holder: Option<&'a str>,
    /// Its live subscriptions: one for an SSE stream, any number on a WebSocket.
    subscriptions: Vec<Sub<'a>>,
    /// Bytes queued toward it and not yet written: its output queue, the live frames
    /// held behind its replay, and what the transport holds (TLS records).
    pub(super) queued_bytes: usize,
    /// Events published between the last one written to it and the last one queued
    /// for it (0 once everything queued was written). Counted in the relay's
    /// publications: for a consumer whose filter matches few Events, an upper bound.
    behind: u64,
    /// Whether a replay is still being paged into its queue.
    replaying: bool,
    /// Events not delivered to it because of backpressure, by severity (AEP-0003 §8.4).
    dropped: Dropped,
    /// Seconds since it connected.
    age_s: f64,
}

/// A subscription in a row: its WebSocket id (none for SSE), its filter in attr-match
/// form and its capture ceiling (`null`: as received).
#[derive(Debug, Serialize)]
struct Sub<'a> {
    id: Option<&'a str>,
    filter: serde_json::Value,
    capture: Option<&'static str>,
}

#[derive(Debug, Serialize)]
struct Dropped {
    debug: u64,
    info: u64,
}

impl Core {
    /// `GET /connections`: every connection's row, most lagging first (by `behind`,
    /// then queued bytes, then id), at most `limit` of them (`None`: all), as
    /// `{"connections": [row, …], "total": N}`.
    pub(super) fn connections_json(&self, limit: Option<usize>) -> Vec<u8> {
        #[derive(Serialize)]
        struct Doc<'a> {
            total: usize,
            connections: Vec<Row<'a>>,
        }
        let doc = Doc {
            total: self.conns.len(),
            connections: self.lagging(limit.unwrap_or(usize::MAX), |_| true),
        };
        // Straight to bytes: no JSON tree of 10 000 rows in between.
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// The rows of the connections `keep` admits, most lagging first, at most `n`. The
    /// filters (the costly part, one JSON value each) are written only for the rows kept.
    pub(super) fn lagging(&self, n: usize, keep: impl Fn(&Row<'_>) -> bool) -> Vec<Row<'_>> {
        let mut rows: Vec<(Row<'_>, &Conn)> = self
            .conns
            .iter()
            .map(|(id, c)| (self.row(id, c), c))
            .filter(|(r, _)| keep(r))
            .collect();
        rows.sort_unstable_by(|(a, _), (b, _)| {
            (b.behind, b.queued_bytes, a.id).cmp(&(a.behind, a.queued_bytes, b.id))
        });
        rows.truncate(n);
        rows.into_iter()
            .map(|(mut r, c)| {
                r.subscriptions = self.subscriptions_of(c);
                r
            })
            .collect()
    }

    /// Connection `c`'s live subscriptions, each with its filter in attr-match form.
    fn subscriptions_of<'a>(&'a self, c: &'a Conn) -> Vec<Sub<'a>> {
        let sub = |ws_id: Option<&'a str>, s: &Subscription| Sub {
            id: ws_id,
            filter: s.filter.to_json(),
            capture: s.ceiling.map(Capture::as_str),
        };
        match &c.phase {
            Phase::Sse { sub: key, .. } => self
                .hub
                .get(*key)
                .map(|s| sub(None, s))
                .into_iter()
                .collect(),
            Phase::Ws(ws) => ws
                .subs
                .iter()
                .filter_map(|(name, key)| Some(sub(Some(name), self.hub.get(*key)?)))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Connection `c`'s row, its subscriptions not yet written.
    fn row<'a>(&'a self, id: ConnId, c: &'a Conn) -> Row<'a> {
        let binding = match &c.phase {
            Phase::Head | Phase::Body { .. } | Phase::Discard(_) => "http",
            Phase::Sse { .. } => "sse",
            Phase::Ws(_) => "ws",
            Phase::Closing => "closing",
        };
        let s = &c.subscriber;
        let queued_bytes = s.out.len() + s.backlog.len();
        let behind = if queued_bytes == 0 && s.replay.is_empty() {
            0
        } else {
            s.decided.saturating_sub(c.written_publication)
        };
        Row {
            id: id.index(),
            binding,
            peer: c.peer,
            holder: c.grant().and_then(|g| g.holder.as_deref()),
            subscriptions: Vec::new(),
            queued_bytes,
            behind,
            replaying: !s.replay.is_empty(),
            dropped: Dropped {
                debug: s.dropped.debug,
                info: s.dropped.info,
            },
            age_s: self.now.saturating_duration_since(c.opened).as_secs_f64(),
        }
    }
}
