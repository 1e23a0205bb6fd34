//! The relay's sans-IO core: everything the relay decides, from the bytes a peer sent
//! and the time the caller says it is, with no socket, clock or file in sight.
//!
//! ```text
//!   reactor (mio)                                   Core
//!   ─────────────                                   ────
//!   accept ─────────────── open(peer, now) ───────► Conn (HTTP phases → SSE | WS)
//!   read   ─────── handle_input(id, bytes, now) ──► head · body · routes · refusals
//!   read into body_room(id) ─ handle_body_read(id, n, now) ─► a body of known length
//!   EOF    ──────────── handle_eof(id, now) ──────►   ingest → Journal → store → fan-out
//!   wake   ───────── handle_timeout(now) ─────────► deadlines (timer heap)
//!   JSONL  ─────── publish_events(evs, now) ──────►
//!          ◄──────────── poll_output() ─────────── Writable(id) · Interest(id, ..) ·
//!                                                  ShutdownWrite(id) · Close(id) · Stop
//!   writev ────── write_to(id, &mut impl Write) ─► drains that connection's queue
//!   sleep until ◄──────── poll_timeout() ───────── next deadline
//! ```
//!
//! The core owns every connection's read buffer and bounded output queue (their bounds
//! are protocol policy, AEP-0003 §8.4), the replay store, the subscription hub, the
//! session claims and the metrics. It never writes to a socket: fan-out queues frames,
//! and a publication whose frames do not fit a queue pauses until the reactor has
//! written (see [`Core::poll_output`]). Durable history is the [`Journal`] port, called
//! before an answer. Time comes in as `now`; WebSocket `ping` times are counted from the
//! wall-clock base given to [`Core::new`].
//!
//! A test, a fuzz target or a bench drives the core exactly as the reactor does, with
//! virtual time and any `Write` as the peer's socket.

use crate::config::Config;
use crate::control::Claims;
use crate::metrics::Metrics;
use crate::refusal::{Code, Refusal};
use crate::store::{Admission, ReplayFrom, Store, StreamId};
use crate::subscription;
use crate::wire::envelope::Event;
use crate::wire::http;
use crate::wire::sse;
use bytes::Bytes;
use conn::{Conn, Conns, Flush, Phase};
use hub::{Fanned, Hub};

/// The least of a body still to come for which [`Core::body_room`] lends its buffer to
/// be read into directly, in bytes: the reactor's own read buffer's size.
pub const BODY_READ_MIN: usize = 64 * 1024;
use orders::Orders;
use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

mod cluster;
pub(crate) mod conn;
mod connections;
mod expiry;
mod hub;
mod journal;
mod memory;
mod orders;
mod replay;
mod request;
mod routes;
mod shutdown;
mod socket;
mod status;
mod storm;
mod timer;

pub use cluster::ClusterState;
pub use journal::{Journal, NoJournal, OutboxLog, UnavailableJournal};

/// The code of a 404 answer: counted in `/metrics`, but not among the `/status`
/// refusals (see `Core::status_json`).
const NOT_FOUND: &str = Code::NotFound.as_str();

/// Replay rounds one `write_to` runs for one connection before others get a turn.
const REPLAY_ROUNDS: usize = 4;

pub use crate::ids::ConnId;

/// What the core wants from a connection's socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    /// Read it (`false` while request backpressure pauses reading; when it turns `true`
    /// again the reactor reads at once: the readiness edge may have passed).
    pub read: bool,
    /// Tell the core when it is writable (some output did not fit the socket).
    pub write: bool,
}

/// Why the core asks the reactor to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// A graceful shutdown is complete: every connection was flushed and closed.
    Drained,
    /// The shutdown deadline passed with this many connections not flushed.
    DeadlinePassed(usize),
}

/// What the reactor must do, in order ([`Core::poll_output`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The connection has output queued: call [`Core::write_to`] with its socket.
    Writable(ConnId),
    /// Register the connection's socket for this interest (only on a change).
    Interest(ConnId, Interest),
    /// Everything is written: half-close the socket's writing side.
    ShutdownWrite(ConnId),
    /// The connection is gone from the core: drop its socket.
    Close(ConnId),
    /// Stop serving (graceful shutdown over).
    Stop(Stop),
}

/// Where Events handed to [`Core::ingest`] come from (the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `POST /events`, or an embedding host's own ingest.
    Http,
    /// A WebSocket emitter.
    Ws,
    /// A JSONL source (`--stdin`, `--ingest-file`).
    Jsonl,
}

/// How long a `POST` waits for the stream's acknowledgements (cluster mode): the
/// request timeout for a single relay.
fn post_wait(c: &Config) -> Duration {
    c.cluster
        .as_ref()
        .map_or(c.request_timeout, cluster::post_deadline)
}

/// The streams a subscription's `from` replays, each with where it starts.
///
/// `all`: every held stream, least-recently-written first (AEP-0003 §5). Positions: a
/// position names a bare session (AEP-0001 §7 #6), so it applies to every owning stream
/// of that name `(source, session)` (AEP-0001 §5.2), each replayed strictly after it, in
/// the order the positions are given and, within a name, the order the streams were
/// created. A name given more than once replays each of its streams once, after the
/// lowest of its positions (never less than any of them asked for: at-least-once,
/// AEP-0001 §7 #4). A name not held adds nothing.
fn replay_sessions(
    store: &Store<Event>,
    from: &subscription::Resume,
) -> VecDeque<(StreamId, ReplayFrom)> {
    match from {
        subscription::Resume::Live => VecDeque::new(),
        subscription::Resume::All => store
            .stream_ids()
            .into_iter()
            .map(|s| (s, ReplayFrom::Start))
            .collect(),
        subscription::Resume::Positions(ps) => {
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

/// A `replay-exhausted` marker for a stream evicted whole: `(session, source, earliest)`.
type LostMarker = (Box<str>, Option<Box<str>>, (u64, u64));

/// The `replay-exhausted` markers a subscription's `from` is owed for streams the store
/// evicted whole and remembers ([`Store::lost`]), as `(session, source, earliest)`: a
/// position names a bare session, so each remembered stream of that name whose lost
/// facts lie after the position owes one (AEP-0003 §5). `all` and live-only owe none
/// (honesty rule 2).
fn lost_markers(store: &Store<Event>, from: &subscription::Resume) -> Vec<LostMarker> {
    let subscription::Resume::Positions(ps) = from else {
        return Vec::new();
    };
    let mut out: Vec<LostMarker> = Vec::new();
    for p in ps {
        for lost in store.lost(&p.session) {
            let known = out
                .iter()
                .any(|(n, s, _)| **n == *lost.name && s.as_deref() == lost.source);
            if !known && lost.owes((p.epoch, p.seq)) {
                out.push((
                    lost.name.into(),
                    lost.source.map(Into::into),
                    lost.earliest(),
                ));
            }
        }
    }
    out
}

/// The streams of a history read ([`subscription::SubscriptionRequest::history_sessions`]):
/// every stream of each name, from its earliest held Event, names in sorted order and,
/// within a name, streams in creation order; a name the store does not hold adds
/// nothing. AEP-0003 §5 leaves `live=0` without `from` open ("composes unchanged").
fn history_streams(store: &Store<Event>, names: &[Box<str>]) -> Vec<(StreamId, ReplayFrom)> {
    names
        .iter()
        .flat_map(|n| store.streams(n))
        .map(|s| (s.id, ReplayFrom::Start))
        .collect()
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

/// Counts and logs one refusal from `peer` (`None`: gone), as [`Core::refused`] says.
fn note_refusal(
    metrics: &mut Metrics,
    peer: Option<SocketAddr>,
    what: &str,
    status: Option<u16>,
    code: Code,
    detail: &str,
) {
    metrics.reject(code.as_str());
    if !log::log_enabled!(log::Level::Info) {
        return;
    }
    let peer = peer.map_or_else(|| "?".to_string(), |p| p.to_string());
    let status = status.map(|s| format!("{s} ")).unwrap_or_default();
    log::info!(
        "refused {what} from {peer}: {status}{code}: {}",
        loggable(detail)
    );
}

/// The answer to a `POST /events` refused with `r` (its JSON error body; the
/// connection closes after it with `close`), the refusal counted and logged as from
/// `peer`.
fn refusal_answer(
    metrics: &mut Metrics,
    peer: Option<SocketAddr>,
    r: &Refusal,
    close: bool,
) -> Vec<u8> {
    let detail = r.to_string();
    note_refusal(
        metrics,
        peer,
        "POST /events",
        Some(r.status()),
        r.code(),
        &detail,
    );
    http::response(r.status(), "application/json", &[], &r.body(), close)
}

/// The relay's logic: connections, replay store, subscriptions, claims and metrics,
/// driven by bytes and time (module docs).
#[derive(Debug)]
pub struct Core {
    config: Config,
    conns: Conns,
    store: Store<Event>,
    hub: Hub,
    /// Which WebSocket connections claim which sessions (command routing, roster).
    claims: Claims,
    journal: Box<dyn Journal>,
    /// Counters for `/metrics`.
    metrics: Metrics,
    /// When the core was made, and the wall-clock time then in ms since the Unix epoch.
    started: Instant,
    started_unix_ms: u64,
    /// The time of the call being handled (every entry point sets it).
    now: Instant,
    /// The outputs, the connections with output to announce, and the deadlines.
    orders: Orders,
    /// Connections whose replay continues after the others had a turn.
    deferred: Vec<ConnId>,
    /// Connections to drop for backpressure (AEP-0003 §8.4).
    doomed: Vec<ConnId>,
    /// Events accepted and not yet published, in order: a publication paused until the
    /// reactor writes (`Fanned::Paused`). Each with the connection its fan-out skips (a
    /// command's claimant, which got it directly). `front_placed`: the streams the front
    /// one was admitted to, once admitted.
    publishing: VecDeque<(Event, Option<ConnId>)>,
    /// The Events of the body being ingested, kept between bodies (`ingest_body`).
    body_events: Vec<Event>,
    /// The buffer of the last `POST` body whose Events no longer point into it, kept
    /// (up to [`request::SPARE_BODY_MAX`] bytes of capacity) for the next body to be
    /// read into: no allocation, and no fresh pages to fault in, per request.
    spare_body: Vec<u8>,
    front_placed: Option<SmallVec<[StreamId; 2]>>,
    /// Events admitted for publication so far: the front one's number (`Subscriber::decided`).
    publication: u64,
    /// Set once a graceful shutdown began: the deadline for flushing.
    shutdown_deadline: Option<Instant>,
    /// During a graceful shutdown, the streams still to end and when, earliest first
    /// (spread over the first half of the deadline, `shutdown`).
    shutdown_closes: VecDeque<(Instant, ConnId)>,
    /// Which accepted connections are served (per address, accept rate: `storm`).
    gate: storm::Gate,
    /// The SSE `retry:` jitter and the order of shutdown closes ([`Core::seed`]).
    rng: storm::Rng,
    stopped: bool,
    /// Events accepted since start.
    ingested: u64,
    /// The discovery document (AEP-0003 §3.4), built on first use: it depends only on
    /// the configuration.
    discovery: std::cell::OnceCell<Bytes>,
    /// The relay's `hello` frames built so far, by version and whether the socket's
    /// credentials route commands (the only facts that vary, AEP-0003 §4).
    hellos: Vec<(&'static str, bool, Bytes)>,
    /// Cluster mode: `None` for a single relay.
    bus: Option<Box<cluster::Bus>>,
    /// The memory budget and what is counted against it (`memory`).
    ledger: memory::Ledger,
}

impl Core {
    /// A core with no connection. `now` is the reactor's clock now and `unix_ms` the
    /// wall-clock time at the same moment (ms since the Unix epoch): the base of
    /// WebSocket `ping` times. No syscall, no I/O.
    ///
    /// `config` is taken as valid ([`Config::validate`] is the caller's first step).
    pub fn new(config: Config, journal: Box<dyn Journal>, now: Instant, unix_ms: u64) -> Core {
        let store = Store::new(config.buffer_per_session, config.max_sessions);
        Core {
            conns: Conns::with_capacity(1024),
            store,
            hub: Hub::default(),
            claims: Claims::default(),
            journal,
            metrics: Metrics::default(),
            started: now,
            started_unix_ms: unix_ms,
            now,
            orders: Orders::default(),
            deferred: Vec::new(),
            doomed: Vec::new(),
            publishing: VecDeque::new(),
            body_events: Vec::new(),
            spare_body: Vec::new(),
            front_placed: None,
            publication: 0,
            shutdown_deadline: None,
            shutdown_closes: VecDeque::new(),
            gate: storm::Gate::new(
                config.max_connections_per_ip,
                config.accept_rate,
                config.accept_burst,
                now,
            ),
            rng: storm::Rng::new(unix_ms),
            stopped: false,
            ingested: 0,
            discovery: std::cell::OnceCell::new(),
            hellos: Vec::new(),
            bus: config
                .cluster
                .clone()
                .map(|c| Box::new(cluster::Bus::new(c, unix_ms))),
            ledger: memory::Ledger {
                budget: config.max_memory.and_then(|b| b.bytes),
                ..Default::default()
            },
            config,
        }
    }

    /// The replay store, to fill from durable history before serving
    /// (`aep_relay::history::History::open`).
    pub fn store_mut(&mut self) -> &mut Store<Event> {
        &mut self.store
    }

    /// Replaces the durable-history port (after the replay buffers were rebuilt from it).
    pub fn set_journal(&mut self, journal: Box<dyn Journal>) {
        self.journal = journal;
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The grant connection `id` streams under (an SSE stream or a WebSocket): its
    /// holder (`Grant::holder`, the tokens file's `name=` or the JWT `sub`, never the
    /// token), scopes, restrictions and expiry. `None` for a connection that does not
    /// stream, or is gone.
    pub fn grant(&self, id: ConnId) -> Option<&crate::auth::Grant> {
        self.conns.get(id)?.grant()
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Events accepted since start.
    pub fn ingested(&self) -> u64 {
        self.ingested
    }

    /// Time since [`Core::new`], as of the last call.
    pub fn uptime(&self) -> Duration {
        self.now.saturating_duration_since(self.started)
    }

    /// A new connection from `peer`.
    ///
    /// # Errors
    /// At `max_connections`, at `max_connections_per_ip` for `peer`'s address, or with
    /// the accept bucket empty (`accept_rate`), the answer the peer gets instead, before
    /// its request is read: a complete 503 response (`too-many-connections`,
    /// `too-many-connections-per-ip`, `accept-rate-limited`) with `Retry-After`, to
    /// write as is before closing; counted (`aep_connections_refused_total{reason}`)
    /// and logged like every refusal.
    pub fn open(&mut self, peer: SocketAddr, now: Instant) -> Result<ConnId, Vec<u8>> {
        self.now = now;
        if self.conns.len() >= self.config.max_connections {
            self.metrics.refused_connections += 1;
            // Counted under its code too, like every refusal.
            self.metrics.reject(Code::TooManyConnections.as_str());
            log::warn!(
                "refused connection from {peer}: {} connections open (max_connections)",
                self.conns.len()
            );
            let code = Code::TooManyConnections;
            return Err(http::error_response(
                code.http_status(),
                code.as_str(),
                "the relay is at its connection limit (AEP_MAX_CONNECTIONS); retry later",
                &[],
                &[("Retry-After", "1")],
                true,
            ));
        }
        if let Err(why) = self.gate.admit(peer.ip(), now) {
            return Err(self.refuse_at_gate(peer, why));
        }
        let (key, conn) = self.conns.insert(Conn::new(peer, now));
        self.orders.rearm(key, conn, &self.config);
        Ok(key)
    }

    /// Bytes that arrived on `id`, in order. A connection that streams (SSE) or that
    /// was answered for the last time discards them. Unknown ids are ignored.
    pub fn handle_input(&mut self, id: ConnId, bytes: &[u8], now: Instant) {
        self.now = now;
        let key = id;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        match conn.phase {
            Phase::Sse { .. } | Phase::Closing => {}
            _ => {
                if conn.rbuf.is_empty() && matches!(conn.phase, Phase::Head) {
                    conn.since = now;
                }
                let mut bytes = bytes;
                if let (true, Some((room, rem))) = (conn.rbuf.is_empty(), conn.body_room(1)) {
                    // A body of known length goes straight into its buffer, not through
                    // `rbuf` (one copy of each body byte fewer); what follows it is the
                    // next request's.
                    let take = room.len().min(bytes.len());
                    room[..take].copy_from_slice(&bytes[..take]);
                    *rem -= take;
                    bytes = &bytes[take..];
                }
                conn.rbuf.extend_from_slice(bytes);
                self.process(key, false);
            }
        }
        self.finish(key);
    }

    /// The unfilled rest of `id`'s request body of known length (RFC 9112 §6.2
    /// `Content-Length`), when the reactor should read the socket straight into it:
    /// nothing is buffered ahead of it, and at least [`BODY_READ_MIN`] bytes of it are
    /// still to come. That saves the copy of every body byte through the reactor's own
    /// read buffer, and one read takes up to the whole rest. A smaller rest is better
    /// read into the reactor's buffer: that read also takes the pipelined requests
    /// behind it. After reading `n > 0` bytes into the room the reactor calls
    /// [`Core::handle_body_read`]; on `None` it reads into a buffer of its own and calls
    /// [`Core::handle_input`].
    pub fn body_room(&mut self, id: ConnId) -> Option<&mut [u8]> {
        let conn = self.conns.get_mut(id)?;
        if !conn.rbuf.is_empty() {
            return None;
        }
        conn.body_room(BODY_READ_MIN).map(|(room, _)| room)
    }

    /// `n` bytes of `id`'s body were read into [`Core::body_room`]: as
    /// [`Core::handle_input`] with those bytes.
    pub fn handle_body_read(&mut self, id: ConnId, n: usize, now: Instant) {
        self.now = now;
        let key = id;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if let Some((room, rem)) = conn.body_room(1) {
            *rem -= n.min(room.len());
        }
        self.process(key, false);
        self.finish(key);
    }

    /// The peer closed its writing side of `id` (a read returned 0).
    pub fn handle_eof(&mut self, id: ConnId, now: Instant) {
        self.now = now;
        let key = id;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.peer_eof = true;
        if conn.request.awaiting.is_some() {
            // A POST waits for the stream (cluster mode): answered, then closed.
            return;
        }
        match conn.phase {
            Phase::Sse { .. } | Phase::Ws(_) => self.close(key),
            _ if conn.subscriber.out.is_empty() && (conn.write_shut || conn.rbuf.is_empty()) => {
                self.close(key)
            }
            _ => {
                // The peer half-closed: every complete request it sent is already
                // answered (input is processed as it is read), so flush and close. The
                // `Closing` phase puts the connection under the linger timer, so a peer
                // that also stops reading cannot hold it open forever.
                conn.close_after_flush = true;
                conn.enter(Phase::Closing);
                conn.since = now;
                conn.rbuf.clear();
                self.orders.mark_dirty(key, conn);
                self.orders.rearm(key, conn, &self.config);
            }
        }
    }

    /// The socket of `id` failed (a read or write error other than would-block): the
    /// connection is dropped at once, its subscriptions and claims released.
    pub fn handle_reset(&mut self, id: ConnId, now: Instant) {
        self.now = now;
        if let Some(c) = self.conns.get(id) {
            log::info!("closing {} after a socket error", c.peer);
        }
        self.close(id);
    }

    /// Runs every deadline due at `now`: SSE heartbeats, WebSocket pings and idle
    /// closes, request timeouts (408), keep-alive idle closes, lingering closes, and the
    /// shutdown deadline. Also lets replays that yielded their turn continue.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = now;
        self.bus_timeout(now);
        self.end_streams_due(now);
        for key in std::mem::take(&mut self.deferred) {
            self.mark_dirty(key);
        }
        // A heartbeat or ping queued by a deadline goes behind the fan-out frames
        // already decided for its connection.
        self.end_unit();
        while let Some((key, generation)) = self.orders.timers.pop_due(now) {
            self.expire(key, generation);
        }
        if let Some(deadline) = self.shutdown_deadline {
            if !self.stopped && now >= deadline {
                let n = self.conns.len();
                self.stopped = true;
                if let Some(left) = self.outbox_left() {
                    log::warn!("shutdown: {left}");
                }
                if n == 0 {
                    // Only the outbox was waited for: every connection is flushed.
                    self.orders.outputs.push_back(Output::Stop(Stop::Drained));
                } else {
                    log::warn!("shutdown deadline passed with {n} connections not flushed");
                    self.orders
                        .outputs
                        .push_back(Output::Stop(Stop::DeadlinePassed(n)));
                }
            }
        }
    }

    /// The earliest deadline the core has (call [`Core::handle_timeout`] then), or
    /// `None` when nothing is timed. Never earlier than needed; may be early (an entry
    /// whose deadline moved later), which costs one empty wake.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.orders.timers.next(),
            self.shutdown_deadline.filter(|_| !self.stopped),
            self.shutdown_closes.front().map(|(at, _)| *at),
            self.bus_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether the core has work that must not wait for a deadline: a replay that
    /// yielded its turn (call [`Core::handle_timeout`] at once), or a publication that
    /// waits for the reactor's writes.
    pub fn is_busy(&self) -> bool {
        !self.deferred.is_empty() || !self.publishing.is_empty()
    }

    /// Whether the reactor should read `id` now (see [`Interest::read`]).
    pub fn wants_read(&self, id: ConnId) -> bool {
        self.conns.get(id).is_some_and(|c| c.reading)
    }

    /// Ingests `ndjson` (one Event per line, blank lines ignored), all or nothing, as
    /// `POST /events` with `application/x-ndjson` does: validated, kept by the
    /// [`Journal`], then published. Returns how many Events were accepted.
    ///
    /// Every Event a replay buffer keeps is copied into the buffer's own arena, so
    /// nothing of `ndjson` stays allocated once the Events are published.
    ///
    /// # Errors
    /// [`Refusal`] as for the HTTP binding; nothing is published then.
    pub fn ingest(
        &mut self,
        ndjson: Bytes,
        origin: Origin,
        now: Instant,
    ) -> Result<usize, Refusal> {
        self.now = now;
        if self.clustered() {
            let events = self.validate_body(ndjson, true, None)?;
            return match self.submit(events, cluster::Waiter::None)? {
                cluster::Submitted::Now(n) => {
                    self.count_ingested(origin, n);
                    Ok(n)
                }
                cluster::Submitted::Waiting => Ok(0),
            };
        }
        self.ingest_body(ndjson, true, None, origin)
    }

    /// Publishes Events already parsed and validated (a JSONL chunk), as one ingest unit:
    /// kept by the [`Journal`] first. The Events are moved out of `events` (no clone):
    /// on success `events` is left empty, its allocation kept.
    ///
    /// # Errors
    /// [`Refusal::HistoryUnavailable`]: nothing was published and `events` is as it was;
    /// retry later.
    pub fn publish_events(&mut self, events: &mut Vec<Event>, now: Instant) -> Result<(), Refusal> {
        self.now = now;
        let n = events.len();
        if self.clustered() {
            self.submit(events.to_vec(), cluster::Waiter::None)?;
            events.clear();
        } else {
            self.persist(events)?;
            self.size_unit(events);
            self.publish_unit(events.drain(..));
        }
        self.count_ingested(Origin::Jsonl, n);
        Ok(())
    }

    /// The next thing the reactor must do, or `None` when nothing is left for now. The
    /// reactor drains this after every `handle_*`, `ingest` and `write_to` call.
    ///
    /// `Writable(id)` asks for [`Core::write_to`] on `id`. A publication paused for lack
    /// of room continues here once every `Writable` it asked for was taken.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.flush_stream_batch();
        loop {
            if let Some(o) = self.orders.outputs.pop_front() {
                return Some(o);
            }
            if self.settle() {
                continue;
            }
            if !self.publishing.is_empty() {
                self.drain_publishing();
                if self.settle() || !self.orders.outputs.is_empty() {
                    continue;
                }
            }
            return None;
        }
    }

    /// Writes `id`'s queued output to `w` (its socket), with one vectored write per
    /// flush, continuing a replay in progress as the queue empties. Never names the
    /// socket type: any `Write` is a peer (a test's `Vec<u8>`, a TLS stream).
    /// Outcomes come out of [`Core::poll_output`]: interest changes, a half-close, a
    /// close.
    pub fn write_to<W: Write>(&mut self, id: ConnId, w: &mut W, now: Instant) {
        self.now = now;
        let key = id;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.subscriber.dirty = false;
        let mut had_output = false;
        let mut rounds = 0;
        let written_before = conn.subscriber.out.pushed() - conn.subscriber.out.queued() as u64;
        let mut pump = !conn.subscriber.replay.is_empty() || !conn.subscriber.backlog.is_empty();
        let max_output = self.config.max_output_bytes;
        let state = loop {
            if pump {
                replay::pump(conn, &self.store, &mut self.hub, max_output);
            }
            had_output |= !conn.subscriber.out.is_empty();
            let state = conn.subscriber.out.flush(w, &mut self.hub.chunks);
            conn.subscriber.offered = conn.subscriber.out.pushed();
            pump = !conn.subscriber.replay.is_empty() || !conn.subscriber.backlog.is_empty();
            rounds += 1;
            if state != Flush::Done || !pump {
                break state;
            }
            if rounds == REPLAY_ROUNDS {
                // The socket keeps up: continue after the others had a turn.
                if !self.deferred.contains(&key) {
                    self.deferred.push(key);
                }
                break state;
            }
        };
        let written = conn.subscriber.out.pushed() - conn.subscriber.out.queued() as u64;
        if let Some((_, at)) = conn.latency_mark.filter(|(end, _)| written >= *end) {
            // The sampled delivery's last byte went to the socket.
            conn.latency_mark = None;
            let d = now.saturating_duration_since(at);
            match conn.phase {
                Phase::Sse { .. } => self.metrics.latency_sse.observe(d),
                Phase::Ws(_) => self.metrics.latency_ws.observe(d),
                _ => {}
            }
        }
        if let Some((_, decided)) = conn.lag_mark.filter(|(end, _)| written >= *end) {
            // What fan-out had queued by then is written.
            conn.lag_mark = None;
            conn.written_publication = decided;
        }
        if matches!(conn.phase, Phase::Closing) && written > written_before {
            // The linger counts from the last byte the peer took: a consumer still
            // reading its last answer (a long `live=0` replay) is not cut off mid-way.
            conn.since = now;
        }
        // Resume a connection paused by `over_output_bound` once its queue is below the
        // bound: first the requests already read, then the socket (its readiness edge
        // has passed; the data is waiting).
        let resume =
            conn.request.read_paused && conn.subscriber.out.len() < self.config.max_output_bytes;
        if resume {
            conn.request.read_paused = false;
        }
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
                    conn.enter(Phase::Closing);
                    conn.since = now;
                    self.orders.outputs.push_back(Output::ShutdownWrite(id));
                }
                self.orders.set_interest(key, conn, None, Some(false));
            }
            Flush::Blocked => self.orders.set_interest(key, conn, None, Some(true)),
        }
        if resume {
            self.process(key, true);
        }
        self.finish(key);
    }

    /// Records the bytes `id`'s transport holds of its own after a write (sealed TLS
    /// records the socket has not taken yet). They count in `id`'s output queue from
    /// then on: its bound (AEP-0003 §8.4: a consumer that falls behind is dropped by
    /// the same rule whether the bytes wait sealed or in plaintext),
    /// `aep_output_queued_bytes`, and its drain at shutdown.
    pub fn set_held(&mut self, id: ConnId, bytes: usize) {
        if let Some(conn) = self.conns.get_mut(id) {
            conn.subscriber.out.set_held(bytes);
        }
    }

    /// Probe (feature `test-probes`, for the tests, benches and fuzz targets; not for
    /// driving the core): bytes queued for output on `id` (`None`: no such
    /// connection). Each connection
    /// stays within `max_output_bytes` plus one frame (AEP-0003 §8.4), replay pages
    /// included; when a stream ends, the live frames held behind its replay
    /// ([`Core::backlog`]) join the queue before the last frame. An invariant the fuzz
    /// targets check.
    #[cfg(feature = "test-probes")]
    pub fn queued(&self, id: ConnId) -> Option<usize> {
        self.conns.get(id).map(|c| c.subscriber.out.len())
    }

    /// Probe (feature `test-probes`): bytes of live frames held back on `id` behind a
    /// replay in progress, not yet in its output queue; bounded like the queue.
    #[cfg(feature = "test-probes")]
    pub fn backlog(&self, id: ConnId) -> Option<usize> {
        self.conns.get(id).map(|c| c.subscriber.backlog.len())
    }

    /// Probe (feature `test-probes`): deadlines held in the timer, stale entries
    /// included (for invariant checks: after every connection closed and the clock
    /// passed every timeout, none remains).
    #[cfg(feature = "test-probes")]
    pub fn armed_deadlines(&self) -> usize {
        self.orders.timers.len()
    }

    // ---- internals ----

    /// [`Orders::mark_dirty`] for a connection not at hand.
    fn mark_dirty(&mut self, key: ConnId) {
        if let Some(c) = self.conns.get_mut(key) {
            self.orders.mark_dirty(key, c);
        }
    }

    /// Closes the doomed and announces every connection with new output. Returns
    /// whether it produced any output.
    fn settle(&mut self) -> bool {
        self.end_unit();
        // After every call, once its units ended: one compare under the budget.
        self.enforce();
        let before = self.orders.outputs.len();
        for key in std::mem::take(&mut self.doomed) {
            let Some(c) = self.conns.get(key) else {
                continue;
            };
            let (peer, dropped) = (c.peer, c.subscriber.dropped.total());
            match c.phase {
                // A WebSocket gets `closing` with its positions, then the close frame.
                Phase::Ws(_) => {
                    log::info!("closing WebSocket {peer} (backpressure, AEP-0003 §8.4)");
                    let reason = "backpressure: the consumer fell behind";
                    let code = crate::wire::ws::rfc6455::close_code::TRY_AGAIN;
                    self.ws_close(key, reason, code);
                    continue;
                }
                Phase::Closing if c.close_after_flush => continue,
                _ => {}
            }
            log::info!(
                "disconnecting slow consumer {peer} (backpressure, AEP-0003 §8.4; {dropped} Events dropped)"
            );
            self.close(key);
        }
        // Answers to requests go out before deliveries: an emitter's `202` does not wait
        // behind a write to every subscriber (10 000 writes a turn, with 10 000 of them).
        let mut dirty = std::mem::take(&mut self.orders.answered);
        dirty.append(&mut self.orders.dirty);
        for &key in &dirty {
            if let Some(c) = self.conns.get_mut(key).filter(|c| c.subscriber.dirty) {
                // Delivery latency is sampled here, once per connection and write batch,
                // never per delivery: the end of what fan-out queued, and when (see
                // `write_to`). Not behind a replay (its frames wait in the backlog).
                if c.latency_mark.is_none()
                    && c.subscriber.decided != c.sampled
                    && c.subscriber.backlog.is_empty()
                    && c.subscriber.replay.is_empty()
                {
                    c.sampled = c.subscriber.decided;
                    c.latency_mark = Some((c.subscriber.out.pushed(), self.now));
                }
                if c.lag_mark.is_none() {
                    c.lag_mark = Some((c.subscriber.out.pushed(), c.subscriber.decided));
                }
                self.orders.outputs.push_back(Output::Writable(key));
                self.orders.rearm(key, c, &self.config);
            }
        }
        dirty.clear();
        // Both lists keep their capacity from one settle to the next (no allocation per
        // fan-out).
        self.orders.answered = std::mem::replace(&mut self.orders.dirty, dirty);
        self.orders.outputs.len() > before
    }

    /// Ends the open fan-out unit, if any: its pending frames are queued before anything
    /// else is (see `fanout::Unit`).
    fn end_unit(&mut self) {
        self.hub.end_unit(self.conns.subscribers());
    }

    fn close(&mut self, key: ConnId) {
        if !self.conns.contains(key) {
            return;
        }
        self.end_unit();
        let mut conn = self.conns.remove(key);
        self.gate.release(conn.peer.ip());
        self.unaccount(&mut conn);
        match &conn.phase {
            Phase::Sse { sub, .. } => self.hub.remove(*sub),
            Phase::Ws(ws) => self.ws_release(key, ws),
            _ => {}
        }
        self.orders.outputs.push_back(Output::Close(key));
        self.check_drained();
    }

    /// During a graceful shutdown, stops once the last connection is gone and, clustered,
    /// the outbox is in the stream (bounded by the shutdown deadline).
    fn check_drained(&mut self) {
        if self.shutdown_deadline.is_some()
            && self.conns.is_empty()
            && !self.stopped
            && self.outbox_len() == 0
        {
            log::info!("shutdown complete: every connection flushed and closed");
            self.stopped = true;
            self.orders.outputs.push_back(Output::Stop(Stop::Drained));
        }
    }

    /// Appends a unit of valid Events to the journal, before they are published or
    /// answered.
    fn persist(&mut self, events: &[Event]) -> Result<(), Refusal> {
        self.journal
            .append(events, &self.store)
            .map_err(|detail| Refusal::HistoryUnavailable { detail })
    }

    /// Publishes accepted Events as one ingest unit: their frames are coalesced (see
    /// `fanout`). Behind a paused publication they wait their turn, in order.
    fn publish_unit(&mut self, events: impl IntoIterator<Item = Event>) {
        let own_unit = !self.hub.unit_open();
        self.hub.begin_unit();
        let mut events = events.into_iter();
        // Straight from the batch while nothing waits (no Event is moved into the
        // queue); after a pause the rest waits its turn behind it.
        while self.publishing.is_empty() {
            let Some(ev) = events.next() else {
                break;
            };
            if !self.fan_one(&ev, None) {
                self.publishing.push_back((ev, None));
            }
        }
        self.publishing.extend(events.map(|ev| (ev, None)));
        if own_unit {
            self.end_unit();
        }
    }

    /// Announces the Events of a unit about to be published to the hub, which sizes the
    /// unit's frame arenas for them at once.
    fn size_unit(&mut self, events: &[Event]) {
        let bytes = events.iter().map(|ev| ev.bytes().len()).sum();
        self.hub.size_unit(events.len(), bytes);
    }

    /// Publishes one Event on its own (a WebSocket message; a command's copy for
    /// observers), in order behind any paused publication.
    fn publish(&mut self, ev: Event) {
        self.publish_unit(std::iter::once(ev));
    }

    /// Publishes a command to its observers and history, skipping `claimant`, which got
    /// it directly (AEP-0004 §4.2: delivered once), in order behind any paused
    /// publication.
    fn publish_except(&mut self, ev: Event, claimant: ConnId) {
        self.publishing.push_back((ev, Some(claimant)));
        self.drain_publishing();
    }

    /// Admits `ev` to the store (unless a pause already did: `front_placed`) and fans it
    /// out, skipping `except`. `false` when a connection needs its socket offered first
    /// (`Fanned::Paused`): `ev` is then to be fanned out again, first, once it was.
    fn fan_one(&mut self, ev: &Event, except: Option<ConnId>) -> bool {
        let resumed = self.front_placed.take();
        if resumed.is_none() {
            self.ingested += 1;
            self.publication += 1;
            if let Admission::Conflict = self.store.admit(ev) {
                log::warn!(
                    "session {:?} of {:?}: two different Events claim position {}:{} (emitter fault, AEP-0001 §7.2); kept the first",
                    ev.session().unwrap_or_default(),
                    ev.source(),
                    ev.epoch(),
                    ev.seq().unwrap_or_default()
                );
            }
        }
        // The streams it was admitted to: read in place from the store (no copy per
        // Event), kept aside only when the fan-out pauses.
        let placed = resumed.as_deref().unwrap_or(self.store.last_placed());
        self.hub.except = except;
        let publication = hub::Publication {
            ev,
            placed,
            number: self.publication,
            max_output: self.config.max_output_bytes,
        };
        let fanned = self.hub.fanout(
            publication,
            self.conns.subscribers(),
            &mut self.orders.dirty,
            &mut self.doomed,
        );
        self.hub.except = None;
        match fanned {
            Fanned::Done => true,
            Fanned::Paused(conn) => {
                // Offer the queues to their sockets, then fan this Event out again.
                self.front_placed =
                    Some(resumed.unwrap_or_else(|| SmallVec::from_slice(self.store.last_placed())));
                self.mark_dirty(conn);
                false
            }
        }
    }

    /// Admits and fans out the Events waiting in `publishing`, in order, until done or
    /// until a connection needs its socket offered first (`Fanned::Paused`).
    fn drain_publishing(&mut self) {
        // Inside a unit the caller opened (the WebSocket messages of one read) the
        // frames join it; otherwise these Events are a unit of their own.
        let own_unit = !self.hub.unit_open();
        self.hub.begin_unit();
        while let Some((ev, except)) = self.publishing.pop_front() {
            if !self.fan_one(&ev, except) {
                self.publishing.push_front((ev, except));
                break;
            }
        }
        if own_unit {
            self.end_unit();
        }
        if self.publishing.is_empty() && self.publishing.capacity() > 64 {
            // A large batch waited behind a pause: do not keep its room.
            self.publishing.shrink_to(8);
        }
    }

    /// Ends an entry point's work on connection `key`: re-arms its deadline and counts
    /// its share of memory again (`memory`), with one lookup. Once a shutdown began, a
    /// connection left with no request to read or answer (its last answers written, a
    /// discarded body read) ends: no next request would be served.
    fn finish(&mut self, key: ConnId) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if self.shutdown_deadline.is_some()
            && matches!(conn.phase, Phase::Head)
            && conn.rbuf.is_empty()
            && conn.request.awaiting.is_none()
        {
            conn.end_after_answer(self.now);
            self.orders.mark_dirty(key, conn);
        }
        self.orders.rearm(key, conn, &self.config);
        self.ledger.recount(conn, self.config.tls_enabled());
        #[cfg(debug_assertions)]
        memory::check_conn(conn, key, &self.hub, &self.orders.timers);
    }

    /// Timer entry `generation` of `key` came due: unless it is stale (an earlier arming,
    /// a connection closed) or the deadline moved later (re-armed then), the heartbeat,
    /// the ping, the token's expiry, or the timeout of its phase. Every path that leaves
    /// the connection open re-arms it.
    fn expire(&mut self, key: ConnId, generation: u64) {
        let now = self.now;
        let c = &self.config;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.armed.map(|(_, g)| g) != Some(generation) {
            return;
        }
        conn.armed = None;
        if conn.deadline(c, post_wait(c)).is_none_or(|d| d > now) {
            return self.orders.rearm(key, conn, c);
        }
        if let Some(serial) = conn.request.awaiting {
            return self.post_expired(serial);
        }
        if conn.expires_at.is_some_and(|t| now >= t) {
            if expiry::token_expired(conn, &mut self.hub, now) {
                let policy = crate::wire::ws::rfc6455::close_code::POLICY;
                return self.ws_close(key, "token expired", policy);
            }
            self.orders.mark_dirty(key, conn);
            return self.orders.rearm(key, conn, c);
        }
        match &mut conn.phase {
            Phase::Sse { .. } => {
                conn.send(sse::PING);
                conn.last_write = now;
            }
            Phase::Ws(ws) => {
                if now.duration_since(ws.last_read) >= c.ws_idle_timeout {
                    let reason = format!(
                        "idle: nothing received for {} s",
                        c.ws_idle_timeout.as_secs_f64()
                    );
                    let code = crate::wire::ws::rfc6455::close_code::GOING_AWAY;
                    return self.ws_close(key, &reason, code);
                }
                // A `ping` every `heartbeat` once `hello` is done, whatever else is being
                // written, so a pure consumer always has something to answer
                // (AEP-0003 §3.5 #5).
                ws.last_ping = now;
                let t = self.started_unix_ms
                    + now.saturating_duration_since(self.started).as_millis() as u64;
                conn.send(crate::wire::ws::aep::ping(t));
                conn.last_write = now;
            }
            Phase::Head if conn.rbuf.is_empty() || conn.request.read_paused => {
                return self.close(key)
            }
            // A body still arriving after its request was answered: no 408 for it.
            Phase::Discard(_) => conn.end_after_answer(now),
            Phase::Head | Phase::Body { .. } => {
                let d = format!(
                    "the request did not arrive within {} s",
                    c.request_timeout.as_secs_f64()
                );
                return self.reply_error(key, Code::RequestTimeout, &d, true);
            }
            Phase::Closing => return self.close(key),
        }
        self.orders.mark_dirty(key, conn);
        self.orders.rearm(key, conn, c);
    }
}
