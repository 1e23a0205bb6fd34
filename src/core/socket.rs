//! The WebSocket binding in the core (`GET /socket`): the upgrade, the frame
//! loop over a connection's read buffer, `hello`, subscriptions with replay, Events from
//! emitters, command routing, the roster, liveness and closes (AEP-0003 §2, §3.5, §4,
//! §4.1, §5, §6.5, §7; AEP-0004 §2, §4).
//!
//! Everything the peer sends is answered in order on the connection's one output queue:
//! pongs, acknowledgements, errors, replayed and live Events, and the close frame all go
//! through `Subscriber::out`, so no reply can overtake an Event queued before it.
//!
//! A connection leaves the `Ws` phase exactly once, through `Core::ws_shut`: its
//! subscriptions and session claims are released there (or in `Core::close` when the
//! socket dies first), and it then drains in `Phase::Closing` like any last HTTP answer.
//! Its `ping` and idle deadlines are `Conn::deadline`'s. What a message means to the
//! connection alone is its phase's state's ([`WsState::on_text`], in `conn::websocket`).

use super::conn::websocket::{lacks, wrong_agent, WsState, WsStep};
use super::conn::{Conn, Phase, ReplayJob};
use super::{ConnId, Core};
use crate::auth::{Grant, Scopes};
use crate::fanout::{Binding, Delivered, Subscription};
use crate::filter::{self, Filter};
use crate::refusal::Code;
use crate::subscription;
use crate::wire::envelope::Event;
use crate::wire::http::RequestHead;
use crate::wire::ws::aep::{self, Ref};
use crate::wire::ws::handshake;
use crate::wire::ws::rfc6455::{self, close_code, Incoming};
use bytes::Bytes;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

impl Core {
    /// `GET /socket`, credentials already checked (401 before the upgrade): completes
    /// the handshake and switches the connection to the `Ws` phase, keeping `grant` for
    /// the per-frame scope checks. Bytes the client sent after its request head stay in
    /// the read buffer and are decoded as frames.
    pub(super) fn begin_ws(&mut self, key: ConnId, head: &RequestHead, grant: Grant) {
        let (resp, deflate) = match handshake::accept(head, self.config.ws_deflate) {
            Ok(r) => r,
            Err(e) => {
                let extra: &[(&str, &str)] = if e.code == Code::UpgradeRequired {
                    &handshake::UPGRADE_HEADERS
                } else {
                    &[]
                };
                return self.reply_skipping_body(key, head, e.code, e.detail, &[], extra);
            }
        };
        let now = self.now;
        let max = self.config.max_ws_message_bytes;
        let expires_at = grant.expires.and_then(|e| self.instant_at_unix(e));
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.expires_at = expires_at;
        conn.send(resp);
        conn.last_write = now;
        conn.since = now;
        conn.subscriber.deflate_window = deflate.map_or(0, |a| a.server_window_bits);
        conn.enter(Phase::Ws(Box::new(WsState::new(grant, max, deflate, now))));
        self.orders.mark_dirty(key, conn);
        if self.shutdown_deadline.is_some() {
            // Opened once the shutdown began (its head was still arriving then).
            self.end_stream(key, now);
        }
    }

    /// Decodes and handles every complete frame in the connection's read buffer.
    pub(super) fn ws_process(&mut self, key: ConnId) {
        let now = self.now;
        let max_claims = self.config.max_sessions;
        let mut used = 0;
        // The Events among these messages are one ingest unit: their frames are
        // coalesced (see `fanout`); anything else queued ends it first. An emitter's
        // messages already read are announced to the fan-out, so that the unit's arenas
        // are sized once (in a cluster its Events go to the stream instead, and are
        // fanned out from there).
        self.hub.begin_unit();
        let sized = self.clustered();
        loop {
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            let Conn {
                rbuf, phase, peer, ..
            } = conn;
            let peer = *peer;
            let Phase::Ws(ws) = phase else {
                // A handler closed the connection (and cleared its input).
                return;
            };
            if used == 0 && !sized && ws.hello.as_ref().is_some_and(|d| d.role.emits()) {
                let (messages, bytes) = ws.decoder.data_ahead(rbuf);
                self.hub.size_unit(messages, bytes);
            }
            ws.last_read = now;
            let unit = match ws.decoder.next(rbuf, &mut used) {
                Ok(None) => {
                    rbuf.drain(..used);
                    break;
                }
                Ok(Some(unit)) => unit,
                Err(v) => {
                    // RFC 6455 §7.1.7: fail the connection, with the close code as the
                    // refusal (counted and logged once, like every refusal).
                    self.refused(key, "WebSocket frame", Some(v.code), v.refusal(), v.reason);
                    return self.ws_shut(key, &[rfc6455::close(v.code, v.reason)]);
                }
            };
            match unit {
                // What the connection can tell alone, read while it is at hand.
                Incoming::Text(t) => {
                    let step = ws.on_text(t, max_claims);
                    self.ws_step(key, peer, step);
                }
                other => self.ws_control(key, other),
            }
        }
        self.end_unit();
    }

    /// A control frame of the peer (RFC 6455 §5.5).
    fn ws_control(&mut self, key: ConnId, unit: Incoming) {
        match unit {
            Incoming::Text(_) => debug_assert!(false, "a text message is a WsStep"),
            Incoming::Ping(p) => self.ws_send(key, rfc6455::pong(&p)),
            Incoming::Pong => {}
            // The peer started the close handshake: echo its code, then close
            // (RFC 6455 §5.5.1, §7.4.1).
            Incoming::Close(code) => self.ws_shut(
                key,
                &[rfc6455::close(code.unwrap_or(close_code::NORMAL), "")],
            ),
        }
    }

    /// Queues a reply to the peer. A peer whose queue is already `max_output_bytes` past
    /// what its latest replay left there is not reading what it asks for: it is closed
    /// (backpressure) rather than let the queue grow without bound.
    pub(super) fn ws_send(&mut self, key: ConnId, f: Bytes) {
        self.end_unit();
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let floor = match &conn.phase {
            Phase::Ws(ws) => ws.reply_floor,
            _ => 0,
        };
        if conn.subscriber.out.len() > floor.saturating_add(self.config.max_output_bytes) {
            return self.ws_close(
                key,
                "backpressure: the peer does not read its replies",
                close_code::TRY_AGAIN,
            );
        }
        conn.send(f);
        self.orders.mark_dirty(key, conn);
    }

    pub(super) fn ws_state(&self, key: ConnId) -> Option<&WsState> {
        match &self.conns.get(key)?.phase {
            Phase::Ws(ws) => Some(ws),
            _ => None,
        }
    }

    /// Ends the `Ws` phase: releases the subscriptions and session claims, queues
    /// `last` (an error, `closing`, the close frame) and closes once it is flushed.
    pub(super) fn ws_shut(&mut self, key: ConnId, last: &[Bytes]) {
        self.end_unit();
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let Phase::Ws(ws) = conn.enter(Phase::Closing) else {
            return;
        };
        // Nothing follows the close frame, not even a replay page (RFC 6455 §5.5.1).
        conn.subscriber.end_streaming();
        for f in last {
            conn.send(f.clone());
        }
        conn.close_after_flush = true;
        conn.rbuf.clear();
        conn.since = self.now;
        self.orders.mark_dirty(key, conn);
        self.orders.rearm(key, conn, &self.config);
        self.ws_release(key, &ws);
    }

    /// Removes a WebSocket's subscriptions from the hub and its claims from the routing
    /// table (also called by `Core::close` for a socket that died).
    pub(super) fn ws_release(&mut self, key: ConnId, ws: &WsState) {
        for (_, sub) in &ws.subs {
            self.hub.remove(*sub);
        }
        for session in &ws.claims {
            self.claims.release(session, key);
            self.claim_changed(session);
        }
    }

    /// Closes WebSocket `key` deliberately (shutdown, backpressure, an idle peer, a
    /// limit): a `closing` frame with the last position delivered per subscription and
    /// session, then a close frame with `code` and `reason`, then the socket once they
    /// are flushed (AEP-0003 §3.5 #4, §8.4). Nothing more is delivered after `closing`,
    /// so the positions are exact: a consumer resuming from them misses nothing the
    /// relay still holds. A connection that never finished `hello` gets only the close
    /// frame (frames follow `hello`). No-op for a connection not in the `Ws` phase.
    ///
    /// `code` is usually [`close_code::GOING_AWAY`] (1001, shutdown, idle) or
    /// [`close_code::TRY_AGAIN`] (1013, backpressure).
    pub(super) fn ws_close(&mut self, key: ConnId, reason: &str, code: u16) {
        self.ws_close_rolled_back(key, reason, code, &HashMap::new());
    }

    /// [`Core::ws_close`] after the connection's queue was cut short: `lowest` holds,
    /// per owning stream `(session, source)`, the lowest position among the Events
    /// discarded from it. The `closing` positions of those streams are moved back to
    /// just before it, so a resume from them delivers every discarded Event again
    /// (at-least-once, AEP-0001 §7 #4); a stream whose position cannot be moved back (a
    /// discarded Event at `(0, 0)`) is left out of `closing`.
    pub(super) fn ws_close_rolled_back(
        &mut self,
        key: ConnId,
        reason: &str,
        code: u16,
        lowest: &HashMap<(Box<str>, Box<str>), crate::store::Position>,
    ) {
        let Some(conn) = self.conns.get(key) else {
            return;
        };
        let Phase::Ws(ws) = &conn.phase else {
            return;
        };
        let mut last = Vec::with_capacity(2);
        if ws.hello.is_some() {
            let mut delivered = Vec::new();
            for (id, sub) in &ws.subs {
                if let Some(Subscription {
                    binding: Binding::Ws(d),
                    ..
                }) = self.hub.get(*sub)
                {
                    // One entry per owning stream (AEP-0001 §5.2); `source` says whose.
                    for (session, source, mut position) in d.positions() {
                        if let Some(&low) = lowest.get(&(session.into(), source.into())) {
                            if position >= low {
                                match super::memory::before(low) {
                                    Some(p) => position = p,
                                    None => continue,
                                }
                            }
                        }
                        let (epoch, seq) = position;
                        delivered.push(json!({
                            "sub": &**id, "session": session, "source": source,
                            "epoch": epoch, "seq": seq
                        }));
                    }
                }
            }
            let dropped = conn.subscriber.dropped.total();
            last.push(aep::closing(reason, delivered, dropped));
        }
        last.push(rfc6455::close(code, reason));
        self.ws_shut(key, &last);
    }

    /// Refuses something with an `error` frame (counted by code for `/metrics` and
    /// logged, see `Core::refused`); the connection stays open.
    pub(super) fn ws_refuse(&mut self, key: ConnId, code: Code, r: Ref<'_>, detail: &str) {
        debug_assert_eq!(code.ws_close(), None, "{code} closes the connection");
        self.refused(key, "WebSocket message", None, code, detail);
        self.ws_send(key, aep::error(code, r, detail, &[]));
    }

    /// Refuses the `hello` exchange (AEP-0003 §3.5 #1, §4): the `error` frame, then a
    /// close with the code's close code (1008) whose reason is the same code; counted
    /// and logged once.
    pub(super) fn ws_refuse_hello(
        &mut self,
        key: ConnId,
        code: Code,
        detail: &str,
        more: &[(&str, Value)],
    ) {
        let close = code.ws_close().unwrap_or(close_code::POLICY);
        self.refused(key, "WebSocket hello", Some(close), code, detail);
        let f = aep::error(code, Ref::None, detail, more);
        let c = rfc6455::close(close, code.as_str());
        self.ws_shut(key, &[f, c]);
    }

    /// Acts on what a text message turned out to be ([`WsState::on_text`]).
    fn ws_step(&mut self, key: ConnId, peer: SocketAddr, step: WsStep) {
        match step {
            WsStep::Hello(text) => self.ws_hello(key, &text),
            WsStep::Event { ev, claimed } => {
                if let (true, Some(session)) = (claimed, ev.session()) {
                    self.claims.claim(session, key);
                    self.claim_changed(session);
                }
                self.ws_ingest(key, peer, ev);
            }
            WsStep::Refused(ev, d) => self.ws_refuse(key, Code::Unauthorized, Ref::Id(ev.id()), &d),
            WsStep::Command(ev) => self.ws_command(key, ev),
            WsStep::Other(text, detail) => self.ws_other(key, &text, &detail),
        }
    }

    /// A message that is no valid Event: a frame, parsed as JSON (a `type` without a
    /// dot), or an invalid Event refused with the scanner's `detail`.
    fn ws_other(&mut self, key: ConnId, text: &[u8], detail: &str) {
        let obj = match serde_json::from_slice::<Value>(text) {
            Ok(Value::Object(m)) => m,
            _ => return self.ws_refuse(key, Code::InvalidEvent, Ref::None, detail),
        };
        match obj.get("type").and_then(Value::as_str) {
            Some(t) if !t.contains('.') => self.ws_frame(key, t, &obj, text),
            _ => {
                let id = obj.get("id").and_then(Value::as_str);
                let r = id.map_or(Ref::None, Ref::Id);
                self.ws_refuse(key, Code::InvalidEvent, r, detail)
            }
        }
    }

    /// The first message: it must be a `hello` (AEP-0003 §3.5 #1, §4).
    pub(super) fn ws_hello(&mut self, key: ConnId, text: &[u8]) {
        self.end_unit();
        let obj = match serde_json::from_slice::<Value>(text) {
            Ok(Value::Object(m)) if m.get("type").and_then(Value::as_str) == Some("hello") => m,
            _ => {
                let d = "the first frame on /socket must be a `hello` (AEP-0003 §3.5 #1)";
                return self.ws_refuse_hello(key, Code::HelloRequired, d, &[]);
            }
        };
        let decl = match aep::parse_hello(&obj) {
            Ok(d) => d,
            Err(e) => {
                let more = [("versions", json!(crate::wire::envelope::SUPPORTED_VERSIONS))];
                let more: &[(&str, Value)] = if e.code == Code::VersionUnsupported {
                    &more
                } else {
                    &[]
                };
                return self.ws_refuse_hello(key, e.code, &e.detail, more);
            }
        };
        // A token granted `agent` speaks as that agent only (AEP-0003 §4, §8.2).
        if let Some(ws) = self.ws_state(key) {
            if decl.agent.is_some() && !ws.grant.may_emit_as(decl.agent.as_deref()) {
                let d = format!(
                    "this token may speak as agent {:?} only; the hello declares {:?} (the token's `agent` grant, AEP-0003 §8.2)",
                    ws.grant.agent().unwrap_or_default(),
                    decl.agent.as_deref().unwrap_or_default()
                );
                return self.ws_refuse_hello(key, Code::Unauthorized, &d, &[]);
            }
        }
        let version = decl.version;
        let now = self.now;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let Phase::Ws(ws) = &mut conn.phase else {
            return;
        };
        let grant = ws.grant.clone();
        // An emitter's messages go into the decoder's text arena (no allocation each).
        ws.decoder.set_arena(decl.role.emits());
        // `dropped` frames only for a peer that asked (`capabilities.experimental`).
        conn.subscriber.announce_drops = decl.dropped;
        ws.hello = Some(Box::new(decl));
        ws.last_ping = now;
        let frame = self.hello_frame(version, &grant);
        self.ws_send(key, frame);
    }

    /// An Event the peer may send ([`WsStep::Event`]): it takes the HTTP ingest path
    /// (store admission and fan-out), or, clustered, goes into the stream.
    fn ws_ingest(&mut self, key: ConnId, peer: SocketAddr, ev: Event) {
        if self.clustered() {
            // Into the stream; admitted from there.
            return match self.submit(vec![ev.clone()], super::cluster::Waiter::Ws(key, peer)) {
                Ok(_) => self.metrics.ingested_ws += 1,
                Err(r) => {
                    let d = r.to_string();
                    self.ws_refuse(key, r.code(), Ref::Id(ev.id()), &d)
                }
            };
        }
        // Kept in the history (when configured) before it is published.
        if let Err(r) = self.persist(std::slice::from_ref(&ev)) {
            let d = r.to_string();
            return self.ws_refuse(key, Code::HistoryUnavailable, Ref::Id(ev.id()), &d);
        }
        self.metrics.ingested_ws += 1;
        self.publish(ev);
    }

    /// A command (AEP-0004 §2): gated on authentication and the `control` scope, then
    /// routed to exactly one claimant, byte-identically, and kept in history and fanned
    /// out to observers like any Event. Refusals are `cause`-correlated `error` frames
    /// that never enter history (§4.2, §4.5).
    pub(super) fn ws_command(&mut self, key: ConnId, ev: Event) {
        let Some(ws) = self.ws_state(key) else {
            return;
        };
        let grant = ws.grant.clone();
        if !grant.authenticated {
            let d = "commands need an authenticated connection (AEP-0004 §4.1); this relay has no token configured, so it is watch-only for control";
            let d = if self.config.auth.enabled() {
                "commands need an authenticated connection (AEP-0004 §4.1)"
            } else {
                d
            };
            return self.ws_refuse(key, Code::Unauthorized, Ref::Cause(ev.id()), d);
        }
        if !grant.scopes.contains(Scopes::CONTROL) {
            let d = lacks(Scopes::CONTROL, "send commands");
            return self.ws_refuse(key, Code::Unauthorized, Ref::Cause(ev.id()), &d);
        }
        // Who may command whom is the deployment's (AEP-0004 §4.2 item 3): the token's
        // `agent`, `commands` and `targets` grants, refused `unauthorized` before the
        // command is routed, kept or published.
        if let Some(d) = wrong_agent(&grant, &ev).or_else(|| self.command_denied(&grant, &ev)) {
            return self.ws_refuse(key, Code::Unauthorized, Ref::Cause(ev.id()), &d);
        }
        let Some(ev) = self.cluster_command(key, ev) else {
            return; // delivered, forwarded or refused across the cluster
        };
        let target = match self.command_target(&ev) {
            Ok(t) => t,
            Err((code, d)) => return self.ws_refuse(key, code, Ref::Cause(ev.id()), &d),
        };

        if let Err(r) = self.persist(std::slice::from_ref(&ev)) {
            let d = r.to_string();
            return self.ws_refuse(key, Code::HistoryUnavailable, Ref::Cause(ev.id()), &d);
        }
        self.hand_command(target, &ev);
        // History and observers; the target already has it. Clustered and degraded, the
        // stream gets it on reconnect (every relay's history, AEP-0004 §4.2).
        self.metrics.ingested_ws += 1;
        self.keep_in_outbox(&ev);
        self.publish_except(ev, target);
    }

    /// Queues command `ev` on its one claimant `target`, byte-identically (AEP-0004
    /// §4.2), behind the fan-out frames already decided for it.
    pub(super) fn hand_command(&mut self, target: ConnId, ev: &Event) {
        self.end_unit();
        if let Some(conn) = self.conns.get_mut(target) {
            conn.send(rfc6455::text(ev.bytes()));
            self.orders.mark_dirty(target, conn);
        }
    }

    /// Why `grant` may not send command `ev` (AEP-0004 §4.2 item 3): its type is not in
    /// the grant's `commands`, or a claimant of its session (here or, clustered, on
    /// another relay) declared an `agent` not in its `targets`. `None`: allowed.
    pub(super) fn command_denied(&self, grant: &Grant, ev: &Event) -> Option<String> {
        if !grant.restricts_commands() {
            return None;
        }
        let ty = ev.event_type();
        if !grant.may_command(ty) {
            return Some(format!(
                "this token may not send `{ty}` (its `commands` grant, AEP-0004 §4.2 item 3)"
            ));
        }
        let session = ev.session().unwrap_or_default();
        let mut agents: Vec<Option<String>> = self
            .claims
            .claimants(session)
            .iter()
            .map(|c| {
                self.ws_state(*c)
                    .and_then(|w| w.hello.as_ref()?.agent.clone())
            })
            .collect();
        if let Some(bus) = self.bus.as_ref() {
            agents.extend(bus.remote_claimant_agents(session));
        }
        let denied = agents.iter().find(|a| !grant.may_target(a.as_deref()))?;
        Some(format!(
            "this token may not command session {session:?}, claimed by agent {} (its `targets` grant, AEP-0004 §4.2 item 3)",
            denied.as_deref().map_or("(none declared)".to_owned(), |a| format!("{a:?}"))
        ))
    }

    /// The one local claimant a command goes to (AEP-0004 §4.2): the session's single
    /// claimant that declared the type in `control.accepts`. A claimant that does not
    /// read its output is disconnected (AEP-0003 §8.4) and the command not delivered.
    ///
    /// # Errors
    /// The refusal's code and detail: `no-route`, `ambiguous`, `unsupported`.
    pub(super) fn command_target(&mut self, ev: &Event) -> Result<ConnId, (Code, String)> {
        let session = ev.session();
        let route = self.claims.route(session, |c| {
            matches!(&self.conns.get(c).map(|c| &c.phase), Some(Phase::Ws(ws))
                if ws.hello.as_ref().is_some_and(|d| d.accepts(ev.event_type())))
        });
        let target = route.map_err(|r| {
            let d = r.detail(ev.event_type(), session.unwrap_or_default());
            (r.code(), d)
        })?;
        let max = self.config.max_output_bytes;
        if self
            .conns
            .get(target)
            .is_none_or(|c| c.subscriber.out.len() > max)
        {
            self.ws_close(
                target,
                "backpressure: the output queue is full",
                close_code::TRY_AGAIN,
            );
            let d = "the only claimant of the session does not read its output; it was disconnected and the command not delivered (AEP-0003 §8.4)";
            return Err((Code::NoRoute, d.to_owned()));
        }
        Ok(target)
    }

    /// A frame (a `type` without a dot). Unknown types, a repeated `hello`, `pong` and
    /// frames only the relay sends are ignored (AEP-0003 §2).
    pub(super) fn ws_frame(&mut self, key: ConnId, ty: &str, obj: &Map<String, Value>, raw: &[u8]) {
        // Frames answer in order after the Events fanned out before them.
        self.end_unit();
        match ty {
            "subscribe" => self.ws_subscribe(key, obj, raw),
            "unsubscribe" => self.ws_unsubscribe(key, obj),
            "roster" => self.ws_roster(key, obj),
            "ping" => self.ws_send(key, aep::pong(obj.get("t"))),
            _ => {}
        }
    }

    /// [`WsState::may_watch`] for connection `key`.
    pub(super) fn ws_may_watch(&self, key: ConnId, what: &str) -> Result<(), String> {
        self.ws_state(key)
            .map_or(Err(String::new()), |ws| ws.may_watch(what))
    }

    /// `subscribe` (AEP-0003 §6.5): `subscribed`, then replay (strictly after each
    /// position, `replay-exhausted` first where the buffer no longer reaches back), then
    /// live delivery; or an `error` from the closed set with the same `id`. A refusal
    /// leaves the connection and its other subscriptions as they were.
    pub(super) fn ws_subscribe(&mut self, key: ConnId, obj: &Map<String, Value>, raw: &[u8]) {
        let Some(id) = obj
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        else {
            let d = "subscribe needs a non-empty string `id` (AEP-0003 §6.5)";
            return self.ws_refuse(key, Code::InvalidFilter, Ref::None, d);
        };
        if let Some(d) = self.catching_up() {
            return self.ws_refuse(key, Code::ClusterUnavailable, Ref::Id(id), d);
        }
        let req = match self.ws_subscription_request(key, id, obj, raw) {
            Ok(r) => r,
            Err((code, detail)) => return self.ws_refuse(key, code, Ref::Id(id), &detail),
        };
        let subscription::SubscriptionRequest {
            filter,
            ceiling,
            from,
            ..
        } = req;
        // Replay precedes live delivery (AEP-0003 §5, §7), paced by the consumer's reading
        // (see `relay::replay`). Other subscriptions of this connection keep their own
        // order: frames already queued stay ahead of this replay, Events published later
        // follow it.
        let sub = self.hub.insert(Subscription {
            conn: key,
            filter: filter.clone(),
            ceiling,
            binding: Binding::Ws(Delivered::new(self.config.max_sessions)),
        });
        let Some(conn) = self.conns.get_mut(key) else {
            return self.hub.remove(sub);
        };
        conn.send(aep::ack("subscribed", id));
        if let Phase::Ws(ws) = &mut conn.phase {
            ws.subs.push((id.into(), sub));
        }
        for (name, source, earliest) in super::lost_markers(&self.store, &from) {
            if !filter.admits_session(&name) {
                continue;
            }
            conn.subscriber.out.push(aep::replay_exhausted(
                id,
                &name,
                source.as_deref(),
                earliest,
            ));
        }
        let sessions = super::replay_sessions(&self.store, &from);
        if !sessions.is_empty() {
            let job = ReplayJob {
                sub: Some(sub),
                ws_id: Some(id.into()),
                pending: sessions.iter().map(|(s, _)| *s).collect(),
                sessions,
                filter,
                ceiling,
                end_after: false,
                lost: false,
            };
            let max = self.config.max_output_bytes;
            super::replay::start(conn, job, &self.store, &mut self.hub, max);
        }
        if let Phase::Ws(ws) = &mut conn.phase {
            ws.reply_floor = conn.subscriber.out.len();
        }
        self.orders.mark_dirty(key, conn);
    }

    /// Checks a `subscribe` frame and compiles it, in the order the refusal codes are
    /// documented: `unauthorized`, `invalid-filter`, `unknown-dialect`, `limit-exceeded`.
    pub(super) fn ws_subscription_request(
        &self,
        key: ConnId,
        id: &str,
        obj: &Map<String, Value>,
        raw: &[u8],
    ) -> Result<subscription::SubscriptionRequest, (Code, String)> {
        self.ws_may_watch(key, "subscribe")
            .map_err(|d| (Code::Unauthorized, d))?;
        let invalid = |d: String| (Code::InvalidFilter, d);
        if let Err(e) = filter::strict_json(raw) {
            return Err(invalid(format!(
                "the subscribe frame is not strict JSON: {e}"
            )));
        }
        if let Some(d) = obj.get("dialect") {
            if d.as_str() != Some("attr-match") {
                return Err((
                    Code::UnknownDialect,
                    format!("filter dialect {d} is not offered; this relay offers attr-match (capabilities.filters, AEP-0003 §6)"),
                ));
            }
        }
        let filter = match obj.get("filter") {
            None => Filter::match_all(),
            Some(f) => Filter::compile(f).map_err(|e| invalid(format!("`filter`: {e}")))?,
        };
        let ceiling = match obj.get("capture") {
            None => None,
            Some(Value::String(c)) => {
                Some(subscription::parse_capture(c).map_err(|e| invalid(e.detail))?)
            }
            Some(_) => return Err(invalid("`capture` must be a string (AEP-0003 §6.4)".into())),
        };
        let from = match obj.get("from") {
            None => subscription::Resume::Live,
            Some(v) => subscription::parse_from_value(v, self.config.max_from_positions)
                .map_err(|e| (e.code, e.detail))?,
        };
        let ws = self
            .ws_state(key)
            .ok_or((Code::Unauthorized, String::new()))?;
        if ws.sub(id).is_some() {
            return Err(invalid(format!(
                "a subscription with id {id:?} is already live on this connection; unsubscribe it first or use another id"
            )));
        }
        let max = self.config.max_subscriptions_per_conn;
        if ws.subs.len() >= max {
            return Err((
                Code::LimitExceeded,
                format!("this connection already holds {max} subscriptions, the most this relay fans out per connection (AEP_MAX_SUBSCRIPTIONS)"),
            ));
        }
        // The connection's grant narrows the filter (AEP-0003 §6.1, a conjunction) and
        // caps the ceiling, once here: fan-out and replay evaluate the one result.
        Ok(subscription::SubscriptionRequest {
            filter: ws.grant.narrow(Arc::new(filter)),
            ceiling: ws.grant.ceiling(ceiling),
            from,
            live: true,
        })
    }

    /// `unsubscribe` by `id`, acknowledged with `unsubscribed` (also for an `id` that is
    /// not live: the outcome the peer asked for holds).
    pub(super) fn ws_unsubscribe(&mut self, key: ConnId, obj: &Map<String, Value>) {
        let Some(id) = obj.get("id").and_then(Value::as_str) else {
            let d = "unsubscribe needs the string `id` of a subscription (AEP-0003 §6.5)";
            return self.ws_refuse(key, Code::InvalidFrame, Ref::None, d);
        };
        if let Some(conn) = self.conns.get_mut(key) {
            if let Phase::Ws(ws) = &mut conn.phase {
                if let Some(i) = ws.subs.iter().position(|(s, _)| &**s == id) {
                    let (_, sub) = ws.subs.remove(i);
                    self.hub.remove(sub);
                    conn.subscriber.replay.retain(|j| j.sub != Some(sub));
                }
            }
        }
        self.ws_send(key, aep::ack("unsubscribed", id));
    }

    /// `roster` (AEP-0003 §4.1): one entry per live (connection, claimed session) pair,
    /// with that connection's declarations verbatim, sorted by session then connection;
    /// a repeated session is a multi-claimant state, shown, never resolved.
    pub(super) fn ws_roster(&mut self, key: ConnId, obj: &Map<String, Value>) {
        let Some(id) = obj.get("id").and_then(Value::as_str) else {
            let d = "roster needs a string `id` (AEP-0003 §4.1 rule 2)";
            return self.ws_refuse(key, Code::InvalidFrame, Ref::None, d);
        };
        if let Err(d) = self.ws_may_watch(key, "read the roster") {
            return self.ws_refuse(key, Code::Unauthorized, Ref::Id(id), &d);
        }
        let mut pairs: Vec<(&str, ConnId)> = self
            .claims
            .iter()
            .flat_map(|(s, conns)| conns.iter().map(move |k| (s, *k)))
            .collect();
        pairs.sort_unstable();
        // The reader's grant shows only the claims whose Events it may see.
        let grant = self
            .ws_state(key)
            .map(|ws| ws.grant.clone())
            .unwrap_or_default();
        let mut entries: Vec<(String, Value)> = pairs
            .into_iter()
            .filter_map(|(session, k)| {
                let d = self.ws_state(k)?.hello.as_ref()?;
                grant
                    .admits_stream(session, d.agent.as_deref())
                    .then(|| (session.to_owned(), aep::roster_entry(session, d)))
            })
            .collect();
        // Claimants on other relays (cluster mode), merged in session order.
        entries.extend(self.remote_roster().into_iter().filter(|(session, e)| {
            grant.admits_stream(session, e.get("agent").and_then(Value::as_str))
        }));
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let entries = entries.into_iter().map(|(_, e)| e).collect();
        let f = aep::roster(id, entries);
        self.ws_send(key, f);
    }
}
