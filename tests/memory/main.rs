//! Memory and allocation, measured with the counting global allocator of
//! `tests/counting`: what a held Event costs whatever it arrived in (`ingest_memory`),
//! that evicting frees (`store_churn`), the replay store's budget (`store_memory`), and
//! that filter matching allocates nothing (`filter_noalloc`).
//!
//! The allocator counts live bytes across every thread of this process, so every test of
//! this binary measures or allocates under [`counting::one_at_a_time`]: no other test
//! allocates while one measures. The JSONL measure is a binary of its own
//! (`tests/ingest_memory_jsonl.rs`): its follower threads outlive their relay.

#[path = "../counting/mod.rs"]
mod counting;
#[path = "../support/mod.rs"]
mod support;

mod filter_noalloc;
mod ingest_memory;
mod store_churn;
mod store_memory;
