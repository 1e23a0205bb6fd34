//! What the core tells the reactor, kept apart from the connection table: the outputs
//! in order, the connections with output to announce, and the armed deadlines.
//!
//! Apart so that a handler holding `&mut Conn` (borrowed from `Core::conns`) can mark
//! it dirty, change its interest or re-arm its deadline through `Core::orders`, a field
//! disjoint from the table, without letting go of the connection and looking it up
//! again by its `ConnId`.

use super::conn::{Conn, Phase};
use super::timer::Timers;
use super::{Interest, Output};
use crate::config::Config;
use crate::ids::ConnId;
use std::collections::VecDeque;

/// The core's orders to the reactor ([`super::Core::poll_output`]) and what they are
/// made from at the end of each call (`Core::settle`).
#[derive(Debug, Default)]
pub(super) struct Orders {
    /// What the reactor must do, in order.
    pub(super) outputs: VecDeque<Output>,
    /// Connections with output to announce ([`Output::Writable`]): streams (fan-out's
    /// deliveries, WebSocket replies).
    pub(super) dirty: Vec<ConnId>,
    /// Connections with an answer to a request to announce: announced before `dirty`,
    /// so an emitter's `202` does not wait behind a write to every subscriber.
    pub(super) answered: Vec<ConnId>,
    /// One armed deadline per connection (see `timer`).
    pub(super) timers: Timers,
}

impl Orders {
    /// Files `conn` (connection `key`) for an [`Output::Writable`] at the end of the
    /// call, once: a stream among the deliveries, anything else among the answers.
    pub(super) fn mark_dirty(&mut self, key: ConnId, conn: &mut Conn) {
        if conn.subscriber.dirty {
            return;
        }
        conn.subscriber.dirty = true;
        if matches!(conn.phase, Phase::Sse { .. } | Phase::Ws(_)) {
            self.dirty.push(key);
        } else {
            self.answered.push(key);
        }
    }

    /// Records the interest wanted for `conn` (`None`: unchanged) and orders it when it
    /// changed ([`Output::Interest`]).
    pub(super) fn set_interest(
        &mut self,
        key: ConnId,
        conn: &mut Conn,
        read: Option<bool>,
        write: Option<bool>,
    ) {
        let (r, w) = (
            read.unwrap_or(conn.reading),
            write.unwrap_or(conn.want_write),
        );
        if (r, w) != (conn.reading, conn.want_write) {
            conn.reading = r;
            conn.want_write = w;
            let i = Interest { read: r, write: w };
            self.outputs.push_back(Output::Interest(key, i));
        }
    }

    /// Arms `conn`'s deadline ([`Conn::deadline`]) when it is earlier than the one
    /// armed; a later one waits for the armed entry to fire (see `timer`).
    pub(super) fn rearm(&mut self, key: ConnId, conn: &mut Conn, c: &Config) {
        let Some(at) = conn.deadline(c, super::post_wait(c)) else {
            return;
        };
        if conn.armed.is_some_and(|(t, _)| t <= at) {
            return;
        }
        conn.armed = Some((at, self.timers.arm(at, key)));
    }
}
