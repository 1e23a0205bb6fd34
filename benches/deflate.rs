//! `deflate`: WebSocket `permessage-deflate` (RFC 7692), as the relay does it
//! (each Event compressed once per capture level, the same bytes for every compressing
//! subscriber, `server_no_context_takeover`) against the per-connection design peers
//! use (one compressor context per subscriber, context takeover).
//!
//! Printed once (no timing, exact): **bytes on the wire**, frame header included, for the
//! golden corpus (`../shared/aep-fixtures/golden/golden.jsonl`, each Event compressed
//! alone) and for the 580-byte benchmark Event (the shape of `aep-load`'s and the
//! `fanout` bench's), plain vs compressed, at levels 1, 6 (the relay's) and 9, and
//! what a per-connection compressor with context takeover gets on the corpus as one
//! stream; and the heap allocations per delivery with compression.
//!
//! Timed (thread CPU time, Throughput: deliveries/s):
//! - `deflate/fanout_1k/{plain,deflate}`: one 580-byte Event ingested in-process
//!   (`aep-sim`, no sockets) and delivered to 1,000 WebSocket subscribers that did not,
//!   or did, negotiate the extension; the in-memory flush of every subscriber included,
//!   as in the `fanout` bench. The ratio of the two is the compression's cost to fan-out.
//! - `deflate/per_connection_1k`: the compression alone of the per-connection design:
//!   the same Event compressed by 1,000 contexts (flate2 on zlib-rs, level 6, 15-bit
//!   window, context takeover, sync flush per message), one per subscriber. Add it to
//!   `fanout_1k/plain` for that design's CPU per delivery.
//! - `deflate/shared_once`: the relay's one compression of that Event (per Event, not
//!   per delivery).

use aep_relay::wire::ws::deflate::{self, Deflater};
use aep_relay::wire::ws::rfc6455::{self, client_frame};
use aep_relay::{Config, ConnId};
use aep_sim::Sim;
use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use flate2::{Compress, Compression, FlushCompress};
use std::time::Duration;

#[path = "support/alloc.rs"]
mod alloc;
mod support;

const SUBSCRIBERS: usize = 1_000;
/// The benchmark Event's size (`benches/compare.sh`'s SIZE, `aep-load --size`).
const SIZE: usize = 580;

/// One WebSocket subscriber on `relay`: the upgrade (offering `permessage-deflate` as
/// browsers do when `offer`), `hello`, and a match-all `subscribe`.
fn ws_subscriber(relay: &mut Sim, offer: bool) -> ConnId {
    let k = relay.connect(None);
    let ext = if offer {
        "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    } else {
        ""
    };
    let req = format!(
        "GET /socket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{ext}\r\n"
    );
    relay.feed(k, req.as_bytes(), false);
    let head = relay.take_output(k).expect("open");
    assert!(head.starts_with(b"HTTP/1.1 101"), "upgrade failed");
    let agreed = head.windows(18).any(|w| w == b"permessage-deflate");
    assert_eq!(agreed, offer, "negotiation");
    let mut frames = Vec::new();
    let hello = br#"{"type":"hello","versions":["0.1"],"role":"consumer"}"#;
    client_frame(0x81, hello, Some([1, 2, 3, 4]), &mut frames);
    client_frame(
        0x81,
        br#"{"type":"subscribe","id":"all"}"#,
        Some([5, 6, 7, 8]),
        &mut frames,
    );
    relay.feed(k, &frames, false);
    let out = relay.take_output(k).expect("hello and subscribed");
    assert!(
        out.windows(10).any(|w| w == b"subscribed"),
        "subscribe failed"
    );
    k
}

struct Bench {
    relay: Sim,
    subs: Vec<ConnId>,
    next: u64,
}

impl Bench {
    fn new(subscribers: usize, offer: bool) -> Bench {
        let mut relay = Sim::new(Config {
            listen: "127.0.0.1:0".parse().expect("addr"),
            ..Config::default()
        })
        .expect("relay");
        let subs = (0..subscribers)
            .map(|_| ws_subscriber(&mut relay, offer))
            .collect();
        Bench {
            relay,
            subs,
            next: 0,
        }
    }

    /// Ingests `n` Events; returns the CPU time of the ingests, the allocations made
    /// there, and the bytes the subscribers received (drained untimed after each).
    fn run(&mut self, n: u64) -> (Duration, usize, usize) {
        let (mut spent, mut allocs, mut wire) = (Duration::ZERO, 0, 0);
        for _ in 0..n {
            self.next += 1;
            let ev = Bytes::from(support::event(self.next, "s_bench", SIZE));
            let a = alloc::allocs();
            let t = support::thread_cpu();
            let accepted = self.relay.ingest(ev);
            spent += support::thread_cpu() - t;
            allocs += alloc::allocs() - a;
            assert_eq!(accepted, Ok(1));
            for &k in &self.subs {
                wire += self.relay.take_output(k).map_or(0, |o| o.len());
            }
        }
        (spent, allocs, wire)
    }
}

/// The relay's frame for `payload` to a compressing subscriber: compressed with RSV1
/// when that is smaller, else the plain frame (RFC 7692 §6).
fn shared_frame(d: &mut Deflater, payload: &[u8]) -> usize {
    match d.message(payload) {
        Some(z) => {
            let mut f = BytesMut::new();
            deflate::write_compressed_text(z, &mut f);
            f.len()
        }
        None => rfc6455::text(payload).len(),
    }
}

/// Bytes a per-connection compressor with context takeover sends for `events` in order
/// (frame headers counted as for the shared frames).
fn stream_bytes(events: &[Vec<u8>], level: u32) -> usize {
    let mut c = Compress::new_with_window_bits(Compression::new(level), false, 15);
    let mut total = 0;
    let mut out = Vec::with_capacity(1 << 16);
    for e in events {
        out.clear();
        let before = c.total_in();
        c.compress_vec(e, &mut out, FlushCompress::Sync)
            .expect("deflate");
        assert_eq!(
            c.total_in() - before,
            e.len() as u64,
            "one call per message"
        );
        let n = out.len() - 4;
        total += n + rfc6455::text(&vec![0; n]).len() - n;
    }
    total
}

fn report_bytes() {
    let mut sets: Vec<(&str, Vec<Vec<u8>>)> = Vec::new();
    if let Some(lines) = support::golden_lines() {
        sets.push(("golden corpus", lines));
    }
    let one = support::event(1, "s_bench", SIZE).into_bytes();
    assert_eq!(one.len(), SIZE);
    sets.push(("580-byte benchmark Event", vec![one]));
    for (name, events) in &sets {
        let plain: usize = events.iter().map(|e| rfc6455::text(e).len()).sum();
        let mut line = format!(
            "deflate/bytes: {name} ({} Events): plain {plain} B on the wire",
            events.len()
        );
        for level in [1, deflate::LEVEL, 9] {
            let mut d = Deflater::new(level);
            let z: usize = events.iter().map(|e| shared_frame(&mut d, e)).sum();
            line += &format!(
                "; shared level {level}: {z} B ({:.1}% fewer)",
                100.0 * (1.0 - z as f64 / plain as f64)
            );
        }
        if events.len() > 1 {
            let s = stream_bytes(events, deflate::LEVEL);
            line += &format!(
                "; per-connection with context takeover, level {}: {s} B ({:.1}% fewer)",
                deflate::LEVEL,
                100.0 * (1.0 - s as f64 / plain as f64)
            );
        }
        println!("{line}");
    }
}

/// Per compression level: the golden corpus's bytes saved and the CPU time of one
/// shared compression per Event, averaged over the corpus (what picks [`deflate::LEVEL`]).
fn report_levels() {
    let Some(lines) = support::golden_lines() else {
        return;
    };
    let plain: usize = lines.iter().map(|e| rfc6455::text(e).len()).sum();
    let rounds = 200;
    let mut line = String::from("deflate/levels (golden corpus, shared):");
    for level in 1..=9 {
        let mut d = Deflater::new(level);
        let z: usize = lines.iter().map(|e| shared_frame(&mut d, e)).sum();
        let t = support::thread_cpu();
        for _ in 0..rounds {
            for e in &lines {
                std::hint::black_box(d.message(e).map(<[u8]>::len));
            }
        }
        let ns = (support::thread_cpu() - t).as_nanos() as f64 / (rounds * lines.len()) as f64;
        line += &format!(
            " {level}: {:.1}% fewer, {:.1} µs/Event;",
            100.0 * (1.0 - z as f64 / plain as f64),
            ns / 1000.0
        );
    }
    println!("{line}");
}

fn report_allocations() {
    let n = 128;
    let mut none = Bench::new(0, true);
    none.run(n);
    let (_, base, _) = none.run(n);
    for offer in [false, true] {
        let mut b = Bench::new(SUBSCRIBERS, offer);
        b.run(n);
        let (_, with, wire) = b.run(n);
        println!(
            "deflate/allocations ({}): {:.5} per delivery; {:.1} B per delivery on the wire",
            if offer { "deflate" } else { "plain" },
            (with as f64 - base as f64) / (n as f64 * SUBSCRIBERS as f64),
            wire as f64 / (n as f64 * SUBSCRIBERS as f64),
        );
    }
}

fn benches(c: &mut Criterion<support::CpuTime>) {
    report_bytes();
    report_levels();
    report_allocations();
    let mut g = c.benchmark_group("deflate");
    g.throughput(Throughput::Elements(SUBSCRIBERS as u64));
    for (name, offer) in [("fanout_1k/plain", false), ("fanout_1k/deflate", true)] {
        let mut b = Bench::new(SUBSCRIBERS, offer);
        b.run(32);
        g.bench_function(name, |bench| bench.iter_custom(|iters| b.run(iters).0));
    }
    // The per-connection design: one context per subscriber, each compressing the Event.
    let mut contexts: Vec<Compress> = (0..SUBSCRIBERS)
        .map(|_| Compress::new_with_window_bits(Compression::new(deflate::LEVEL), false, 15))
        .collect();
    let mut out = Vec::with_capacity(4096);
    let mut n = 0u64;
    g.bench_function("per_connection_1k", |bench| {
        bench.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let ev = support::event(n, "s_bench", SIZE);
                let t = support::thread_cpu();
                for c in &mut contexts {
                    out.clear();
                    c.compress_vec(ev.as_bytes(), &mut out, FlushCompress::Sync)
                        .expect("deflate");
                    std::hint::black_box(&out);
                }
                spent += support::thread_cpu() - t;
            }
            spent
        })
    });
    g.throughput(Throughput::Elements(1));
    let mut d = Deflater::default();
    g.bench_function("shared_once", |bench| {
        bench.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let ev = support::event(n, "s_bench", SIZE);
                let t = support::thread_cpu();
                std::hint::black_box(d.message(ev.as_bytes()).map(<[u8]>::len));
                spent += support::thread_cpu() - t;
            }
            spent
        })
    });
    g.finish();
}

criterion_group! {
    name = deflate_benches;
    config = support::config().sample_size(10);
    targets = benches
}
criterion_main!(deflate_benches);
