//! The modules and the sans-IO core, with no socket: the envelope scanner, filters,
//! capture down-leveling and the replay store against the upstream corpora and reference
//! models, and the core driven by `aep_sim` (in-memory connections, virtual time).
//!
//! One test binary for all of them, so `tests/support` compiles once. Run one file's
//! tests by its module path: `cargo test --test sans_io virtual_time::`.

#[path = "../support/mod.rs"]
mod support;

mod body_read;
mod capabilities;
mod capture_downlevel;
mod capture_fixtures;
mod capture_table;
mod core_cluster;
mod core_publication;
mod envelope_differential;
mod envelope_fixtures;
mod filter_fixtures;
mod fuzz_regressions;
mod memory_conn;
mod metrics_scope;
mod replay_pacing;
mod store_model;
mod virtual_time;
mod ws_backpressure;
