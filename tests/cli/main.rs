//! The real `aep-relay` binary as a process: its commands (`--help`, `validate`, `tail`,
//! `check`), and what only a process shows (durable history across a SIGKILL, JSONL from
//! stdin and files, `/metrics` scraped by a real Prometheus).
//!
//! One test binary for all of them, so `tests/support` compiles once. Run one file's
//! tests by its module path: `cargo test --test cli tail_cmd::`.

#[path = "../support/mod.rs"]
mod support;

mod cli_help;
mod conformance_check;
mod connections;
mod history_restart;
mod jsonl_ingest;
mod jwt_reload;
mod memory_cgroup;
mod prometheus;
mod tail_cmd;
mod tokens_reload;
mod validate_cmd;
