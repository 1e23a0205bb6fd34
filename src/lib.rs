//! aep-relay: a relay for the Agent Event Protocol (AEP).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod envelope;
