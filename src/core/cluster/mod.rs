//! Cluster mode, the core's side: what to publish to the engine, what to admit from it,
//! the claims of other relays, and commands routed between relays. Sans-IO like the rest
//! of the core: it takes [`FromBus`] values and `now`, and leaves [`ToBus`] values for
//! the reactor to hand to the bridge thread (`aep_relay::bridge::Bridge`).
//!
//! # One stream, one order
//!
//! Every Event a relay ingests (HTTP POST, WebSocket, JSONL, [`Core::ingest`]) is
//! published to the one JetStream stream, with a `Nats-Msg-Id` that names the publish
//! ([`cluster::publish_id`]: relay, start, serial), so the engine collapses only this
//! relay's own retries of one publish. Nothing is admitted at ingest: each relay admits
//! and fans out only what its ordered consumer delivers, once per stream sequence, and
//! exactly as a single relay admits what it ingests: buffer admission dedupes on
//! `(source, id)` (AEP-0001 §7.4), live fan-out forwards every Event as received,
//! redeliveries included (AEP-0003 §5: "at-least-once redelivery MUST be able to
//! traverse the hop"). So every relay builds the same replay buffers in the same order,
//! and a resume `(session, epoch, seq)` is exact at any of them (AEP-0003 §5, §7). A
//! `POST /events` is answered 202 once the stream acknowledged all its Events; the
//! publishes are pipelined.
//!
//! # When the engine is down
//!
//! With [`Degrade::Local`] the relay serves locally: an Event is admitted and fanned out
//! at once, and kept in a bounded outbox that is published on reconnect. When that
//! publish comes back through the stream it is not fanned out here again (its publish id
//! is remembered): a relay's own outbox flush is not a redelivery. With a durable place
//! ([`Core::set_outbox_log`]: `--history`), each outbox message is kept there before its
//! Events are answered, and a restarted relay publishes what a previous run left. With
//! [`Degrade::Refuse`] ingest answers 503 `cluster-unavailable`.
//!
//! # Commands across relays (AEP-0004 §4)
//!
//! Each relay keeps a claim record per session its emitters claim in the claims bucket
//! (`{relay, session, entries}`), refreshed every third of the claim TTL. A command counts
//! local and remote claimants: none is `no-route`, more than one `ambiguous`. With one
//! claimant on another relay, the command goes to that relay as a request; it checks
//! again, delivers byte-identically, publishes the command to the stream (so it enters
//! every relay's history and reaches observers), and answers. A refusal, a timeout or no
//! responder becomes the sender's in-band `error`.
//!
//! # Files
//!
//! Here: the state ([`Bus`]), the link to the engine, and [`Core::handle_bus`], which
//! hands each report of the bridge to its handler. [`publish`]: what goes to the stream
//! and its acknowledgements; [`outbox`]: what waits for it while the engine is down;
//! [`posts`]: the answers to `POST`s waiting for it; [`admit`]: what comes from it;
//! [`claims`]: the claims bucket (claim and presence records); [`commands`]: commands
//! routed between relays.
//!
//! [`cluster::publish_id`]: crate::cluster::publish_id
//! [`Degrade::Local`]: crate::cluster::Degrade::Local
//! [`Degrade::Refuse`]: crate::cluster::Degrade::Refuse

use super::Core;
use crate::cluster::{ClusterConfig, FromBus, ToBus};
use crate::ids::ConnId;
use crate::wire::envelope::Event;
use claims::RemoteClaim;
use posts::Group;
use publish::{Held, Outgoing, Ticket};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::Instant;

mod admit;
mod claims;
mod commands;
mod outbox;
mod posts;
mod publish;

pub(super) use posts::{may_join, post_deadline};

/// Where the relay stands with the engine (`/healthz` `cluster.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    /// Connected, and the consumer has delivered the stream up to where it stood at the
    /// connection (`/readyz` answers 200).
    Connected,
    /// Connected, rebuilding from the stream (`/readyz` answers 503).
    CatchingUp,
    /// The engine is unreachable or stalled after the relay was connected: serving
    /// locally or refusing ingest, per `--cluster-degrade` (`/readyz` answers 503). A
    /// relay never connected yet reports [`ClusterState::CatchingUp`] instead, though
    /// it serves the same way meanwhile.
    Degraded,
}

impl ClusterState {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterState::Connected => "connected",
            ClusterState::CatchingUp => "catching-up",
            ClusterState::Degraded => "degraded",
        }
    }
}

/// The core's cluster state (see the module docs).
#[derive(Debug)]
pub(super) struct Bus {
    config: ClusterConfig,
    /// When this relay started (ms since the Unix epoch): the middle of its publish ids.
    boot: u64,
    state: ClusterState,
    /// Whether the relay was ever connected (a later `Connected` is a reconnect).
    ever_connected: bool,
    max_payload: usize,
    /// The last stream sequence admitted.
    applied: u64,
    /// The stream's last sequence when the connection came up: caught up past it.
    target: u64,
    /// Messages the consumer still has to deliver, as it last said.
    lag: u64,
    to_bus: VecDeque<ToBus>,
    next_ticket: u64,
    tickets: HashMap<u64, Ticket>,
    /// Groups of `POST`s waiting for the stream, by serial.
    posts: HashMap<u64, Group>,
    /// The group that this turn's `POST`s join, not published yet (see [`Bus::loose`]).
    open_group: Option<u64>,
    /// Messages of Events admitted locally while degraded, not yet acknowledged by the
    /// stream, with whether a publish of each is in flight.
    outbox: BTreeMap<u64, (Outgoing, bool)>,
    /// Events in `outbox`.
    outbox_events: usize,
    /// Where the outbox is kept durably (`--history`), if anywhere.
    log: Option<Box<dyn super::OutboxLog>>,
    /// Publish ids of this relay's messages whose Events were delivered here already
    /// (the outbox, commands given to their claimant directly): when the stream delivers
    /// that very message, it is not fanned out again, except to everyone but the
    /// connection named. Keyed by the publish, never by the Event: a relay's own outbox
    /// flush is not a redelivery, an emitter's re-send is (AEP-0003 §5).
    delivered: HashMap<String, Option<ConnId>>,
    remote: HashMap<String, RemoteClaim>,
    /// The other relays' presence records (`{relay, state, lag, outbox, applied}`), by
    /// their KV key (so by relay id): put by each relay with its claims' refresh, gone
    /// after the claim TTL.
    relays: BTreeMap<String, Value>,
    /// Commands forwarded to another relay: the sender's connection and command id.
    requests: HashMap<u64, (ConnId, String)>,
    /// Sessions whose local claim record must be put again (or deleted).
    claims_dirty: HashSet<String>,
    refresh_at: Option<Instant>,
    /// Connected, but the engine stopped acknowledging (a publish timed out): degraded
    /// until an acknowledgement comes again, with the outbox retried meanwhile.
    stalled: bool,
    /// Set at the first local admission of an outage: the replay store as the stream
    /// had built it, and every stream message admitted since, in stream order. Once the
    /// outbox is back through the stream, the store is rebuilt from them, so it is again
    /// what every other relay built (the same rings, in the same order).
    provisional: Option<(super::Store<Event>, Vec<Event>)>,
    /// Events accepted for the stream and not yet published, with who waits on them
    /// (a WebSocket emitter, or the open group of `POST`s): published together when the
    /// reactor next takes what is for the bridge, once per turn (so the Events of one
    /// turn travel as few stream messages as they can), or before any other publish.
    loose: Vec<(Event, Held)>,
    /// Stream messages admitted since the last output, published as one ingest unit
    /// (their frames coalesced per consumer, as a POSTed batch's are) when the reactor
    /// next asks for output.
    batch: Vec<Event>,
    /// Counters for `/metrics`.
    pub(super) reconnects: u64,
    pub(super) consumer_resets: u64,
    pub(super) publish_errors: u64,
}

impl Bus {
    /// The cluster state for a relay configured with `config`, not connected yet.
    pub(super) fn new(config: ClusterConfig, boot: u64) -> Bus {
        Bus {
            config,
            boot,
            state: ClusterState::Degraded,
            ever_connected: false,
            max_payload: usize::MAX,
            applied: 0,
            target: 0,
            lag: 0,
            to_bus: VecDeque::new(),
            next_ticket: 1,
            tickets: HashMap::new(),
            posts: HashMap::new(),
            open_group: None,
            outbox: BTreeMap::new(),
            outbox_events: 0,
            log: None,
            delivered: HashMap::new(),
            remote: HashMap::new(),
            relays: BTreeMap::new(),
            requests: HashMap::new(),
            claims_dirty: HashSet::new(),
            refresh_at: None,
            stalled: false,
            provisional: None,
            batch: Vec::new(),
            loose: Vec::new(),
            reconnects: 0,
            consumer_resets: 0,
            publish_errors: 0,
        }
    }

    /// A fresh number for a ticket, a POST or a forwarded command.
    fn serial(&mut self) -> u64 {
        let n = self.next_ticket;
        self.next_ticket += 1;
        n
    }

    fn ticket(&mut self, t: Ticket) -> u64 {
        let n = self.serial();
        self.tickets.insert(n, t);
        n
    }

    /// The state of a relay whose engine answers: caught up with the stream or not.
    fn up_state(&self) -> ClusterState {
        if self.applied >= self.target {
            ClusterState::Connected
        } else {
            ClusterState::CatchingUp
        }
    }

    fn connected(&self) -> bool {
        self.state != ClusterState::Degraded
    }

    /// The state, the consumer's lag and the outbox size (`/healthz`).
    pub(super) fn health(&self) -> Value {
        json!({
            "state": self.state().as_str(),
            "relay": self.config.relay_id,
            "lag": self.lag,
            "outbox": self.outbox_events,
            "applied": self.applied,
            "remote_claims": self.remote.len(),
        })
    }

    /// The state as reported (`/healthz`, `/readyz`, the state metric): a relay that was
    /// never connected is `catching-up` until it is connected and caught up, not
    /// `degraded`; it serves as a degraded one meanwhile.
    pub(super) fn state(&self) -> ClusterState {
        if self.state == ClusterState::Degraded && !self.ever_connected {
            ClusterState::CatchingUp
        } else {
            self.state
        }
    }

    /// Messages the consumer still has to deliver.
    pub(super) fn lag(&self) -> u64 {
        self.lag
    }

    /// Events in the outbox.
    pub(super) fn outbox_len(&self) -> usize {
        self.outbox_events
    }

    /// The engine is unreachable ([`FromBus::Disconnected`]): degraded, and the other
    /// relays' claims and presence forgotten until the reconnect brings them again.
    fn on_disconnected(&mut self, reason: &str) {
        if self.state != ClusterState::Degraded {
            log::warn!("cluster: engine unreachable ({reason}); degraded");
        }
        self.state = ClusterState::Degraded;
        self.stalled = false;
        // Remote claims cannot be reached meanwhile.
        self.remote.clear();
        self.relays.clear();
    }

    /// The ordered consumer was recreated ([`FromBus::ConsumerReset`]): counted.
    fn on_consumer_reset(&mut self) {
        self.consumer_resets += 1;
    }

    /// The engine stopped answering on a connection that stays up ([`FromBus::Stalled`]):
    /// degraded until it answers again.
    fn on_stalled(&mut self, reason: &str) {
        if self.state != ClusterState::Degraded {
            log::warn!("cluster: the engine stalled ({reason}); degraded until it answers");
            self.state = ClusterState::Degraded;
            self.stalled = true;
        }
    }

    /// The engine answers again after a stall ([`FromBus::Answering`]): up again, and the
    /// outbox retried.
    fn on_answering(&mut self) {
        if self.stalled {
            self.stalled = false;
            self.state = self.up_state();
            log::info!("cluster: the engine answers again");
            self.flush_outbox();
        }
    }
}

/// Who hears how a cluster-mode ingest went.
pub(super) enum Waiter {
    /// A `POST /events` on this connection (and its `Connection: close`): answered once
    /// the stream acknowledged every Event.
    Post(ConnId, bool),
    /// A WebSocket emitter on this connection, from this peer: told with an `error`
    /// frame if an Event is neither stored by the stream nor kept locally (and the
    /// connection is still the same peer's then).
    Ws(ConnId, SocketAddr),
    /// No one (JSONL, an embedding host's ingest).
    None,
}

/// How an ingest went in cluster mode.
pub(super) enum Submitted {
    /// Accepted now (degraded, served locally): this many Events.
    Now(usize),
    /// Waiting for the stream's acknowledgements; the answer comes later.
    Waiting,
}

impl Core {
    /// Whether the relay runs clustered.
    pub fn clustered(&self) -> bool {
        self.bus.is_some()
    }

    /// Events in the cluster outbox (0 for a single relay).
    pub fn outbox_len(&self) -> usize {
        self.bus.as_ref().map_or(0, |b| b.outbox_len())
    }

    /// The cluster state, when clustered.
    pub fn cluster_state(&self) -> Option<ClusterState> {
        self.bus.as_ref().map(|b| b.state())
    }

    /// Whether the relay is ready to serve as a member of the cluster: a single relay
    /// always; a clustered one once connected and caught up (`/readyz`).
    pub fn ready(&self) -> bool {
        self.bus
            .as_ref()
            .is_none_or(|b| b.state == ClusterState::Connected)
    }

    /// While a clustered relay rebuilds its replay buffers from the stream, why a new
    /// subscription must wait (it would get history as live Events, and a resume could
    /// not be exact yet); `None` otherwise. Subscriptions made before keep their Events.
    pub(in crate::core) fn catching_up(&self) -> Option<&'static str> {
        let up_and_behind = self
            .bus
            .as_ref()
            .is_some_and(|b| b.state == ClusterState::CatchingUp);
        up_and_behind.then_some(
            "this relay is catching up with the cluster's stream; subscribe again shortly (GET /readyz says when it is ready)",
        )
    }

    /// The next value for the bridge thread, or `None`. The reactor drains this after
    /// every call into the core, as it does [`Core::poll_output`].
    pub fn poll_bus(&mut self) -> Option<ToBus> {
        let bus = self.bus.as_mut()?;
        bus.flush_loose();
        if !bus.claims_dirty.is_empty() {
            let sessions: Vec<String> = bus.claims_dirty.drain().collect();
            for s in sessions {
                self.put_claim(&s);
            }
        }
        self.bus.as_mut()?.to_bus.pop_front()
    }

    /// Hands the core what the bridge reported (see [`FromBus`]).
    pub fn handle_bus(&mut self, msg: FromBus, now: Instant) {
        self.now = now;
        if !matches!(msg, FromBus::Message { .. }) {
            // What the stream delivered before this report goes out first.
            self.flush_stream_batch();
        }
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        match msg {
            FromBus::Connected {
                max_payload,
                last_seq,
            } => self.bus_connected(max_payload, last_seq, now),
            FromBus::Disconnected { reason } => bus.on_disconnected(&reason),
            FromBus::Message {
                stream_seq,
                pending,
                payload,
                own_id,
            } => self.bus_message(stream_seq, pending, payload, own_id),
            FromBus::ConsumerReset => bus.on_consumer_reset(),
            FromBus::Stalled { reason } => bus.on_stalled(&reason),
            FromBus::Answering => bus.on_answering(),
            FromBus::Acked { ticket, .. } => self.bus_acked(ticket),
            FromBus::PublishFailed { ticket, error } => self.bus_publish_failed(ticket, error),
            FromBus::Claim { key, value } => bus.on_claim(key, value),
            FromBus::Request { reply, payload } => self.bus_request(reply, payload),
            FromBus::Response { ticket, result } => self.bus_response(ticket, result),
        }
    }

    /// Connected to the engine ([`FromBus::Connected`], also after each reconnect): the
    /// outbox published, in order, then every local claim put again, and this relay's
    /// presence record.
    fn bus_connected(&mut self, max_payload: usize, last_seq: u64, now: Instant) {
        let bus = self.bus.as_mut().expect("clustered");
        if bus.ever_connected {
            bus.reconnects += 1;
        }
        bus.ever_connected = true;
        bus.max_payload = max_payload;
        bus.target = last_seq;
        bus.state = bus.up_state();
        log::info!(
            "cluster: connected (stream at {last_seq}, applied {}); {} Events in the outbox",
            bus.applied,
            bus.outbox_events
        );
        bus.stalled = false;
        // The outbox, in order, then every local claim again.
        bus.flush_outbox();
        let sessions: Vec<String> = self.claims.iter().map(|(s, _)| s.to_owned()).collect();
        let bus = self.bus.as_mut().expect("clustered");
        bus.claims_dirty.extend(sessions);
        bus.put_presence();
        if bus.refresh_at.is_none() {
            bus.refresh_at = Some(now + bus.config.claim_ttl / 3);
        }
    }
}
