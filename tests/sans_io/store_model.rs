//! Differential test of the replay store against a naive reference model
//! (`src/store/model.rs`; AEP-0001 §5.2, §7; AEP-0003 §5, §7; AEP-0007 §5).

use aep_relay::store::Store;

#[path = "../../src/store/model.rs"]
mod model;
#[path = "../../src/store/stand_in.rs"]
mod stand_in;
use model::{compare, random_event, Draw, Model};
use stand_in::T;

struct Rng(u64);

impl Draw for Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The store and the naive model agree on every admission, every replay and every
/// marker over random workloads with two emitters sharing session names, backfill,
/// redelivery, conflicts, foreign Events, `debug` and other Events, ring eviction,
/// stream eviction with its records, and sheds for the memory budget.
#[test]
fn store_matches_naive_model() {
    for seed in 1..=300u64 {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let cap = 1 + r.below(8) as usize;
        let max = 1 + r.below(4) as usize;
        let mut st: Store<T> = Store::new(cap, max);
        let mut m = Model::new(cap, max);
        let mut serial = 0;
        for step in 0..400 {
            if r.below(40) == 0 {
                let target = st.memory_bytes() * r.below(4) as usize / 4;
                let shed = st.shed_to(target);
                assert!(st.memory_bytes() <= target || st.is_empty());
                m.shed(shed);
                compare(
                    &st,
                    &m,
                    &format!("seed {seed} step {step}: shed to {target}"),
                );
                continue;
            }
            let ev = random_event(&mut r, &mut serial);
            let ctx = format!("seed {seed} step {step} cap {cap} max {max} ev {ev:?}");
            let (a, b) = (st.admit(&ev), m.admit(&ev));
            assert_eq!(a, b, "{ctx}: admission");
            if step % 10 == 0 || step == 399 {
                compare(&st, &m, &ctx);
            }
        }
    }
}
