//! One WebSocket connection's binding state, the `Phase::Ws` of its `Conn`: the
//! decoder over its read buffer, its `hello`, its subscriptions (keys into the core's
//! hub) and claims, and its liveness clocks. Core state, so it lives in the core; the
//! codec it uses is `ws::rfc6455`.

use crate::auth::Grant;
use crate::ids::SubId;
use crate::wire::ws::aep::Declaration;
use crate::wire::ws::{deflate, rfc6455};
use std::time::Instant;

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

    /// The hub key of the subscription the client calls `id`.
    pub(crate) fn sub(&self, id: &str) -> Option<SubId> {
        self.subs.iter().find(|(i, _)| &**i == id).map(|(_, k)| *k)
    }
}
