//! A counting global allocator: the number of allocations (and reallocations), the bytes
//! they asked for, and the live heap bytes since start, so benches can report allocations
//! per delivery and bytes allocated and held per Event. Each bench binary that includes this module installs it.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering::Relaxed};

pub struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static LIVE: AtomicIsize = AtomicIsize::new(0);
static ASKED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call defers to `System`; the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        ASKED.fetch_add(l.size(), Relaxed);
        LIVE.fetch_add(l.size() as isize, Relaxed);
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        ASKED.fetch_add(l.size(), Relaxed);
        LIVE.fetch_add(l.size() as isize, Relaxed);
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Relaxed);
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        ASKED.fetch_add(n, Relaxed);
        LIVE.fetch_add(n as isize - l.size() as isize, Relaxed);
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations (including reallocations) since start.
pub fn allocs() -> usize {
    ALLOCS.load(Relaxed)
}

/// Bytes asked for since start: the size of every allocation, and the new size of every
/// reallocation (a reallocation may move, so it counts as a new block of that size).
pub fn asked_bytes() -> usize {
    ASKED.load(Relaxed)
}

/// Heap bytes currently allocated.
pub fn live_bytes() -> isize {
    LIVE.load(Relaxed)
}
