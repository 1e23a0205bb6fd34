//! aep-relay: a relay for the Agent Event Protocol (AEP).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod capture;
pub mod envelope;
pub mod fanout;
pub mod filter;
pub mod store;
