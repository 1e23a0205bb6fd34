//! The relay over real TCP: HTTP ingest, SSE and WebSocket consumers and emitters, TLS,
//! tokens, refusals and operations, each test against a relay in a thread
//! (`support::TestRelay`) or the real binary, with real clients.
//!
//! One test binary for all of them, so `tests/support` compiles once. Run one file's
//! tests by its module path: `cargo test --test wire sse_stream::`.

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod conformance_corpus;
mod grants;
mod http_ingest;
mod jwt;
mod memory_budget;
mod operations;
mod refusals;
mod retention;
mod review_findings;
mod same_name_sessions;
mod shedding;
mod sse_hostile;
mod sse_stream;
mod status_page;
mod storms;
mod tls;
mod ws_control;
mod ws_deflate;
mod ws_hello;
mod ws_liveness;
mod ws_operations;
mod ws_rfc6455;
mod ws_subscribe;
