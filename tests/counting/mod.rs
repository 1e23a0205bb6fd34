//! A counting global allocator for memory tests: `live()` is the number of bytes
//! allocated and not yet freed, across every thread of the test process, and
//! `allocs_here()` the number of allocations the calling thread has made. Every test of a
//! binary that uses it runs under [`one_at_a_time`], so no other test allocates while one
//! measures `live()`. It declares the `#[global_allocator]`: a test binary includes this
//! module once (`mod counting;`) and declares no other.
//!
//! Also the measures the held-Event memory tests share (`tests/ingest_memory*.rs`):
//! [`assert_held_at_own_size`] and [`buffered_of_metrics`].
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: defers to `System`; the per-thread counter is a const-initialised thread-local
// `Cell`, which does not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::SeqCst);
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        LIVE.fetch_add(new_size, Ordering::SeqCst);
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Bytes allocated and not freed, process-wide.
pub fn live() -> usize {
    LIVE.load(Ordering::SeqCst)
}

/// Allocations (and reallocations) the calling thread has made: what other threads do
/// does not move it.
pub fn allocs_here() -> usize {
    ALLOCS.with(Cell::get)
}

static ONE: Mutex<()> = Mutex::new(());

/// Serializes the tests of one test binary: each holds the guard for its whole run.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// What one held Event may cost beyond its own bytes, in bytes: the `Event` struct
/// (~370 bytes of scanned spans), its `Arc`, the store's ring entry and dedupe slot, a
/// `Bytes` header, and its session's fixed cost (struct, name, index slot) when every
/// session holds one Event. Far below one megabyte, which is what a pinned body costs.
pub const PER_EVENT_CONSTANT: usize = 2048;

/// Asserts that `events` held Events of `kept` bytes in all (their own bytes) cost at
/// most `kept + events * PER_EVENT_CONSTANT + slack` bytes live since `before` (a
/// [`live`] reading); `slack` is what the path may keep besides (buffers, threads).
/// Prints the measure first, `what` saying where the Events came from ("held from padded
/// JSONL lines"). Reads [`live`] before allocating anything.
pub fn assert_held_at_own_size(
    what: &str,
    before: usize,
    kept: usize,
    events: usize,
    slack: usize,
) {
    let grown = live().saturating_sub(before);
    let per_event = grown as f64 / events as f64;
    println!("{events} Events {what}: {grown} bytes live, {per_event:.0} B/Event ({kept} bytes of Events)");
    assert!(
        grown <= kept + events * PER_EVENT_CONSTANT + slack,
        "{events} held Events keep {grown} bytes allocated ({per_event:.0} per Event) for {kept} bytes of Events"
    );
}

/// `aep_buffered_bytes` and `aep_buffered_events` (AEP-0003 §5: what the replay buffers
/// hold, in bytes and Events) of a `GET /metrics` answer `metrics` (head and body, or
/// the body alone). Panics naming the metric when one is missing.
pub fn buffered_of_metrics(metrics: &str) -> (usize, usize) {
    let value = |name: &str| -> usize {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
            .parse::<f64>()
            .unwrap() as usize
    };
    (value("aep_buffered_bytes"), value("aep_buffered_events"))
}
