//! Unit tests for the replay store (AEP-0001 §5.2, §7; AEP-0003 §5, §7).

use super::*;
use std::sync::Arc;

#[path = "stand_in.rs"]
mod stand_in;
use stand_in::{sealed, T};

const OWNER: &str = "aep://h/agent/a/session/s";

/// A sequenced Event at `(epoch, seq)` from the session owner, id `e{epoch}.{seq}`.
fn sq(session: &str, epoch: u64, seq: u64) -> Arc<T> {
    sq_id(session, (epoch, seq), OWNER, &format!("e{epoch}.{seq}"))
}

fn sq_id(session: &str, pos: Position, source: &str, id: &str) -> Arc<T> {
    sealed(T {
        session: Some(session.into()),
        pos: Some(pos),
        source: source.into(),
        id: id.into(),
        scope: Scope::Sequenced,
        debug: false,
        len: 100,
        raw: Vec::new(),
    })
}

/// A foreign Event (no seq) from a consumer, id `name`.
fn fo(session: &str, name: &str) -> Arc<T> {
    sealed(T {
        session: Some(session.into()),
        pos: None,
        source: "aep://h/consumer".into(),
        id: name.into(),
        scope: Scope::Foreign,
        debug: false,
        len: 50,
        raw: Vec::new(),
    })
}

fn agent(id: &str) -> Arc<T> {
    sealed(T {
        session: None,
        pos: None,
        source: OWNER.into(),
        id: id.into(),
        scope: Scope::Agent,
        debug: false,
        len: 10,
        raw: Vec::new(),
    })
}

fn admit(st: &mut Store<T>, ev: Arc<T>) -> Admission {
    let a = st.admit(&ev);
    st.check();
    a
}

fn admit_all(st: &mut Store<T>, evs: impl IntoIterator<Item = Arc<T>>) {
    for ev in evs {
        assert_eq!(admit(st, ev), Admission::Admitted);
    }
}

/// `replay_after` of a name held by one stream, as (ids delivered, marker).
fn after(st: &Store<T>, session: &str, pos: Position) -> (Vec<String>, Option<Position>) {
    let mut got = Vec::new();
    let m = st.replay_after(session, pos, &mut |e| got.push(e.id.clone()));
    assert!(m.len() <= 1, "one stream, at most one marker: {m:?}");
    (got, m.first().map(|x| x.earliest))
}

fn from_start(st: &Store<T>, session: &str) -> Vec<String> {
    let mut got = Vec::new();
    let n = st.replay_session_from_start(session, &mut |e| got.push(e.id.clone()));
    assert_eq!(n, got.len());
    got
}

/// The id of the one stream held under `name`.
fn sid(st: &Store<T>, name: &str) -> StreamId {
    st.session(name).expect("held").id
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// AEP-0001 §5.2: agent.* Events are fanned out live, never buffered.
#[test]
fn agent_scope_is_not_buffered() {
    let mut st: Store<T> = Store::new(10, 10);
    assert_eq!(admit(&mut st, agent("a1")), Admission::NotBuffered);
    assert_eq!(st.len(), 0);
    assert_eq!(st.session_count(), 0);
}

/// Unvalidated input lacking what its scope needs is not buffered, not a panic.
#[test]
fn incomplete_events_are_not_buffered() {
    let mut st: Store<T> = Store::new(10, 10);
    let no_session = sealed(T {
        session: None,
        pos: Some((0, 1)),
        source: OWNER.into(),
        id: "x".into(),
        scope: Scope::Sequenced,
        debug: false,
        len: 1,
        raw: Vec::new(),
    });
    let no_seq = sealed(T {
        session: Some("s".into()),
        pos: None,
        source: OWNER.into(),
        id: "y".into(),
        scope: Scope::Sequenced,
        debug: false,
        len: 1,
        raw: Vec::new(),
    });
    assert_eq!(admit(&mut st, no_session), Admission::NotBuffered);
    assert_eq!(admit(&mut st, no_seq), Admission::NotBuffered);
    assert!(st.is_empty());
}

/// A zero bound buffers nothing.
#[test]
fn zero_bounds_buffer_nothing() {
    let mut st: Store<T> = Store::new(0, 10);
    assert_eq!(admit(&mut st, sq("s", 0, 1)), Admission::NotBuffered);
    let mut st: Store<T> = Store::new(10, 0);
    assert_eq!(admit(&mut st, sq("s", 0, 1)), Admission::NotBuffered);
    assert_eq!(st.session_count(), 0);
}

/// AEP-0001 §7 #2, #3: backfill is ordered by (epoch, seq), lexicographically, like any
/// Event; gaps are legal.
#[test]
fn backfill_is_inserted_in_place() {
    let mut st: Store<T> = Store::new(100, 10);
    admit_all(
        &mut st,
        [
            sq("s", 0, 1),
            sq("s", 0, 2),
            sq("s", 0, 5),
            sq("s", 1, 0),
            sq("s", 0, 3),   // backfill
            sq("s", 0, 9),   // backfill of the old epoch, after (0,5)
            sq("s", 1, 2),   // append
            sq("s", 0, 0),   // backfill at the very front
            sq("s", 1, 1),   // backfill inside the new epoch
            sq("s", 2, 100), // append
        ],
    );
    assert_eq!(
        from_start(&st, "s"),
        strs(&["e0.0", "e0.1", "e0.2", "e0.3", "e0.5", "e0.9", "e1.0", "e1.1", "e1.2", "e2.100"])
    );
    assert_eq!(
        after(&st, "s", (0, 4)),
        (
            strs(&["e0.5", "e0.9", "e1.0", "e1.1", "e1.2", "e2.100"]),
            None
        )
    );
    // A resume position between held positions (a gap) is legal (AEP-0003 §7).
    assert_eq!(
        after(&st, "s", (0, 100)),
        (strs(&["e1.0", "e1.1", "e1.2", "e2.100"]), None)
    );
    let info = st.session("s").unwrap();
    assert_eq!(info.earliest, Some((0, 0)));
    assert_eq!(info.latest, Some((2, 100)));
    assert_eq!(info.high_water, Some((2, 100)));
    assert_eq!(info.evicted_high, None);
}

/// AEP-0001 §7 #4, AEP-0003 §5: buffer admission dedupes on (source, id), not on bare
/// id, and not on position.
#[test]
fn dedupe_on_source_and_id() {
    let mut st: Store<T> = Store::new(100, 10);
    assert_eq!(
        admit(&mut st, sq_id("s", (0, 1), "A", "x")),
        Admission::Admitted
    );
    // Redelivery: same (source, id).
    assert_eq!(
        admit(&mut st, sq_id("s", (0, 1), "A", "x")),
        Admission::Duplicate
    );
    // Same (source, id) claiming another position is still the same Event.
    assert_eq!(
        admit(&mut st, sq_id("s", (0, 2), "A", "x")),
        Admission::Duplicate
    );
    // Another emitter may mint the same id (and is another stream, AEP-0001 §5.2).
    assert_eq!(
        admit(&mut st, sq_id("s", (0, 3), "B", "x")),
        Admission::Admitted
    );
    // Foreign redelivery is a duplicate too (the Event joined both streams of `s`).
    assert_eq!(admit(&mut st, fo("s", "cmd")), Admission::Admitted);
    assert_eq!(st.last_placed().len(), 2);
    assert_eq!(admit(&mut st, fo("s", "cmd")), Admission::Duplicate);
    assert!(st.last_placed().is_empty());
    // Dedupe is per session.
    assert_eq!(
        admit(&mut st, sq_id("t", (0, 1), "A", "x")),
        Admission::Admitted
    );
    assert_eq!(st.len(), 5);
    let per: Vec<_> = st.streams("s").map(|i| (i.source, i.events)).collect();
    assert_eq!(per, [(Some("A"), 2), (Some("B"), 2)]);
}

/// AEP-0001 §7 #2: two different Events at one position are an emitter fault; the first
/// is kept and the second reported as a conflict, not held.
#[test]
fn position_conflict_keeps_first() {
    let mut st: Store<T> = Store::new(100, 10);
    admit_all(&mut st, [sq("s", 0, 1), sq("s", 0, 2), sq("s", 0, 3)]);
    // At the tail (fast path) and in the middle (binary search).
    assert_eq!(
        admit(&mut st, sq_id("s", (0, 3), OWNER, "other3")),
        Admission::Conflict
    );
    assert_eq!(
        admit(&mut st, sq_id("s", (0, 2), OWNER, "other2")),
        Admission::Conflict
    );
    // Not in the dedupe set: resending reports the conflict again.
    assert_eq!(
        admit(&mut st, sq_id("s", (0, 2), OWNER, "other2")),
        Admission::Conflict
    );
    assert_eq!(from_start(&st, "s"), strs(&["e0.1", "e0.2", "e0.3"]));
    // Redelivery of the held Event stays a plain duplicate.
    assert_eq!(admit(&mut st, sq("s", 0, 2)), Admission::Duplicate);
}

/// The ring keeps the newest `buffer_per_session` positions, evicting the lowest, and
/// remembers the highest evicted.
#[test]
fn ring_evicts_lowest_and_tracks_evicted_high() {
    let mut st: Store<T> = Store::new(3, 10);
    admit_all(&mut st, (1..=3).map(|i| sq("s", 0, i)));
    assert_eq!(st.session("s").unwrap().evicted_high, None);
    admit_all(&mut st, [sq("s", 0, 4), sq("s", 0, 5)]);
    assert_eq!(from_start(&st, "s"), strs(&["e0.3", "e0.4", "e0.5"]));
    let info = st.session("s").unwrap();
    assert_eq!(info.evicted_high, Some((0, 2)));
    assert_eq!((info.events, info.bytes), (3, 300));
    assert_eq!((st.len(), st.byte_len()), (3, 300));
    // Backfill above the front evicts the front, lands in place.
    admit_all(&mut st, [sq("s", 0, 10), sq("s", 0, 7)]);
    assert_eq!(from_start(&st, "s"), strs(&["e0.5", "e0.7", "e0.10"]));
    assert_eq!(st.session("s").unwrap().evicted_high, Some((0, 4)));
}

/// AEP-0003 §5: `replay-exhausted` fires exactly when something after the resume position
/// was evicted, never otherwise.
#[test]
fn marker_is_exact() {
    let mut st: Store<T> = Store::new(3, 10);
    admit_all(&mut st, (1..=5).map(|i| sq("s", 0, i))); // holds 3,4,5; evicted 1,2
    let all = strs(&["e0.3", "e0.4", "e0.5"]);
    // Last saw 2 (the highest evicted): nothing missed.
    assert_eq!(after(&st, "s", (0, 2)), (all.clone(), None));
    assert_eq!(after(&st, "s", (0, 3)), (strs(&["e0.4", "e0.5"]), None));
    assert_eq!(after(&st, "s", (0, 5)), (vec![], None));
    assert_eq!(after(&st, "s", (7, 0)), (vec![], None));
    // Last saw 1: missed 2.
    assert_eq!(after(&st, "s", (0, 1)), (all.clone(), Some((0, 3))));
    assert_eq!(after(&st, "s", (0, 0)), (all, Some((0, 3))));

    // With gaps, the exact line is the highest evicted position, not earliest - 1.
    let mut st: Store<T> = Store::new(3, 10);
    admit_all(&mut st, [10, 20, 30, 40].map(|i| sq("g", 0, i))); // evicted 10
    assert_eq!(
        after(&st, "g", (0, 15)),
        (strs(&["e0.20", "e0.30", "e0.40"]), None)
    );
    assert_eq!(after(&st, "g", (0, 10)).1, None);
    assert_eq!(after(&st, "g", (0, 9)).1, Some((0, 20)));
    // Epochs compare first (AEP-0001 §7 #3).
    assert_eq!(after(&st, "g", (1, 0)), (vec![], None));
}

/// A backfill below everything a full ring holds is dropped on arrival, and a resume from
/// below it is told so.
#[test]
fn backfill_below_full_ring_is_dropped_and_marked() {
    let mut st: Store<T> = Store::new(3, 10);
    admit_all(&mut st, [10, 20, 30].map(|i| sq("s", 0, i)));
    assert_eq!(admit(&mut st, sq("s", 0, 5)), Admission::NotBuffered);
    assert_eq!(from_start(&st, "s"), strs(&["e0.10", "e0.20", "e0.30"]));
    assert_eq!(st.session("s").unwrap().evicted_high, Some((0, 5)));
    assert_eq!(after(&st, "s", (0, 4)).1, Some((0, 10)));
    assert_eq!(after(&st, "s", (0, 5)).1, None);
    // A lower drop does not lower evicted_high.
    assert_eq!(admit(&mut st, sq("s", 0, 1)), Admission::NotBuffered);
    assert_eq!(st.session("s").unwrap().evicted_high, Some((0, 5)));
    // A drop does not count as a write for the session LRU.
    let mut st: Store<T> = Store::new(1, 2);
    admit_all(&mut st, [sq("a", 0, 5), sq("b", 0, 5)]);
    assert_eq!(admit(&mut st, sq("a", 0, 1)), Admission::NotBuffered);
    admit_all(&mut st, [sq("c", 0, 1)]);
    assert!(st.session("a").is_none());
}

/// The dedupe set follows eviction: an evicted Event's id is forgotten. A redelivered
/// foreign Event is then admitted again as a new arrival; a redelivered sequenced Event
/// is placed by its position again, below a full ring, so it is dropped.
#[test]
fn dedupe_forgets_evicted_events() {
    let mut st: Store<T> = Store::new(2, 10);
    admit_all(&mut st, [fo("s", "cmd"), sq("s", 0, 1), sq("s", 0, 2)]); // evicts cmd
    assert_eq!(from_start(&st, "s"), strs(&["e0.1", "e0.2"]));
    assert_eq!(admit(&mut st, fo("s", "cmd")), Admission::Admitted); // evicts 0.1
    assert_eq!(from_start(&st, "s"), strs(&["e0.2", "cmd"]));
    assert_eq!(admit(&mut st, sq("s", 0, 1)), Admission::NotBuffered);
    assert_eq!(admit(&mut st, sq("s", 0, 2)), Admission::Duplicate);
    // In a ring that is not full nothing was evicted, so nothing is forgotten.
    let mut st: Store<T> = Store::new(10, 10);
    admit_all(&mut st, [sq("s", 0, 1)]);
    assert_eq!(admit(&mut st, sq("s", 0, 1)), Admission::Duplicate);
}

/// AEP-0001 §5.2: foreign Events (no seq) are kept in arrival order, anchored to the
/// session's high-water position; replay after their anchor includes them.
#[test]
fn foreign_anchoring_and_replay_inclusion() {
    let mut st: Store<T> = Store::new(100, 10);
    admit_all(
        &mut st,
        [
            sq("s", 0, 1),
            sq("s", 0, 2),
            fo("s", "A"), // anchored at 2
            sq("s", 0, 3),
            fo("s", "B"), // anchored at 3
            fo("s", "C"), // anchored at 3, after B
        ],
    );
    assert_eq!(
        from_start(&st, "s"),
        strs(&["e0.1", "e0.2", "A", "e0.3", "B", "C"])
    );
    assert_eq!(
        after(&st, "s", (0, 1)),
        (strs(&["e0.2", "A", "e0.3", "B", "C"]), None)
    );
    // Anchored AT the resume position: included (at-least-once).
    assert_eq!(
        after(&st, "s", (0, 2)),
        (strs(&["A", "e0.3", "B", "C"]), None)
    );
    assert_eq!(after(&st, "s", (0, 3)), (strs(&["B", "C"]), None));
    assert_eq!(after(&st, "s", (0, 4)), (vec![], None));
    let info = st.session("s").unwrap();
    assert_eq!((info.earliest, info.latest), (Some((0, 1)), Some((0, 3))));
}

/// Late backfill relative to foreign Events: below the anchor goes before, above the
/// anchor goes after; the next foreign Event anchors to the new high-water.
#[test]
fn foreign_and_backfill_interleave() {
    let mut st: Store<T> = Store::new(100, 10);
    admit_all(
        &mut st,
        [
            sq("s", 0, 5),
            fo("s", "A"), // anchored at 5
            sq("s", 0, 3),
            sq("s", 0, 7),
            fo("s", "B"), // anchored at 7
            sq("s", 0, 6),
        ],
    );
    assert_eq!(
        from_start(&st, "s"),
        strs(&["e0.3", "e0.5", "A", "e0.6", "e0.7", "B"])
    );
    assert_eq!(after(&st, "s", (0, 5)).0, strs(&["A", "e0.6", "e0.7", "B"]));
    assert_eq!(after(&st, "s", (0, 6)).0, strs(&["e0.7", "B"]));
}

/// A foreign Event in a session with no sequenced Event yet sorts before everything.
#[test]
fn foreign_before_everything() {
    let mut st: Store<T> = Store::new(100, 10);
    admit_all(
        &mut st,
        [fo("s", "F"), fo("s", "G"), sq("s", 0, 0), fo("s", "H")],
    );
    assert_eq!(from_start(&st, "s"), strs(&["F", "G", "e0.0", "H"]));
    assert_eq!(after(&st, "s", (0, 0)), (strs(&["H"]), None));
    let mut st: Store<T> = Store::new(100, 10);
    admit_all(&mut st, [fo("t", "F")]);
    let info = st.session("t").unwrap();
    assert_eq!(
        (info.earliest, info.latest, info.high_water),
        (None, None, None)
    );
    assert_eq!(after(&st, "t", (0, 0)), (vec![], None));
}

/// Evicting a foreign Event anchored at P means a consumer resuming from P (which replay
/// would have redelivered it to) gets a marker; one resuming from above P does not.
#[test]
fn evicted_foreign_marks_its_anchor() {
    let mut st: Store<T> = Store::new(2, 10);
    admit_all(&mut st, [sq("s", 0, 1), fo("s", "A"), sq("s", 0, 2)]); // evicts 1
    assert_eq!(after(&st, "s", (0, 1)), (strs(&["A", "e0.2"]), None));
    admit_all(&mut st, [sq("s", 0, 3)]); // evicts A (anchored at 1)
    let info = st.session("s").unwrap();
    assert_eq!(info.evicted_high, Some((0, 1)));
    assert_eq!(
        after(&st, "s", (0, 1)),
        (strs(&["e0.2", "e0.3"]), Some((0, 2)))
    );
    assert_eq!(after(&st, "s", (0, 2)), (strs(&["e0.3"]), None));
    // Foreign Events anchored before everything, evicted, never mark a position.
    let mut st: Store<T> = Store::new(1, 10);
    admit_all(&mut st, [fo("t", "F"), sq("t", 0, 0)]);
    assert_eq!(st.session("t").unwrap().evicted_high, None);
    assert_eq!(after(&st, "t", (0, 0)), (vec![], None));
}

/// When the highest sequenced Event is evicted and only foreign Events remain, they keep
/// its anchor, and a marker names that anchor as `earliest`.
#[test]
fn foreign_only_buffer_after_eviction() {
    let mut st: Store<T> = Store::new(2, 10);
    admit_all(
        &mut st,
        [sq("s", 0, 1), fo("s", "A"), fo("s", "B"), fo("s", "C")],
    );
    assert_eq!(from_start(&st, "s"), strs(&["B", "C"]));
    let info = st.session("s").unwrap();
    assert_eq!((info.earliest, info.latest), (None, None));
    assert_eq!(info.high_water, Some((0, 1)));
    assert_eq!(after(&st, "s", (0, 1)), (strs(&["B", "C"]), Some((0, 1))));
    assert_eq!(after(&st, "s", (0, 0)), (strs(&["B", "C"]), Some((0, 1))));
    assert_eq!(after(&st, "s", (0, 2)), (vec![], None));
    // A later sequenced Event goes after them.
    admit_all(&mut st, [sq("s", 0, 2)]);
    assert_eq!(from_start(&st, "s"), strs(&["C", "e0.2"]));
}

/// At `max_sessions`, a new session evicts the least-recently-written one entirely.
#[test]
fn session_lru_eviction() {
    let mut st: Store<T> = Store::new(10, 2);
    admit_all(&mut st, [sq("a", 0, 1), sq("b", 0, 1), sq("a", 0, 2)]);
    // b is now least recently written.
    admit_all(&mut st, [sq("c", 0, 1)]);
    assert_eq!(st.session_count(), 2);
    assert!(st.session("b").is_none());
    assert_eq!(after(&st, "b", (0, 0)), (vec![], None));
    assert_eq!(from_start(&st, "b"), Vec::<String>::new());
    assert_eq!((st.len(), st.byte_len()), (3, 300));
    let names: Vec<_> = st.sessions().map(|s| s.name.to_string()).collect();
    assert_eq!(names, ["a", "c"]);
    // Duplicates and conflicts do not count as writes.
    assert_eq!(admit(&mut st, sq("a", 0, 1)), Admission::Duplicate);
    assert_eq!(
        admit(&mut st, sq_id("a", (0, 2), OWNER, "z")),
        Admission::Conflict
    );
    admit_all(&mut st, [sq("d", 0, 1)]);
    assert!(st.session("a").is_none());
    assert_eq!(st.evictions().sessions, 3, "b's one Event, then a's two");
    // Its record remains: a resume of it is owed `replay-exhausted` (AEP-0003 §5).
    let lost: Vec<_> = st.lost("a").map(|l| (l.source, l.high)).collect();
    assert_eq!(lost, [(Some(OWNER), (0, 2))]);
    assert_eq!(st.lost("d").count(), 0, "held, not lost");
    // A re-created session takes the record over: it holds only what came since, and a
    // resume from before what it lost gets the marker.
    admit_all(&mut st, [sq("a", 0, 3)]);
    assert_eq!(st.lost("a").count(), 0);
    assert_eq!(from_start(&st, "a"), strs(&["e0.3"]));
    assert_eq!(st.session("a").unwrap().evicted_high, Some((0, 2)));
    assert_eq!(after(&st, "a", (0, 1)), (strs(&["e0.3"]), Some((0, 3))));
    assert_eq!(after(&st, "a", (0, 2)), (strs(&["e0.3"]), None));
}

/// AEP-0003 §5 replay-all: every held session from its earliest, least-recently-written
/// first, no marker involved.
#[test]
fn replay_all_order() {
    let mut st: Store<T> = Store::new(2, 10);
    admit_all(
        &mut st,
        [
            sq("a", 0, 1),
            sq("b", 0, 1),
            sq("c", 0, 1),
            sq("a", 0, 2),
            sq("b", 0, 2),
            sq("b", 0, 3), // evicts b 0.1
        ],
    );
    let mut got = Vec::new();
    let n = st.replay_all(&mut |e| got.push(format!("{}/{}", e.session.as_deref().unwrap(), e.id)));
    assert_eq!(n, 5);
    assert_eq!(got, ["c/e0.1", "a/e0.1", "a/e0.2", "b/e0.2", "b/e0.3"]);
    let order: Vec<_> = st.sessions().map(|s| s.name).collect();
    assert_eq!(order, ["c", "a", "b"]);
}

/// Metrics introspection: counts and bytes per session and in total, with positions.
#[test]
fn introspection() {
    let mut st: Store<T> = Store::new(3, 10);
    admit_all(
        &mut st,
        [sq("a", 0, 1), fo("a", "F"), sq("b", 1, 7), sq("a", 0, 2)],
    );
    assert_eq!(st.session_count(), 2);
    assert_eq!(st.len(), 4);
    assert_eq!(st.byte_len(), 350);
    let infos: Vec<_> = st.sessions().collect();
    assert_eq!(
        infos,
        [
            SessionInfo {
                id: sid(&st, "b"),
                name: "b",
                source: Some(OWNER),
                agent: None,
                events: 1,
                bytes: 100,
                earliest: Some((1, 7)),
                latest: Some((1, 7)),
                high_water: Some((1, 7)),
                evicted_high: None,
            },
            SessionInfo {
                id: sid(&st, "a"),
                name: "a",
                source: Some(OWNER),
                agent: None,
                events: 3,
                bytes: 250,
                earliest: Some((0, 1)),
                latest: Some((0, 2)),
                high_water: Some((0, 2)),
                evicted_high: None,
            },
        ]
    );
    assert_eq!(st.buffer_per_session(), 3);
    assert_eq!(st.max_sessions(), 10);
}

/// The ring entry stays at a 20-byte key, the 4-byte dedupe hash and 12 bytes saying
/// where its bytes are in the arena; a dedupe slot at 4 bytes (module docs, "Memory").
#[test]
fn entry_is_small() {
    assert_eq!(std::mem::size_of::<Key>(), 20);
    assert_eq!(std::mem::size_of::<Entry>(), 36);
    assert_eq!(std::mem::size_of::<u32>(), 4);
}

/// 100k admits into buffers of 1000 stay bounded: per-session length and capacity, session
/// count, and a dedupe set that mirrors the ring.
#[test]
fn large_counts_stay_bounded() {
    let mut st: Store<T> = Store::new(1000, 10);
    for i in 0..100_000u64 {
        let s = format!("s{}", i % 10);
        let ev = if i % 7 == 0 {
            fo(&s, &format!("f{i}"))
        } else {
            sq(&s, i / 50_000, i)
        };
        assert_eq!(st.admit(&ev), Admission::Admitted);
        if i % 9973 == 0 {
            st.check();
        }
    }
    st.check();
    assert_eq!(st.session_count(), 10);
    assert_eq!(st.len(), 10 * 1000);
    assert!(st.sessions().all(|s| s.events == 1000));
    // Session churn: 10k one-off sessions replace them all, keeping 10.
    for i in 0..10_000u64 {
        assert_eq!(
            st.admit(&sq(&format!("churn{i}"), 0, 1)),
            Admission::Admitted
        );
    }
    st.check();
    assert_eq!((st.session_count(), st.len()), (10, 10));
    assert_eq!(st.byte_len(), 10 * 100);

    // One hot session: exactly the newest 1000 are held.
    let mut st: Store<T> = Store::new(1000, 1);
    for i in 0..100_000u64 {
        st.admit(&sq("hot", 0, i));
    }
    st.check();
    assert_eq!(st.len(), 1000);
    let info = st.session("hot").unwrap();
    assert_eq!(info.earliest, Some((0, 99_000)));
    assert_eq!(info.evicted_high, Some((0, 98_999)));
    assert_eq!(after(&st, "hot", (0, 98_999)).1, None);
    assert_eq!(after(&st, "hot", (0, 98_998)).1, Some((0, 99_000)));
}

/// Pages of any size concatenate to exactly what one `replay_after` returns, foreign
/// Events and backfill included.
#[test]
fn pages_concatenate_to_the_whole_replay() {
    let mut st: Store<T> = Store::new(100, 10);
    admit_all(
        &mut st,
        [
            sq("s", 0, 1),
            fo("s", "f1"),
            sq("s", 0, 3),
            sq("s", 0, 2),
            fo("s", "f2"),
            sq("s", 1, 0),
        ],
    );
    let (whole, marker) = after(&st, "s", (0, 1));
    assert_eq!(marker, None);
    for max in 1..=7 {
        let mut got = Vec::new();
        let mut from = ReplayFrom::After((0, 1));
        loop {
            let page = st
                .replay_page(sid(&st, "s"), from, max, &mut |e| {
                    got.push(e.id.clone());
                    true
                })
                .unwrap();
            assert_eq!(page.marker, None);
            match page.next {
                Some(c) => from = ReplayFrom::Cursor(c),
                None => break,
            }
        }
        assert_eq!(got, whole, "page size {max}");
    }
    let mut all = Vec::new();
    st.replay_page(sid(&st, "s"), ReplayFrom::Start, 100, &mut |e| {
        all.push(e.id.clone());
        true
    });
    assert_eq!(all, from_start(&st, "s"));
    // A stream no longer held answers `None`, even once its slot is reused.
    let mut one: Store<T> = Store::new(4, 1);
    admit_all(&mut one, [sq("gone", 0, 0)]);
    let gone = sid(&one, "gone");
    admit_all(&mut one, [sq("next", 0, 0)]);
    assert!(one.stream(gone).is_none());
    assert!(one
        .replay_page(gone, ReplayFrom::Start, 1, &mut |_| true)
        .is_none());
}

/// A page ends after the Event for which the consumer says its budget is spent, and
/// continues from there: nothing skipped, nothing twice.
#[test]
fn a_page_stops_where_the_consumer_says() {
    let mut st: Store<T> = Store::new(8, 4);
    admit_all(&mut st, (0..6).map(|i| sq("s", 0, i)));
    let mut got = Vec::new();
    let mut from = ReplayFrom::Start;
    let mut pages = 0;
    loop {
        let mut taken = 0;
        let page = st
            .replay_page(sid(&st, "s"), from, 64, &mut |e| {
                got.push(e.id.clone());
                taken += 1;
                taken < 2
            })
            .unwrap();
        pages += 1;
        match page.next {
            Some(c) => from = ReplayFrom::Cursor(c),
            None => break,
        }
    }
    assert_eq!(got, from_start(&st, "s"));
    assert_eq!(pages, 3, "two Events a page");
}

/// When the ring evicts past a paged replay's cursor, the next page carries a marker
/// and continues from the earliest held Event: no gap is ever hidden.
#[test]
fn eviction_overtaking_a_cursor_marks_the_next_page() {
    let mut st: Store<T> = Store::new(4, 10);
    admit_all(&mut st, (0..4).map(|i| sq("s", 0, i)));
    let mut got = Vec::new();
    let page = st
        .replay_page(sid(&st, "s"), ReplayFrom::Start, 1, &mut |e| {
            got.push(e.id.clone());
            true
        })
        .unwrap();
    let cursor = page.next.unwrap();
    admit_all(&mut st, (4..8).map(|i| sq("s", 0, i)));
    let page = st
        .replay_page(sid(&st, "s"), ReplayFrom::Cursor(cursor), 10, &mut |e| {
            got.push(e.id.clone());
            true
        })
        .unwrap();
    assert_eq!(
        page.marker,
        Some((0, 4)),
        "events 1..=3 were evicted unread"
    );
    assert_eq!(page.next, None);
    assert_eq!(got, strs(&["e0.0", "e0.4", "e0.5", "e0.6", "e0.7"]));
}

const ALPHA: &str = "aep://host-c/agent/alpha-agent/session/s_shared";
const BETA: &str = "aep://host-d/agent/beta-agent/session/s_shared";

/// A sequenced Event of `source`'s stream of `session`, id `{source}#{epoch}.{seq}`.
fn of(source: &str, session: &str, seq: u64) -> Arc<T> {
    sq_id(session, (0, seq), source, &format!("{source}#0.{seq}"))
}

/// AEP-0001 §5.2: two emitters carrying one `session` string are two sessions. Both
/// are held, each in its own stream, even at the same position (the golden corpus's
/// `s_shared` pair), and a resume position of the bare name applies to both.
#[test]
fn same_name_from_two_emitters_is_two_streams() {
    let mut st: Store<T> = Store::new(10, 10);
    assert_eq!(
        admit(&mut st, of(ALPHA, "s_shared", 0)),
        Admission::Admitted
    );
    assert_eq!(admit(&mut st, of(BETA, "s_shared", 0)), Admission::Admitted);
    admit_all(&mut st, [of(ALPHA, "s_shared", 1), of(BETA, "s_shared", 1)]);
    assert_eq!(st.session_count(), 2);
    let streams: Vec<_> = st
        .streams("s_shared")
        .map(|i| (i.source, i.events, i.latest))
        .collect();
    assert_eq!(
        streams,
        [
            (Some(ALPHA), 2, Some((0, 1))),
            (Some(BETA), 2, Some((0, 1)))
        ],
        "creation order"
    );
    assert_eq!(
        st.find(BETA, "s_shared"),
        Some(st.streams("s_shared").nth(1).unwrap().id)
    );
    assert_eq!(st.find("aep://nobody", "s_shared"), None);
    let mut got = Vec::new();
    let markers = st.replay_after("s_shared", (0, 0), &mut |e| got.push(e.id.clone()));
    assert!(markers.is_empty());
    assert_eq!(got, [format!("{ALPHA}#0.1"), format!("{BETA}#0.1")]);
    let mut all = Vec::new();
    assert_eq!(st.replay_all(&mut |e| all.push(e.id.clone())), 4);
}

/// AEP-0001 §7 #2: a position conflict is an emitter fault within one stream; the
/// other emitter's stream at that position is untouched.
#[test]
fn a_conflict_is_within_one_stream_only() {
    let mut st: Store<T> = Store::new(10, 10);
    admit_all(&mut st, [of(ALPHA, "s", 3), of(BETA, "s", 3)]);
    assert_eq!(
        admit(&mut st, sq_id("s", (0, 3), ALPHA, "alpha-other")),
        Admission::Conflict
    );
    assert!(st.last_placed().is_empty());
    assert_eq!(
        admit(&mut st, sq_id("s", (0, 3), BETA, "beta-other")),
        Admission::Conflict
    );
    assert_eq!(
        from_start(&st, "s"),
        [format!("{ALPHA}#0.3"), format!("{BETA}#0.3")]
    );
}

/// Ring eviction and `replay-exhausted` are per stream: a busy emitter's evictions
/// never mark (or shorten) the quiet one's replay of the same name.
#[test]
fn ring_eviction_and_markers_are_per_stream() {
    let mut st: Store<T> = Store::new(2, 10);
    admit_all(&mut st, (0..5).map(|q| of(ALPHA, "s", q)));
    admit_all(&mut st, (0..2).map(|q| of(BETA, "s", q)));
    let mut got = Vec::new();
    let markers = st.replay_after("s", (0, 0), &mut |e| got.push(e.id.clone()));
    let alpha = st.find(ALPHA, "s").unwrap();
    assert_eq!(
        markers,
        [Exhausted {
            stream: alpha,
            earliest: (0, 3)
        }]
    );
    assert_eq!(
        got,
        [
            format!("{ALPHA}#0.3"),
            format!("{ALPHA}#0.4"),
            format!("{BETA}#0.1")
        ]
    );
}

/// `max_sessions` counts owning streams: a new stream evicts the least-recently-written
/// stream, which may be one of two sharing a name; the other stays whole.
#[test]
fn session_eviction_counts_streams() {
    let mut st: Store<T> = Store::new(10, 2);
    admit_all(
        &mut st,
        [of(ALPHA, "s", 0), of(BETA, "s", 0), of(ALPHA, "s", 1)],
    );
    admit_all(&mut st, [sq("t", 0, 0)]);
    assert_eq!(st.session_count(), 2);
    let held: Vec<_> = st.sessions().map(|i| (i.name, i.source)).collect();
    assert_eq!(held, [("s", Some(ALPHA)), ("t", Some(OWNER))]);
    // The evicted stream comes back empty of its past, as a new stream.
    admit_all(&mut st, [of(BETA, "s", 1)]);
    let held: Vec<_> = st.sessions().map(|i| (i.name, i.source)).collect();
    assert_eq!(held, [("t", Some(OWNER)), ("s", Some(BETA))]);
}

/// Foreign Events (AEP-0001 §5.2) join every owning stream of their name, anchored at
/// each stream's own high-water, so a resume from a position of any of them delivers
/// the Event when it arrived after that position (at-least-once, AEP-0001 §7 #4).
#[test]
fn foreign_events_join_every_stream_of_their_name() {
    let mut st: Store<T> = Store::new(10, 10);
    admit_all(&mut st, (0..3).map(|q| of(ALPHA, "s", q)));
    admit_all(&mut st, (0..6).map(|q| of(BETA, "s", q)));
    assert_eq!(admit(&mut st, fo("s", "routed")), Admission::Admitted);
    let placed: Vec<_> = st.last_placed().to_vec();
    let ids: Vec<_> = st.streams("s").map(|i| i.id).collect();
    assert_eq!(placed, ids);
    assert_eq!(st.len(), 11, "held once per stream");
    let delivered = |after: u64| {
        let mut got = Vec::new();
        st.replay_after("s", (0, after), &mut |e| got.push(e.id.clone()));
        got.iter().filter(|id| *id == "routed").count()
    };
    // Beta's high-water was 5, alpha's 2: after 4 only beta's copy is due; after 1 both.
    assert_eq!(delivered(5), 1);
    assert_eq!(delivered(4), 1);
    assert_eq!(delivered(2), 2);
    assert_eq!(delivered(1), 2);
    assert_eq!(delivered(6), 0);
    // Whole-store questions see it once per stream; the history asks whether it is held.
    assert!(st.holds(&fo("s", "routed")));
    assert!(!st.holds(&fo("s", "other")));
    assert!(!st.holds(&of(ALPHA, "s", 3)));
    assert!(st.holds(&of(BETA, "s", 5)));
    assert!(
        !st.holds(&sq_id("s", (0, 5), ALPHA, &format!("{BETA}#0.5"))),
        "a sequenced Event is looked for in its own stream only"
    );
}

/// A foreign Event of a name with no owning stream starts a foreign-only stream, which
/// the first owner of that name adopts; a second owner starts a stream of its own.
#[test]
fn a_foreign_only_stream_is_adopted_by_the_first_owner() {
    let mut st: Store<T> = Store::new(10, 10);
    admit_all(&mut st, [fo("s", "early")]);
    let early = st.session("s").unwrap();
    assert_eq!((early.source, early.earliest), (None, None));
    let id = early.id;
    admit_all(&mut st, [of(ALPHA, "s", 0)]);
    assert_eq!(st.session_count(), 1, "adopted, not a new stream");
    assert_eq!(st.stream(id).unwrap().source, Some(ALPHA));
    admit_all(&mut st, [of(BETA, "s", 0), fo("s", "late")]);
    assert_eq!(st.session_count(), 2);
    let per: Vec<_> = st.streams("s").map(|i| (i.source, i.events)).collect();
    assert_eq!(per, [(Some(ALPHA), 3), (Some(BETA), 2)]);
    assert_eq!(
        from_start(&st, "s"),
        [
            "early".to_string(),
            format!("{ALPHA}#0.0"),
            "late".into(),
            format!("{BETA}#0.0"),
            "late".into()
        ]
    );
}

/// A `debug` sequenced Event (a delta of the live view) from the owner, id `d{seq}`.
fn dq(session: &str, epoch: u64, seq: u64) -> Arc<T> {
    sealed(T {
        session: Some(session.into()),
        pos: Some((epoch, seq)),
        source: OWNER.into(),
        id: format!("d{seq}"),
        scope: Scope::Sequenced,
        debug: true,
        len: 100,
        raw: Vec::new(),
    })
}

/// AEP-0007 §5 item 1: a full ring evicts its oldest `debug` Event first, so a durable
/// fact outlives any number of deltas that follow it, and a resume from the fact reaches
/// the next fact with no `replay-exhausted` (only deltas were lost).
#[test]
fn a_fact_outlives_the_deltas_that_follow_it() {
    let mut st: Store<T> = Store::new(8, 4);
    admit_all(&mut st, [sq("s", 0, 1)]);
    for seq in 2..=101 {
        assert_eq!(admit(&mut st, dq("s", 0, seq)), Admission::Admitted);
    }
    admit_all(&mut st, [sq("s", 0, 102)]);
    let held = from_start(&st, "s");
    assert_eq!(held.len(), 8);
    assert_eq!(held[0], "e0.1", "the fact is kept: {held:?}");
    assert_eq!(held[7], "e0.102");
    assert_eq!(st.debug_len(), 6);
    // Resume from the first fact: the held deltas, then the next fact; no marker.
    let (got, marker) = after(&st, "s", (0, 1));
    assert_eq!(got.last().map(String::as_str), Some("e0.102"));
    assert_eq!(marker, None, "only debug Events were evicted");
    assert_eq!(st.evictions().ring, 94, "102 admitted, 8 held");
}

/// A stream full of facts holds no `debug` Event: one arriving is not held (it would
/// be the first evicted), and no fact is evicted for it.
#[test]
fn a_delta_never_displaces_a_fact() {
    let mut st: Store<T> = Store::new(3, 4);
    admit_all(&mut st, [sq("s", 0, 1), sq("s", 0, 2), sq("s", 0, 3)]);
    assert_eq!(admit(&mut st, dq("s", 0, 4)), Admission::NotBuffered);
    assert_eq!(from_start(&st, "s"), strs(&["e0.1", "e0.2", "e0.3"]));
    assert_eq!(
        after(&st, "s", (0, 0)),
        (strs(&["e0.1", "e0.2", "e0.3"]), None)
    );
    // A fact arriving at a full stream of facts evicts the oldest fact, as before.
    admit_all(&mut st, [sq("s", 0, 5)]);
    assert_eq!(
        after(&st, "s", (0, 0)),
        (strs(&["e0.2", "e0.3", "e0.5"]), Some((0, 2)))
    );
}

/// `replay-exhausted` is owed exactly when a durable fact after the position was
/// evicted (AEP-0003 §5); deltas and facts interleave in replay in `(epoch, seq)` order.
#[test]
fn markers_follow_evicted_facts_only() {
    let mut st: Store<T> = Store::new(4, 4);
    admit_all(
        &mut st,
        [sq("s", 0, 1), dq("s", 0, 2), sq("s", 0, 3), dq("s", 0, 4)],
    );
    // Full: two facts arriving evict both deltas.
    admit_all(&mut st, [sq("s", 0, 5), sq("s", 0, 6)]);
    assert_eq!(
        from_start(&st, "s"),
        strs(&["e0.1", "e0.3", "e0.5", "e0.6"])
    );
    assert_eq!(after(&st, "s", (0, 0)).1, None);
    // The next fact evicts the oldest fact.
    admit_all(&mut st, [sq("s", 0, 7)]);
    assert_eq!(after(&st, "s", (0, 0)).1, Some((0, 3)));
    assert_eq!(
        after(&st, "s", (0, 1)).1,
        None,
        "the evicted fact is at (0, 1)"
    );
    // Backfilled deltas sort in place between facts; with room they are held.
    let mut st: Store<T> = Store::new(10, 4);
    admit_all(
        &mut st,
        [sq("s", 0, 1), sq("s", 0, 4), dq("s", 0, 3), dq("s", 0, 2)],
    );
    assert_eq!(from_start(&st, "s"), strs(&["e0.1", "d2", "d3", "e0.4"]));
    assert_eq!(after(&st, "s", (0, 2)).0, strs(&["d3", "e0.4"]));
}

/// A paged replay merges the two lanes and its cursor continues across them.
#[test]
fn pages_merge_facts_and_deltas() {
    let mut st: Store<T> = Store::new(100, 4);
    for seq in 1..=30 {
        let ev = if seq % 3 == 0 {
            sq("s", 0, seq)
        } else {
            dq("s", 0, seq)
        };
        admit_all(&mut st, [ev]);
    }
    let id = sid(&st, "s");
    let mut from = ReplayFrom::After((0, 4));
    let mut got = Vec::new();
    loop {
        let page = st
            .replay_page(id, from, 7, &mut |e| {
                got.push(e.pos.unwrap().1);
                true
            })
            .unwrap();
        match page.next {
            Some(c) => from = ReplayFrom::Cursor(c),
            None => break,
        }
    }
    assert_eq!(got, (5..=30).collect::<Vec<_>>());
}

/// A ring of 4 and one stream: `--buffer 4 --max-sessions 1`, `sA` seq 1-9, then `sB`, then `sA`
/// seq 20. A resume of `sA` after seq 3 gets seq 20 and `replay-exhausted`: the relay
/// held and evicted seq 4-9.
#[test]
fn session_eviction_leaves_a_record() {
    let mut st: Store<T> = Store::new(4, 1);
    for seq in 1..=9 {
        admit_all(&mut st, [sq("sA", 0, seq)]);
    }
    admit_all(&mut st, [sq("sB", 0, 1)]);
    assert_eq!(st.record_count(), 1);
    assert!(st.record_bytes() > 0);
    let lost: Vec<_> = st.lost("sA").map(|l| l.high).collect();
    assert_eq!(lost, [(0, 9)]);
    admit_all(&mut st, [sq("sA", 0, 20)]);
    assert_eq!(after(&st, "sA", (0, 3)), (strs(&["e0.20"]), Some((0, 20))));
    // sB's record: it held a fact at (0, 1).
    assert_eq!(st.lost("sB").map(|l| l.high).collect::<Vec<_>>(), [(0, 1)]);
}

/// A stream that held only deltas leaves no record (nothing it lost is owed a marker);
/// records are bounded, oldest forgotten first.
#[test]
fn records_are_bounded() {
    let mut st: Store<T> = Store::new(2, 1);
    admit_all(&mut st, [dq("d", 0, 1), sq("x", 0, 1)]);
    assert_eq!(st.lost("d").count(), 0);
    for i in 0..MIN_RECORDS + 10 {
        assert_eq!(st.admit(&sq(&format!("n{i}"), 0, 1)), Admission::Admitted);
    }
    st.check();
    assert_eq!(st.record_count(), MIN_RECORDS);
    assert_eq!(st.lost("x").count(), 0, "the oldest record is forgotten");
    assert_eq!(st.lost("n0").count(), 0);
    assert_eq!(st.lost(&format!("n{}", MIN_RECORDS + 8)).count(), 1);
}

/// The memory budget's shed: `debug` Events first (least-recently-written streams
/// first), then the oldest facts of the least-recently-written stream; a stream left
/// empty is evicted and leaves a record, so a resume still gets its marker.
#[test]
fn shed_takes_deltas_first_then_the_oldest_facts() {
    let mut st: Store<T> = Store::new(1000, 10);
    for seq in 1..=200 {
        st.admit(&dq("a", 0, seq));
    }
    for seq in 1..=200 {
        st.admit(&sq("b", 0, seq));
    }
    for seq in 1..=200 {
        st.admit(&sq("c", 0, seq));
        st.admit(&dq("c", 0, 1000 + seq));
    }
    st.check();
    let full = st.memory_bytes();
    assert!(full > 120 * 1000, "{full}");
    // Shed a little: deltas only, a's first (least recently written).
    let first = st.shed_to(full * 9 / 10);
    st.check();
    assert!(st.memory_bytes() <= full * 9 / 10);
    assert_eq!(first.events, first.debug_events, "{first:?}");
    assert!(first.debug_events > 0);
    assert!(
        st.session("a").is_none() || st.session("c").unwrap().events == 400,
        "a's deltas go before c's"
    );
    assert_eq!(st.lost("a").count(), 0, "a held only deltas: no record");
    assert_eq!(st.session("b").unwrap().events, 200);
    // Shed to a quarter: every delta goes before any fact, then b's oldest facts.
    let second = st.shed_to(full / 4);
    st.check();
    assert!(
        st.memory_bytes() <= full / 4,
        "{} > {}",
        st.memory_bytes(),
        full / 4
    );
    assert_eq!(st.debug_len(), 0);
    assert_eq!(first.debug_events + second.debug_events, 400);
    assert!(second.events > second.debug_events);
    let c = st.session("c").unwrap();
    assert_eq!(c.latest, Some((0, 200)), "the newest fact is kept");
    match st.session("b") {
        Some(_) => assert!(after(&st, "b", (0, 0)).1.is_some()),
        None => assert_eq!(st.lost("b").map(|l| l.high).collect::<Vec<_>>(), [(0, 200)]),
    }
    assert_eq!(st.evictions().memory as usize, first.events + second.events);
    // Shed to nothing: everything goes, every fact-holding stream leaves a record.
    st.shed_to(0);
    st.check();
    assert!(st.is_empty());
    assert_eq!(st.memory_bytes(), st.record_bytes());
    assert_eq!(st.lost("c").map(|l| l.high).collect::<Vec<_>>(), [(0, 200)]);
}

/// What the store says it holds follows what it allocates: the count is exact for the
/// arenas and the rings, so it grows with Events and returns to the records alone.
#[test]
fn memory_bytes_tracks_the_heap() {
    let mut st: Store<T> = Store::new(100, 10);
    assert_eq!(st.memory_bytes(), 0);
    for i in 0..10 {
        for seq in 1..=300 {
            st.admit(&sq(&format!("s{i}"), 0, seq));
        }
    }
    let m = st.memory_bytes();
    // 1,000 Events of 100 bytes held; each costs its bytes plus at most ~64 more,
    // chunk slack included.
    assert!((100 * 1000..=180 * 1000).contains(&m), "{m}");
}

/// A name's foreign-only stream adopted by an owner whose earlier stream was evicted
/// whole takes that stream's record over: one marker per stream, naming its earliest
/// held Event, and the record no longer listed as lost.
#[test]
fn an_adopted_stream_takes_its_owners_record_over() {
    let mut st: Store<T> = Store::new(4, 1);
    admit_all(&mut st, [sq("sA", 0, 1), sq("sA", 0, 2), sq("sA", 0, 3)]);
    admit_all(&mut st, [sq("sB", 0, 1)]);
    admit_all(&mut st, [fo("sA", "routed")]);
    assert_eq!(st.lost("sA").count(), 1);
    admit_all(&mut st, [sq("sA", 0, 10)]);
    assert_eq!(st.lost("sA").count(), 0, "held again, not lost");
    assert_eq!(from_start(&st, "sA"), strs(&["routed", "e0.10"]));
    assert_eq!(after(&st, "sA", (0, 0)), (strs(&["e0.10"]), Some((0, 10))));
    assert_eq!(after(&st, "sA", (0, 3)).1, None);
}

/// A shed frees what it evicts: chunks it empties are not kept as spares while it
/// runs, and a lane it empties keeps no chunk, so it evicts no more than it must.
#[test]
fn a_shed_stops_at_its_target() {
    let mut st: Store<T> = Store::new(1000, 100);
    for s in 0..50 {
        for seq in 1..=100 {
            let name = format!("s{s}");
            let ev = if seq % 10 == 0 {
                sq(&name, 0, seq)
            } else {
                dq(&name, 0, seq)
            };
            st.admit(&ev);
        }
    }
    st.check();
    let full = st.memory_bytes();
    let target = full * 7 / 8;
    let shed = st.shed_to(target);
    st.check();
    let now = st.memory_bytes();
    assert!(now <= target, "{now} > {target}");
    assert!(
        now + 16 * 1024 >= target,
        "shed {shed:?}: {now} is far below {target}"
    );
    assert_eq!(shed.events, shed.debug_events);
}
