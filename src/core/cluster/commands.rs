//! Commands across relays (AEP-0004 §4): routed over the local and remote claimants of
//! their session, forwarded to the one claimant's relay as a request, and the answers
//! both ways.

use super::publish::Ticket;
use crate::cluster::ToBus;
use crate::core::Core;
use crate::envelope::Event;
use crate::ws::aep::Ref;
use crate::ws::rfc6455;
use crate::Code;
use bytes::Bytes;
use serde_json::json;

/// The answer a relay gives to a routed command: `{"ok":true}` or `{"code","detail"}`.
pub(super) fn route_answer(r: Result<(), (Code, String)>) -> Bytes {
    let v = match r {
        Ok(()) => json!({ "ok": true }),
        Err((code, detail)) => json!({ "code": code.as_str(), "detail": detail }),
    };
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

impl Core {
    /// A command for `session` (AEP-0004 §4.2) in cluster mode, from WebSocket `key`:
    /// routed over local and remote claimants. `true` when handled here (delivered,
    /// forwarded or refused); `false` leaves it to the single-relay path (exactly one
    /// local claimant and no remote one, while degraded).
    pub(in crate::core) fn cluster_command(&mut self, key: usize, ev: Event) -> Option<Event> {
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
    pub(super) fn routed_command(&mut self, payload: Bytes) -> Result<(), (Code, String)> {
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
