//! The measuring stick of the core-driving targets' speed, not a bug finder: each input
//! goes whole, in one piece, to one connection of a fresh `Core` (`aep_sim::Sim`), then
//! EOF and every timer; no oracle, no chunking, no determinism re-run. Whatever `http`
//! adds (chunks, pipelining, the reference framer, the response parser, the re-run) costs
//! execs/s against this; no target that drives a fresh core per input can be faster.
//! `fuzz/scripts/speed.sh` runs it beside `http` and `ws`.
//!
//! Invariants asserted: nothing panics, and after EOF and every timer the connection is
//! closed (as `http` 1 and 3).
#![no_main]

use aep_relay_fuzz::harness;
use aep_sim::Sim;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut relay = Sim::new(harness::http_config(1024, 2048, 64 * 1024)).expect("config");
    let key = relay.connect(None);
    relay.feed(key, data, true);
    relay.advance(2 * harness::JUMP);
    assert!(
        !relay.is_open(key),
        "connection open after EOF and every timer"
    );
});
