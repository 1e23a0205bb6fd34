//! The byte formats, with no relay state: HTTP/1.1 ([`http`]), the SSE stream's messages
//! ([`sse`]), the WebSocket frames, upgrade, compression and AEP messages ([`ws`]), JSONL
//! lines ([`jsonl`]), and the Event envelope and its scanner ([`envelope`]).
//!
//! Each parses and writes bytes, sans-IO: none holds a connection, a subscription, the
//! store or a clock. They name one another and the leaves below them (`refusal`'s codes,
//! `buf`); the building blocks and the core above name these, never the other way
//! (`.ci/module-cycles.py` fails on a cycle).

pub mod envelope;
pub mod http;
pub mod jsonl;
pub mod sse;
pub mod ws;
