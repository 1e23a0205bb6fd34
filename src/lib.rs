//! aep-relay: a relay for the Agent Event Protocol (AEP).
//!
//! ```text
//! socket bytes ─► Conn (read buffer)
//!    └─ HTTP POST /events ─► body ─► lines (memchr) ─► Event::parse (scanner: routing
//!                                                      attributes only, `data` skipped)
//!                                                            ▼
//!                     Relay::publish ─► Store::admit (dedupe, (epoch, seq) order, ring)
//!                                    └► Hub::fanout ─► index ─► compiled attr-match
//!                                          ├─ ceiling ≥ capture ─► shared frame
//!                                          └─ lower ceiling ─► capture::downlevel (once)
//!                                                            ▼
//!                     Conn output queue (Bytes, bounded) ─► writev
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod capture;
pub mod config;
pub(crate) mod conn;
pub mod envelope;
pub mod fanout;
pub mod filter;
pub mod history;
pub mod http;
pub mod jsonl;
pub mod relay;
pub mod sse;
pub mod store;
pub(crate) mod transport;

pub use config::Config;
pub use relay::{Refusal, Relay, StartError, StopHandle};
