//! `http`: the HTTP ingest binding without sockets.
//!
//! - `http/head/*`: `http::parse_head` of a typical request head, in **MB/s**
//!   (Throughput: bytes) — the `POST /events` head an emitter sends and a
//!   `GET /stream` head with a filter.
//! - `http/ingest/*`: one `POST /events` of 1 000 distinct ~600-byte Events as NDJSON
//!   fed whole to an in-memory connection (`Sim::connect_memory` + `Sim::feed`),
//!   with 0 and with 10 SSE subscribers, in **Events/s** (Throughput: Events). This is
//!   the whole server-side path minus the socket: read into the connection buffer, head,
//!   body, line split, envelope parse of every line, store admission, fan-out and the
//!   flush into the subscribers' in-memory pipes (a memcpy each), and the 202 answer.
//!   Bodies are generated and outputs drained outside the timed region.
//! - `http/replay/*`: `GET /stream?from=all&live=0` over a store of 16 sessions of 1 000
//!   ~600-byte Events, in **Events/s** (Throughput: Events): store pages, the SSE frame
//!   of every Event and the paced refill of the output queue (AEP-0003 §8.4; pages end
//!   at the bound). `read_all`: the consumer's socket takes everything
//!   (the whole replay runs inside one request); `window_64k`: it holds at most 64 KiB
//!   unread, as a socket buffer does, and the consumer reads it out each time, so the
//!   queue refills page by page from where the last page stopped. The request and the
//!   peer's reads are timed; the store is filled outside.

use aep_relay::ConnId;
use aep_sim::Sim;
use std::time::Duration;

use aep_relay::wire::http;
use aep_relay::Config;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

mod support;

const POST_HEAD: &str = "POST /events HTTP/1.1\r\nHost: 127.0.0.1:8787\r\nUser-Agent: aep-emitter/0.1\r\nAEP-Version: 0.1\r\nContent-Type: application/x-ndjson\r\nContent-Length: 614000\r\nAccept: */*\r\n\r\n";
const GET_HEAD: &str = "GET /stream?filter=%7B%22type%22%3A%5B%22attention.*%22%2C%22error.*%22%5D%2C%22severity%22%3A%7B%22gte%22%3A%22notice%22%7D%7D&capture=metadata HTTP/1.1\r\nHost: 127.0.0.1:8787\r\nAccept: text/event-stream\r\nLast-Event-ID: s_8f2c:0:100\r\nCache-Control: no-cache\r\n\r\n";

fn head(c: &mut Criterion<support::CpuTime>) {
    let mut g = c.benchmark_group("http/head");
    for (name, h) in [
        ("post_events", POST_HEAD),
        ("get_stream_filtered", GET_HEAD),
    ] {
        g.throughput(Throughput::Bytes(h.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let parsed = http::parse_head(black_box(h.as_bytes()));
                assert!(matches!(parsed, Ok(Some(_))));
                parsed
            })
        });
    }
    g.finish();
}

const BATCH: usize = 1_000;

fn ingest(c: &mut Criterion<support::CpuTime>) {
    let mut g = c.benchmark_group("http/ingest");
    g.throughput(Throughput::Elements(BATCH as u64));
    for subscribers in [0usize, 10] {
        // Under a memory budget, as the binary always is (its default comes from the
        // host), so the accounting runs; 1 GiB is never reached here.
        let config = Config {
            listen: "127.0.0.1:0".parse().expect("addr"),
            max_memory: Some(aep_relay::config::MemoryBudget::flag(1 << 30)),
            ..Config::default()
        };
        let mut relay = Sim::new(config).expect("relay");
        let subs: Vec<ConnId> = (0..subscribers)
            .map(|_| {
                let k = relay.connect(None);
                relay.feed(k, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", false);
                relay.take_output(k);
                k
            })
            .collect();
        let emitter = relay.connect(None);
        let mut next = 0u64;
        g.bench_function(format!("ndjson_1000x600B_{subscribers}_subscribers"), |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let req = support::post_ndjson(&support::ndjson(next, BATCH, "s_http", 600));
                    next += BATCH as u64;
                    let t = support::thread_cpu();
                    relay.feed(emitter, &req, false);
                    spent += support::thread_cpu() - t;
                    let resp = relay.take_output(emitter).expect("open");
                    assert!(resp.starts_with(b"HTTP/1.1 202"), "ingest refused");
                    for &k in &subs {
                        black_box(relay.take_output(k));
                    }
                }
                spent
            })
        });
    }
    g.finish();
}

const REPLAY_SESSIONS: usize = 16;
const REPLAY_PER_SESSION: usize = 1_000;

fn replay(c: &mut Criterion<support::CpuTime>) {
    let mut g = c.benchmark_group("http/replay");
    let events = REPLAY_SESSIONS * REPLAY_PER_SESSION;
    g.throughput(Throughput::Elements(events as u64));
    let config = Config {
        listen: "127.0.0.1:0".parse().expect("addr"),
        ..Config::default()
    };
    let mut relay = Sim::new(config).expect("relay");
    for s in 0..REPLAY_SESSIONS {
        let body = support::ndjson(0, REPLAY_PER_SESSION, &format!("s_replay{s}"), 600);
        let n = relay.ingest(body.into()).expect("ingest");
        assert_eq!(n, REPLAY_PER_SESSION);
    }
    const REQUEST: &[u8] = b"GET /stream?from=all&live=0 HTTP/1.1\r\nHost: x\r\n\r\n";
    // One replay taken whole, untimed: every Event once, and the bytes a replay is.
    let mut whole = Vec::new();
    replay_into(&mut relay, REQUEST, None, |b| whole.extend_from_slice(b));
    let frames = whole.windows(5).filter(|w| w == b"\nid: ").count();
    assert_eq!(
        frames, events,
        "the replay delivered {frames} of {events} Events"
    );
    for (name, window) in [("read_all", None), ("window_64k", Some(64 * 1024))] {
        g.bench_function(format!("{events}x600B_{name}"), |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let t = support::thread_cpu();
                    let n = replay_into(&mut relay, REQUEST, window, |_| {});
                    spent += support::thread_cpu() - t;
                    assert_eq!(n, whole.len(), "a replay of another length");
                }
                spent
            })
        });
    }
    g.finish();
}

/// Opens a consumer whose socket takes at most `window` bytes unread (`None`: no limit),
/// sends `request` (a stream that ends after its replay) and reads everything written
/// until the relay has shut its side; the peer then closes too. `keep` gets every byte
/// read; returns how many there were.
fn replay_into(
    relay: &mut Sim,
    request: &[u8],
    window: Option<usize>,
    mut keep: impl FnMut(&[u8]),
) -> usize {
    let k = relay.connect(window);
    relay.feed(k, request, false);
    let mut n = 0;
    for _ in 0..10_000_000 {
        let out = relay.take_output(k).expect("open until the peer closes");
        n += out.len();
        keep(black_box(&out));
        if out.is_empty() && relay.is_shut(k) {
            relay.feed(k, b"", true);
            assert!(
                !relay.is_open(k),
                "the relay kept the connection after both sides shut"
            );
            return n;
        }
    }
    panic!("the replay did not end after {n} bytes");
}

criterion_group! {
    name = http_benches;
    config = support::config();
    targets = head, ingest, replay
}
criterion_main!(http_benches);
