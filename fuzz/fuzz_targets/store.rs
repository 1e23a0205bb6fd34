//! The replay store against its naive reference model (`src/store/model.rs`), with the
//! order of admissions, evictions, sheds and resumes chosen by the input.
//!
//! Invariants asserted (AEP-0003 §5, AEP-0007 §5): every admission answers as the model
//! does; no fact is evicted while a `debug` Event is held in the same stream (the model
//! evicts so, and the two must agree on what is held); a shed for the memory budget
//! evicts every `debug` Event before any fact and brings `memory_bytes` to its target;
//! every resume delivers what the model holds after the position, and `replay-exhausted`
//! appears exactly when an evicted fact is owed, including for streams evicted whole
//! (their records).
#![no_main]

use aep_relay::store::Store;
use libfuzzer_sys::fuzz_target;

#[path = "../../src/store/stand_in.rs"]
mod stand_in;
#[path = "../../src/store/model.rs"]
mod model;
use model::{compare, random_event, Draw, Model};

// Every admission and shed is checked as it happens; the full comparison (every resume
// of every name at a grid of positions) runs once per input, at its end: a shorter
// input is another input's intermediate state.
use stand_in::T;

/// The input as a source of numbers: one byte each (two for a larger range), zeros
/// once it is spent.
struct Input<'a>(&'a [u8]);

impl Draw for Input<'_> {
    fn below(&mut self, n: u64) -> u64 {
        let take = if n > 256 { 2 } else { 1 };
        let mut v = 0u64;
        for _ in 0..take {
            let (b, rest) = self.0.split_first().unwrap_or((&0, &[]));
            v = (v << 8) | u64::from(*b);
            self.0 = rest;
        }
        v % n
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Input(data);
    let cap = 1 + r.below(8) as usize;
    let max = 1 + r.below(4) as usize;
    let mut st: Store<T> = Store::new(cap, max);
    let mut m = Model::new(cap, max);
    let mut serial = 0;
    let mut step = 0;
    while !r.0.is_empty() && step < 300 {
        step += 1;
        if r.below(16) == 0 {
            let target = st.memory_bytes() * r.below(4) as usize / 4;
            let shed = st.shed_to(target);
            assert!(st.memory_bytes() <= target || st.is_empty(), "shed short");
            if shed.events > shed.debug_events {
                assert_eq!(st.debug_len(), 0, "a fact shed while a debug Event is held");
            }
            m.shed(shed);
        } else {
            let ev = random_event(&mut r, &mut serial);
            assert_eq!(st.admit(&ev), m.admit(&ev), "admission of {ev:?}");
        }
    }
    compare(&st, &m, "end");
});
