//! Connection deadlines: one armed deadline per connection, kept in a min-heap with a
//! generation, so the core's next wake-up is a heap peek and no timer tick scans every
//! connection.
//!
//! A connection's deadline depends on its phase (request timeout, keep-alive idle,
//! linger, SSE heartbeat, WebSocket ping and idle). The core does not move an entry when
//! a deadline gets *later* (a write resets the heartbeat): the entry fires early, the
//! core recomputes the deadline and re-arms. It pushes a new entry only when a deadline
//! gets *earlier* than the one armed (a connection entering `Closing`). Entries of a
//! connection that closed, or of an earlier arming, carry a generation that no longer
//! matches and are dropped when they come due. Generations are never reused, so a
//! connection slot reused by a new connection does not inherit a stale deadline.

use crate::ids::ConnId;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// Armed deadlines: `(when, connection slot, generation)`, earliest first.
///
/// Invariant: every live connection with a deadline has exactly one entry whose
/// generation matches its `Conn::armed`; other entries are stale.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, ConnId, u64)>>,
    generation: u64,
}

impl Timers {
    /// Arms a deadline at `at` for slot `key`; returns the generation that names it.
    pub(crate) fn arm(&mut self, at: Instant, key: ConnId) -> u64 {
        self.generation += 1;
        self.heap.push(Reverse((at, key, self.generation)));
        self.generation
    }

    /// The earliest entry's time (possibly stale: waking early is harmless).
    pub(crate) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Takes the earliest entry due at `now` (time at or before it).
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(ConnId, u64)> {
        match self.heap.peek() {
            Some(Reverse((at, _, _))) if *at <= now => self
                .heap
                .pop()
                .map(|Reverse((_, key, generation))| (key, generation)),
            _ => None,
        }
    }

    /// The last generation handed out: every armed connection's is at most this.
    #[cfg(debug_assertions)]
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Entries held, stale ones included.
    #[cfg(feature = "test-probes")]
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}
