//! What the stream delivers: each message admitted and fanned out once per stream
//! sequence, exactly as a single relay admits what it ingests, and the replay store
//! rebuilt in stream order after an outage.

use super::publish::split_message;
use super::ClusterState;
use crate::core::Core;
use bytes::Bytes;

impl Core {
    /// One stream message from the consumer ([`FromBus::Message`]): the lag and the
    /// catching-up state brought up to date, then the message admitted, once per stream
    /// sequence.
    ///
    /// [`FromBus::Message`]: crate::cluster::FromBus::Message
    pub(super) fn bus_message(
        &mut self,
        stream_seq: u64,
        pending: u64,
        payload: Bytes,
        own_id: Option<String>,
    ) {
        let bus = self.bus.as_mut().expect("clustered");
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
        if bus.state == ClusterState::CatchingUp && (bus.applied >= bus.target || pending == 0) {
            bus.state = ClusterState::Connected;
            log::info!("cluster: caught up at stream sequence {stream_seq}");
        }
        self.admit_from_stream(stream_seq, payload, own_id);
        self.settle_provisional();
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
    pub(in crate::core) fn flush_stream_batch(&mut self) {
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
            || self
                .conns
                .iter()
                .any(|(_, c)| !c.subscriber.replay.is_empty())
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
}
