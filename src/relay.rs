//! The reactor: one thread, one `mio::Poll`, a slab of connections, a coarse tick for
//! heartbeats and timeouts. Every byte a peer sends is handled here, in readiness order;
//! a slow or dead peer never blocks anyone else (all sockets are non-blocking and output
//! is queued per connection).

use crate::auth::Scopes;
use crate::config::{Config, ConfigError};
use crate::conn::{BodyReader, Conn, Flush, Phase, ReplayJob};
use crate::control::Claims;
use crate::envelope::{self, Event};
use crate::fanout::{Binding, Hub, Subscription};
use crate::http::{self, ChunkError, Framing, FramingError, HeadError, RequestHead};
use crate::metrics::{self, Exposition, Metrics};
use crate::sse;
use crate::subscription;
use crate::store::{Admission, ReplayFrom, Store, StreamId};
#[cfg(feature = "tls")]
use crate::tls::TlsStream;
use crate::transport::{MemoryPipe, Transport};
use bytes::Bytes;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use serde_json::json;
use slab::Slab;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod replay;
mod socket;
/// The status page served at `GET /` (one self-contained file, no external assets).
#[cfg(feature = "status-page")]
const STATUS_PAGE: &str = include_str!("status.html");

/// The code of a 404 answer: counted in `/metrics`, but not among the `/status`
/// refusals (see `Relay::status_json`).
const NOT_FOUND: &str = "not-found";

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONN: usize = 3;
/// How long a connection that got its final answer keeps draining input before it is
/// dropped (so the peer sees the answer rather than a reset).
const LINGER: Duration = Duration::from_secs(2);

/// The streams a subscription's `from` replays, each with where it starts.
///
/// `all`: every held stream, least-recently-written first (AEP-0003 §5). Positions: a
/// position names a bare session (AEP-0001 §7 #6), so it applies to every owning stream
/// of that name `(source, session)` (AEP-0001 §5.2), each replayed strictly after it, in
/// the order the positions are given and, within a name, the order the streams were
/// created. A name given more than once replays each of its streams once, after the
/// lowest of its positions (never less than any of them asked for: at-least-once,
/// AEP-0001 §7 #4). A name not held adds nothing.
fn replay_sessions(store: &Store<Event>, from: &subscription::From) -> VecDeque<(StreamId, ReplayFrom)> {
    match from {
        subscription::From::Live => VecDeque::new(),
        subscription::From::All => store
            .stream_ids()
            .into_iter()
            .map(|s| (s, ReplayFrom::Start))
            .collect(),
        subscription::From::Positions(ps) => {
            let mut out: VecDeque<(StreamId, ReplayFrom)> = VecDeque::new();
            let mut at: HashMap<StreamId, usize> = HashMap::new();
            for p in ps {
                let pos = (p.epoch, p.seq);
                for stream in store.streams(&p.session) {
                    match at.get(&stream.id) {
                        Some(&i) => {
                            if let ReplayFrom::After(q) = &mut out[i].1 {
                                *q = (*q).min(pos);
                            }
                        }
                        None => {
                            at.insert(stream.id, out.len());
                            out.push_back((stream.id, ReplayFrom::After(pos)));
                        }
                    }
                }
            }
            out
        }
    }
}

/// An Event about to be published, made fit to be held in a replay buffer (AEP-0003 §5):
/// when it may be held (it is session-scoped) and its bytes are only part of the
/// `backing`-byte buffer it was read into (a batch body, a message with whitespace
/// around the Event), its bytes are copied into an allocation of their own
/// ([`Event::compact`]), so what the store keeps, and what `aep_buffered_bytes` counts,
/// is the Event and not its batch. One copy per held Event at ingest, never per
/// delivery; agent-scoped Events are never held and are not copied.
pub(crate) fn keepable(mut ev: Event, backing: usize) -> Event {
    if ev.scope() != envelope::Scope::Agent {
        ev.compact(backing);
    }
    ev
}

/// `METHOD /path` of a request for the log: never its query string (it may carry
/// `access_token`, AEP-0003 §8.1).
fn request_line(head: &RequestHead) -> String {
    format!("{} {}", head.method, head.path)
}

/// A peer-influenced text made fit for one log line: control characters escaped, cut
/// after 300 characters.
fn loggable(s: &str) -> String {
    const MAX: usize = 300;
    let mut out = String::with_capacity(s.len().min(MAX + 8));
    for (i, c) in s.chars().enumerate() {
        if i == MAX {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn cors_lines(origin: &str) -> String {
    format!("Access-Control-Allow-Origin: {origin}\r\nVary: Origin\r\n")
}

fn conn_token(key: usize) -> Token {
    Token(key + FIRST_CONN)
}

/// Why the relay could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Binding the listener or creating the poller failed.
    #[error("cannot listen on {addr}: {source}")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// The history directory (`--history`) cannot be opened (JSONL and history, issue 5).
    #[error(transparent)]
    History(#[from] crate::history::HistoryError),
    /// A JSONL source (`--stdin`, `--ingest-file`) could not be started.
    #[error("cannot start JSONL ingest: {0}")]
    Jsonl(io::Error),
}

/// Why an Event, a batch or a request was refused. Each refusal has exactly one HTTP
/// status and JSON error code (see [`Refusal::status`], [`Refusal::code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// An Event failed envelope validation (400 `invalid-event`); `line` is 1-based.
    #[error("line {line}: {detail}")]
    InvalidEvent {
        /// 1-based line of the failing Event in the body (1 for a single Event).
        line: usize,
        /// What was wrong, naming the attribute and section.
        detail: String,
    },
    /// A batch held more Events than `max_batch_events` (413 `too-many-events`).
    #[error("the batch holds {count} Events; at most {max} are accepted (AEP_MAX_BATCH)")]
    TooManyEvents {
        /// Events in the batch.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A command arrived on a binding that may not carry control (403 `forbidden`),
    /// AEP-0004 §4.1.
    #[error("line {line}: `{event_type}` is a command; control flows only on an authenticated duplex binding (WebSocket), never over HTTP POST (AEP-0004 §4.1)")]
    Command {
        /// 1-based line.
        line: usize,
        /// The command type.
        event_type: String,
    },
    /// The durable history (`--history`) could not keep the Events, so none of them was
    /// accepted (503 `history-unavailable`): disk full, unwritable directory, I/O error.
    #[error(
        "the relay's history cannot keep these Events, so none was accepted; retry later: {detail}"
    )]
    HistoryUnavailable {
        /// The failed operation and the OS error.
        detail: String,
    },
}

impl Refusal {
    /// The HTTP status for this refusal.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::InvalidEvent { .. } => 400,
            Refusal::TooManyEvents { .. } => 413,
            Refusal::Command { .. } => 403,
            Refusal::HistoryUnavailable { .. } => 503,
        }
    }

    /// The JSON error code.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::InvalidEvent { .. } => "invalid-event",
            Refusal::TooManyEvents { .. } => "too-many-events",
            Refusal::Command { .. } => "forbidden",
            Refusal::HistoryUnavailable { .. } => "history-unavailable",
        }
    }

    /// The full JSON error body.
    pub fn body(&self) -> Vec<u8> {
        match self {
            Refusal::InvalidEvent { line, detail } => {
                http::error_body(self.code(), detail, &[("line", json!(line))])
            }
            Refusal::Command { line, .. } => {
                http::error_body(self.code(), &self.to_string(), &[("line", json!(line))])
            }
            _ => http::error_body(self.code(), &self.to_string(), &[]),
        }
    }
}

/// Stops a running relay from any thread.
#[derive(Clone, Debug)]
pub struct StopHandle {
    flag: Arc<AtomicBool>,
    graceful: Arc<AtomicBool>,
    waker: Arc<Waker>,
}

impl StopHandle {
    /// Asks the relay to stop at once; `run` returns after its current iteration
    /// without notifying consumers.
    pub fn stop(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }

    /// Asks the relay to shut down gracefully, as on SIGTERM: stop accepting, end every
    /// stream with a notice, flush, then `run` returns (see [`Relay::run`]).
    pub fn shutdown(&self) {
        self.graceful.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}

/// The relay: listener, connections, replay store and subscriptions, driven by one
/// `mio::Poll` on the calling thread.
pub struct Relay {
    config: Config,
    poll: Poll,
    events: Events,
    listener: TcpListener,
    local_addr: SocketAddr,
    conns: Slab<Conn>,
    store: Store<Event>,
    hub: Hub,
    /// Which WebSocket connections claim which sessions (command routing, roster).
    claims: Claims,
    stop: Arc<AtomicBool>,
    graceful: Arc<AtomicBool>,
    waker: Arc<Waker>,
    /// Set once a graceful shutdown began: the deadline for flushing.
    shutdown_deadline: Option<Instant>,
    /// Counters for `/metrics`.
    metrics: Metrics,
    started: Instant,
    next_tick: Instant,
    dirty: Vec<usize>,
    doomed: Vec<usize>,
    scratch: Vec<u8>,
    /// Final output of in-memory connections the relay closed, until taken.
    memory_closed: Vec<(usize, Vec<u8>)>,
    /// Events accepted since start.
    ingested: u64,
    /// JSONL sources (`--stdin`, `--ingest-file`), when configured.
    jsonl: Option<crate::jsonl::Ingest>,
    /// The durable history (`--history`), when configured.
    history: Option<crate::history::History>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("local_addr", &self.local_addr)
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// Validates `config`, binds its listen address and prepares the poller. Nothing is
    /// served until [`Relay::run`] or [`Relay::poll_once`] is called.
    ///
    /// # Errors
    /// [`StartError`].
    pub fn bind(config: Config) -> Result<Relay, StartError> {
        config.validate()?;
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
        let mut store = Store::new(config.buffer_per_session, config.max_sessions);
        // JSONL and history (issue 5): rebuild the replay buffers, then start the sources.
        let history = match &config.history {
            Some(h) => {
                let (h, st) = crate::history::History::open(h.clone(), &mut store)?;
                log::info!(
                    "history {}: {} of {} session files read, {} Events offered to the replay buffers, {} invalid and {} torn lines skipped (fsync {})",
                    h.config().dir.display(), st.files_read, st.files, st.events, st.invalid, st.torn, h.config().fsync
                );
                Some(h)
            }
            None => None,
        };
        let jsonl =
            crate::jsonl::Ingest::start(&config.jsonl, config.max_body_bytes, waker.clone())
                .map_err(StartError::Jsonl)?;
        Ok(Relay {
            poll,
            events: Events::with_capacity(1024),
            listener,
            local_addr,
            conns: Slab::with_capacity(1024),
            store,
            hub: Hub::default(),
            claims: Claims::default(),
            stop: Arc::new(AtomicBool::new(false)),
            graceful: Arc::new(AtomicBool::new(false)),
            waker,
            shutdown_deadline: None,
            metrics: Metrics::default(),
            started: now,
            next_tick: now,
            dirty: Vec::new(),
            doomed: Vec::new(),
            scratch: vec![0; 64 * 1024],
            memory_closed: Vec::new(),
            ingested: 0,
            jsonl,
            history,
            config,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A handle that stops [`Relay::run`] from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            flag: self.stop.clone(),
            graceful: self.graceful.clone(),
            waker: self.waker.clone(),
        }
    }

    /// Runs until stopped through a [`StopHandle`] or, after a graceful shutdown (a
    /// signal or [`StopHandle::shutdown`]), until every connection is flushed and closed.
    ///
    /// # Errors
    /// An I/O error of the poller itself (per-connection errors only close that
    /// connection); `ErrorKind::TimedOut` when a graceful shutdown could not flush every
    /// connection within `shutdown_deadline`.
    pub fn run(&mut self) -> io::Result<()> {
        while !self.stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            let mut wake = self.next_tick;
            if let Some(deadline) = self.shutdown_deadline {
                if self.conns.is_empty() {
                    log::info!("shutdown complete: every connection flushed and closed");
                    return Ok(());
                }
                if now >= deadline {
                    let n = self.conns.len();
                    log::warn!("shutdown deadline passed with {n} connections not flushed");
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("shutdown deadline passed with {n} connections not flushed"),
                    ));
                }
                wake = wake.min(deadline);
            }
            let timeout = if self.dirty.is_empty() {
                wake.saturating_duration_since(now)
            } else {
                Duration::ZERO
            };
            self.poll_once(Some(timeout))?;
        }
        Ok(())
    }

    /// Starts a graceful shutdown: stop accepting; end every SSE stream with
    /// `: shutting-down`; close idle connections; let requests in flight finish with
    /// `Connection: close`; `run` returns once all is flushed or the deadline passes.
    pub fn begin_shutdown(&mut self) {
        if self.shutdown_deadline.is_some() {
            return;
        }
        log::info!(
            "shutting down: {} connections to drain within {:?}",
            self.conns.len(),
            self.config.shutdown_deadline
        );
        self.shutdown_deadline = Some(Instant::now() + self.config.shutdown_deadline);
        let _ = self.poll.registry().deregister(&mut self.listener);
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            let conn = &mut self.conns[key];
            match conn.phase {
                Phase::Sse { sub } => {
                    self.hub.remove(sub);
                    conn.send(sse::SHUTTING_DOWN);
                    conn.phase = Phase::Closing;
                    conn.close_after_flush = true;
                    self.mark_dirty(key);
                }
                Phase::Ws(_) => {
                    let going_away = crate::ws::rfc6455::close_code::GOING_AWAY;
                    self.ws_close(key, "shutting down", going_away);
                }
                Phase::Head if conn.rbuf.is_empty() && conn.out.is_empty() => self.close(key),
                Phase::Closing => {}
                _ => {
                    // Answered with Connection: close when it completes (see `reply`).
                }
            }
        }
    }

    fn tick_interval(&self) -> Duration {
        let shortest = self
            .config
            .heartbeat
            .min(self.config.request_timeout)
            .min(self.config.idle_timeout)
            .min(self.config.ws_idle_timeout);
        (shortest / 4).clamp(Duration::from_millis(5), Duration::from_secs(1))
    }

    /// Waits at most `timeout` for readiness, handles it, runs due timers and flushes
    /// output. For hosts that drive the relay from their own loop.
    ///
    /// # Errors
    /// An I/O error of the poller itself.
    pub fn poll_once(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        // Output work left from the last turn (a replay in progress) must not wait.
        let timeout = if self.dirty.is_empty() {
            timeout
        } else {
            Some(Duration::ZERO)
        };
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        let events = std::mem::replace(&mut self.events, Events::with_capacity(0));
        for e in events.iter() {
            let readable = e.is_readable() || e.is_read_closed() || e.is_error();
            let writable = e.is_writable() || e.is_write_closed();
            match e.token() {
                LISTENER => self.accept(),
                WAKER => {
                    if self.graceful.load(Ordering::SeqCst) {
                        self.begin_shutdown();
                    }
                    self.on_wake();
                }
                Token(t) => {
                    let key = t - FIRST_CONN;
                    if readable {
                        self.on_readable(key);
                    }
                    if writable {
                        self.mark_dirty(key);
                    }
                }
            }
        }
        self.events = events;
        let now = Instant::now();
        if now >= self.next_tick {
            self.tick(now);
            self.next_tick = now + self.tick_interval();
        }
        self.settle();
        Ok(())
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((sock, peer)) => self.admit_conn(sock, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::warn!("accept failed: {e}");
                    return;
                }
            }
        }
    }

    fn admit_conn(&mut self, mut sock: TcpStream, peer: SocketAddr) {
        let _ = sock.set_nodelay(true);
        if self.conns.len() >= self.config.max_connections {
            self.metrics.refused_connections += 1;
            // Counted under its code too, like every refusal (it is logged just below).
            self.metrics.reject("too-many-connections");
            log::warn!(
                "refused connection from {peer}: {} connections open (max_connections)",
                self.conns.len()
            );
            let resp = http::error_response(
                503,
                "too-many-connections",
                "the relay is at its connection limit (AEP_MAX_CONNECTIONS); retry later",
                &[],
                &[("Retry-After", "1")],
                true,
            );
            if !self.config.tls_enabled() {
                let _ = sock.write(&resp);
            }
            return;
        }
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        #[cfg(not(feature = "tls"))]
        let mut sock = Transport::Tcp(sock);
        #[cfg(feature = "tls")]
        let mut sock = match &self.config.tls {
            None => Transport::Tcp(sock),
            Some(tls) => match TlsStream::new(sock, tls.clone()) {
                Ok(s) => Transport::Tls(Box::new(s)),
                Err(e) => {
                    log::warn!("refused connection from {peer}: TLS set-up failed: {e}");
                    return;
                }
            },
        };
        if let Err(e) = sock.register(self.poll.registry(), conn_token(key), Interest::READABLE) {
            log::warn!("cannot register connection from {peer}: {e}");
            return;
        }
        entry.insert(Conn::new(sock, peer, Instant::now()));
    }

    fn mark_dirty(&mut self, key: usize) {
        if let Some(c) = self.conns.get_mut(key) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(key);
            }
        }
    }

    fn on_readable(&mut self, key: usize) {
        loop {
            if self.over_output_bound(key) {
                return;
            }
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            match conn.sock.read(&mut self.scratch) {
                Ok(0) => {
                    self.on_eof(key);
                    return;
                }
                Ok(n) => match conn.phase {
                    Phase::Sse { .. } | Phase::Closing => {}
                    _ => {
                        if conn.rbuf.is_empty() && matches!(conn.phase, Phase::Head) {
                            conn.since = Instant::now();
                        }
                        conn.rbuf.extend_from_slice(&self.scratch[..n]);
                        self.process(key);
                    }
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // A TLS handshake may have output waiting for a writable socket.
                    if !matches!(conn.sock, Transport::Tcp(_)) {
                        self.mark_dirty(key);
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::info!("closing {} after a read error: {e}", conn.peer);
                    self.close(key);
                    return;
                }
            }
        }
    }

    fn on_eof(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.peer_eof = true;
        match conn.phase {
            Phase::Sse { .. } | Phase::Ws(_) => self.close(key),
            _ if conn.out.is_empty() && (conn.write_shut || conn.rbuf.is_empty()) => {
                self.close(key)
            }
            _ => {
                // The peer half-closed: every complete request it sent is already
                // answered (input is processed as it is read), so flush and close. The
                // `Closing` phase puts the connection under the linger timer, so a peer
                // that also stops reading cannot hold it open forever.
                conn.close_after_flush = true;
                conn.phase = Phase::Closing;
                conn.since = Instant::now();
                conn.rbuf.clear();
                self.mark_dirty(key);
            }
        }
    }

    /// Answers on `key`; with `close`, this is the connection's last answer.
    fn reply(&mut self, key: usize, bytes: Vec<u8>, close: bool) {
        self.end_unit();
        let close = close || self.shutdown_deadline.is_some();
        if let Some(conn) = self.conns.get_mut(key) {
            match &conn.cors {
                Some(origin) => conn.send(http::insert_headers(&bytes, &cors_lines(origin))),
                None => conn.send(bytes),
            }
            if close {
                conn.close_after_flush = true;
                conn.phase = Phase::Closing;
                conn.rbuf.clear();
            }
            conn.since = Instant::now();
            self.mark_dirty(key);
        }
    }

    /// Refuses what was read on `key` before it was a request with a head (a head too
    /// large or malformed, a request too slow) or a body that cannot be read: counted,
    /// logged (see [`Relay::refused`]) and answered.
    fn reply_error(
        &mut self,
        key: usize,
        status: u16,
        code: &'static str,
        detail: &str,
        close: bool,
    ) {
        self.refused(key, "request", Some(status), code, detail);
        let body = http::error_response(status, code, detail, &[], &[], close);
        self.reply(key, body, close);
    }

    /// The one place every refusal the relay answers passes through, once, whatever
    /// the binding: it is counted under `code` (`aep_events_rejected_total{reason}`,
    /// `/status`) and logged at `info` as
    /// `refused {what} from {peer}: {status} {code}: {detail}` (README, "Logging").
    /// `what` is the method and path of a request (`POST /events`) or the kind of
    /// WebSocket unit (`WebSocket hello`); `status` the HTTP status or the close code,
    /// `None` for an in-band `error` frame that leaves the connection open. Query strings
    /// and credentials are never part of it; control characters in `detail` are escaped
    /// and a long detail is cut.
    pub(crate) fn refused(
        &mut self,
        key: usize,
        what: &str,
        status: Option<u16>,
        code: &'static str,
        detail: &str,
    ) {
        self.metrics.reject(code);
        if !log::log_enabled!(log::Level::Info) {
            return;
        }
        let peer = self.conns.get(key).map(|c| c.peer);
        let peer = peer.map_or_else(|| "?".to_string(), |p| p.to_string());
        let status = status.map(|s| format!("{s} ")).unwrap_or_default();
        log::info!(
            "refused {what} from {peer}: {status}{code}: {}",
            loggable(detail)
        );
    }

    /// Runs the HTTP state machine over the connection's read buffer.
    /// Request backpressure: whether the answers queued on `key` have reached
    /// `max_output_bytes`, in which case reading and request processing pause (marked in
    /// `Conn::read_paused`) until `flush` brings the queue back under the bound. Without
    /// it a peer pipelining requests and never reading the answers grows the queue
    /// without limit (each ~25-byte `GET /events` queues a ~400-byte answer). Only the
    /// HTTP request phases pause: streams and closing connections discard their input
    /// (and must see EOF), and WebSockets bound their replies themselves.
    fn over_output_bound(&mut self, key: usize) -> bool {
        let max = self.config.max_output_bytes;
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        let request = matches!(
            conn.phase,
            Phase::Head | Phase::Body { .. } | Phase::Discard(_)
        );
        if !request || conn.out.len() < max {
            return false;
        }
        conn.read_paused = true;
        true
    }

    fn process(&mut self, key: usize) {
        let max_head = self.config.max_head_bytes;
        let max_body = self.config.max_body_bytes;
        loop {
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            if conn.close_after_flush {
                conn.rbuf.clear();
                return;
            }
            match &mut conn.phase {
                Phase::Head => {
                    if conn.rbuf.is_empty() || self.over_output_bound(key) {
                        return;
                    }
                    let Some(conn) = self.conns.get_mut(key) else {
                        return;
                    };
                    // A head ends with a line feed, so it can only have completed if one
                    // arrived since the last parse. Without this, a head of `max_head`
                    // bytes (192 KiB by default) trickled in a byte at a time would be
                    // parsed from its start once per byte: quadratic work on the reactor.
                    // The first bytes are always parsed, so garbage is refused at once.
                    let fresh = match conn.rbuf.get(conn.head_scanned..) {
                        Some(new) => conn.head_scanned == 0 || memchr::memchr(b'\n', new).is_some(),
                        None => true,
                    };
                    // No new line feed: still incomplete, as `parse_head` would say.
                    let parsed = if fresh {
                        http::parse_head(&conn.rbuf)
                    } else {
                        Ok(None)
                    };
                    match parsed {
                        Ok(None) => {
                            conn.head_scanned = conn.rbuf.len();
                            if conn.rbuf.len() > max_head {
                                let d = format!("the request head exceeds {max_head} bytes");
                                self.reply_error(key, 431, "head-too-large", &d, true);
                            }
                            return;
                        }
                        Ok(Some((head, n))) => {
                            if n > max_head {
                                let d = format!("the request head exceeds {max_head} bytes");
                                self.reply_error(key, 431, "head-too-large", &d, true);
                                return;
                            }
                            conn.rbuf.drain(..n);
                            conn.head_scanned = 0;
                            self.on_head(key, head);
                        }
                        Err(HeadError::TooManyHeaders) => {
                            let d = format!("more than {} header lines", http::MAX_HEADERS);
                            self.reply_error(key, 431, "head-too-large", &d, true);
                            return;
                        }
                        Err(HeadError::Malformed(why)) => {
                            let d = format!("malformed request head: {why}");
                            self.reply_error(key, 400, "bad-request", &d, true);
                            return;
                        }
                    }
                }
                Phase::Body { reader, body, .. } => {
                    match reader.take(&mut conn.rbuf, body, max_body) {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(e) => return self.chunk_error(key, e),
                    }
                    let Phase::Body { head, body, .. } =
                        std::mem::replace(&mut conn.phase, Phase::Head)
                    else {
                        return;
                    };
                    conn.since = Instant::now();
                    self.on_request(key, *head, body);
                }
                Phase::Discard(reader) => {
                    // The answer went out already: read the body to its end and drop it.
                    // A body that turns out malformed gets no second answer (one request,
                    // one response): the connection just closes after what is queued.
                    match reader.take(&mut conn.rbuf, &mut Vec::new(), max_body) {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(_) => return self.close_after_answer(key),
                    }
                    conn.phase = Phase::Head;
                    conn.since = Instant::now();
                }
                Phase::Sse { .. } | Phase::Closing => {
                    conn.rbuf.clear();
                    return;
                }
                Phase::Ws(_) => return self.ws_process(key),
            }
        }
    }

    /// Ends a connection whose current request already has its answer (a body being
    /// discarded turned out malformed, too large or too slow): flush, then close, with no
    /// second answer. HTTP/1.1 gives one final response per request (RFC 9112 §9.3); an
    /// extra one is paired by a client or a proxy with its next request.
    fn close_after_answer(&mut self, key: usize) {
        if let Some(conn) = self.conns.get_mut(key) {
            conn.close_after_flush = true;
            conn.phase = Phase::Closing;
            conn.rbuf.clear();
            conn.since = Instant::now();
        }
        self.mark_dirty(key);
    }

    fn chunk_error(&mut self, key: usize, e: ChunkError) {
        match e {
            ChunkError::TooLarge => {
                let d = format!(
                    "the request body exceeds {} bytes (AEP_MAX_BODY)",
                    self.config.max_body_bytes
                );
                self.reply_error(key, 413, "body-too-large", &d, true)
            }
            ChunkError::Malformed => {
                self.reply_error(key, 400, "bad-request", "malformed chunked body", true)
            }
        }
    }

    /// Answers a request whose body we will not use: keep the connection when the body
    /// can be skipped, close it otherwise.
    #[allow(clippy::too_many_arguments)]
    fn reply_skipping_body(
        &mut self,
        key: usize,
        head: &RequestHead,
        resp_status: u16,
        code: &'static str,
        detail: &str,
        more: &[(&str, serde_json::Value)],
        extra: &[(&str, &str)],
    ) {
        let what = request_line(head);
        self.refused(key, &what, Some(resp_status), code, detail);
        let framing = http::framing(head, self.config.max_body_bytes);
        let expect = head.header("expect").is_some();
        let close = head.wants_close()
            || expect
            || !matches!(
                framing,
                Ok(Framing::None) | Ok(Framing::Length(_)) | Ok(Framing::Chunked)
            );
        let body = http::error_response(resp_status, code, detail, more, extra, close);
        self.reply(key, body, close);
        if !close {
            if let Some(conn) = self.conns.get_mut(key) {
                conn.phase = match framing {
                    Ok(Framing::Length(n)) => Phase::Discard(BodyReader::Length(n)),
                    Ok(Framing::Chunked) => Phase::Discard(BodyReader::Chunked(Default::default())),
                    _ => Phase::Head,
                };
            }
        }
    }

    fn on_head(&mut self, key: usize, head: RequestHead) {
        let cors = self.cors_origin(&head);
        if let Some(conn) = self.conns.get_mut(key) {
            conn.cors = cors;
        }
        // Only `POST /events` reads a body; any other request that declares one has it
        // skipped and is refused, never left in the buffer to parse as the next request
        // (RFC 9112 §6.3: the framing headers delimit a body whatever the method).
        if head.method != "POST"
            && !matches!(
                http::framing(&head, self.config.max_body_bytes),
                Ok(Framing::None)
            )
        {
            let d = format!("a {} request carries no body", head.method);
            return self.reply_skipping_body(key, &head, 400, "bad-request", &d, &[], &[]);
        }
        if head.method == "OPTIONS" && self.conns.get(key).is_some_and(|c| c.cors.is_some()) {
            // A CORS preflight (Fetch standard §3.2.2).
            let close = head.wants_close();
            let resp = http::response(
                204,
                "text/plain",
                &[
                    ("Access-Control-Allow-Methods", "GET, POST"),
                    (
                        "Access-Control-Allow-Headers",
                        "Authorization, AEP-Version, Content-Type, Last-Event-ID",
                    ),
                    ("Access-Control-Max-Age", "600"),
                ],
                b"",
                close,
            );
            return self.reply(key, resp, close);
        }
        if head.path == "/healthz" && head.method == "GET" {
            let body = self.health(
                self.config
                    .auth
                    .check(&head)
                    .is_ok_and(|g| g.authenticated || !self.config.auth.enabled()),
            );
            let close = head.wants_close();
            let resp = http::response(200, "application/json", &[], &body, close);
            return self.reply(key, resp, close);
        }
        let allow = match head.path.as_str() {
            "/events" => "GET, POST",
            "/.well-known/aep" | "/stream" | "/healthz" | "/metrics" | "/status" | "/socket" => {
                "GET"
            }
            #[cfg(feature = "status-page")]
            "/" => "GET",
            _ => {
                let d = format!("no resource at {}", head.path);
                return self.reply_skipping_body(key, &head, 404, NOT_FOUND, &d, &[], &[]);
            }
        };
        let method_ok = allow.split(", ").any(|m| m == head.method);
        if !method_ok {
            let d = format!(
                "{} is not allowed on {}; use {allow}",
                head.method, head.path
            );
            return self.reply_skipping_body(
                key,
                &head,
                405,
                "method-not-allowed",
                &d,
                &[],
                &[("Allow", allow)],
            );
        }
        let grant = match self.config.auth.check(&head) {
            Ok(g) => g,
            Err(e) => {
                let extra = [("WWW-Authenticate", "Bearer")];
                return self.reply_skipping_body(
                    key,
                    &head,
                    401,
                    "unauthorized",
                    e.detail(),
                    &[],
                    &extra,
                );
            }
        };
        let needed = match (head.method.as_str(), head.path.as_str()) {
            ("POST", "/events") => Scopes::EMIT,
            ("GET", "/stream") | ("GET", "/metrics") | ("GET", "/status") | ("GET", "/") => {
                Scopes::WATCH
            }
            _ => Scopes::NONE,
        };
        if !grant.scopes.contains(needed) {
            let d = format!(
                "this token lacks the `{}` scope needed for {} {} (AEP-0003 §8.1)",
                needed.name(),
                head.method,
                head.path
            );
            return self.reply_skipping_body(key, &head, 403, "forbidden", &d, &[], &[]);
        }
        match (head.method.as_str(), head.path.as_str()) {
            ("POST", "/events") => self.begin_ingest(key, head),
            ("GET", "/events") | ("GET", "/.well-known/aep") => {
                let close = head.wants_close();
                let doc = self.discovery();
                let body = http::response(200, "application/json", &[], &doc, close);
                self.reply(key, body, close);
            }
            ("GET", "/stream") => self.begin_sse(key, head),
            ("GET", "/socket") => self.begin_ws(key, head, grant),
            ("GET", "/status") => {
                let close = head.wants_close();
                let body = self.status_json();
                let resp = http::response(200, "application/json", &[], &body, close);
                self.reply(key, resp, close);
            }
            #[cfg(feature = "status-page")]
            ("GET", "/") => {
                let close = head.wants_close();
                let resp = http::response(
                    200,
                    "text/html; charset=utf-8",
                    &[(
                        "Content-Security-Policy",
                        "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:",
                    )],
                    STATUS_PAGE.as_bytes(),
                    close,
                );
                self.reply(key, resp, close);
            }
            ("GET", "/metrics") => {
                let close = head.wants_close();
                let text = self.metrics_text();
                let body = http::response(
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    &[],
                    text.as_bytes(),
                    close,
                );
                self.reply(key, body, close);
            }
            _ => {}
        }
    }

    /// `GET /status`: what the status page shows, as JSON: counts, totals (rates are
    /// the client's deltas), and the 100 most recently written sessions with their
    /// positions.
    fn status_json(&self) -> Vec<u8> {
        let (mut http_n, mut sse_n, mut ws_n) = (0u64, 0u64, 0u64);
        for (_, c) in self.conns.iter() {
            match c.phase {
                Phase::Sse { .. } => sse_n += 1,
                Phase::Ws(_) => ws_n += 1,
                _ => http_n += 1,
            }
        }
        let pos = |p: Option<(u64, u64)>| p.map(|(e, s)| json!({"epoch": e, "seq": s}));
        let count = self.store.session_count();
        let recent: Vec<serde_json::Value> = self
            .store
            .sessions()
            .skip(count.saturating_sub(100))
            .map(|s| {
                // One row per owning stream `(source, session)` (AEP-0001 §5.2): two
                // emitters sharing a name are two rows; `source` and `agent` say whose
                // (`null` for a name's stream of foreign Events only).
                json!({
                    "session": s.name,
                    "source": s.source,
                    "agent": s.agent,
                    "events": s.events,
                    "earliest": pos(s.earliest),
                    "latest": pos(s.latest),
                })
            })
            .collect();
        // A 404 is an unknown path (a browser's `/favicon.ico`, a scanner), not a refused
        // Event or request of the protocol: `/metrics` counts it under `not-found`, the
        // status page's refusals leave it out and show it as `not_found`.
        let rejected: serde_json::Map<String, serde_json::Value> = self
            .metrics
            .rejected
            .iter()
            .filter(|(c, _)| *c != NOT_FOUND)
            .map(|(c, n)| (c.to_string(), json!(n)))
            .collect();
        let not_found = self
            .metrics
            .rejected
            .iter()
            .find(|(c, _)| *c == NOT_FOUND)
            .map_or(0, |(_, n)| *n);
        let st = &self.hub.stats;
        let doc = json!({
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "connections": {"total": self.conns.len(), "http": http_n, "sse": sse_n, "ws": ws_n},
            "subscriptions": self.hub.len(),
            "sessions": {"count": count, "recent": recent},
            "buffered_events": self.store.len(),
            // The bytes the held Events retain: each has an allocation of its own
            // (`keepable`), so this is the sum of their sizes.
            "buffered_bytes": self.store.byte_len(),
            "ingested": self.ingested,
            "deliveries": st.deliveries,
            "dropped": st.dropped,
            "backpressure_disconnects": st.backpressure_disconnects,
            "rejected": rejected,
            "not_found": not_found,
        });
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// The Prometheus exposition of `GET /metrics`.
    fn metrics_text(&self) -> String {
        let mut x = Exposition::default();
        x.family(metrics::INGESTED, "counter", "Events ingested, by binding.")
            .sample(
                metrics::INGESTED,
                &[("binding", "http")],
                self.metrics.ingested_http as f64,
            )
            .sample(
                metrics::INGESTED,
                &[("binding", "ws")],
                self.metrics.ingested_ws as f64,
            );
        x.family(
            metrics::REJECTED,
            "counter",
            "Requests or Events refused, by reason.",
        );
        for (code, n) in &self.metrics.rejected {
            x.sample(metrics::REJECTED, &[("reason", code)], *n as f64);
        }
        let st = &self.hub.stats;
        x.family(
            metrics::DELIVERIES,
            "counter",
            "Frames delivered to subscribers, by binding.",
        )
        .sample(
            metrics::DELIVERIES,
            &[("binding", "sse")],
            (st.deliveries - st.deliveries_ws) as f64,
        )
        .sample(
            metrics::DELIVERIES,
            &[("binding", "ws")],
            st.deliveries_ws as f64,
        );
        x.family(
            metrics::DROPPED,
            "counter",
            "debug/info Events not delivered to slow consumers (AEP-0003 §8.4).",
        )
        .sample(metrics::DROPPED, &[], st.dropped as f64);
        x.family(
            metrics::DISCONNECTS,
            "counter",
            "Consumers disconnected because a notice-or-above Event could not be queued.",
        )
        .sample(
            metrics::DISCONNECTS,
            &[],
            st.backpressure_disconnects as f64,
        );
        x.family(
            metrics::REFUSED_CONNECTIONS,
            "counter",
            "Connections refused at the connection limit.",
        )
        .sample(
            metrics::REFUSED_CONNECTIONS,
            &[],
            self.metrics.refused_connections as f64,
        );
        let (mut http_n, mut sse_n, mut ws_n, mut queued) = (0u64, 0u64, 0u64, 0usize);
        x.family(
            metrics::CONN_DROPPED,
            "gauge",
            "Events dropped toward each live connection that had drops.",
        );
        for (key, c) in self.conns.iter() {
            match c.phase {
                Phase::Sse { .. } => sse_n += 1,
                Phase::Ws(_) => ws_n += 1,
                _ => http_n += 1,
            }
            queued += c.out.len();
            if c.dropped > 0 {
                let k = key.to_string();
                let peer = c.peer.to_string();
                x.sample(
                    metrics::CONN_DROPPED,
                    &[("conn", &k), ("peer", &peer)],
                    c.dropped as f64,
                );
            }
        }
        x.family(
            metrics::CONNECTIONS,
            "gauge",
            "Open connections, by binding.",
        )
        .sample(metrics::CONNECTIONS, &[("binding", "http")], http_n as f64)
        .sample(metrics::CONNECTIONS, &[("binding", "sse")], sse_n as f64)
        .sample(metrics::CONNECTIONS, &[("binding", "ws")], ws_n as f64);
        x.family(metrics::SUBSCRIPTIONS, "gauge", "Live subscriptions.")
            .sample(metrics::SUBSCRIPTIONS, &[], self.hub.len() as f64);
        x.family(
            metrics::SESSIONS,
            "gauge",
            "Sessions held in the replay store, one per owning stream (source, session).",
        )
        .sample(metrics::SESSIONS, &[], self.store.session_count() as f64);
        x.family(
            metrics::BUFFERED_EVENTS,
            "gauge",
            "Events held in the replay store.",
        )
        .sample(metrics::BUFFERED_EVENTS, &[], self.store.len() as f64);
        x.family(
            metrics::BUFFERED_BYTES,
            "gauge",
            "Bytes the Events held in the replay store retain (each Event's own bytes: a held Event never keeps its batch body alive).",
        )
        .sample(metrics::BUFFERED_BYTES, &[], self.store.byte_len() as f64);
        x.family(
            metrics::QUEUED_BYTES,
            "gauge",
            "Bytes queued for output across all connections.",
        )
        .sample(metrics::QUEUED_BYTES, &[], queued as f64);
        x.family(metrics::UPTIME, "gauge", "Seconds since start.")
            .sample(metrics::UPTIME, &[], self.started.elapsed().as_secs_f64());
        x.finish()
    }

    /// The `Access-Control-Allow-Origin` value for a request, when its `Origin` is
    /// allowed by `cors_origins`.
    fn cors_origin(&self, head: &RequestHead) -> Option<String> {
        let origin = head.header("origin")?;
        let allowed = &self.config.cors_origins;
        if allowed.iter().any(|o| o == "*") {
            Some("*".to_string())
        } else if allowed.iter().any(|o| o == origin) {
            Some(origin.to_string())
        } else {
            None
        }
    }

    /// `GET /healthz`: `{"ok":true}`, with counts for an authenticated caller.
    fn health(&self, detailed: bool) -> Vec<u8> {
        let doc = if detailed {
            json!({
                "ok": true,
                "sessions": self.store.session_count(),
                "subscribers": self.hub.len(),
                "connections": self.conns.len(),
                "uptime_s": self.started.elapsed().as_secs(),
            })
        } else {
            json!({ "ok": true })
        };
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// The discovery document (AEP-0003 §3.4) with what this relay really does.
    fn discovery(&self) -> Vec<u8> {
        let doc = json!({
            "aep": envelope::SUPPORTED_VERSIONS,
            "role": "relay",
            "endpoints": { "events": "/events", "stream": "/stream", "socket": "/socket" },
            "capabilities": {
                "filters": ["attr-match"],
                "replay": {
                    "buffer": self.config.buffer_per_session,
                    "per": "session",
                    "sessions": self.config.max_sessions,
                    "all": true
                },
                "capture": ["none", "metadata", "redacted", "full"],
                "roster": {},
                "control": { "accepts": [], "routes": self.config.auth.enabled() },
                "experimental": {}
            }
        });
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    fn begin_ingest(&mut self, key: usize, head: RequestHead) {
        let framing = match http::framing(&head, self.config.max_body_bytes) {
            Ok(f) => f,
            // Unreadable framing: `reply_skipping_body` closes after the answer.
            Err(FramingError::TooLarge(n)) => {
                let d = format!(
                    "the request body is {n} bytes; at most {} are accepted (AEP_MAX_BODY)",
                    self.config.max_body_bytes
                );
                return self.reply_skipping_body(key, &head, 413, "body-too-large", &d, &[], &[]);
            }
            Err(FramingError::Bad(why)) => {
                return self.reply_skipping_body(key, &head, 400, "bad-request", why, &[], &[]);
            }
        };
        match head.header("aep-version") {
            None => {
                let d = "the AEP-Version request header is required (AEP-0003 §3.2.2)";
                return self.reply_skipping_body(key, &head, 400, "version-required", d, &[], &[]);
            }
            Some(v) if !envelope::header_version_supported(v) => {
                let d = format!("AEP-Version {v:?} is not supported (AEP-0003 §3.2.2)");
                let more = [("versions", json!(envelope::SUPPORTED_VERSIONS))];
                return self.reply_skipping_body(
                    key,
                    &head,
                    426,
                    "version-unsupported",
                    &d,
                    &more,
                    &[],
                );
            }
            Some(_) => {}
        }
        match head.media_type().as_deref() {
            Some("application/json") | Some("application/x-ndjson") => {}
            other => {
                let d = format!(
                    "Content-Type must be application/json (one Event) or application/x-ndjson (a batch), got {} (AEP-0003 §3.2.1)",
                    other.unwrap_or("none")
                );
                return self.reply_skipping_body(
                    key,
                    &head,
                    415,
                    "unsupported-media-type",
                    &d,
                    &[],
                    &[],
                );
            }
        }
        let reader = match framing {
            Framing::None => return self.on_request(key, head, Vec::new()),
            Framing::Length(n) => BodyReader::Length(n),
            Framing::Chunked => BodyReader::Chunked(Default::default()),
        };
        if head
            .header("expect")
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
        {
            if let Some(conn) = self.conns.get_mut(key) {
                conn.send(&b"HTTP/1.1 100 Continue\r\n\r\n"[..]);
            }
            self.mark_dirty(key);
        }
        let cap = match reader {
            BodyReader::Length(n) => n,
            _ => 0,
        };
        if let Some(conn) = self.conns.get_mut(key) {
            conn.phase = Phase::Body {
                head: Box::new(head),
                reader,
                body: Vec::with_capacity(cap),
            };
        }
    }

    fn on_request(&mut self, key: usize, head: RequestHead, body: Vec<u8>) {
        let close = head.wants_close();
        let batch = head.media_type().as_deref() == Some("application/x-ndjson");
        // The allocation the body's Bytes keep alive: its capacity (a chunked body grew
        // by doubling), not its length.
        let backing = body.capacity();
        let resp = match self.ingest_body(Bytes::from(body), backing, batch) {
            Ok(n) => http::response(
                202,
                "application/json",
                &[],
                format!("{{\"accepted\":{n}}}").as_bytes(),
                close,
            ),
            Err(r) => {
                self.refused(
                    key,
                    "POST /events",
                    Some(r.status()),
                    r.code(),
                    &r.to_string(),
                );
                http::response(r.status(), "application/json", &[], &r.body(), close)
            }
        };
        self.reply(key, resp, close);
    }

    /// Validates every Event of a body, then ingests them all in order, or none.
    /// `backing` is the size of the allocation `body` is part of (`usize::MAX` when
    /// unknown): every Event that may be held is given bytes of its own when it is only
    /// part of it (see [`keepable`]).
    fn ingest_body(&mut self, body: Bytes, backing: usize, batch: bool) -> Result<usize, Refusal> {
        let mut events = Vec::new();
        if batch {
            let count = memchr::memchr_iter(b'\n', &body).count() + 1;
            let mut start = 0;
            let mut line = 0;
            let max = self.config.max_batch_events;
            if count > max {
                // Blank lines do not count; only refuse when the Events really are too many.
                let real = body
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.iter().all(|b| b.is_ascii_whitespace()))
                    .count();
                if real > max {
                    return Err(Refusal::TooManyEvents { count: real, max });
                }
            }
            while start < body.len() {
                let end = memchr::memchr(b'\n', &body[start..]).map_or(body.len(), |i| start + i);
                line += 1;
                let slice = &body[start..end];
                if !slice.iter().all(|b| b.is_ascii_whitespace()) {
                    events.push((line, Event::parse(body.slice(start..end))));
                }
                start = end + 1;
            }
        } else {
            events.push((1, Event::parse(body)));
        }
        let mut ok = Vec::with_capacity(events.len());
        for (line, ev) in events {
            match ev {
                Ok(ev) if ev.is_command() => {
                    return Err(Refusal::Command {
                        line,
                        event_type: ev.event_type().to_string(),
                    })
                }
                Ok(ev) => ok.push(Arc::new(keepable(ev, backing))),
                Err(e) => {
                    return Err(Refusal::InvalidEvent {
                        line,
                        detail: e.detail,
                    })
                }
            }
        }
        let n = ok.len();
        // Kept in the history before it is published or answered (issue 5).
        self.persist(&ok)?;
        self.metrics.ingested_http += n as u64;
        // One ingest unit: the batch's frames are coalesced (see `fanout`).
        self.hub.begin_unit();
        for ev in ok {
            self.publish(ev);
        }
        self.end_unit();
        Ok(n)
    }

    // ---- JSONL ingest and durable history (issue 5; src/jsonl.rs, src/history.rs) ----

    /// Appends a batch of valid Events to the history, when one is configured. Called
    /// before the batch is published or answered.
    pub(super) fn persist(&mut self, events: &[Arc<Event>]) -> Result<(), Refusal> {
        let Some(h) = self.history.as_mut() else {
            return Ok(());
        };
        h.append_batch(events, &self.store)
            .map(|_| ())
            .map_err(|e| Refusal::HistoryUnavailable { detail: e.reason() })
    }

    /// Ingests what the JSONL sources read: per chunk, history append then publish.
    fn on_wake(&mut self) {
        let Some(mut jsonl) = self.jsonl.take() else {
            return;
        };
        let stop = jsonl.drain(Instant::now(), |events| {
            self.persist(events)?;
            // One ingest unit per chunk (see `fanout`).
            self.hub.begin_unit();
            for ev in events {
                self.publish(ev.clone());
            }
            self.end_unit();
            Ok::<(), Refusal>(())
        });
        if stop {
            self.stop.store(true, Ordering::SeqCst);
        }
        if jsonl.more_ready() {
            let _ = self.waker.wake();
        }
        self.jsonl = Some(jsonl);
    }

    // ---- end of JSONL ingest and durable history ----

    /// Ingests Events in-process, exactly as `POST /events` with
    /// `application/x-ndjson` would (all or nothing).
    ///
    /// # Errors
    /// [`Refusal`] as for the HTTP binding.
    ///
    /// The relay does not know what allocation `ndjson` is a slice of, so every Event it
    /// keeps in a replay buffer is copied out of it (one copy of the Event's bytes):
    /// the caller's buffer is never kept alive by the relay.
    pub fn ingest(&mut self, ndjson: Bytes) -> Result<usize, Refusal> {
        let n = self.ingest_body(ndjson, usize::MAX, true)?;
        self.settle();
        Ok(n)
    }

    /// Admits one valid Event to the replay store and fans it out.
    fn publish(&mut self, ev: Arc<Event>) {
        self.ingested += 1;
        if let Admission::Conflict = self.store.admit(&ev) {
            log::warn!(
                "session {:?} of {:?}: two different Events claim position {}:{} (emitter fault, AEP-0001 §7.2); kept the first",
                ev.session().unwrap_or_default(),
                ev.source(),
                ev.epoch(),
                ev.seq().unwrap_or_default()
            );
        }
        self.hub.fanout(
            &ev,
            self.store.last_placed(),
            &mut self.conns,
            self.config.max_output_bytes,
            &mut self.dirty,
            &mut self.doomed,
        );
    }

    fn begin_sse(&mut self, key: usize, head: RequestHead) {
        let req = match sse::parse_request(&head, self.config.max_from_positions) {
            Ok(r) => r,
            Err(e) => {
                return self.reply_skipping_body(key, &head, 400, e.code, &e.detail, &[], &[]);
            }
        };
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        match &conn.cors {
            Some(origin) => conn.send(http::insert_headers(sse::STREAM_HEAD, &cors_lines(origin))),
            None => conn.send(sse::STREAM_HEAD),
        }
        conn.last_write = Instant::now();
        // Replay precedes live delivery (AEP-0003 §5, §7), paced by the consumer's reading
        // (see `relay::replay`): no gap and no duplicate across the boundary.
        let sub = req.live.then(|| {
            self.hub.insert(Subscription {
                conn: key,
                filter: req.filter.clone(),
                ceiling: req.ceiling,
                binding: Binding::Sse,
            })
        });
        let conn = &mut self.conns[key];
        conn.phase = match sub {
            Some(sub) => Phase::Sse { sub },
            None => Phase::Closing,
        };
        let sessions = replay_sessions(&self.store, &req.from);
        self.start_replay(
            key,
            ReplayJob {
                sub,
                ws_id: None,
                pending: sessions.iter().map(|(s, _)| *s).collect(),
                sessions,
                filter: req.filter,
                ceiling: req.ceiling,
                end_after: !req.live,
            },
        );
    }

    /// Timers: heartbeats, request and idle timeouts, lingering closes.
    fn tick(&mut self, now: Instant) {
        self.on_wake(); // JSONL: retry a chunk the history refused (issue 5)
        let mut expired = Vec::new();
        let mut slow = Vec::new();
        let mut ws_idle = Vec::new();
        for (key, conn) in self.conns.iter_mut() {
            match conn.phase {
                Phase::Sse { .. } => {
                    if now.duration_since(conn.last_write) >= self.config.heartbeat {
                        conn.send(sse::PING);
                        conn.last_write = now;
                        if !conn.dirty {
                            conn.dirty = true;
                            self.dirty.push(key);
                        }
                    }
                }
                Phase::Ws(_) => match socket::tick_ws(conn, now, &self.config) {
                    socket::WsTick::Quiet => {}
                    socket::WsTick::Pinged => {
                        if !conn.dirty {
                            conn.dirty = true;
                            self.dirty.push(key);
                        }
                    }
                    socket::WsTick::Idle => ws_idle.push(key),
                },
                Phase::Head if conn.rbuf.is_empty() && conn.out.is_empty() => {
                    if now.duration_since(conn.since) >= self.config.idle_timeout {
                        expired.push(key);
                    }
                }
                Phase::Head | Phase::Body { .. } | Phase::Discard(_) => {
                    if now.duration_since(conn.since) >= self.config.request_timeout
                        && !conn.close_after_flush
                    {
                        slow.push((key, matches!(conn.phase, Phase::Discard(_))));
                    }
                }
                Phase::Closing => {
                    let waited = now.duration_since(conn.since);
                    if (conn.out.is_empty() && waited >= LINGER)
                        || waited >= self.config.request_timeout.max(LINGER)
                    {
                        expired.push(key);
                    }
                }
            }
        }
        for key in expired {
            self.close(key);
        }
        for key in ws_idle {
            let reason = format!(
                "idle: nothing received for {} s",
                self.config.ws_idle_timeout.as_secs_f64()
            );
            self.ws_close(key, &reason, crate::ws::rfc6455::close_code::GOING_AWAY);
        }
        for (key, answered) in slow {
            if answered {
                // A body still arriving after its request was answered: no 408 for it.
                self.close_after_answer(key);
                continue;
            }
            let d = format!(
                "the request did not arrive within {} s",
                self.config.request_timeout.as_secs_f64()
            );
            self.reply_error(key, 408, "request-timeout", &d, true);
        }
    }

    /// Flushes every connection with new output, closes the doomed, updates interest.
    fn settle(&mut self) {
        self.end_unit();
        for key in std::mem::take(&mut self.doomed) {
            match self.conns.get(key).map(|c| &c.phase) {
                // A WebSocket gets `closing` with its positions, then the close frame.
                Some(Phase::Ws(_)) => {
                    log::info!(
                        "closing WebSocket {} (backpressure, AEP-0003 §8.4)",
                        self.conns[key].peer
                    );
                    let reason = "backpressure: the consumer fell behind";
                    self.ws_close(key, reason, crate::ws::rfc6455::close_code::TRY_AGAIN);
                    continue;
                }
                Some(Phase::Closing) if self.conns[key].close_after_flush => continue,
                _ => {}
            }
            if let Some(c) = self.conns.get(key) {
                log::info!(
                    "disconnecting slow consumer {} (backpressure, AEP-0003 §8.4; {} Events dropped)",
                    c.peer, c.dropped
                );
            }
            self.close(key);
        }
        let mut dirty = std::mem::take(&mut self.dirty);
        // One clock read per settle, not per connection (it showed in fan-out profiles).
        let now = Instant::now();
        for &key in &dirty {
            self.flush(key, now);
        }
        // Keep what flushing marked again (replay continuing on the next turn).
        dirty.clear();
        dirty.append(&mut self.dirty);
        self.dirty = dirty;
    }

    fn flush(&mut self, key: usize, now: Instant) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.dirty = false;
        let mut had_output = false;
        let mut rounds = 0;
        let state = loop {
            let conn = &mut self.conns[key];
            if !conn.replay.is_empty() || !conn.backlog.is_empty() {
                self.pump_replay(key);
            }
            let conn = &mut self.conns[key];
            had_output |= !conn.out.is_empty();
            let mut state = conn.out.flush(&mut conn.sock);
            if state == Flush::Done {
                state = match conn.sock.write_pending() {
                    Ok(false) => Flush::Done,
                    Ok(true) => Flush::Blocked,
                    Err(_) => Flush::Closed,
                };
            }
            let more = !conn.replay.is_empty() || !conn.backlog.is_empty();
            rounds += 1;
            if state != Flush::Done || !more {
                break state;
            }
            if rounds == 4 {
                // The socket keeps up: continue on the next turn, after the others.
                self.mark_dirty(key);
                break state;
            }
        };
        let conn = &mut self.conns[key];
        match state {
            Flush::Closed => return self.close(key),
            Flush::Done => {
                if had_output {
                    conn.last_write = now;
                }
                if conn.close_after_flush && conn.peer_eof {
                    return self.close(key);
                }
                if conn.close_after_flush && !conn.write_shut {
                    conn.write_shut = true;
                    conn.sock.shutdown_write();
                    conn.phase = Phase::Closing;
                    conn.since = now;
                }
                if conn.want_write {
                    conn.want_write = false;
                    let _ = conn.sock.reregister(
                        self.poll.registry(),
                        conn_token(key),
                        Interest::READABLE,
                    );
                }
            }
            Flush::Blocked => {
                if !conn.want_write {
                    conn.want_write = true;
                    let _ = conn.sock.reregister(
                        self.poll.registry(),
                        conn_token(key),
                        Interest::READABLE | Interest::WRITABLE,
                    );
                }
            }
        }
        // Resume a connection paused by `over_output_bound`: first the requests already
        // read, then the socket (its readiness edge has passed; the data is waiting).
        if conn.read_paused && conn.out.len() < self.config.max_output_bytes {
            conn.read_paused = false;
            self.process(key);
            self.on_readable(key);
        }
    }

    /// Ends the open fan-out unit, if any: its pending frames are queued before anything
    /// else is (see `fanout::Unit`).
    pub(super) fn end_unit(&mut self) {
        self.hub.end_unit(&mut self.conns);
    }

    fn close(&mut self, key: usize) {
        if !self.conns.contains(key) {
            return;
        }
        self.end_unit();
        let mut conn = self.conns.remove(key);
        match &conn.phase {
            Phase::Sse { sub } => self.hub.remove(*sub),
            Phase::Ws(ws) => self.ws_release(key, ws),
            _ => {}
        }
        let _ = conn.sock.deregister(self.poll.registry());
        if let Some(pipe) = conn.sock.memory() {
            let out = std::mem::take(&mut pipe.output);
            self.memory_closed.push((key, out));
        }
    }

    /// Opens an in-memory connection that runs the same state machine as a TCP one
    /// (HTTP, SSE, …) without a socket; returns its key. For tests, fuzzing, benchmarks
    /// and hosts that embed the relay. Drive it with [`Relay::feed`] and read what the
    /// relay sent with [`Relay::take_output`].
    ///
    /// `write_limit` makes the connection stop accepting output once that many bytes
    /// are unread: a consumer that stopped reading.
    #[doc(hidden)]
    pub fn connect_memory(&mut self, write_limit: Option<usize>) -> usize {
        let pipe = MemoryPipe {
            write_limit,
            ..Default::default()
        };
        let peer = SocketAddr::from(([0, 0, 0, 0], 0));
        let key = self
            .conns
            .insert(Conn::new(Transport::Memory(pipe), peer, Instant::now()));
        self.memory_closed.retain(|(k, _)| *k != key);
        key
    }

    /// Delivers `bytes` to the in-memory connection `key` as if they arrived from the
    /// network, with `eof` closing the peer's writing side after them; then runs the
    /// connection and flushes all output. Returns `false` when `key` is not an open
    /// in-memory connection.
    #[doc(hidden)]
    pub fn feed(&mut self, key: usize, bytes: &[u8], eof: bool) -> bool {
        let Some(pipe) = self.conns.get_mut(key).and_then(|c| c.sock.memory()) else {
            return false;
        };
        pipe.input.extend_from_slice(bytes);
        pipe.eof |= eof;
        self.on_readable(key);
        self.settle();
        true
    }

    /// Takes what the relay wrote to the in-memory connection `key` so far (and, once,
    /// the final output of one the relay closed). `None` for an unknown key.
    #[doc(hidden)]
    pub fn take_output(&mut self, key: usize) -> Option<Vec<u8>> {
        if let Some(pipe) = self.conns.get_mut(key).and_then(|c| c.sock.memory()) {
            // Leave a buffer of the same capacity behind, so a host that drains a pipe
            // regularly (the fan-out bench) sees no allocation in the relay's writes.
            let cap = pipe.output.capacity();
            let out = std::mem::replace(&mut pipe.output, Vec::with_capacity(cap));
            if !out.is_empty() {
                // Room was made: let a write-limited pipe take more.
                self.mark_dirty(key);
                self.settle();
            }
            return Some(out);
        }
        let i = self.memory_closed.iter().position(|(k, _)| *k == key)?;
        Some(self.memory_closed.swap_remove(i).1)
    }

    /// Whether connection `key` is open.
    #[doc(hidden)]
    pub fn is_open(&self, key: usize) -> bool {
        self.conns.contains(key)
    }

    /// Runs the timers (heartbeats, timeouts) as if `now` had come.
    #[doc(hidden)]
    pub fn tick_at(&mut self, now: Instant) {
        self.tick(now);
        self.settle();
    }

    /// Bytes queued for output across all connections (an invariant check for fuzzing:
    /// each connection stays within `max_output_bytes` plus one frame).
    #[doc(hidden)]
    pub fn queued_output(&self, key: usize) -> Option<usize> {
        self.conns.get(key).map(|c| c.out.len())
    }

    /// Bytes of live frames held back on connection `key` behind a replay in progress,
    /// not yet in its output queue (an invariant check for fuzzing: the backlog is held to
    /// `max_output_bytes` by the same backpressure rule, AEP-0003 §8.4). `None` for an
    /// unknown connection.
    #[doc(hidden)]
    pub fn queued_backlog(&self, key: usize) -> Option<usize> {
        self.conns.get(key).map(|c| c.backlog.len())
    }

    /// Seconds since [`Relay::bind`].
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Events accepted since start.
    pub fn ingested(&self) -> u64 {
        self.ingested
    }
}
