//! Memory budget of the replay store (store module docs, "Memory"): for ~600-byte Events
//! the store holds Events in at most 1.25× their raw bytes, not counting each Event's own
//! attribute struct (shared with fan-out). The `Arc` reference counts are charged to the
//! store.
//!
//! Measured with the counting global allocator of `tests/counting`; this file holds one
//! test so nothing else allocates concurrently.

use std::sync::Arc;

use aep_relay::envelope::Scope;
use aep_relay::store::{Admission, Position, Store, Stored};

mod counting;

use counting::live;

/// Raw bytes plus spans into them, like `envelope::Event`.
struct M {
    bytes: Box<[u8]>,
    session: (u32, u32),
    source: (u32, u32),
    id: (u32, u32),
    pos: Option<Position>,
}

impl M {
    fn text(&self, (s, e): (u32, u32)) -> &str {
        std::str::from_utf8(&self.bytes[s as usize..e as usize]).unwrap()
    }
}

impl Stored for M {
    fn session(&self) -> Option<&str> {
        Some(self.text(self.session))
    }
    fn position(&self) -> Option<Position> {
        self.pos
    }
    fn dedupe_key(&self) -> (&str, &str) {
        (self.text(self.source), self.text(self.id))
    }
    fn scope(&self) -> Scope {
        if self.pos.is_some() {
            Scope::Sequenced
        } else {
            Scope::Foreign
        }
    }
    fn byte_len(&self) -> usize {
        self.bytes.len()
    }
}

const RAW: usize = 600;

fn event(session: usize, i: u64, foreign: bool) -> Arc<M> {
    let session = format!("session-{session:04}");
    let source = "aep://host.example/agent/claude-code/session/abc";
    let id = format!("01J{i:023}");
    let mut text = String::new();
    let span = |t: &mut String, v: &str| {
        let s = t.len() as u32;
        t.push_str(v);
        (s, t.len() as u32)
    };
    let session_span = span(&mut text, &session);
    let source_span = span(&mut text, source);
    let id_span = span(&mut text, &id);
    let mut bytes = text.into_bytes();
    bytes.resize(RAW, b' ');
    Arc::new(M {
        bytes: bytes.into_boxed_slice(),
        session: session_span,
        source: source_span,
        id: id_span,
        pos: (!foreign).then_some((0, i)),
    })
}

/// Store overhead per held Event, in bytes, after a churning workload.
fn overhead_per_event(buffer: usize, sessions: usize, admits: u64) -> f64 {
    let before = live();
    let mut st: Store<M> = Store::new(buffer, sessions);
    for i in 0..admits {
        let ev = event(i as usize % sessions, i, i % 5 == 0);
        assert_eq!(st.admit(&ev), Admission::Admitted);
    }
    let after = live();
    let held = st.len();
    assert_eq!(held, buffer * sessions);
    assert_eq!(st.byte_len(), held * RAW);
    // Each held Event's own allocations: its struct (excluded from the budget: it is the
    // Event, shared) and its raw bytes. The Arc counts stay charged to the store.
    let events = held * (std::mem::size_of::<M>() + RAW);
    let overhead = (after - before - events) as f64 / held as f64;
    drop(st);
    // The test harness may allocate a little on other threads meanwhile: allow slack far
    // below one held Event per session, so a real leak still fails.
    let left = live().abs_diff(before);
    assert!(
        left < 16 * 1024,
        "no leak: {left} bytes still live after drop"
    );
    overhead
}

#[test]
fn store_memory_within_budget() {
    for (buffer, sessions, admits) in [(1000, 10, 100_000), (1024, 4, 50_000), (100, 50, 60_000)] {
        let per = overhead_per_event(buffer, sessions, admits);
        let ratio = (RAW as f64 + per) / RAW as f64;
        println!("buffer {buffer} x {sessions} sessions: {per:.1} B/Event overhead, {ratio:.3}x");
        assert!(
            ratio <= 1.25,
            "buffer {buffer}: {per:.1} B/Event overhead = {ratio:.3}x raw"
        );
    }
}
