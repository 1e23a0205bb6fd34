//! Memory budget of the replay store (store module docs, "Memory"): everything a held
//! ~600-byte Event retains (its bytes, its ring entry, its dedupe slot, and its share of
//! the stream's arena chunks) stays within 1.25× its raw bytes, once the admitted Event
//! itself is gone. Nothing of the request it arrived in stays.
//!
//! Measured with the counting global allocator of `tests/counting`, under its lock, so no
//! other test allocates concurrently.

use aep_relay::store::{Admission, Position, Store, Stored};
use aep_relay::wire::envelope::Scope;
use bytes::Bytes;

use crate::counting;

use counting::{live, one_at_a_time};

/// Raw bytes plus spans into them, like `envelope::Event`. The bytes spell `session`,
/// `source`, `id` and the position, separated by U+001F, padded with spaces to [`RAW`].
struct M {
    bytes: Bytes,
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
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    fn reread(bytes: Bytes) -> Option<M> {
        let text = std::str::from_utf8(&bytes).ok()?;
        let mut spans = Vec::new();
        let mut at = 0u32;
        for field in text.split('\u{1f}').take(4) {
            spans.push((at, at + field.len() as u32));
            at += field.len() as u32 + 1;
        }
        let (s, e) = *spans.get(3)?;
        let pos = match &text[s as usize..e as usize] {
            "-" => None,
            p => Some((0, p.parse().ok()?)),
        };
        Some(M {
            session: spans[0],
            source: spans[1],
            id: spans[2],
            pos,
            bytes,
        })
    }
}

const RAW: usize = 600;

fn event(session: usize, i: u64, foreign: bool) -> M {
    let session = format!("session-{session:04}");
    let source = "aep://host.example/agent/claude-code/session/abc";
    let id = format!("01J{i:023}");
    let mut text = String::new();
    let span = |t: &mut String, v: &str| {
        let s = t.len() as u32;
        t.push_str(v);
        (s, t.len() as u32)
    };
    let pos = (!foreign).then_some((0, i));
    let session_span = span(&mut text, &session);
    text.push('\u{1f}');
    let source_span = span(&mut text, source);
    text.push('\u{1f}');
    let id_span = span(&mut text, &id);
    text.push('\u{1f}');
    text.push_str(&pos.map_or("-".to_string(), |(_, s)| s.to_string()));
    text.push('\u{1f}');
    let mut bytes = text.into_bytes();
    bytes.resize(RAW, b' ');
    M {
        bytes: Bytes::from(bytes),
        session: session_span,
        source: source_span,
        id: id_span,
        pos,
    }
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
    // Everything the store retains, beyond the held Events' own bytes (each admitted `M`
    // was dropped after its admission).
    let overhead = (after - before - held * RAW) as f64 / held as f64;
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
    let _one = one_at_a_time();
    for (buffer, sessions, admits) in [(1000, 10, 100_000), (1024, 4, 50_000), (100, 50, 60_000)] {
        let per = overhead_per_event(buffer, sessions, admits);
        let ratio = (RAW as f64 + per) / RAW as f64;
        println!("buffer {buffer} x {sessions} sessions: {per:.1} B/Event retained beyond its bytes, {ratio:.3}x");
        assert!(
            ratio <= 1.25,
            "buffer {buffer}: {per:.1} B/Event retained beyond its bytes = {ratio:.3}x raw"
        );
    }
}
