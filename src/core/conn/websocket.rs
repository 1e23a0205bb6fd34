//! One WebSocket connection's binding state, the `Phase::Ws` of its `Conn`: the
//! decoder over its read buffer, its `hello`, its subscriptions (keys into the core's
//! hub) and claims, and its liveness clocks. Core state, so it lives in the core; the
//! codec it uses is `ws::rfc6455`. What a message means to the connection alone (its
//! role, its grant, its claims) is read here ([`WsState::on_text`]); what needs the relay
//! (ingest, routing, subscriptions) is the core's (`core::socket`).

use crate::auth::{Grant, Scopes};
use crate::ids::SubId;
use crate::wire::envelope::{Attr, Event, Scope};
use crate::wire::ws::aep::Declaration;
use crate::wire::ws::{deflate, rfc6455};
use bytes::Bytes;
use std::time::Instant;

/// The `detail` of a refusal for lack of `scope`.
pub(crate) fn lacks(scope: Scopes, what: &str) -> String {
    format!(
        "this connection's credentials lack the `{}` scope needed to {what} (AEP-0003 §8.1)",
        scope.name()
    )
}

/// Why `ev` may not be sent under `grant`: it names an `agent` other than the grant's
/// (read by the scanner, no JSON parse). `None`: allowed.
pub(crate) fn wrong_agent(grant: &Grant, ev: &Event) -> Option<String> {
    let agent = ev.attr(Attr::Agent);
    (!grant.may_emit_as(agent)).then(|| {
        format!(
            "this token may emit as agent {:?} only, and the Event's `agent` is {} (the token's `agent` grant)",
            grant.agent().unwrap_or_default(),
            serde_json::to_string(&agent).unwrap_or_default()
        )
    })
}

/// What one text message is, as far as its connection alone can tell
/// ([`WsState::on_text`]); the core acts on it.
#[derive(Debug)]
#[must_use]
pub(crate) enum WsStep {
    /// The first message, which must be a `hello` (AEP-0003 §3.5 #1, §4).
    Hello(Bytes),
    /// An Event this connection may send (role, `emit` scope, `agent` grant checked),
    /// not a command: to ingest. `claimed`: its sequenced session is newly claimed by
    /// this connection (AEP-0004 §4), to record in the routing table.
    Event { ev: Event, claimed: bool },
    /// A valid Event this connection may not send: refuse it `unauthorized` with this
    /// detail (AEP-0003 §4 rule 2, §8.1, §8.2); the connection stays open.
    Refused(Event, String),
    /// A command (AEP-0004 §2): its checks need the routing table.
    Command(Event),
    /// Not a valid Event: a frame, or an invalid Event (the scanner's reason).
    Other(Bytes, String),
}

/// One live WebSocket connection's binding state (the `Phase::Ws` of its `Conn`).
#[derive(Debug)]
pub(crate) struct WsState {
    /// What the upgrade request's credentials allow (AEP-0003 §8.1, AEP-0004 §4.1).
    pub(crate) grant: Grant,
    /// The RFC 6455 decoder over the connection's read buffer.
    pub(crate) decoder: rfc6455::Decoder,
    /// The client's `hello`; `None` until it arrives (every other first frame is
    /// refused with `hello-required`).
    pub(crate) hello: Option<Box<Declaration>>,
    /// Live subscriptions: (the client's `id`, the hub key), in subscribe order.
    pub(crate) subs: Vec<(Box<str>, SubId)>,
    /// Sessions this connection claims (it sent a sequenced Event for each), in claim
    /// order; mirrored in `control::Claims`.
    pub(crate) claims: Vec<Box<str>>,
    /// When the peer last sent anything (idle timeout).
    pub(crate) last_read: Instant,
    /// When the relay last sent a `ping` frame.
    pub(crate) last_ping: Instant,
    /// Output queued when the latest replay was queued: replies to the peer may take the
    /// queue `max_output_bytes` past it before the peer counts as not reading (a replay
    /// may legitimately exceed the bound; the peer's next request must not be punished).
    pub(crate) reply_floor: usize,
}

impl WsState {
    /// `deflate`: the `permessage-deflate` parameters agreed in the handshake, if any.
    pub(crate) fn new(
        grant: Grant,
        max_message: usize,
        deflate: Option<deflate::Agreed>,
        now: Instant,
    ) -> WsState {
        WsState {
            grant,
            decoder: rfc6455::Decoder::with_deflate(max_message, deflate),
            hello: None,
            subs: Vec::new(),
            claims: Vec::new(),
            last_read: now,
            last_ping: now,
            reply_floor: 0,
        }
    }

    /// Reads one text message after the upgrade: the `hello` first, then Events (scanned,
    /// as on every ingest path; only what is no valid Event is left to be parsed as a
    /// frame), checked against the `hello`'s role and the grant. A sequenced Event this
    /// connection may send claims its session, at most `max_claims` per connection.
    pub(crate) fn on_text(&mut self, text: Bytes, max_claims: usize) -> WsStep {
        if self.hello.is_none() {
            return WsStep::Hello(text);
        }
        // An emitter's message may be a slice of the decoder's text arena, which it keeps
        // alive while it lives: the replay buffer copies what it holds.
        let ev = match Event::parse(text.clone()) {
            Ok(ev) => ev,
            Err(e) => return WsStep::Other(text, e.detail),
        };
        if ev.is_command() {
            return WsStep::Command(ev);
        }
        if !self.hello.as_ref().is_some_and(|d| d.role.emits()) {
            let d = "this connection's hello declared role consumer; Events need role emitter or both (AEP-0003 §4 rule 2)";
            return WsStep::Refused(ev, d.to_owned());
        }
        if !self.grant.scopes.contains(Scopes::EMIT) {
            return WsStep::Refused(ev, lacks(Scopes::EMIT, "send Events"));
        }
        if let Some(d) = wrong_agent(&self.grant, &ev) {
            return WsStep::Refused(ev, d);
        }
        let claimed = match (ev.scope(), ev.session()) {
            (Scope::Sequenced, Some(session)) => self.claim(session, max_claims),
            _ => false,
        };
        WsStep::Event { ev, claimed }
    }

    /// Claims `session` for this connection (it sent a sequenced Event of it, AEP-0004
    /// §4); `true` when the claim is new. Free for a session already claimed; at most
    /// `max` claims per connection.
    pub(crate) fn claim(&mut self, session: &str, max: usize) -> bool {
        if self.claims.iter().any(|c| &**c == session) {
            return false;
        }
        if self.claims.len() >= max {
            log::debug!("connection claims {max} sessions already (max_sessions); session {session:?} not claimed");
            return false;
        }
        self.claims.push(session.into());
        true
    }

    /// Whether this connection may watch (subscribe, read the roster): role `consumer`
    /// or `both`, and the `watch` scope (AEP-0003 §4.1 rule 2, §6.5, §8.1). `Err` holds
    /// the refusal's detail.
    pub(crate) fn may_watch(&self, what: &str) -> Result<(), String> {
        if !self.hello.as_ref().is_some_and(|d| d.role.consumes()) {
            return Err(format!(
                "this connection's hello declared role emitter; to {what} declare consumer or both (AEP-0003 §4.1 rule 2, §6.5)"
            ));
        }
        if !self.grant.scopes.contains(Scopes::WATCH) {
            return Err(lacks(Scopes::WATCH, what));
        }
        Ok(())
    }

    /// The hub key of the subscription the client calls `id`.
    pub(crate) fn sub(&self, id: &str) -> Option<SubId> {
        self.subs.iter().find(|(i, _)| &**i == id).map(|(_, k)| *k)
    }
}
