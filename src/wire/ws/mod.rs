//! The WebSocket duplex binding, `GET /socket` (AEP-0003 §2, §3.5, §4, §4.1, §5, §6.5,
//! §7; AEP-0004 §2, §4).
//!
//! ```text
//! client bytes ─► Conn::rbuf ─► rfc6455::Decoder (RFC 6455: unmask, reassemble, limits)
//!                                  ├─ ping ─► pong          ├─ close ─► close, done
//!                                  └─ text ─► hello first (aep::parse_hello)
//!                                             ├─ Event ─► Event::parse ─► publish (as HTTP)
//!                                             │          └─ command ─► control::route ─► one claimant
//!                                             └─ frame ─► subscribe / unsubscribe / roster / ping
//! fan-out ─► Frames::ws (header + original bytes, built once per Event and ceiling;
//!            compressed, RSV1, once more for connections with permessage-deflate)
//!        ─► every matching connection's queue (shared Bytes, no copy)
//! ```
//!
//! The pieces here are sans-IO: [`rfc6455`] (the RFC 6455 frame codec), [`handshake`] (the upgrade),
//! [`deflate`] (RFC 7692 `permessage-deflate`: negotiation, the shared compressor, bounded inflating),
//! [`aep`] (the AEP frame vocabulary: `hello`, `subscribe`, `error`…). The binding's
//! logic, which owns the connection's state, the subscription hub, the store and the
//! session claims, is the core's (`core::socket`).
//!
//! A connection's life: upgrade (auth was checked on the request: 401 before it) →
//! client `hello` → relay `hello` → frames and Events in any order → close handshake
//! (either side), or a deliberate close by the relay with a `closing` frame carrying the
//! last delivered position per subscription (shutdown, backpressure, idle peer; the
//! positions are kept by `fanout::Delivered`).

pub mod aep;
pub mod deflate;
pub mod handshake;
pub mod rfc6455;
