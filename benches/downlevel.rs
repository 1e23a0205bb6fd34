//! `downlevel`: capture down-leveling at the fan-out hop (AEP-0003 §6.4, AEP-0001 §8.2),
//! in **µs per Event** (Throughput: Events/s).
//!
//! `capture::downlevel(ev, ceiling)` for every golden-corpus Event whose `capture` is
//! above the ceiling (23 `redacted` Events toward `metadata`; 46 `metadata`/`redacted`
//! Events toward `none`), and for the AEP-0001 §5.3 worked example toward `none`. This
//! is the one place the relay parses and re-serializes an Event; fan-out does it at most
//! once per Event and level and shares the result. `passthrough` is the check alone for
//! Events at or below the ceiling (no parse: it reads the scanned `capture`).

use aep_relay::capture;
use aep_relay::wire::envelope::{Capture, Event};
use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

mod support;

fn bench_set(c: &mut Criterion<support::CpuTime>, name: &str, events: &[Event], ceiling: Capture) {
    let above: Vec<&Event> = events.iter().filter(|e| e.capture() > ceiling).collect();
    if above.is_empty() {
        return;
    }
    let bytes: usize = above.iter().map(|e| e.bytes().len()).sum();
    let mut g = c.benchmark_group(format!("downlevel/{name}"));
    g.throughput(Throughput::Elements(above.len() as u64));
    g.bench_function(format!("to_{}_{bytes}B", ceiling.as_str()), |b| {
        b.iter(|| {
            for e in &above {
                black_box(capture::downlevel(e, ceiling));
            }
        })
    });
    g.finish();
}

fn benches(c: &mut Criterion<support::CpuTime>) {
    let parse = |l: &[u8]| Event::parse(Bytes::copy_from_slice(l)).expect("valid Event");
    if let Some(lines) = support::golden_lines() {
        let events: Vec<Event> = lines.iter().map(|l| parse(l)).collect();
        bench_set(c, "golden", &events, Capture::Metadata);
        bench_set(c, "golden", &events, Capture::None);
        let mut g = c.benchmark_group("downlevel/golden");
        g.throughput(Throughput::Elements(events.len() as u64));
        g.bench_function("passthrough_full_ceiling", |b| {
            b.iter(|| {
                for e in &events {
                    black_box(capture::downlevel(e, Capture::Full));
                }
            })
        });
        g.finish();
    }
    let worked = [parse(support::WORKED_EXAMPLE.as_bytes())];
    bench_set(c, "worked_example", &worked, Capture::None);
}

criterion_group! {
    name = downlevel;
    config = support::config();
    targets = benches
}
criterion_main!(downlevel);
