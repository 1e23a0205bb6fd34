//! Cluster mode, the core's side: what to publish to the engine, what to admit from it,
//! the claims of other relays, and commands routed between relays. Sans-IO like the rest
//! of the core: it takes [`FromBus`] values and `now`, and leaves [`ToBus`] values for
//! the reactor to hand to the bridge thread ([`crate::bridge::Bridge`]).
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

use super::conn::Answer;
use super::{Core, Refusal};
use crate::cluster::{self, ClusterConfig, Degrade, FromBus, ToBus};
use crate::envelope::{Attr, Event, Scope};
use crate::ws::aep::{self, Ref};
use crate::ws::rfc6455;
use crate::{Code, ConnId};
use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

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

/// One stream message this relay publishes: its msg id ([`cluster::publish_id`], kept
/// through every retry of it, the outbox's included), its subject and its Events.
#[derive(Debug, Clone)]
struct Outgoing {
    id: String,
    subject: String,
    events: Vec<Event>,
}

impl Outgoing {
    /// The message's payload: the Events' bytes, unchanged, one per line (`\n` between
    /// them); one Event alone is its bytes as they are (no copy).
    fn payload(&self) -> Bytes {
        if let [one] = &self.events[..] {
            return one.bytes().clone();
        }
        let len = self
            .events
            .iter()
            .map(|e| e.bytes().len() + 1)
            .sum::<usize>()
            - 1;
        let mut b = Vec::with_capacity(len);
        for (i, e) in self.events.iter().enumerate() {
            if i > 0 {
                b.push(b'\n');
            }
            b.extend_from_slice(e.bytes());
        }
        Bytes::from(b)
    }
}

/// What a message takes besides its payload (subject, `Nats-Msg-Id` and the protocol's
/// own headers), kept free under the server's `max_payload`.
const MESSAGE_OVERHEAD: usize = 512;
/// The most payload one message carries even when the server allows more (1 MiB, the
/// server's default `max_payload`): an outbox message made before the first connection
/// (when the server's limit is not known yet) fits a default server.
const MAX_MESSAGE: usize = 1 << 20;

/// Splits one stream message into its Events (see [`Outgoing::payload`]): several, one
/// per line, or one Event alone, raw line breaks and all (an Event with a raw line break
/// always travels alone: its first line is then no Event). Each Event is a slice of the
/// message (a replay buffer copies what it keeps). A line that is no Event is skipped
/// with a warning (relays publish only validated Events).
fn split_message(seq: u64, payload: Bytes) -> Vec<Event> {
    let whole = |payload: Bytes| match Event::parse(payload) {
        Ok(ev) => vec![ev],
        Err(e) => {
            log::warn!(
                "cluster: stream message {seq} is not a valid Event ({}); skipped",
                e.detail
            );
            Vec::new()
        }
    };
    if memchr::memchr(b'\n', &payload).is_none() {
        return whole(payload);
    }
    let mut out = Vec::new();
    let mut start = 0;
    while start < payload.len() {
        let end = memchr::memchr(b'\n', &payload[start..]).map_or(payload.len(), |i| start + i);
        if !payload[start..end].iter().all(u8::is_ascii_whitespace) {
            match Event::parse(payload.slice(start..end)) {
                Ok(ev) => out.push(ev),
                Err(_) if out.is_empty() => return whole(payload),
                Err(e) => log::warn!(
                    "cluster: a line of stream message {seq} is not a valid Event ({}); skipped",
                    e.detail
                ),
            }
        }
        start = end + 1;
    }
    out
}

/// A WebSocket emitter to tell when its Event fails for good: its key and peer (the
/// same key may be another connection by then).
type Emitter = Option<(usize, std::net::SocketAddr)>;

/// Who waits on an Event held for the stream ([`Bus::loose`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// A WebSocket emitter (told if it fails for good), or no one.
    Ws(Emitter),
    /// A `POST` of the open [`Group`] ([`Bus::open_group`]).
    Post,
}

/// What a publish's ticket is for.
#[derive(Debug)]
enum Ticket {
    /// A message of the group of `POST`s with this serial.
    Post(u64, Outgoing),
    /// An outbox entry, by its serial.
    Outbox(u64),
    /// Published with no one waiting (WebSocket, JSONL, host ingest, a routed command),
    /// with the WebSocket emitter to tell when it fails for good (its key and peer).
    Loose(Outgoing, Emitter),
}

/// A `POST /events` waiting for the stream's acknowledgements: its connection, its
/// `Connection: close`, and how many Events it carried.
#[derive(Debug)]
struct Post {
    key: usize,
    close: bool,
    accepted: usize,
}

/// The `POST`s read in one reactor turn, published together: their Events that share a
/// subject travel as one stream message, as a single relay fans them out as one unit
/// (the engine's cost is per message, and so is every relay's fan-out write). Each
/// `POST` is answered once every message of its group is.
#[derive(Debug, Default)]
struct Group {
    posts: Vec<Post>,
    /// Messages not answered yet (none before the group is published).
    remaining: usize,
    /// Messages whose publish failed, with their tickets (in the bodies' order once
    /// sorted: acks come in any order).
    failed: Vec<(u64, Outgoing)>,
}

/// A remote claim record: one relay's claimants of one session.
#[derive(Debug, Clone)]
struct RemoteClaim {
    relay: String,
    session: String,
    /// Roster entries (AEP-0003 §4.1), one per claimant there.
    entries: Vec<Value>,
    /// Each claimant's declared `control.accepts`.
    accepts: Vec<Vec<String>>,
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
    requests: HashMap<u64, (usize, String)>,
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

    /// The subject of `ev`, from its scanned attributes (never the other way round:
    /// relays route on the Event, not on the subject).
    fn subject_of(&self, ev: &Event) -> String {
        let agent = ev.attr(Attr::Agent).unwrap_or_default();
        let prefix = &self.config.prefix;
        match (ev.scope(), ev.session()) {
            (Scope::Agent, _) | (_, None) => cluster::agent_subject(prefix, agent),
            (_, Some(s)) => cluster::event_subject(prefix, agent, s),
        }
    }

    /// The stream messages of one ingest unit, each with a publish id of its own: the
    /// Events that share a subject travel together, in their order, as few messages as
    /// fit under the server's `max_payload` (the engine's cost is per message, not per
    /// byte). Messages come in the order their first Event came, so each subject's (each
    /// session's) Events keep their order in the stream; an Event with a raw line break
    /// travels alone, and nothing of its subject joins a message before it.
    fn outgoing(&mut self, events: Vec<Event>) -> Vec<Outgoing> {
        let room = self
            .max_payload
            .min(MAX_MESSAGE)
            .saturating_sub(MESSAGE_OVERHEAD);
        let mut out: Vec<Outgoing> = Vec::new();
        // Per subject: the message its next Event may join, and that message's size.
        let mut open: HashMap<String, (usize, usize)> = HashMap::new();
        for ev in events {
            let subject = self.subject_of(&ev);
            let len = ev.bytes().len();
            let alone = memchr::memchr(b'\n', ev.bytes()).is_some();
            if !alone {
                if let Some((i, size)) = open.get_mut(&subject) {
                    if *size + 1 + len <= room {
                        *size += 1 + len;
                        out[*i].events.push(ev);
                        continue;
                    }
                }
            }
            let serial = self.serial();
            out.push(Outgoing {
                id: cluster::publish_id(&self.config.relay_id, self.boot, serial),
                subject: subject.clone(),
                events: vec![ev],
            });
            if alone {
                open.remove(&subject);
            } else {
                open.insert(subject, (out.len() - 1, len));
            }
        }
        out
    }

    /// Publishes the Events held since the last call ([`Bus::loose`]) as few stream
    /// messages as fit: one ingest unit per run of one WebSocket emitter's Events, and
    /// one for each run of `POST`s of the open group (a group always has an Event:
    /// [`Core::submit`] answers an empty body at once).
    fn flush_loose(&mut self) {
        let group = self.open_group.take();
        if self.loose.is_empty() {
            return;
        }
        let loose = std::mem::take(&mut self.loose);
        let mut run: Vec<Event> = Vec::new();
        let mut held = loose[0].1;
        let mut runs = Vec::new();
        for (ev, h) in loose {
            if h != held {
                runs.push((std::mem::take(&mut run), held));
                held = h;
            }
            run.push(ev);
        }
        runs.push((run, held));
        for (events, held) in runs {
            let msgs = self.outgoing(events);
            match (held, group) {
                (Held::Post, Some(g)) => {
                    if let Some(group) = self.posts.get_mut(&g) {
                        group.remaining += msgs.len();
                    }
                    for o in msgs {
                        self.send_publish(o, |o| Ticket::Post(g, o));
                    }
                }
                (held, _) => {
                    // A `POST`'s Events always have an open group; no one else waits.
                    let emitter = match held {
                        Held::Ws(e) => e,
                        Held::Post => None,
                    };
                    for o in msgs {
                        self.send_publish(o, |o| Ticket::Loose(o, emitter));
                    }
                }
            }
        }
    }

    /// Keeps `msgs` in the durable outbox, if there is one; on a failure, none of them.
    fn log_keep(&mut self, msgs: &[Outgoing]) -> Result<(), String> {
        let Some(log) = self.log.as_mut() else {
            return Ok(());
        };
        for (i, o) in msgs.iter().enumerate() {
            if let Err(e) = log.keep(&o.id, &o.subject, &o.payload()) {
                for o in &msgs[..i] {
                    log.done(&o.id);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// The message `id` needs no durable place any more.
    fn log_done(&mut self, id: &str) {
        if let Some(log) = self.log.as_mut() {
            log.done(id);
        }
    }

    /// Publishes `o` under a fresh ticket made of it by `ticket`, behind the WebSocket
    /// Events held so far (the stream keeps the order they came in).
    fn publish_with(&mut self, o: Outgoing, ticket: impl FnOnce(Outgoing) -> Ticket) {
        self.flush_loose();
        self.send_publish(o, ticket);
    }

    fn send_publish(&mut self, o: Outgoing, ticket: impl FnOnce(Outgoing) -> Ticket) {
        let n = self.serial();
        self.publish(&o, n);
        self.tickets.insert(n, ticket(o));
    }

    /// The publish of `o` (again, on a retry: the same msg id).
    fn publish(&mut self, o: &Outgoing, ticket: u64) {
        self.to_bus.push_back(ToBus::Publish {
            ticket,
            subject: o.subject.clone(),
            msg_id: o.id.clone(),
            payload: o.payload(),
        });
    }

    fn connected(&self) -> bool {
        self.state != ClusterState::Degraded
    }

    /// Publishes every outbox Event not in flight, in order: on each connection, on
    /// each claim refresh while connected (an ack that timed out while the connection
    /// stayed up must not leave an Event out of the stream), and when an Event joins it
    /// while connected.
    fn flush_outbox(&mut self) {
        if self.state == ClusterState::Degraded && !self.stalled {
            return;
        }
        let waiting: Vec<u64> = self
            .outbox
            .iter()
            .filter(|(_, (_, in_flight))| !in_flight)
            .map(|(k, _)| *k)
            .collect();
        for serial in waiting {
            let t = self.ticket(Ticket::Outbox(serial));
            let (o, in_flight) = self.outbox.get_mut(&serial).expect("listed");
            *in_flight = true;
            let o = o.clone();
            self.publish(&o, t);
        }
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

    /// This relay's presence record, put in the claims bucket under a three-part key
    /// (claim keys have two), so relays see each other without a protocol of their own.
    fn put_presence(&mut self) {
        let mut v = self.health();
        v["presence"] = true.into();
        let key = cluster::kv_key(&["relay", &self.config.relay_id, "presence"]);
        let value = Bytes::from(serde_json::to_vec(&v).unwrap_or_default());
        self.to_bus.push_back(ToBus::PutClaim { key, value });
    }

    /// Every relay of the cluster as this one knows it, itself first (`/status`).
    pub(super) fn relays(&self) -> Vec<Value> {
        let mut own = self.health();
        own["self"] = true.into();
        std::iter::once(own)
            .chain(self.relays.values().cloned())
            .collect()
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

    /// Remote claimants of `session` (relay, accepts of each).
    fn remote_claimants(&self, session: &str) -> Vec<(&str, &[String])> {
        let mut v: Vec<(&str, &[String])> = self
            .remote
            .values()
            .filter(|r| r.session == session)
            .flat_map(|r| r.accepts.iter().map(move |a| (r.relay.as_str(), &a[..])))
            .collect();
        v.sort_unstable();
        v
    }
}

/// A claim record's value: `{"relay","session","entries","accepts"}`.
fn claim_record(relay: &str, session: &str, entries: &[Value], accepts: &[Vec<String>]) -> Bytes {
    let v = json!({ "relay": relay, "session": session, "entries": entries, "accepts": accepts });
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

fn parse_claim(b: &[u8]) -> Option<RemoteClaim> {
    let v: Value = serde_json::from_slice(b).ok()?;
    let accepts = v
        .get("accepts")?
        .as_array()?
        .iter()
        .map(|a| {
            a.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|t| t.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect();
    Some(RemoteClaim {
        relay: v.get("relay")?.as_str()?.to_owned(),
        session: v.get("session")?.as_str()?.to_owned(),
        entries: v.get("entries")?.as_array()?.clone(),
        accepts,
    })
}

/// The answer a relay gives to a routed command: `{"ok":true}` or `{"code","detail"}`.
fn route_answer(r: Result<(), (Code, String)>) -> Bytes {
    let v = match r {
        Ok(()) => json!({ "ok": true }),
        Err((code, detail)) => json!({ "code": code.as_str(), "detail": detail }),
    };
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

/// Who hears how a cluster-mode ingest went.
pub(super) enum Waiter {
    /// A `POST /events` on this connection (and its `Connection: close`): answered once
    /// the stream acknowledged every Event.
    Post(usize, bool),
    /// A WebSocket emitter on this connection: told with an `error` frame if an Event
    /// is neither stored by the stream nor kept locally.
    Ws(usize),
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

    /// Gives a clustered relay a durable outbox, with the messages a previous run left in
    /// it: `(publish id, subject, payload)`, in order. Those are published with their own
    /// ids once connected (the stream collapses one that got in before), are not
    /// delivered here again when the stream brings them back (their Events are in the
    /// history, so in the replay store already), and once they are all in the stream the
    /// replay store is rebuilt in the stream's order, as every other relay has it. A
    /// no-op for a single relay.
    pub fn set_outbox_log(
        &mut self,
        log: Box<dyn super::OutboxLog>,
        kept: Vec<(String, String, Bytes)>,
    ) {
        let (buffer, sessions) = (self.config.buffer_per_session, self.config.max_sessions);
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        bus.log = Some(log);
        if kept.is_empty() {
            return;
        }
        // Everything the stream delivers from its start this run, to rebuild from.
        bus.provisional = Some((super::Store::new(buffer, sessions), Vec::new()));
        let mut events = 0;
        for (id, subject, payload) in kept {
            let evs = split_message(0, payload);
            events += evs.len();
            if !evs.is_empty() {
                self.insert_outbox(Outgoing {
                    id,
                    subject,
                    events: evs,
                });
            }
        }
        log::info!("cluster: {events} Events of the last run's outbox, to publish once connected");
    }

    /// What a stop leaves of the outbox, for the log (`None`: nothing).
    pub(super) fn outbox_left(&self) -> Option<String> {
        let bus = self.bus.as_ref()?;
        let n = bus.outbox_len();
        (n > 0).then(|| match &bus.log {
            Some(log) => format!(
                "{n} Events of the cluster outbox did not reach the stream in time; they stay in {} and are published at the next start",
                log.place()
            ),
            None => format!(
                "{n} Events of the cluster outbox did not reach the stream in time and are lost to the cluster (no --history: the outbox is in memory only)"
            ),
        })
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
    pub(super) fn catching_up(&self) -> Option<&'static str> {
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
            } => {
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
            FromBus::Disconnected { reason } => {
                if bus.state != ClusterState::Degraded {
                    log::warn!("cluster: engine unreachable ({reason}); degraded");
                }
                bus.state = ClusterState::Degraded;
                bus.stalled = false;
                // Remote claims cannot be reached meanwhile.
                bus.remote.clear();
                bus.relays.clear();
            }
            FromBus::Message {
                stream_seq,
                pending,
                payload,
                own_id,
            } => {
                // Behind by what the consumer says is pending, or by what the stream held
                // at the connection, whichever is more; nothing once caught up.
                bus.target = bus.target.max(stream_seq);
                let behind = bus.target.saturating_sub(stream_seq);
                bus.lag = if bus.state == ClusterState::CatchingUp {
                    behind.max(pending)
                } else {
                    behind
                };
                if stream_seq <= bus.applied {
                    return; // once per stream sequence
                }
                bus.applied = stream_seq;
                if bus.state == ClusterState::CatchingUp
                    && (bus.applied >= bus.target || pending == 0)
                {
                    bus.state = ClusterState::Connected;
                    log::info!("cluster: caught up at stream sequence {stream_seq}");
                }
                self.admit_from_stream(stream_seq, payload, own_id);
                self.settle_provisional();
            }
            FromBus::ConsumerReset => bus.consumer_resets += 1,
            FromBus::Stalled { reason } => {
                if bus.state != ClusterState::Degraded {
                    log::warn!("cluster: the engine stalled ({reason}); degraded until it answers");
                    bus.state = ClusterState::Degraded;
                    bus.stalled = true;
                }
            }
            FromBus::Answering => {
                if bus.stalled {
                    bus.stalled = false;
                    bus.state = bus.up_state();
                    log::info!("cluster: the engine answers again");
                    bus.flush_outbox();
                }
            }
            FromBus::Acked { ticket, .. } => {
                self.acked(ticket, None);
                self.settle_provisional();
            }
            FromBus::PublishFailed { ticket, error } => {
                bus.publish_errors += 1;
                self.acked(ticket, Some(error));
            }
            FromBus::Claim { key, value } => {
                let own = bus.config.relay_id.clone();
                let presence = value
                    .as_deref()
                    .and_then(|b| serde_json::from_slice::<Value>(b).ok())
                    .filter(|v| v.get("presence").and_then(Value::as_bool) == Some(true));
                if let Some(p) = presence {
                    if p.get("relay").and_then(Value::as_str) != Some(own.as_str()) {
                        bus.relays.insert(key, p);
                    }
                    return;
                }
                match value.as_deref().and_then(parse_claim) {
                    Some(c) if c.relay != own => {
                        bus.remote.insert(key, c);
                    }
                    Some(_) => {}
                    None => {
                        bus.remote.remove(&key);
                        // A presence record gone: the relay stopped refreshing it.
                        bus.relays.remove(&key);
                    }
                }
            }
            FromBus::Request { reply, payload } => {
                let answer = self.routed_command(payload);
                if let Some(bus) = self.bus.as_mut() {
                    bus.to_bus.push_back(ToBus::Reply {
                        reply,
                        payload: route_answer(answer),
                    });
                }
            }
            FromBus::Response { ticket, result } => {
                let Some((key, id)) = bus.requests.remove(&ticket) else {
                    return;
                };
                let refusal = match result {
                    Ok(body) => {
                        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        if v.get("ok").and_then(Value::as_bool) == Some(true) {
                            None
                        } else {
                            let code = match v.get("code").and_then(Value::as_str) {
                                Some("ambiguous") => Code::Ambiguous,
                                Some("unsupported") => Code::Unsupported,
                                _ => Code::NoRoute,
                            };
                            let d = v
                                .get("detail")
                                .and_then(Value::as_str)
                                .unwrap_or("the claimant's relay refused the command")
                                .to_owned();
                            Some((code, d))
                        }
                    }
                    Err(e) => Some((
                        Code::NoRoute,
                        format!(
                            "the claimant's relay did not take the command ({e}) (AEP-0004 §4.2)"
                        ),
                    )),
                };
                if let Some((code, d)) = refusal {
                    self.ws_refuse(key, code, Ref::Cause(&id), &d);
                }
            }
        }
    }

    /// The claim refresh, when due (from [`Core::handle_timeout`]).
    pub(super) fn bus_timeout(&mut self, now: Instant) {
        // A rebuild deferred behind a replay in progress.
        self.settle_provisional();
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        if bus.refresh_at.is_some_and(|t| t <= now) {
            bus.refresh_at = Some(now + bus.config.claim_ttl / 3);
            bus.flush_outbox();
            if bus.connected() {
                bus.put_presence();
                let sessions: Vec<String> = self.claims.iter().map(|(s, _)| s.to_owned()).collect();
                self.bus
                    .as_mut()
                    .expect("clustered")
                    .claims_dirty
                    .extend(sessions);
            }
        }
    }

    /// The next cluster deadline (the claim refresh).
    pub(super) fn bus_deadline(&self) -> Option<Instant> {
        self.bus.as_ref()?.refresh_at
    }

    /// Marks `session`'s local claim record for a put (or a delete once unclaimed).
    pub(super) fn claim_changed(&mut self, session: &str) {
        if let Some(bus) = self.bus.as_mut() {
            bus.claims_dirty.insert(session.to_owned());
        }
    }

    fn put_claim(&mut self, session: &str) {
        let mut entries = Vec::new();
        let mut accepts = Vec::new();
        for c in self.claims.claimants(session) {
            if let Some(d) = self.ws_state(c.0).and_then(|w| w.hello.as_deref()) {
                entries.push(aep::roster_entry(session, d));
                accepts.push(d.accepts.clone().unwrap_or_default());
            }
        }
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        let key = cluster::kv_key(&[&bus.config.relay_id, session]);
        if entries.is_empty() {
            bus.to_bus.push_back(ToBus::DeleteClaim { key });
        } else {
            let value = claim_record(&bus.config.relay_id, session, &entries, &accepts);
            bus.to_bus.push_back(ToBus::PutClaim { key, value });
        }
    }

    /// The cluster's relays for `/status` (`None` for a single relay).
    pub(super) fn cluster_status(&self) -> Option<Value> {
        let bus = self.bus.as_ref()?;
        let mut v = bus.health();
        v["relays"] = bus.relays().into();
        Some(v)
    }

    /// Roster entries of the claimants on other relays (AEP-0003 §4.1), by session.
    pub(super) fn remote_roster(&self) -> Vec<(String, Value)> {
        let Some(bus) = self.bus.as_ref() else {
            return Vec::new();
        };
        let mut v: Vec<(String, Value)> = bus
            .remote
            .values()
            .flat_map(|r| r.entries.iter().map(|e| (r.session.clone(), e.clone())))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Cluster-mode ingest of validated Events. With `waiter` (a `POST`'s connection
    /// and its `Connection: close`), the answer goes to it once the stream acknowledged
    /// them all.
    ///
    /// # Errors
    /// [`Refusal::EventTooLarge`] over the engine's `max_payload`;
    /// [`Refusal::ClusterUnavailable`] when degraded and refusing (or the outbox full);
    /// [`Refusal::HistoryUnavailable`] when a local admission cannot be kept.
    pub(super) fn submit(
        &mut self,
        events: Vec<Event>,
        waiter: Waiter,
    ) -> Result<Submitted, Refusal> {
        let Some(bus) = self.bus.as_mut() else {
            return Err(Refusal::ClusterUnavailable {
                detail: "not clustered".into(),
            });
        };
        // Headers and subject take some room of their own. Before the first connection
        // the server's limit is unknown: its default (1 MiB), so that nothing the
        // outbox takes meanwhile is too big to publish later.
        let limit = if bus.ever_connected {
            bus.max_payload
        } else {
            MAX_MESSAGE
        };
        let max = limit.saturating_sub(MESSAGE_OVERHEAD);
        if let Some((i, ev)) = events
            .iter()
            .enumerate()
            .find(|(_, e)| e.bytes().len() > max)
        {
            return Err(Refusal::EventTooLarge {
                line: i + 1,
                size: ev.bytes().len(),
                max,
            });
        }
        if !bus.connected() {
            return self.degraded(events).map(Submitted::Now);
        }
        let n = events.len();
        if n == 0 {
            return Ok(Submitted::Now(0));
        }
        let emitter = match waiter {
            Waiter::Ws(key) => self.conns.get(key).map(|c| (key, c.peer)),
            _ => None,
        };
        let bus = self.bus.as_mut().expect("clustered");
        match waiter {
            Waiter::Ws(_) => {
                bus.loose
                    .extend(events.into_iter().map(|ev| (ev, Held::Ws(emitter))));
                Ok(Submitted::Now(n))
            }
            Waiter::Post(key, close) => {
                // Joins this turn's group: published with the other `POST`s read in
                // this turn when the reactor next takes what is for the bridge.
                let serial = match bus.open_group {
                    Some(g) => g,
                    None => {
                        let g = bus.serial();
                        bus.open_group = Some(g);
                        g
                    }
                };
                bus.posts.entry(serial).or_default().posts.push(Post {
                    key,
                    close,
                    accepted: n,
                });
                bus.loose
                    .extend(events.into_iter().map(|ev| (ev, Held::Post)));
                if let Some(conn) = self.conns.get_mut(key) {
                    conn.awaiting = Some(serial);
                    let cors = conn.cors.clone();
                    conn.answers.push_back(Answer::Waiting(cors));
                }
                // No next request is read until this one is answered.
                self.set_interest(key, Some(false), None);
                Ok(Submitted::Waiting)
            }
            Waiter::None => {
                let msgs = bus.outgoing(events);
                for o in msgs {
                    bus.publish_with(o, |o| Ticket::Loose(o, emitter));
                }
                Ok(Submitted::Now(n))
            }
        }
    }

    /// Ingest while the engine is unreachable (see the module docs).
    fn degraded(&mut self, events: Vec<Event>) -> Result<usize, Refusal> {
        let bus = self.bus.as_mut().expect("clustered");
        let msgs = bus.outgoing(events);
        self.degraded_msgs(msgs)
    }

    /// Messages that did not reach the stream, served locally and kept in the outbox
    /// with their msg ids (a retry of a publish that did get in is then collapsed by the
    /// stream, and not fanned out here again when it comes back).
    fn degraded_msgs(&mut self, msgs: Vec<Outgoing>) -> Result<usize, Refusal> {
        let bus = self.bus.as_mut().expect("clustered");
        let n: usize = msgs.iter().map(|o| o.events.len()).sum();
        if bus.config.degrade == Degrade::Refuse {
            return Err(Refusal::ClusterUnavailable {
                detail: "the engine is unreachable and this relay refuses local ingest (--cluster-degrade refuse)".into(),
            });
        }
        if bus.outbox_events + n > bus.config.outbox {
            return Err(Refusal::ClusterUnavailable {
                detail: format!(
                    "the engine is unreachable and the outbox holds {} Events already (its bound)",
                    bus.outbox_events
                ),
            });
        }
        let events: Vec<Event> = msgs.iter().flat_map(|o| o.events.iter().cloned()).collect();
        // On disk before it is answered, then in the history.
        bus.log_keep(&msgs)
            .map_err(|detail| Refusal::HistoryUnavailable { detail })?;
        if let Err(r) = self.persist(&events) {
            let bus = self.bus.as_mut().expect("clustered");
            for o in &msgs {
                bus.log_done(&o.id);
            }
            return Err(r);
        }
        for o in msgs {
            self.insert_outbox(o);
        }
        self.size_unit(&events);
        self.publish_unit(events);
        Ok(n)
    }

    /// Keeps `ev`, delivered here already, for the stream: published on (re)connect, and
    /// not delivered here again when the stream brings that publish back. A no-op for a
    /// single relay.
    pub(super) fn keep_in_outbox(&mut self, ev: &Event) {
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        let o = bus.outgoing(vec![ev.clone()]).pop().expect("one");
        self.keep_msg_in_outbox(o);
    }

    /// [`Core::keep_in_outbox`] for a message with its msg id.
    fn keep_msg_in_outbox(&mut self, o: Outgoing) {
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        if let Err(e) = bus.log_keep(std::slice::from_ref(&o)) {
            log::warn!("cluster: outbox message {} not kept on disk: {e}", o.id);
        }
        self.insert_outbox(o);
    }

    /// Puts `o`, kept on disk already (or with no durable place), in the outbox.
    fn insert_outbox(&mut self, o: Outgoing) {
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        if bus.provisional.is_none() {
            // The store from here on holds Events out of stream order (see `provisional`).
            bus.provisional = Some((self.store.clone(), Vec::new()));
        }
        let serial = bus.serial();
        bus.delivered.insert(o.id.clone(), None);
        bus.outbox_events += o.events.len();
        bus.outbox.insert(serial, (o, false));
        if bus.state != ClusterState::Degraded {
            // A publish that failed while connected: straight back to the engine.
            bus.flush_outbox();
        }
    }

    /// A publish answered: `error` `None` when stored.
    fn acked(&mut self, ticket: u64, error: Option<String>) {
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        let Some(t) = bus.tickets.remove(&ticket) else {
            return;
        };
        match &error {
            None if bus.stalled => {
                bus.stalled = false;
                bus.state = bus.up_state();
                log::info!("cluster: the engine acknowledges again");
                bus.flush_outbox();
            }
            Some(e) if bus.state != ClusterState::Degraded && e != cluster::NOT_CONNECTED => {
                log::warn!(
                    "cluster: the engine does not acknowledge ({e}); degraded until it does"
                );
                bus.state = ClusterState::Degraded;
                bus.stalled = true;
            }
            _ => {}
        }
        match t {
            Ticket::Outbox(serial) => match error {
                None => {
                    if let Some((o, _)) = bus.outbox.remove(&serial) {
                        bus.outbox_events -= o.events.len();
                        bus.log_done(&o.id);
                    }
                    // A shutdown may wait for the outbox.
                    self.check_drained();
                }
                Some(e) => {
                    log::debug!("cluster: outbox publish failed ({e}); kept, retried");
                    if let Some((_, in_flight)) = bus.outbox.get_mut(&serial) {
                        *in_flight = false;
                    }
                }
            },
            Ticket::Loose(o, emitter) => {
                if let Some(e) = error {
                    log::warn!(
                        "cluster: publish {} ({} Events) failed ({e}); kept locally",
                        o.id,
                        o.events.len()
                    );
                    match bus.delivered.remove(&o.id) {
                        // A command its claimant already has: the observers here get
                        // it now, the stream on reconnect.
                        Some(Some(claimant)) => {
                            if let Err(r) = self.persist(&o.events) {
                                log::warn!("cluster: command not kept in the history: {r}");
                            }
                            let ev = o.events[0].clone();
                            self.keep_msg_in_outbox(o);
                            self.publish_except(ev, claimant);
                        }
                        _ => {
                            let events = o.events.clone();
                            if let Err(r) = self.degraded_msgs(vec![o]) {
                                // The emitter, if still the same connection, hears it.
                                for ev in events {
                                    log::warn!("cluster: Event {:?} not accepted: {r}", ev.id());
                                    if let Some((key, peer)) = emitter {
                                        if self.conns.get(key).is_some_and(|c| c.peer == peer) {
                                            let d = r.to_string();
                                            self.ws_refuse(key, r.code(), Ref::Id(ev.id()), &d);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            Ticket::Post(serial, o) => {
                let Some(group) = bus.posts.get_mut(&serial) else {
                    return;
                };
                group.remaining -= 1;
                if error.is_some() {
                    group.failed.push((ticket, o));
                }
                if group.remaining > 0 {
                    return;
                }
                let group = bus.posts.remove(&serial).expect("present");
                self.answer_posts(serial, group, error);
            }
        }
    }

    /// Answers the `POST`s of a group whose every publish was answered: each with its
    /// own count, or all with the one refusal when what failed could not be kept
    /// locally either (the group's Events share stream messages, so they share that
    /// fate). Each connection then sends its answers in request order (those of the
    /// requests read behind its `POST`s included), and reads on; a connection gone
    /// meanwhile is not answered.
    fn answer_posts(&mut self, serial: u64, group: Group, error: Option<String>) {
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
        let mut keys: Vec<usize> = Vec::new();
        for Post {
            key,
            close,
            accepted,
        } in posts
        {
            let Some(conn) = self.conns.get(key).filter(|c| c.awaiting == Some(serial)) else {
                continue; // the connection is gone
            };
            // A peer that half-closed meanwhile gets its answer, then the close.
            let close = close || conn.peer_eof;
            let outcome = outcome.clone().map(|()| accepted);
            if let Ok(n) = outcome {
                self.metrics.ingested_http += n as u64;
            }
            let resp = self.post_answer(key, outcome, close);
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            if let Some(t) = conn.post_since.take() {
                self.metrics
                    .post_duration
                    .observe(self.now.saturating_duration_since(t));
            }
            // This `POST`'s place among the connection's answers.
            if let Some(slot) = conn
                .answers
                .iter_mut()
                .find(|a| matches!(a, Answer::Waiting(_)))
            {
                let Answer::Waiting(cors) = slot else {
                    unreachable!("matched")
                };
                let resp = match cors {
                    Some(origin) => {
                        crate::http::insert_headers(&resp, &crate::http::cors_lines(origin))
                    }
                    None => resp,
                };
                *slot = Answer::Ready(resp, close);
            }
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        for key in keys {
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            conn.awaiting = None;
            conn.since = self.now;
            let answers = std::mem::take(&mut conn.answers);
            self.end_unit();
            for a in answers {
                match a {
                    Answer::Ready(bytes, close) => {
                        self.send_answer(key, bytes, close);
                        if close {
                            break;
                        }
                    }
                    Answer::Waiting(_) => {
                        debug_assert!(false, "a POST of another group on one connection");
                    }
                }
            }
            // The requests read behind them, then the socket.
            self.process(key);
            if self
                .conns
                .get(key)
                .is_some_and(|c| !c.read_paused && c.awaiting.is_none() && !c.close_after_flush)
            {
                self.set_interest(key, Some(true), None);
            }
            self.rearm(key);
        }
    }

    /// Whether the next request read on `key`, which waits for the open group of
    /// `POST`s, may join that group: only a pipelined `POST /events`, read in the same
    /// turn (its answer then waits in order behind the others, [`Conn::answers`](super::conn::Conn::answers)).
    pub(super) fn may_join_group(&self, key: usize) -> bool {
        let (Some(bus), Some(conn)) = (self.bus.as_ref(), self.conns.get(key)) else {
            return false;
        };
        if bus.open_group.is_none() || conn.awaiting != bus.open_group {
            return false;
        }
        matches!(
            crate::http::parse_head(&conn.rbuf),
            Ok(Some((head, _))) if head.method == "POST" && head.path == "/events"
        )
    }

    /// A `POST` that waited too long for the stream (the bridge answers every publish
    /// within its ack timeout; this only guards against a bridge that cannot).
    pub(super) fn post_expired(&mut self, key: usize) {
        let Some(serial) = self.conns.get(key).and_then(|c| c.awaiting) else {
            return;
        };
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

    /// One stream message: admitted and fanned out (once per stream sequence; the caller
    /// checked the sequence), exactly as a single relay admits an ingested Event: buffer
    /// admission dedupes on `(source, id)`, live fan-out forwards every Event as received,
    /// redeliveries included (AEP-0003 §5). Only this relay's own message whose Events
    /// were delivered here already (`own_id` in `Bus::delivered`: the outbox, a command
    /// given to its claimant) is not fanned out again to them.
    fn admit_from_stream(&mut self, seq: u64, payload: Bytes, own_id: Option<String>) {
        let events = split_message(seq, payload);
        let bus = self.bus.as_mut().expect("clustered");
        if let Some((_, log)) = bus.provisional.as_mut() {
            log.extend(events.iter().cloned());
            // Bounded: past what the replay buffers can hold twice over, the rebuild is
            // given up (the store then keeps its local order until a restart).
            let cap = self
                .config
                .buffer_per_session
                .saturating_mul(self.config.max_sessions);
            if log.len() > cap.saturating_mul(2).max(1 << 16) {
                log::warn!("cluster: the outbox has not drained in {} stream messages; the replay store keeps this relay's order after the outage", log.len());
                bus.provisional = None;
            }
        }
        let delivered = match own_id {
            Some(id) if !bus.delivered.is_empty() => bus.delivered.remove(&id),
            _ => None,
        };
        match delivered {
            // Delivered here already (an outbox message): nothing more to do.
            Some(None) => {}
            None => bus.batch.extend(events),
            // A command given to its claimant directly: everyone else gets it now.
            Some(Some(c)) => {
                self.flush_stream_batch();
                if let Err(r) = self.persist(&events) {
                    log::warn!("cluster: stream message {seq} not kept in the history: {r}");
                }
                for ev in events {
                    self.publish_except(ev, c);
                }
            }
        }
    }

    /// Publishes the stream messages admitted since the last output as one ingest unit:
    /// kept in the history, then fanned out (from [`Core::poll_output`], and before any
    /// other report of the bridge is handled).
    pub(super) fn flush_stream_batch(&mut self) {
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        if bus.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut bus.batch);
        if let Err(r) = self.persist(&batch) {
            // The stream keeps them; this relay's history misses them.
            log::warn!(
                "cluster: {} stream messages not kept in the history: {r}",
                batch.len()
            );
        }
        self.size_unit(&batch);
        self.publish_unit(batch.iter().cloned());
        if let Some(bus) = self.bus.as_mut() {
            // The room stays for the next batch.
            let mut batch = batch;
            batch.clear();
            bus.batch = batch;
        }
        self.settle_provisional();
    }

    /// Rebuilds the replay store in stream order once an outage's local admissions are
    /// all back through the stream (see `Bus::provisional`), when no replay or paused
    /// publication holds a position in it.
    pub(super) fn settle_provisional(&mut self) {
        let Some(bus) = self.bus.as_ref() else {
            return;
        };
        let healed = bus.provisional.is_some()
            && bus.batch.is_empty()
            && bus.connected()
            && bus.outbox.is_empty()
            && !bus.delivered.values().any(Option::is_none);
        if !healed
            || !self.publishing.is_empty()
            || self.conns.iter().any(|(_, c)| !c.replay.is_empty())
        {
            return;
        }
        let bus = self.bus.as_mut().expect("clustered");
        let (mut store, log) = bus.provisional.take().expect("checked");
        for ev in &log {
            store.admit(ev);
        }
        log::info!(
            "cluster: replay store rebuilt in stream order after an outage ({} stream messages since it began)",
            log.len()
        );
        self.store = store;
    }

    /// A command for `session` (AEP-0004 §4.2) in cluster mode, from WebSocket `key`:
    /// routed over local and remote claimants. `true` when handled here (delivered,
    /// forwarded or refused); `false` leaves it to the single-relay path (exactly one
    /// local claimant and no remote one, while degraded).
    pub(super) fn cluster_command(&mut self, key: usize, ev: Event) -> Option<Event> {
        let Some(bus) = self.bus.as_ref() else {
            return Some(ev);
        };
        let session = ev.session().unwrap_or_default().to_owned();
        let remote: Vec<(String, bool)> = bus
            .remote_claimants(&session)
            .into_iter()
            .map(|(r, a)| (r.to_owned(), a.iter().any(|t| t == ev.event_type())))
            .collect();
        let local = self.claims.claimants(&session).len();
        if remote.is_empty() && (local != 1 || !bus.connected()) {
            return Some(ev); // no-route, ambiguous, or local delivery: as a single relay
        }
        if local + remote.len() > 1 {
            let d = format!(
                "session {session:?} has {} claimants across the cluster; a command needs exactly one (AEP-0004 §4.5)",
                local + remote.len()
            );
            self.ws_refuse(key, Code::Ambiguous, Ref::Cause(ev.id()), &d);
            return None;
        }
        if local == 1 {
            // The one claimant is here: deliver, then publish to the stream.
            let id = ev.id().to_owned();
            if let Err((code, d)) = self.deliver_command(ev) {
                self.ws_refuse(key, code, Ref::Cause(&id), &d);
            }
            return None;
        }
        let (relay, accepts) = remote.into_iter().next().expect("one");
        if !accepts {
            let d = format!(
                "the claimant of session {session:?} does not accept {} (AEP-0004 §4.2)",
                ev.event_type()
            );
            self.ws_refuse(key, Code::Unsupported, Ref::Cause(ev.id()), &d);
            return None;
        }
        let bus = self.bus.as_mut().expect("clustered");
        let ticket = bus.serial();
        bus.requests.insert(ticket, (key, ev.id().to_owned()));
        bus.to_bus.push_back(ToBus::Request {
            ticket,
            relay,
            payload: ev.bytes().clone(),
        });
        None
    }

    /// A command another relay forwarded: checked again here, then delivered.
    fn routed_command(&mut self, payload: Bytes) -> Result<(), (Code, String)> {
        let ev = Event::parse(payload).map_err(|e| (Code::InvalidEvent, e.detail))?;
        if !ev.is_command() {
            return Err((Code::InvalidEvent, "not a command".into()));
        }
        self.deliver_command(ev)
    }

    /// Delivers a command to its one local claimant byte-identically, then publishes it
    /// to the stream for history and observers (the claimant is skipped when it comes
    /// back).
    fn deliver_command(&mut self, ev: Event) -> Result<(), (Code, String)> {
        let target = self.command_target(&ev)?;
        self.end_unit();
        self.conns[target.0].send(rfc6455::text(ev.bytes()));
        self.mark_dirty(target.0);
        self.metrics.ingested_ws += 1;

        let bus = self.bus.as_mut().expect("clustered");
        let o = bus.outgoing(vec![ev]).pop().expect("one");
        bus.delivered.insert(o.id.clone(), Some(target));
        bus.publish_with(o, |o| Ticket::Loose(o, None));
        Ok(())
    }
}

/// How long a `POST` may wait for the stream before the core gives up on the bridge.
pub(super) fn post_deadline(config: &ClusterConfig) -> Duration {
    config.ack_timeout * 2 + Duration::from_secs(1)
}
