//! Test support for every integration test binary (its root declares `mod support;`,
//! with `#[path = "../support/mod.rs"]` in a `tests/NAME/main.rs`, and a file under it
//! says `use crate::support;`): a
//! relay to talk to, in a thread ([`TestRelay`]) or as the real binary
//! ([`RelayProcess`]), and the clients that talk to it over real TCP: ureq and a raw
//! HTTP/1.1 reader ([`http`]), an SSE reader ([`sse`]), a WHATWG `EventSource` parser
//! ([`whatwg`]), a WebSocket client and a raw-frame one ([`ws`]), the fixtures the
//! tests share ([`fixtures`]), and a real nats-server for the cluster tests ([`nats`]).
//!
//! Every wait is bounded by [`WAIT`] and fails the test with a message; nothing sleeps
//! to synchronise. A test binary uses a part of this, hence unused items and re-exports
//! are allowed.
#![allow(dead_code, unused_imports)]

pub mod fixtures;
pub mod http;
pub mod nats;
pub mod process;
pub mod relay;
pub mod sim;
pub mod sse;
pub mod whatwg;
pub mod ws;

pub use fixtures::*;
pub use http::*;
pub use process::*;
pub use relay::*;
pub use sse::*;
pub use ws::*;

use std::time::Duration;

/// The longest any single wait of a test may take (a read, a start-up, an exit) before
/// the test fails.
pub const WAIT: Duration = Duration::from_secs(15);
