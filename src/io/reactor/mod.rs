//! The reactor: one thread, one `mio::Poll`, the only code of the relay that touches
//! sockets, the clock and the JSONL reader threads. It knows nothing of HTTP, WebSocket,
//! SSE or JSON: it moves bytes between sockets and the sans-IO [`Core`].
//!
//! One turn: poll (until the core's next deadline, at once when the core is busy), read
//! the clock once, accept, read each readable connection with a budget and hand the
//! bytes to the core, write each connection the core announces (up to a budget, the rest
//! in the turns after; sockets are closed the same way), re-register only when the core's
//! interest changes, run the core's due deadlines, and last (cluster mode) hand the bridge
//! thread what the core has for it, once for the whole turn.

#[cfg(feature = "tls")]
use super::tls::TlsStream;
use super::transport::Transport;
use crate::config::Config;
use crate::core::{ConnId, Core, Interest as Want, NoJournal, Origin, Output, Stop};
use crate::refusal::Refusal;
use bytes::Bytes;
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Values from the bridge handled per wake before the sockets get a turn.
#[cfg(feature = "cluster")]
const BUS_BUDGET: usize = 1024;
/// How soon the reactor offers the bridge what its full channel refused.
#[cfg(feature = "cluster")]
const BUS_RETRY: Duration = Duration::from_millis(1);
const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
/// Connection tokens are the core's connection slots, offset by the reserved tokens.
const FIRST_CONN: usize = 2;
/// Reads of one connection per wake before the others get a turn (64 KiB each).
const READS_PER_WAKE: usize = 16;
/// Size of the one read buffer shared by every connection.
const SCRATCH: usize = 64 * 1024;
/// Connections written per batch of output the core announces, and of those left over,
/// per turn, before the reactor polls again. One Event to 10 000 subscribers is 10 000
/// writes, about 100 ms of loopback TCP on one core; a request that arrives meanwhile is
/// read at the next poll and its answer, which the core announces first, goes out then,
/// not after the whole fan-out. 256 writes are a few milliseconds.
const WRITES_PER_TURN: usize = 256;
/// Sockets closed per turn. A close is a FIN through the kernel, about 14 µs on loopback;
/// when 10 000 subscribers drop at once, closing each as its end is read keeps a request
/// that arrives behind those ends waiting about 150 ms. Deregistered at once, closed here.
const CLOSES_PER_TURN: usize = 256;

mod handles;
pub use handles::{StartError, StopHandle};

/// A seed for the core's jitter from the operating system's randomness (the keys of
/// std's `RandomState`), so that relays started in the same millisecond draw apart.
fn os_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    h.finish()
}

fn conn_token(id: ConnId) -> Token {
    Token(id.index() + FIRST_CONN)
}

/// A connection's socket, with what it is registered for.
#[derive(Debug)]
struct Socket {
    io: Transport,
    /// What the core wants ([`Output::Interest`]).
    want: Want,
    /// The transport holds output of its own (TLS records) not yet written.
    pending: bool,
    /// What the poller has: READABLE, plus WRITABLE when `want.write || pending`.
    registered_write: bool,
}

/// The relay: a listener and a [`Core`], driven by one `mio::Poll` on the calling thread.
pub struct Relay {
    core: Core,
    poll: Poll,
    events: Events,
    listener: TcpListener,
    listening: bool,
    local_addr: SocketAddr,
    /// Sockets by core connection slot.
    sockets: Vec<Option<Socket>>,
    /// Connections with input left unread (read budget spent, or reading resumed).
    read_again: Vec<ConnId>,
    /// Connections the core announced as writable past a batch's write budget, oldest
    /// first; written [`WRITES_PER_TURN`] a turn. The core announces a connection again
    /// only once it was written, so the list holds at most one entry per connection.
    write_later: VecDeque<ConnId>,
    /// Sockets of closed connections, deregistered, to be closed [`CLOSES_PER_TURN`] a
    /// turn.
    close_later: VecDeque<Socket>,
    scratch: Vec<u8>,
    stop: Arc<AtomicBool>,
    graceful: Arc<AtomicBool>,
    waker: Arc<Waker>,
    /// JSONL sources (`--stdin`, `--ingest-file`), when configured.
    jsonl: Option<super::feed::Ingest>,
    /// Cluster mode: the bridge thread to the engine, and what the core gave for it that
    /// its channel had no room for yet.
    #[cfg(feature = "cluster")]
    bus: Option<(
        super::bridge::Bridge,
        std::collections::VecDeque<crate::cluster::ToBus>,
    )>,
    /// Why the core asked to stop, once it did.
    stopped: Option<Stop>,
    now: Instant,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("local_addr", &self.local_addr)
            .field("connections", &self.core.connections())
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// Validates `config`, binds its listen address, prepares the poller, rebuilds the
    /// replay buffers from durable history (`--history`) and starts the JSONL sources.
    /// Nothing is served until [`Relay::run`] or [`Relay::poll_once`] is called.
    ///
    /// # Errors
    /// [`StartError`].
    pub fn bind(mut config: Config) -> Result<Relay, StartError> {
        config.validate()?;
        if config.max_memory.is_none() {
            config.max_memory = Some(super::host::memory_budget());
        }
        let addr = config.listen;
        let io_err = |source| StartError::Io { addr, source };
        let poll = Poll::new().map_err(io_err)?;
        let mut listener = TcpListener::bind(addr).map_err(io_err)?;
        let local_addr = listener.local_addr().map_err(io_err)?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(io_err)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(io_err)?);
        let now = Instant::now();
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let history = config.history.clone();
        #[cfg(feature = "cluster")]
        let bus = match config.cluster.clone() {
            Some(c) => Some((
                super::bridge::Bridge::start(c, waker.clone())
                    .map_err(|e| StartError::Cluster(e.to_string()))?,
                Default::default(),
            )),
            None => None,
        };
        #[cfg(not(feature = "cluster"))]
        if config.cluster.is_some() {
            return Err(StartError::Cluster(
                "this build leaves out the `cluster` feature".into(),
            ));
        }
        let jsonl = super::feed::Ingest::start(&config.jsonl, config.max_body_bytes, waker.clone())
            .map_err(StartError::Jsonl)?;
        let mut core = Core::new(config, Box::new(NoJournal), now, unix_ms);
        core.seed(os_seed());
        // The durable history: rebuild the replay buffers, then keep appending.
        if let Some(h) = history {
            let (dir, sync) = (h.dir.clone(), h.fsync != super::history::Fsync::Never);
            let (h, st) = super::history::History::open(h, core.store_mut())?;
            log::info!(
                "history {}: {} of {} session files read, {} Events offered to the replay buffers, {} invalid and {} torn lines skipped (fsync {})",
                h.config().dir.display(), st.files_read, st.files, st.events, st.invalid, st.torn, h.config().fsync
            );
            core.set_journal(Box::new(h));
            if core.clustered() {
                // The cluster outbox on disk beside the history, under its lock.
                let (f, kept) = super::outbox::OutboxFile::open(&dir, sync).map_err(|e| {
                    StartError::Cluster(format!(
                        "{}: {e}",
                        dir.join(super::outbox::OUTBOX_FILE).display()
                    ))
                })?;
                let kept = kept.into_iter().map(|k| (k.id, k.subject, k.payload));
                core.set_outbox_log(Box::new(f), kept.collect());
            }
        }
        Ok(Relay {
            core,
            poll,
            events: Events::with_capacity(1024),
            listener,
            listening: true,
            local_addr,
            sockets: Vec::new(),
            read_again: Vec::new(),
            write_later: VecDeque::new(),
            close_later: VecDeque::new(),
            scratch: vec![0; SCRATCH],
            stop: Arc::new(AtomicBool::new(false)),
            graceful: Arc::new(AtomicBool::new(false)),
            waker,
            jsonl,
            #[cfg(feature = "cluster")]
            bus,
            stopped: None,
            now,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        self.core.config()
    }

    /// A handle that stops [`Relay::run`] from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            flag: self.stop.clone(),
            graceful: self.graceful.clone(),
            waker: self.waker.clone(),
        }
    }

    /// Runs until stopped through a [`StopHandle`] or, after a graceful shutdown
    /// ([`StopHandle::shutdown`]), until every connection is flushed and closed.
    ///
    /// # Errors
    /// An I/O error of the poller itself (per-connection errors only close that
    /// connection); `ErrorKind::TimedOut` when a graceful shutdown could not flush every
    /// connection within `shutdown_deadline`.
    pub fn run(&mut self) -> io::Result<()> {
        while !self.stop.load(Ordering::SeqCst) {
            self.poll_once(None)?;
            match self.stopped {
                None => {}
                Some(Stop::Drained) => return Ok(()),
                Some(Stop::DeadlinePassed(n)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("shutdown deadline passed with {n} connections not flushed"),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Starts a graceful shutdown (see [`Core::begin_shutdown`]): stop accepting, end
    /// every stream with a notice; `run` returns once all is flushed or the deadline
    /// passes.
    pub fn begin_shutdown(&mut self) {
        if self.listening {
            self.listening = false;
            let _ = self.poll.registry().deregister(&mut self.listener);
        }
        self.core.begin_shutdown(Instant::now());
        self.drain();
        self.send_bus();
    }

    /// Ingests Events in-process, exactly as `POST /events` with
    /// `application/x-ndjson` would (all or nothing); see [`Core::ingest`].
    ///
    /// # Errors
    /// [`Refusal`] as for the HTTP binding.
    pub fn ingest(&mut self, ndjson: Bytes) -> Result<usize, Refusal> {
        self.now = Instant::now();
        let n = self.core.ingest(ndjson, Origin::Http, self.now)?;
        self.drain();
        self.send_bus();
        Ok(n)
    }

    /// Time since [`Relay::bind`].
    pub fn uptime(&self) -> Duration {
        self.core.uptime()
    }

    /// Events accepted since start.
    pub fn ingested(&self) -> u64 {
        self.core.ingested()
    }

    /// Waits at most `timeout` (`None`: until the core's next deadline) for readiness,
    /// handles it, runs due deadlines and writes output. For hosts that drive the relay
    /// from their own loop.
    ///
    /// # Errors
    /// An I/O error of the poller itself.
    pub fn poll_once(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let now = Instant::now();
        let mut wake = self.core.poll_timeout();
        if let Some(t) = self.jsonl.as_ref().and_then(|j| j.retry_at()) {
            wake = Some(wake.map_or(t, |w| w.min(t)));
        }
        let mut timeout = match (timeout, wake) {
            (Some(t), Some(w)) => Some(t.min(w.saturating_duration_since(now))),
            (t, None) => t,
            (None, Some(w)) => Some(w.saturating_duration_since(now)),
        };
        if self.core.is_busy()
            || !self.read_again.is_empty()
            || !self.write_later.is_empty()
            || !self.close_later.is_empty()
        {
            timeout = Some(Duration::ZERO);
        }
        #[cfg(feature = "cluster")]
        if self.bus.as_ref().is_some_and(|(_, held)| !held.is_empty()) {
            // The bridge's channel was full: try again soon.
            timeout = Some(timeout.map_or(BUS_RETRY, |t| t.min(BUS_RETRY)));
        }
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        // The clock, once per turn.
        self.now = Instant::now();
        let events = std::mem::replace(&mut self.events, Events::with_capacity(0));
        for e in events.iter() {
            match e.token() {
                LISTENER => self.accept(),
                WAKER => {
                    if self.graceful.load(Ordering::SeqCst) {
                        self.begin_shutdown();
                    }
                    self.on_wake();
                }
                Token(t) => {
                    let id = ConnId(t - FIRST_CONN);
                    if e.is_writable() || e.is_write_closed() {
                        self.write(id);
                    }
                    if e.is_readable() || e.is_read_closed() || e.is_error() {
                        self.read(id);
                    }
                }
            }
            self.drain();
        }
        self.events = events;
        for id in std::mem::take(&mut self.read_again) {
            self.read(id);
            self.drain();
        }
        self.deferred();
        if self
            .jsonl
            .as_ref()
            .and_then(|j| j.retry_at())
            .is_some_and(|t| t <= self.now)
        {
            self.on_wake(); // JSONL: retry a chunk the history refused
        }
        self.core.handle_timeout(self.now);
        self.drain();
        self.send_bus();
        Ok(())
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((sock, peer)) => self.admit(sock, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::warn!("accept failed: {e}");
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut sock: mio::net::TcpStream, peer: SocketAddr) {
        let _ = sock.set_nodelay(true);
        #[cfg(not(feature = "tls"))]
        let tls: Option<()> = None;
        #[cfg(feature = "tls")]
        let tls = self.core.config().tls.clone();
        let id = match self.core.open(peer, self.now) {
            Ok(id) => id,
            Err(answer) => {
                // Best effort, plain HTTP only; the socket closes when dropped.
                if tls.is_none() {
                    let _ = sock.write(&answer);
                }
                return;
            }
        };
        #[cfg(not(feature = "tls"))]
        let io = Transport::Tcp(sock);
        #[cfg(feature = "tls")]
        let io = match tls {
            None => Transport::Tcp(sock),
            Some(tls) => match TlsStream::new(sock, tls) {
                Ok(s) => Transport::Tls(Box::new(s)),
                Err(e) => {
                    log::warn!("refused connection from {peer}: TLS set-up failed: {e}");
                    return self.core.handle_reset(id, self.now);
                }
            },
        };
        let mut socket = Socket {
            io,
            want: Want {
                read: true,
                write: false,
            },
            pending: false,
            registered_write: false,
        };
        let registry = self.poll.registry();
        if let Err(e) = socket
            .io
            .register(registry, conn_token(id), Interest::READABLE)
        {
            log::warn!("cannot register connection from {peer}: {e}");
            return self.core.handle_reset(id, self.now);
        }
        let i = id.index();
        if self.sockets.len() <= i {
            self.sockets.resize_with(i + 1, || None);
        }
        self.sockets[i] = Some(socket);
    }

    /// Reads `id` until it would block, the core stops wanting input, or the budget for
    /// this wake is spent.
    fn read(&mut self, id: ConnId) {
        for _ in 0..READS_PER_WAKE {
            if !self.core.wants_read(id) {
                return;
            }
            let Some(Some(s)) = self.sockets.get_mut(id.index()) else {
                return;
            };
            // A body of known length is read straight into its buffer; anything else
            // through the scratch buffer.
            let (read, direct) = match self.core.body_room(id) {
                Some(room) => (s.io.read(room), true),
                None => (s.io.read(&mut self.scratch), false),
            };
            match read {
                Ok(0) => return self.core.handle_eof(id, self.now),
                Ok(n) if direct => self.core.handle_body_read(id, n, self.now),
                Ok(n) => self.core.handle_input(id, &self.scratch[..n], self.now),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // A TLS handshake may have output waiting for a writable socket.
                    if !matches!(s.io, Transport::Tcp(_)) {
                        self.write(id);
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::debug!("read error on {id}: {e}");
                    return self.core.handle_reset(id, self.now);
                }
            }
        }
        if !self.read_again.contains(&id) {
            self.read_again.push(id);
        }
    }

    /// Writes what the transport holds of its own, then what the core has queued.
    fn write(&mut self, id: ConnId) {
        let Some(Some(s)) = self.sockets.get_mut(id.index()) else {
            return;
        };
        self.core.write_to(id, &mut s.io, self.now);
        let Some(Some(s)) = self.sockets.get_mut(id.index()) else {
            return;
        };
        match s.io.write_pending() {
            Ok(pending) => s.pending = pending,
            Err(_) => return self.core.handle_reset(id, self.now),
        }
        if !matches!(s.io, Transport::Tcp(_)) {
            // Sealed records waiting in the transport count in the queue's bound.
            let held = s.io.held();
            self.core.set_held(id, held);
        }
        self.register(id);
    }

    /// Re-registers `id` when what it needs from the poller changed.
    fn register(&mut self, id: ConnId) {
        let Some(Some(s)) = self.sockets.get_mut(id.index()) else {
            return;
        };
        let write = s.want.write || s.pending;
        if write != s.registered_write {
            s.registered_write = write;
            let interest = if write {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            let _ =
                s.io.reregister(self.poll.registry(), conn_token(id), interest);
        }
    }

    /// Writes up to [`WRITES_PER_TURN`] of the connections left over by earlier batches,
    /// and closes up to [`CLOSES_PER_TURN`] sockets.
    fn deferred(&mut self) {
        let n = self.close_later.len().min(CLOSES_PER_TURN);
        self.close_later.drain(..n);
        // One budget for the whole pass, what the writes announce in turn included: a
        // write that resumes a paused publication announces its fan-out again.
        let mut budget = WRITES_PER_TURN;
        while budget > 0 {
            let Some(id) = self.write_later.pop_front() else {
                return;
            };
            budget -= 1;
            self.write(id);
            self.drain_within(&mut budget);
        }
    }

    /// Carries out what the core asks for, until it asks for nothing more. Of the
    /// connections it announces as writable, the first [`WRITES_PER_TURN`] are written
    /// now (answers to requests among them: the core announces those first) and the rest
    /// after the next poll.
    fn drain(&mut self) {
        let mut budget = WRITES_PER_TURN;
        self.drain_within(&mut budget);
    }

    /// [`Relay::drain`], writing at most `budget` connections (lowered by each write)
    /// and keeping the rest for later turns.
    fn drain_within(&mut self, budget: &mut usize) {
        while let Some(out) = self.core.poll_output() {
            match out {
                Output::Writable(id) if *budget == 0 => self.write_later.push_back(id),
                Output::Writable(id) => {
                    *budget -= 1;
                    self.write(id);
                }
                Output::Interest(id, want) => {
                    if let Some(Some(s)) = self.sockets.get_mut(id.index()) {
                        let resumed = want.read && !s.want.read;
                        s.want = want;
                        if resumed && !self.read_again.contains(&id) {
                            self.read_again.push(id);
                        }
                    }
                    self.register(id);
                }
                Output::ShutdownWrite(id) => {
                    if let Some(Some(s)) = self.sockets.get_mut(id.index()) {
                        s.io.shutdown_write();
                    }
                }
                Output::Close(id) => {
                    if let Some(mut s) = self.sockets.get_mut(id.index()).and_then(Option::take) {
                        let _ = s.io.deregister(self.poll.registry());
                        self.close_later.push_back(s);
                    }
                    // Left in `write_later`: writing a slot that is empty, or taken by a
                    // new connection, writes what is queued there, if anything.
                    self.read_again.retain(|r| *r != id);
                }
                Output::Stop(why) => {
                    // Every connection is closed when `run` returns, its socket too.
                    self.close_later.clear();
                    self.stopped = Some(why);
                }
            }
        }
    }

    /// Hands the bridge what the core has for it: once per turn (and after a call from
    /// the host), so that the `POST`s and WebSocket Events read in one turn travel as
    /// few stream messages as they can, and every relay fans them out as one unit.
    fn send_bus(&mut self) {
        #[cfg(feature = "cluster")]
        if let Some((bridge, held)) = self.bus.as_mut() {
            held.extend(std::iter::from_fn(|| self.core.poll_bus()));
            while let Some(m) = held.pop_front() {
                if let Err(m) = bridge.send(m) {
                    held.push_front(m);
                    break;
                }
            }
        }
    }

    /// Ingests what the JSONL sources read: per chunk, journal then publish.
    fn on_wake(&mut self) {
        #[cfg(feature = "cluster")]
        if let Some((bridge, _)) = self.bus.as_mut() {
            // What the engine said, a budget's worth per turn.
            let mut took = 0;
            while let Some(m) = bridge.try_recv() {
                self.core.handle_bus(m, self.now);
                took += 1;
                if took == BUS_BUDGET {
                    let _ = self.waker.wake();
                    break;
                }
            }
            self.drain();
        }
        let Some(mut jsonl) = self.jsonl.take() else {
            return;
        };
        let (core, now) = (&mut self.core, self.now);
        let stop = jsonl.drain(now, |events| core.publish_events(events, now));
        if stop {
            self.stop.store(true, Ordering::SeqCst);
        }
        if jsonl.more_ready() {
            let _ = self.waker.wake();
        }
        self.jsonl = Some(jsonl);
        self.drain();
    }
}
