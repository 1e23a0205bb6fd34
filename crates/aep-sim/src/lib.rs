//! Drives aep-relay's sans-IO [`Core`] the way its reactor does, with in-memory peers
//! and virtual time: for the relay's tests, benches and fuzz targets. No socket, no
//! poller, no clock: the same input always gives the same output.
//!
//! A peer is a connection whose "socket" is two byte buffers: what the peer sent and the
//! core has not read yet, and what the core wrote and the peer has not taken yet. A
//! write limit makes a peer that stopped reading: the core's writes would block once
//! that many bytes are untaken.
//!
//! ```
//! use aep_sim::Sim;
//! use aep_relay::Config;
//!
//! let mut sim = Sim::new(Config::default()).unwrap();
//! let c = sim.connect(None);
//! sim.feed(c, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false);
//! let out = sim.take_output(c).unwrap();
//! assert!(out.starts_with(b"HTTP/1.1 200 OK\r\n"));
//! ```

use aep_relay::config::ConfigError;
use aep_relay::core::{ConnId, Core, Interest, Journal, NoJournal, Origin, Output, Stop};
use aep_relay::wire::envelope::Event;
use aep_relay::Config;
use aep_relay::Refusal;
use bytes::Bytes;
use std::io::{self, IoSlice, Write};
use std::time::{Duration, Instant};

/// One in-memory peer.
#[derive(Debug, Default)]
struct Peer {
    /// Sent by the peer, not yet handed to the core (reading paused).
    input: Vec<u8>,
    /// The peer closed its writing side after `input`.
    eof: bool,
    eof_given: bool,
    /// Written by the core, not yet taken.
    output: Vec<u8>,
    /// Writes would block once `output` holds this many bytes.
    write_limit: Option<usize>,
    interest: Option<Interest>,
    /// The core half-closed the writing side.
    shut: bool,
}

/// Values per connection, indexed by the slot number [`ConnId::index`] (dense, reused):
/// a lookup is an index, not a hash (the fuzz targets make thousands per input).
#[derive(Debug)]
struct Slots<T>(Vec<Option<T>>);

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots(Vec::new())
    }
}

impl<T> Slots<T> {
    fn get(&self, id: &ConnId) -> Option<&T> {
        self.0.get(id.index())?.as_ref()
    }

    fn get_mut(&mut self, id: &ConnId) -> Option<&mut T> {
        self.0.get_mut(id.index())?.as_mut()
    }

    fn contains_key(&self, id: &ConnId) -> bool {
        self.get(id).is_some()
    }

    fn insert(&mut self, id: ConnId, v: T) {
        let i = id.index();
        if self.0.len() <= i {
            self.0.resize_with(i + 1, || None);
        }
        self.0[i] = Some(v);
    }

    fn remove(&mut self, id: &ConnId) -> Option<T> {
        self.0.get_mut(id.index())?.take()
    }
}

/// The peer's side of the core's writes.
struct Sink<'a>(&'a mut Peer);

impl Write for Sink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let p = &mut *self.0;
        let room = p
            .write_limit
            .map_or(usize::MAX, |l| l.saturating_sub(p.output.len()));
        if room == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(room - n);
            p.output.extend_from_slice(&b[..take]);
            n += take;
            if n == room {
                break;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A [`Core`] with in-memory peers on a virtual clock (crate docs).
#[derive(Debug)]
pub struct Sim {
    core: Core,
    now: Instant,
    peers: Slots<Peer>,
    /// Final output of peers the core closed, until taken.
    closed: Slots<Vec<u8>>,
    stopped: Option<Stop>,
}

impl Sim {
    /// A core for `config` (validated as `Relay::bind` does), without durable history.
    ///
    /// # Errors
    /// The configuration cannot work.
    pub fn new(config: Config) -> Result<Sim, ConfigError> {
        Sim::with_journal(config, Box::new(NoJournal))
    }

    /// A core for `config` keeping accepted Events in `journal`.
    ///
    /// # Errors
    /// The configuration cannot work.
    pub fn with_journal(config: Config, journal: Box<dyn Journal>) -> Result<Sim, ConfigError> {
        config.validate()?;
        // The one clock read: the base of virtual time.
        let now = Instant::now();
        Ok(Sim {
            core: Core::new(config, journal, now, 1_767_225_600_000),
            now,
            peers: Slots::default(),
            closed: Slots::default(),
            stopped: None,
        })
    }

    /// The core itself.
    pub fn core(&mut self) -> &mut Core {
        &mut self.core
    }

    /// Virtual time now.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Why the core asked to stop, once it did.
    pub fn stopped(&self) -> Option<Stop> {
        self.stopped
    }

    /// Opens a connection; `write_limit` makes a peer that takes at most that many
    /// untaken bytes (`Some(0)`: one that never reads). `None` when the core refused it
    /// (at `max_connections`).
    pub fn try_connect(&mut self, write_limit: Option<usize>) -> Option<ConnId> {
        let peer = "127.0.0.1:40000".parse().expect("address");
        let id = self.core.open(peer, self.now).ok()?;
        self.closed.remove(&id);
        self.peers.insert(
            id,
            Peer {
                write_limit,
                ..Peer::default()
            },
        );
        self.run();
        Some(id)
    }

    /// [`Sim::try_connect`], panicking when the core refuses.
    pub fn connect(&mut self, write_limit: Option<usize>) -> ConnId {
        self.try_connect(write_limit)
            .expect("the core refused the connection")
    }

    /// The peer `id` sends `bytes`, then (with `eof`) closes its writing side; the core
    /// reads them as the reactor would and everything it writes is delivered. `false`
    /// when `id` is not open.
    pub fn feed(&mut self, id: ConnId, bytes: &[u8], eof: bool) -> bool {
        let Some(p) = self.peers.get_mut(&id) else {
            return false;
        };
        p.input.extend_from_slice(bytes);
        p.eof |= eof;
        self.read(id);
        self.run();
        true
    }

    /// The peer `id` resets the connection (a socket error).
    pub fn reset(&mut self, id: ConnId) {
        self.core.handle_reset(id, self.now);
        self.run();
    }

    /// Takes what the core wrote to `id` so far (and, once, the final output of a
    /// connection the core closed). Room is made: a write-limited peer takes more.
    /// `None` for an unknown id.
    pub fn take_output(&mut self, id: ConnId) -> Option<Vec<u8>> {
        self.take_some(id, usize::MAX)
    }

    /// As [`Sim::take_output`], but the peer reads at most `max` bytes (the oldest);
    /// the rest stays untaken and still counts against its write limit. Of a connection
    /// the core closed, the first `max` bytes of its final output, the rest dropped
    /// (the socket is gone).
    pub fn take_some(&mut self, id: ConnId, max: usize) -> Option<Vec<u8>> {
        if let Some(p) = self.peers.get_mut(&id) {
            let out = if max >= p.output.len() {
                // A buffer of the same capacity stays behind, so the core's next writes
                // to this peer allocate nothing (a bench counts allocations in the core).
                let cap = p.output.capacity();
                std::mem::replace(&mut p.output, Vec::with_capacity(cap))
            } else {
                let rest = p.output.split_off(max);
                std::mem::replace(&mut p.output, rest)
            };
            if !out.is_empty() && p.interest.is_some_and(|i| i.write) {
                self.core.write_to(id, &mut Sink(p), self.now);
                self.run();
            }
            return Some(out);
        }
        let mut out = self.closed.remove(&id)?;
        out.truncate(max);
        Some(out)
    }

    /// Whether `id` is open.
    pub fn is_open(&self, id: ConnId) -> bool {
        self.peers.contains_key(&id)
    }

    /// Whether the core half-closed `id`'s writing side.
    pub fn is_shut(&self, id: ConnId) -> bool {
        self.peers.get(&id).is_some_and(|p| p.shut)
    }

    /// Bytes the core holds queued for `id`.
    pub fn queued_output(&self, id: ConnId) -> Option<usize> {
        self.core.queued(id)
    }

    /// Bytes of live frames held back behind a replay on `id`.
    pub fn queued_backlog(&self, id: ConnId) -> Option<usize> {
        self.core.backlog(id)
    }

    /// Moves virtual time forward by `d`, running every deadline on the way at its own
    /// time (heartbeats at their exact instants, timeouts in order).
    ///
    /// Each deadline on the way costs one `handle_timeout` (an SSE stream with a 15 s
    /// heartbeat wakes 240 times in an hour): a fuzz target or a test that only wants
    /// "every timeout passed" configures short (virtual) timeouts and advances past
    /// them, not by hours.
    pub fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        while self.step(end).is_some() {}
        self.now = end;
        self.core.handle_timeout(self.now);
        self.run();
    }

    /// Runs the core's earliest deadline if it is due by `end`: virtual time moves to it
    /// (never back), `handle_timeout` runs there and its outputs are carried out.
    /// Returns the time it ran at, or `None` (time unchanged) when no deadline is due by
    /// `end`. [`Sim::advance`] is this in a loop; an invariant check calls it itself to
    /// look at the core between deadlines (after `handle_timeout(t)`, `poll_timeout()`
    /// should be `None` or later than `t`).
    pub fn step(&mut self, end: Instant) -> Option<Instant> {
        let t = self.core.poll_timeout().filter(|t| *t <= end)?;
        self.now = self.now.max(t);
        self.core.handle_timeout(self.now);
        self.run();
        Some(self.now)
    }

    /// Ingests `ndjson` in process, as `POST /events` with `application/x-ndjson`.
    ///
    /// # Errors
    /// [`Refusal`], as the HTTP binding answers.
    pub fn ingest(&mut self, ndjson: Bytes) -> Result<usize, Refusal> {
        let n = self.core.ingest(ndjson, Origin::Http, self.now)?;
        self.run();
        Ok(n)
    }

    /// Publishes Events already parsed and validated, as one ingest unit (as a JSONL
    /// source does, [`Core::publish_events`]): no parse, so a fuzz target can parse a
    /// fixed set of Events once and share them between inputs (cloning an Event shares
    /// its bytes).
    ///
    /// # Errors
    /// [`Refusal::HistoryUnavailable`] from the journal; nothing was published.
    pub fn publish_events(&mut self, events: &[Event]) -> Result<(), Refusal> {
        self.core.publish_events(&mut events.to_vec(), self.now)?;
        self.run();
        Ok(())
    }

    /// Hands the core what a cluster bridge would report (cluster mode), and
    /// carries out its outputs.
    pub fn bus(&mut self, msg: aep_relay::cluster::FromBus) {
        self.core.handle_bus(msg, self.now);
        self.run();
    }

    /// Takes what the core asked of the cluster bridge so far (cluster mode), oldest
    /// first.
    pub fn take_bus(&mut self) -> Vec<aep_relay::cluster::ToBus> {
        std::iter::from_fn(|| self.core.poll_bus()).collect()
    }

    /// Starts a graceful shutdown.
    pub fn shutdown(&mut self) {
        self.core.begin_shutdown(self.now);
        self.run();
    }

    /// Hands `id`'s pending input to the core while it wants to read, then the EOF.
    fn read(&mut self, id: ConnId) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if !p.input.is_empty() && self.core.wants_read(id) {
            let mut input = std::mem::take(&mut p.input);
            // In pieces as a socket would give them, so that reading pauses between
            // requests exactly as it does on TCP; a body of known length straight into
            // its buffer, as the reactor reads it (`Core::body_room`).
            let mut at = 0;
            while at < input.len() && self.core.wants_read(id) {
                if let Some(room) = self.core.body_room(id) {
                    let n = room.len().min(input.len() - at);
                    room[..n].copy_from_slice(&input[at..at + n]);
                    self.core.handle_body_read(id, n, self.now);
                    at += n;
                    continue;
                }
                let end = (at + 64 * 1024).min(input.len());
                self.core.handle_input(id, &input[at..end], self.now);
                at = end;
            }
            // The core does not reach the peers: nothing was added to `p.input` meanwhile,
            // so the rest (and the buffer, for the next feed) goes back as it is.
            if let Some(p) = self.peers.get_mut(&id) {
                debug_assert!(p.input.is_empty());
                input.drain(..at);
                p.input = input;
            }
        }
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        // As a socket read: the EOF is seen only by a read, and the core reads only while
        // it wants input (a paused connection still holds requests to answer).
        if p.eof && p.input.is_empty() && !p.eof_given && self.core.wants_read(id) {
            p.eof_given = true;
            self.core.handle_eof(id, self.now);
        }
    }

    /// Carries out the core's outputs (and replays that yielded their turn, as the
    /// reactor's next turn would) until there are none.
    fn run(&mut self) {
        loop {
            while let Some(out) = self.core.poll_output() {
                self.apply(out);
            }
            if !self.core.is_busy() {
                return;
            }
            self.core.handle_timeout(self.now);
        }
    }

    /// Does what one output asks, as the reactor does.
    fn apply(&mut self, out: Output) {
        match out {
            Output::Writable(id) => {
                if let Some(p) = self.peers.get_mut(&id) {
                    self.core.write_to(id, &mut Sink(p), self.now);
                }
            }
            Output::Interest(id, i) => {
                let Some(p) = self.peers.get_mut(&id) else {
                    return;
                };
                let resumed = i.read && !p.interest.is_none_or(|o| o.read);
                p.interest = Some(i);
                if resumed {
                    self.read(id);
                }
            }
            Output::ShutdownWrite(id) => {
                if let Some(p) = self.peers.get_mut(&id) {
                    p.shut = true;
                }
            }
            Output::Close(id) => {
                if let Some(p) = self.peers.remove(&id) {
                    self.closed.insert(id, p.output);
                }
            }
            Output::Stop(why) => self.stopped = Some(why),
        }
    }
}
