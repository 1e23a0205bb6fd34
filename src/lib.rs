//! aep-relay: a relay for the Agent Event Protocol (AEP).
//!
//! Agents emit JSON Events; dashboards, notifiers, history stores and other agents
//! consume them. The relay ingests Events (HTTP POST, WebSocket, JSONL), keeps a bounded
//! per-session replay buffer, and fans every Event out to each subscriber whose
//! `attr-match` filter matches (SSE, WebSocket), with exact resume by
//! `(session, epoch, seq)` (AEP-0001 §7, AEP-0003 §5–§7).
//!
//! # The data path
//!
//! ```text
//! socket bytes ─► Conn (read buffer; TLS unwrapped by the transport)
//!    ├─ HTTP POST /events ─► body ─► lines (memchr) ─┐
//!    └─ WS /socket ─► ws::rfc6455::Decoder ─► text ───┴► Event::parse (the scanner reads
//!                     (commands: control::Claims::route    the routing attributes only;
//!                      ─► the one claimant's Conn)         `data` is validated, never built)
//!                                                            ▼
//!                     Core::publish ─► Store::admit (dedupe (source, id), order by
//!                                    │                (epoch, seq), a ring per owning
//!                                    │                stream (source, session))
//!                                    └► Hub::fanout ─► SubscriptionIndex ─► compiled
//!                                          │            attr-match per candidate
//!                                          ├─ ceiling ≥ capture ─► the Event's shared frame
//!                                          └─ lower ceiling ─► capture::downlevel (once per
//!                                                               Event and level)
//!                                                            ▼
//!                     Conn output queue (slices of the unit's frames, bounded) ─► writev
//! ```
//!
//! Two layers: the sans-IO [`core::Core`] (every decision, from bytes and `now`; it names
//! no socket, clock or file) and the I/O layer around it (`src/io`): the reactor,
//! [`Relay`] (one thread, one `mio::Poll`), with the sockets, files and threads it drives,
//! the only code that does I/O. An Event is kept as the byte slice the emitter sent;
//! each wire frame is built once per Event (and capture level) and shared by every
//! subscriber: no copy and no JSON re-serialization per subscriber. The frames of one
//! ingest unit (an NDJSON body, the WebSocket messages of one read, a JSONL chunk) are
//! laid out back to back, so a subscriber that takes a run of them queues one
//! reference-counted slice for the run and the kernel gets one `writev` per connection.
//!
//! # Embedding
//!
//! [`Relay`] is the whole server. [`Relay::bind`] validates a [`Config`] and binds the
//! listener; then either
//! - [`Relay::run`] blocks the calling thread until a [`StopHandle`] stops it
//!   (`stop` at once, `shutdown` gracefully; the `aep-relay` binary calls `shutdown` on
//!   SIGTERM and SIGINT);
//! - or the host calls [`Relay::poll_once`] from its own loop.
//!
//! [`Relay::ingest`] hands Events to the relay in-process, without a socket, with the
//! same all-or-nothing validation as `POST /events`.
//!
//! ```no_run
//! use aep_relay::{Config, Relay};
//!
//! let mut relay = Relay::bind(Config::default())?; // 127.0.0.1:8787
//! let stop = relay.stop_handle();
//! let server = std::thread::spawn(move || relay.run());
//! // … later, from any thread:
//! stop.shutdown();
//! server.join().unwrap()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ```
//! use aep_relay::{Config, Relay, Refusal};
//! use bytes::Bytes;
//!
//! let mut relay = Relay::bind(Config { listen: "127.0.0.1:0".parse()?, ..Config::default() })?;
//! let ev = r#"{"aep":"0.1","id":"1","type":"run.started","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a","agent":"a","session":"s","seq":0}"#;
//! assert_eq!(relay.ingest(Bytes::from(ev))?, 1);
//! assert!(matches!(
//!     relay.ingest(Bytes::from_static(b"{}")),
//!     Err(Refusal::InvalidEvent { line: 1, .. })
//! ));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The `examples/` directory has a runnable program per use: `thread` (the relay on its
//! own thread), `poll_once` (driven from a host loop), `in_process` (ingest without a
//! socket).
//!
//! # Building blocks
//!
//! The parts are usable on their own: [`filter`] (attr-match), [`capture`] (capture
//! ceilings and down-leveling), [`store`] (replay rings), [`fanout`] (subscriptions and
//! their index), [`subscription`] (what a consumer asks for), [`control`] (session claims
//! and command routing), [`auth`], [`metrics`]; and under [`wire`] the byte formats:
//! [`wire::envelope`] (the scanner and envelope validation), [`wire::http`],
//! [`wire::sse`], [`wire::ws`] (the WebSocket codec, handshake and AEP frames),
//! [`wire::jsonl`]. The live conformance checker behind `aep-relay check` is a crate of
//! its own in the workspace, `aep-check`.
//!
//! # Features
//!
//! - `cli` (default): the `aep-relay` binary and its dependencies (clap, env_logger,
//!   signal-hook, ureq, aep-check); the library uses none of them.
//! - `tls` (default): native TLS with rustls and the ring provider.
//! - `status-page` (default): the HTML status page at `GET /`.
//! - `cluster` (default): the bridge thread to NATS JetStream ([`bridge::Bridge`], with
//!   async-nats on a current-thread tokio runtime) that cluster mode (`--cluster`,
//!   [`Config::cluster`]) needs; the core's cluster logic and the [`cluster`] boundary
//!   types are always there.
//!
//! - `test-probes`: the core's test probes (`Core::queued`, `Core::backlog`,
//!   `Core::armed_deadlines`), bounds for the tests, benches and fuzz targets; `aep-sim` enables
//!   it.
//!
//! A small host builds with `default-features = false` (adding `tls` or `status-page` as
//! it needs).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Lets a test file shared by the unit tests and the integration tests name this crate
// the same way in both (`src/store/stand_in.rs`).
#[cfg(test)]
extern crate self as aep_relay;

pub mod auth;
mod buf;
pub mod capture;
pub mod cluster;
pub mod config;
pub mod control;
pub mod core;
pub mod fanout;
pub mod filter;
mod ids;
mod io;
pub mod metrics;
mod refusal;
pub mod store;
pub mod subscription;
pub mod wire;

pub use crate::core::{Core, Output};
pub use config::Config;
pub use ids::ConnId;
#[cfg(feature = "cluster")]
pub use io::bridge;
pub use io::history;
pub use io::reactor::{Relay, StartError, StopHandle};
#[cfg(feature = "tls")]
pub use io::tls;
pub use refusal::{Code, Refusal};
