//! Commands across relays (AEP-0004 §4): routed over the local and remote claimants of
//! their session, forwarded to the one claimant's relay as a request, and the answers
//! both ways.

use super::publish::Ticket;
use crate::cluster::ToBus;
use crate::core::Core;
use crate::ids::ConnId;
use crate::refusal::Code;
use crate::wire::envelope::Event;
use crate::wire::ws::aep::Ref;
use bytes::Bytes;
use serde_json::{json, Value};

/// The answer a relay gives to a routed command: `{"ok":true}` or `{"code","detail"}`.
fn route_answer(r: Result<(), (Code, String)>) -> Bytes {
    let v = match r {
        Ok(()) => json!({ "ok": true }),
        Err((code, detail)) => json!({ "code": code.as_str(), "detail": detail }),
    };
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

/// What a relay's answer to a routed command ([`route_answer`]), or the failure to get
/// one, refuses: `None` for `{"ok":true}`, else the code and detail of the sender's
/// in-band `error`.
fn route_refusal(result: Result<Bytes, String>) -> Option<(Code, String)> {
    match result {
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
            format!("the claimant's relay did not take the command ({e}) (AEP-0004 §4.2)"),
        )),
    }
}

impl Core {
    /// A command for `session` (AEP-0004 §4.2) in cluster mode, from WebSocket `key`:
    /// routed over local and remote claimants. `true` when handled here (delivered,
    /// forwarded or refused); `false` leaves it to the single-relay path (exactly one
    /// local claimant and no remote one, while degraded).
    pub(in crate::core) fn cluster_command(&mut self, key: ConnId, ev: Event) -> Option<Event> {
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
        self.hand_command(target, &ev);
        self.metrics.ingested_ws += 1;

        let bus = self.bus.as_mut().expect("clustered");
        let o = bus.outgoing(vec![ev]).pop().expect("one");
        bus.delivered.insert(o.id.clone(), Some(target));
        bus.publish_with(o, |o| Ticket::Loose(o, None));
        Ok(())
    }

    /// A command another relay forwarded here ([`FromBus::Request`]), answered on
    /// `reply` (see [`route_answer`]).
    ///
    /// [`FromBus::Request`]: crate::cluster::FromBus::Request
    pub(super) fn bus_request(&mut self, reply: u64, payload: Bytes) {
        let answer = self.routed_command(payload);
        if let Some(bus) = self.bus.as_mut() {
            bus.to_bus.push_back(ToBus::Reply {
                reply,
                payload: route_answer(answer),
            });
        }
    }

    /// The answer to a command forwarded to its claimant's relay ([`FromBus::Response`]):
    /// a refusal, a timeout or no responder becomes the sender's in-band `error`.
    ///
    /// [`FromBus::Response`]: crate::cluster::FromBus::Response
    pub(super) fn bus_response(&mut self, ticket: u64, result: Result<Bytes, String>) {
        let bus = self.bus.as_mut().expect("clustered");
        let Some((key, id)) = bus.requests.remove(&ticket) else {
            return;
        };
        if let Some((code, d)) = route_refusal(result) {
            self.ws_refuse(key, code, Ref::Cause(&id), &d);
        }
    }
}
