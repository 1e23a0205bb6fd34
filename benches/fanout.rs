//! `fanout`: one Event delivered in-process (no sockets) to 10 000 SSE subscribers, in
//! **ns per delivery** (Throughput: deliveries/s), and **heap allocations per delivery**
//! (printed once, counted by a counting global allocator).
//!
//! Each subscriber is an in-memory connection (`Sim::connect_memory`) that sent
//! `GET /stream` with no filter. One iteration is `Sim::ingest` of one distinct
//! ~600-byte Event: envelope parse, replay-store admission, index lookup, one shared SSE
//! frame built once, 10 000 queue pushes, and the flush of every subscriber. The flush
//! writes into the in-memory pipe, i.e. a `memcpy` of the ~700-byte frame per subscriber
//! where TCP would make one `writev` syscall (a documented mock-stream cost: the real
//! per-delivery cost over sockets is measured by `aep-load`). After every Event the
//! subscribers' output is taken, outside the timed region.
//!
//! Allocations per delivery = (allocations of ingesting Events with 10 000 subscribers −
//! allocations of the same ingest with none) / 10 000. The in-memory pipe keeps its
//! buffer's capacity across `take_output`, so in steady state it allocates nothing.

use aep_relay::ConnId;
use aep_sim::Sim;
use std::time::Duration;

use aep_relay::Config;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

#[path = "support/alloc.rs"]
mod alloc;
mod support;

const SUBSCRIBERS: usize = 10_000;
const SIZE: usize = 600;

fn relay() -> Sim {
    let c = Config {
        listen: "127.0.0.1:0".parse().expect("addr"),
        ..Config::default()
    };
    Sim::new(c).expect("relay")
}

fn subscribe(relay: &mut Sim, n: usize, query: &str) -> Vec<ConnId> {
    let req = format!("GET /stream{query} HTTP/1.1\r\nHost: x\r\n\r\n");
    (0..n)
        .map(|_| {
            let k = relay.connect(None);
            relay.feed(k, req.as_bytes(), false);
            let head = relay.take_output(k).expect("open");
            assert!(head.starts_with(b"HTTP/1.1 200"), "subscribe failed");
            k
        })
        .collect()
}

fn drain(relay: &mut Sim, subs: &[ConnId]) -> usize {
    subs.iter()
        .map(|&k| relay.take_output(k).map_or(0, |o| o.len()))
        .sum()
}

struct Bench {
    relay: Sim,
    subs: Vec<ConnId>,
    next: u64,
}

impl Bench {
    fn new(subscribers: usize, query: &str) -> Bench {
        let mut relay = relay();
        let subs = subscribe(&mut relay, subscribers, query);
        Bench {
            relay,
            subs,
            next: 0,
        }
    }

    fn event(&mut self) -> Bytes {
        self.next += 1;
        Bytes::from(support::event(self.next, "s_bench", SIZE))
    }

    /// Ingests `n` Events, returning the CPU time spent in `ingest` and the allocations
    /// made there; subscribers are drained after each Event, untimed and uncounted.
    fn run(&mut self, n: u64) -> (Duration, usize) {
        let mut spent = Duration::ZERO;
        let mut allocs = 0;
        for _ in 0..n {
            let ev = self.event();
            let a = alloc::allocs();
            let t = support::thread_cpu();
            let accepted = self.relay.ingest(ev);
            spent += support::thread_cpu() - t;
            allocs += alloc::allocs() - a;
            assert_eq!(accepted, Ok(1));
            drain(&mut self.relay, &self.subs);
        }
        (spent, allocs)
    }
}

fn report_allocations() {
    let n = 256;
    let mut none = Bench::new(0, "");
    none.run(n); // warm: store ring, hash sets
    let (_, base) = none.run(n);
    let mut many = Bench::new(SUBSCRIBERS, "");
    many.run(n); // warm: queues and pipes reach their steady capacity
    drain(&mut many.relay, &many.subs);
    let (_, with) = many.run(n);
    let extra = with as f64 - base as f64;
    println!(
        "fanout/allocations: {:.2} per Event with no subscriber, {:.2} per Event with {SUBSCRIBERS}; \
         {:.5} per delivery ({} deliveries)",
        base as f64 / n as f64,
        with as f64 / n as f64,
        extra / (n as f64 * SUBSCRIBERS as f64),
        n as usize * SUBSCRIBERS,
    );
}

fn benches(c: &mut Criterion<support::CpuTime>) {
    report_allocations();
    let mut g = c.benchmark_group("fanout");
    g.throughput(Throughput::Elements(SUBSCRIBERS as u64));
    for (name, query) in [
        ("sse_10k_match_all", ""),
        (
            "sse_10k_session_filter",
            "?filter=%7B%22session%22%3A%22s_bench%22%7D",
        ),
        ("sse_10k_ceiling_none", "?capture=none"),
    ] {
        let mut b = Bench::new(SUBSCRIBERS, query);
        b.run(64);
        g.bench_function(name, |bench| bench.iter_custom(|iters| b.run(iters).0));
    }
    g.finish();
}

criterion_group! {
    name = fanout;
    config = support::config().sample_size(10);
    targets = benches
}
criterion_main!(fanout);
