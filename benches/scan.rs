//! `scan`: the envelope scanner's throughput, in **MB/s** (groups `*/bytes`) and
//! **Events/s** (groups `*/events`), on the golden corpus (64 Events, ~24 KB), on the
//! AEP-0001 §5.3 worked example, and on 64 generated Events of 580 bytes and of 4 KiB
//! (`support::event`: the load tool's shape, routing attributes plus one extension, the
//! rest ASCII free text in `data`), next to `serde_json::from_slice::<Value>` and
//! simd-json's borrowed parse of the same bytes in the same run.
//!
//! - `event_parse`: `Event::parse`, what every ingest path calls (scan + envelope
//!   validation); `event_scan`: `Event::scan` alone (JSON validation + attribute spans).
//! - `serde_value`: builds a full `serde_json::Value` DOM (what a relay that parses
//!   Events would do).
//! - `simd_borrowed`: `simd_json::to_borrowed_value_with_buffers`; simd-json rewrites
//!   its input in place, so each iteration first copies the Event into a reused
//!   buffer (a memcpy of the Event, included in its time; its scratch buffers are reused).
//!
//! Each line is a pre-split `Bytes` slice (as the NDJSON ingest path hands it over), so
//! line splitting is not measured.

use aep_relay::wire::envelope::Event;
use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

mod support;

fn run(c: &mut Criterion<support::CpuTime>, name: &str, lines: &[Vec<u8>]) {
    let total: usize = lines.iter().map(Vec::len).sum();
    let shared: Vec<Bytes> = lines.iter().map(|l| Bytes::from(l.clone())).collect();
    for l in &shared {
        if let Err(e) = Event::parse(l.clone()) {
            panic!("{name}: the corpus holds an invalid Event: {e}");
        }
    }
    let longest = lines.iter().map(Vec::len).max().unwrap_or(0);
    for (unit, tp) in [
        ("bytes", Throughput::Bytes(total as u64)),
        ("events", Throughput::Elements(lines.len() as u64)),
    ] {
        let mut g = c.benchmark_group(format!("scan/{name}/{unit}"));
        g.throughput(tp);
        g.bench_function("event_parse", |b| {
            b.iter(|| {
                for l in &shared {
                    black_box(Event::parse(l.clone()).is_ok());
                }
            })
        });
        g.bench_function("event_scan", |b| {
            b.iter(|| {
                for l in &shared {
                    black_box(Event::scan(l.clone()).is_ok());
                }
            })
        });
        g.bench_function("serde_value", |b| {
            b.iter(|| {
                for l in lines {
                    let v = serde_json::from_slice::<serde_json::Value>(l);
                    black_box(v.is_ok());
                }
            })
        });
        g.bench_function("simd_borrowed", |b| {
            let mut buf = Vec::with_capacity(longest);
            let mut scratch = simd_json::Buffers::new(longest);
            b.iter(|| {
                for l in lines {
                    buf.clear();
                    buf.extend_from_slice(l);
                    let v = simd_json::to_borrowed_value_with_buffers(&mut buf, &mut scratch);
                    black_box(v.is_ok());
                }
            })
        });
        g.finish();
    }
}

fn benches(c: &mut Criterion<support::CpuTime>) {
    if let Some(lines) = support::golden_lines() {
        run(c, "golden", &lines);
    }
    run(
        c,
        "worked_example",
        &[support::WORKED_EXAMPLE.as_bytes().to_vec()],
    );
    for (name, size) in [("event_580b", 580), ("event_4kib", 4096)] {
        let lines: Vec<Vec<u8>> = (0..64)
            .map(|n| support::event(n, "s_8f2c", size).into_bytes())
            .collect();
        run(c, name, &lines);
    }
}

criterion_group! {
    name = scan;
    config = support::config();
    targets = benches
}
criterion_main!(scan);
