//! The outbox: messages of Events admitted locally while the engine is down (or whose
//! publish failed), kept, in memory or durably (`--history`), until the stream stores
//! them (see the module docs of [`super`]).

use super::publish::{split_message, Outgoing, Ticket};
use super::{Bus, ClusterState};
use crate::cluster::Degrade;
use crate::core::Core;
use crate::refusal::Refusal;
use crate::wire::envelope::Event;
use bytes::Bytes;

impl Bus {
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
    pub(super) fn log_done(&mut self, id: &str) {
        if let Some(log) = self.log.as_mut() {
            log.done(id);
        }
    }

    /// Publishes every outbox Event not in flight, in order: on each connection, on
    /// each claim refresh while connected (an ack that timed out while the connection
    /// stayed up must not leave an Event out of the stream), and when an Event joins it
    /// while connected.
    pub(super) fn flush_outbox(&mut self) {
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
}

impl Core {
    /// Gives a clustered relay a durable outbox, with the messages a previous run left in
    /// it: `(publish id, subject, payload)`, in order. Those are published with their own
    /// ids once connected (the stream collapses one that got in before), are not
    /// delivered here again when the stream brings them back (their Events are in the
    /// history, so in the replay store already), and once they are all in the stream the
    /// replay store is rebuilt in the stream's order, as every other relay has it. A
    /// no-op for a single relay.
    pub fn set_outbox_log(
        &mut self,
        log: Box<dyn crate::core::OutboxLog>,
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
        bus.provisional = Some((crate::store::Store::new(buffer, sessions), Vec::new()));
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
    pub(in crate::core) fn outbox_left(&self) -> Option<String> {
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

    /// Ingest while the engine is unreachable (see the module docs).
    pub(super) fn degraded(&mut self, events: Vec<Event>) -> Result<usize, Refusal> {
        let bus = self.bus.as_mut().expect("clustered");
        let msgs = bus.outgoing(events);
        self.degraded_msgs(msgs)
    }

    /// Messages that did not reach the stream, served locally and kept in the outbox
    /// with their msg ids (a retry of a publish that did get in is then collapsed by the
    /// stream, and not fanned out here again when it comes back).
    pub(super) fn degraded_msgs(&mut self, msgs: Vec<Outgoing>) -> Result<usize, Refusal> {
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
    pub(in crate::core) fn keep_in_outbox(&mut self, ev: &Event) {
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        let o = bus.outgoing(vec![ev.clone()]).pop().expect("one");
        self.keep_msg_in_outbox(o);
    }

    /// [`Core::keep_in_outbox`] for a message with its msg id.
    pub(super) fn keep_msg_in_outbox(&mut self, o: Outgoing) {
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
}
