//! `store`: the replay store (AEP-0003 §5, §7), in **ns per Event** (Throughput:
//! Events/s), and its memory per held Event (printed once, from a counting allocator).
//!
//! - `store/admit/one_session`: `Store::admit` of distinct ~600-byte Events with rising
//!   `seq` into one session whose 10 000-Event ring is full (every admission evicts:
//!   the steady state). `store/admit/100_sessions`: the same, round-robin over 100
//!   sessions of 1 000. Events are parsed outside the timed region, 4 096 at a time.
//! - `store/hostile_ids/{plain,colliding}`: 10 000 Events admitted into an empty store
//!   of one 10 000-Event session, ids `01JX…{n}` against ids that all collide under a
//!   weak unkeyed string hash (`h = 31h + c`, the classic hash-flooding set: each id is
//!   14 blocks of `Aa` or `BB`). The store's keyed hash must make both cost the same
//!   (the bound: a hostile id set slows admission by less than 2x).
//! - `store/replay/after_5000`: `Store::replay_after` from the middle of a full
//!   10 000-Event session (5 000 Events delivered to a callback that counts them; each is
//!   read back from a copy of its bytes, `Stored::reread`).
//! - `store/replay/all_100x1000`: `Store::replay_all` over 100 sessions of 1 000.
//! - Memory: heap the store retains per Event once 10 000 Events sit in it (its copy of
//!   their bytes in the stream's arena, ring entries, dedupe slots), against their raw
//!   bytes; and, for comparison, what one admitted (scanned) Event costs outside it.

use std::sync::Arc;
use std::time::Duration;

use aep_relay::store::{Admission, Store};
use aep_relay::wire::envelope::Event;
use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

#[path = "support/alloc.rs"]
mod alloc;
mod support;

const SIZE: usize = 600;

/// An Event whose buffer is exactly its bytes (as a slice of a request body is).
fn parse(n: u64, session: &str) -> Arc<Event> {
    let bytes = Bytes::copy_from_slice(support::event(n, session, SIZE).as_bytes());
    Arc::new(Event::parse(bytes).expect("valid"))
}

struct Feed {
    sessions: Vec<String>,
    next: u64,
}

impl Feed {
    fn new(sessions: usize) -> Feed {
        Feed {
            sessions: (0..sessions).map(|s| format!("s_{s}")).collect(),
            next: 0,
        }
    }
    fn chunk(&mut self, n: usize) -> Vec<Arc<Event>> {
        (0..n)
            .map(|_| {
                self.next += 1;
                let s = &self.sessions[self.next as usize % self.sessions.len()];
                parse(self.next, s)
            })
            .collect()
    }
}

fn filled(buffer: usize, sessions: usize) -> (Store<Event>, Feed) {
    let mut store: Store<Event> = Store::new(buffer, sessions.max(1));
    let mut feed = Feed::new(sessions);
    for ev in feed.chunk(buffer * sessions) {
        assert_eq!(store.admit(&ev), Admission::Admitted);
    }
    (store, feed)
}

fn report_memory() {
    const N: usize = 10_000;
    let mut feed = Feed::new(1);
    let before_events = alloc::live_bytes();
    let events = feed.chunk(N);
    let events_heap = alloc::live_bytes() - before_events;
    let raw: usize = events.iter().map(|e| e.bytes().len()).sum();
    let before = alloc::live_bytes();
    let mut store: Store<Event> = Store::new(N, 1);
    for e in &events {
        store.admit(e);
    }
    let store_heap = alloc::live_bytes() - before;
    // The store keeps its own copy of each held Event's bytes (its arena), so what it
    // retains is independent of the admitted Events, which the caller may drop.
    println!(
        "store/memory: {N} Events of {} raw bytes each; the store retains {:.1} B/Event \
         ({:.1} B beyond the bytes, {:.3}x raw); an admitted Event outside it \
         {:.1} B (size_of::<Event>() = {})",
        raw / N,
        store_heap as f64 / N as f64,
        (store_heap as f64 - raw as f64) / N as f64,
        store_heap as f64 / raw as f64,
        events_heap as f64 / N as f64,
        std::mem::size_of::<Event>(),
    );
    black_box(store);
}

fn admit(c: &mut Criterion<support::CpuTime>) {
    report_memory();
    let mut g = c.benchmark_group("store/admit");
    g.throughput(Throughput::Elements(1));
    for (name, buffer, sessions) in [("one_session", 10_000, 1), ("100_sessions", 1_000, 100)] {
        let (mut store, mut feed) = filled(buffer, sessions);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let chunk = feed.chunk(left.min(4096));
                    left -= chunk.len();
                    let t = support::thread_cpu();
                    for ev in &chunk {
                        black_box(store.admit(ev));
                    }
                    spent += support::thread_cpu() - t;
                }
                spent
            })
        });
    }
    g.finish();
}

/// Id `n` of the hash-flooding set: 14 blocks, `Aa` or `BB` by the bits of `n`. Every
/// such id has the same `h = 31h + c` hash ("Aa" and "BB" do, and the hash composes).
fn colliding_id(n: u64) -> String {
    (0..14)
        .map(|bit| if n >> bit & 1 == 1 { "BB" } else { "Aa" })
        .collect()
}

/// A ~600-byte Event of session `s_h` at `seq` `n` with id `id`.
fn with_id(n: u64, id: &str) -> Arc<Event> {
    let text = support::event(n, "s_h", SIZE).replacen(&format!("01JXBENCH{n:016}"), id, 1);
    Arc::new(Event::parse(Bytes::from(text)).expect("valid"))
}

fn hostile_ids(c: &mut Criterion<support::CpuTime>) {
    const N: u64 = 10_000;
    let java = |s: &str| {
        s.bytes()
            .fold(0u32, |h, c| h.wrapping_mul(31).wrapping_add(u32::from(c)))
    };
    assert_eq!(
        java(&colliding_id(0)),
        java(&colliding_id(N - 1)),
        "the set collides"
    );
    let mut g = c.benchmark_group("store/hostile_ids");
    g.throughput(Throughput::Elements(N));
    for (name, id) in [
        (
            "plain",
            (|n: u64| format!("01JXBENCH{n:014}")) as fn(u64) -> String,
        ),
        ("colliding", colliding_id),
    ] {
        let events: Vec<Arc<Event>> = (0..N).map(|n| with_id(n, &id(n))).collect();
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let mut store: Store<Event> = Store::new(N as usize, 1);
                    let t = support::thread_cpu();
                    for ev in &events {
                        assert_eq!(store.admit(ev), Admission::Admitted);
                    }
                    spent += support::thread_cpu() - t;
                    black_box(store);
                }
                spent
            })
        });
    }
    g.finish();
}

fn replay(c: &mut Criterion<support::CpuTime>) {
    let mut g = c.benchmark_group("store/replay");
    let (store, _) = filled(10_000, 1);
    g.throughput(Throughput::Elements(5_000));
    g.bench_function("after_5000", |b| {
        b.iter(|| {
            let mut n = 0usize;
            store.replay_after("s_0", (0, 5_000), &mut |_| n += 1);
            assert_eq!(n, 5_000);
            n
        })
    });
    let (store, _) = filled(1_000, 100);
    g.throughput(Throughput::Elements(100_000));
    g.bench_function("all_100x1000", |b| {
        b.iter(|| {
            let mut n = 0usize;
            store.replay_all(&mut |_| n += 1);
            n
        })
    });
    g.finish();
}

criterion_group! {
    name = store;
    config = support::config();
    targets = admit, hostile_ids, replay
}
criterion_main!(store);
