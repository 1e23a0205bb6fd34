//! What this relay publishes to the stream: the messages ([`Outgoing`]) its Events travel
//! in, cluster-mode ingest ([`Core::submit`]), and what each acknowledgement or failure
//! of a publish settles ([`Ticket`]).

use super::{Bus, ClusterState, Submitted, Waiter};
use crate::cluster::{self, ToBus};
use crate::core::conn::Answer;
use crate::core::Core;
use crate::ids::ConnId;
use crate::refusal::Refusal;
use crate::wire::envelope::{Attr, Event, Scope};
use crate::wire::ws::aep::Ref;
use bytes::Bytes;
use std::collections::HashMap;

/// A `POST /events` waiting for the stream's acknowledgements: its connection, its
/// `Connection: close`, and how many Events it carried.
#[derive(Debug)]
pub(super) struct Post {
    pub(super) key: ConnId,
    pub(super) close: bool,
    pub(super) accepted: usize,
}

/// One stream message this relay publishes: its msg id ([`cluster::publish_id`], kept
/// through every retry of it, the outbox's included), its subject and its Events.
#[derive(Debug, Clone)]
pub(super) struct Outgoing {
    pub(super) id: String,
    pub(super) subject: String,
    pub(super) events: Vec<Event>,
}

impl Outgoing {
    /// The message's payload: the Events' bytes, unchanged, one per line (`\n` between
    /// them); one Event alone is its bytes as they are (no copy).
    pub(super) fn payload(&self) -> Bytes {
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
pub(super) fn split_message(seq: u64, payload: Bytes) -> Vec<Event> {
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
pub(super) type Emitter = Option<(ConnId, std::net::SocketAddr)>;

/// Who waits on an Event held for the stream ([`Bus::loose`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// A WebSocket emitter (told if it fails for good), or no one.
    Ws(Emitter),
    /// A `POST` of the open group of `POST`s ([`Bus::open_group`]).
    Post,
}

/// What a publish's ticket is for.
#[derive(Debug)]
pub(super) enum Ticket {
    /// A message of the group of `POST`s with this serial.
    Post(u64, Outgoing),
    /// An outbox entry, by its serial.
    Outbox(u64),
    /// Published with no one waiting (WebSocket, JSONL, host ingest, a routed command),
    /// with the WebSocket emitter to tell when it fails for good (its key and peer).
    Loose(Outgoing, Emitter),
}

impl Bus {
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
    pub(super) fn outgoing(&mut self, events: Vec<Event>) -> Vec<Outgoing> {
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
    pub(super) fn flush_loose(&mut self) {
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

    /// Publishes `o` under a fresh ticket made of it by `ticket`, behind the WebSocket
    /// Events held so far (the stream keeps the order they came in).
    pub(super) fn publish_with(&mut self, o: Outgoing, ticket: impl FnOnce(Outgoing) -> Ticket) {
        self.flush_loose();
        self.send_publish(o, ticket);
    }

    fn send_publish(&mut self, o: Outgoing, ticket: impl FnOnce(Outgoing) -> Ticket) {
        let n = self.serial();
        self.publish(&o, n);
        self.tickets.insert(n, ticket(o));
    }

    /// The publish of `o` (again, on a retry: the same msg id).
    pub(super) fn publish(&mut self, o: &Outgoing, ticket: u64) {
        self.to_bus.push_back(ToBus::Publish {
            ticket,
            subject: o.subject.clone(),
            msg_id: o.id.clone(),
            payload: o.payload(),
        });
    }
}

impl Core {
    /// Cluster-mode ingest of validated Events. With `waiter` (a `POST`'s connection
    /// and its `Connection: close`), the answer goes to it once the stream acknowledged
    /// them all.
    ///
    /// # Errors
    /// [`Refusal::EventTooLarge`] over the engine's `max_payload`;
    /// [`Refusal::ClusterUnavailable`] when degraded and refusing (or the outbox full);
    /// [`Refusal::HistoryUnavailable`] when a local admission cannot be kept.
    pub(in crate::core) fn submit(
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
            Waiter::Ws(key, peer) => Some((key, peer)),
            _ => None,
        };
        let bus = self.bus.as_mut().expect("clustered");
        match waiter {
            Waiter::Ws(..) => {
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
                    conn.request.awaiting = Some(serial);
                    let cors = conn.request.cors.clone();
                    conn.request.answers.push_back(Answer::Waiting(cors));
                    // No next request is read until this one is answered.
                    self.orders.set_interest(key, conn, Some(false), None);
                }
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

    /// A publish stored in the stream ([`FromBus::Acked`]).
    ///
    /// [`FromBus::Acked`]: crate::cluster::FromBus::Acked
    pub(super) fn bus_acked(&mut self, ticket: u64) {
        self.acked(ticket, None);
        self.settle_provisional();
    }

    /// A publish not stored ([`FromBus::PublishFailed`]): counted, then kept locally,
    /// retried or refused as its ticket says.
    ///
    /// [`FromBus::PublishFailed`]: crate::cluster::FromBus::PublishFailed
    pub(super) fn bus_publish_failed(&mut self, ticket: u64, error: String) {
        self.bus.as_mut().expect("clustered").publish_errors += 1;
        self.acked(ticket, Some(error));
    }
}
