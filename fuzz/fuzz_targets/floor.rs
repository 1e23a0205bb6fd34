//! The measuring stick of the core-driving targets' speed (issue 14, evidence item 2),
//! not a bug finder: each input goes whole, in one piece, to one connection of a fresh
//! `Core` (`aep_sim::Sim`), then EOF and every timer; no oracle, no chunking, no
//! determinism re-run. Whatever `http` adds (chunks, pipelining, the reference framer,
//! the response parser, the re-run) costs execs/s against this; no target that drives a
//! fresh core per input can be faster. `fuzz/scripts/speed.sh` runs it beside `http`
//! and `ws`.
//!
//! Invariants asserted: nothing panics, and after EOF and every timer the connection is
//! closed (as `http` 1 and 3).
#![no_main]

use aep_relay::Config;
use aep_relay_fuzz::harness;
use aep_sim::Sim;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut c = harness::timeouts(Config::default());
    c.listen = "127.0.0.1:0".parse().unwrap();
    // As `http`'s configuration.
    c.buffer_per_session = harness::BUFFER;
    c.max_sessions = harness::SESSIONS;
    c.max_body_bytes = 2048;
    c.max_batch_events = 4;
    c.max_from_positions = 4;
    c.max_head_bytes = 1024;
    c.max_output_bytes = 64 * 1024;
    let mut relay = Sim::new(c).expect("config");
    let key = relay.connect(None);
    relay.feed(key, data, true);
    relay.advance(2 * harness::JUMP);
    assert!(
        !relay.is_open(key),
        "connection open after EOF and every timer"
    );
});
