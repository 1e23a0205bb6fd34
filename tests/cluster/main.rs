//! Cluster mode against a real nats-server: the bridge driven as the reactor drives it
//! (`cluster_bridge`), and real relays joined through JetStream (`cluster`). Without
//! `nats-server` the tests skip with a message; under `CI=true` they fail.
//!
//! Run one file's tests by its module path: `cargo test --test cluster cluster_bridge::`.

#[path = "../support/mod.rs"]
mod support;

mod cluster;
mod cluster_bridge;
