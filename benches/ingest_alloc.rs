//! `ingest_alloc`: what ingest allocates per admitted Event, and what a held Event keeps
//! allocated (the targets: no per-Event allocation in the request path, bytes retained
//! per held Event ≤ its size + 64). Counted with the counting global allocator
//! (`support/alloc.rs`), not timed; `cargo bench --bench ingest_alloc` prints two tables
//! in a few seconds. Everything goes through the relay's public interfaces: the sans-IO
//! [`aep_relay::core::Core`] driven by `aep_sim::Sim` as `benches/http.rs` drives it (no
//! sockets), its `GET /metrics`, and `Core::ingested`; no store internals.
//!
//! **Table 1, allocations per admitted Event**, one line per path × batch shape ×
//! subscribers. Each line is one fresh relay whose one session's replay buffer
//! (`buffer_per_session` = 1 000) is filled first with 2 000 Events, so every admission
//! of the measured run evicts the oldest Event (the steady state); then `events` Events
//! (100 000 of 580 B, 20 000 of 4 KiB) are ingested and only the calls into the relay
//! are counted (bodies are generated and subscriber output is taken outside them).
//! - `path`: `http`: a `POST /events` request with an NDJSON body fed whole to one
//!   keep-alive in-memory emitter connection (`Sim::feed`), the whole request path: read
//!   into the connection buffer, head, body, line split, envelope scan, admission,
//!   fan-out, the 202 answer. `core`: `Core::ingest` of the NDJSON body as `Bytes`
//!   (`Sim::ingest`), the same path minus HTTP. `ws`: the same Events as one WebSocket
//!   text message each (masked client frames), all of a batch fed at once to one
//!   emitter connection (`GET /socket`, `hello` as emitter): frame decoding, unmasking,
//!   UTF-8, the scan, admission and fan-out.
//! - `batch`: Events per body (64 or 1); `size`: bytes per Event (580 or 4 096).
//! - `sub`: the one subscriber attached, reading everything after every body: `none`;
//!   `sse`: `GET /stream` with no filter; `ws`: a WebSocket consumer (`GET /socket`
//!   upgrade without `permessage-deflate`, `hello`, `subscribe` with no filter).
//! - `allocs/Event`: allocations and reallocations during the ingest calls divided by
//!   the Events admitted (the `Core::ingested` delta, checked equal to the Events sent).
//!   Target: ≤ 0.05.
//! - `bytes/Event`: bytes those allocations asked for (a reallocation counts its new
//!   size), divided by the Events admitted.
//! - `allocs/body`: the same allocations per request body (per ingest call).
//!
//! **Table 2, retained bytes per held Event**: one relay with `buffer_per_session` =
//! 1 000 and `max_sessions` = 1 000 is filled through `Core::ingest` with 1 000 sessions
//! × 1 000 distinct Events of 580 B (one body of 1 000 per session, each body dropped
//! after its call).
//! - `live/Event`: heap bytes live after the fill minus before (the relay created, empty),
//!   divided by the Events held (`aep_buffered_events`); everything the relay keeps:
//!   Event bytes, scanned attributes, store ring and dedupe entries, per-session state.
//! - `mean size`: the mean length of the Events held (their own bytes, no newline).
//! - `live − size`: the overhead per held Event beyond its bytes. Target: ≤ 64 B.
//! - `live/size`: the same as a ratio.
//! - `buffered/sum`: `aep_buffered_bytes` of `GET /metrics` divided by the sum of the
//!   Events' lengths (1.000 when the metric counts exactly the Events' own bytes).

use aep_relay::wire::ws::rfc6455::client_frame;
use aep_relay::{Config, ConnId};
use aep_sim::Sim;
use criterion::black_box;

#[path = "support/alloc.rs"]
mod alloc;
mod support;

/// Depth of the replay buffer of the allocation runs: full after the warm-up.
const BUFFER: usize = 1_000;

fn config(buffer: usize, sessions: usize) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().expect("addr"),
        buffer_per_session: buffer,
        max_sessions: sessions,
        ..Config::default()
    }
}

/// The subscriber a run has (module docs, `sub`).
#[derive(Clone, Copy)]
enum Sub {
    None,
    Sse,
    Ws,
}

impl Sub {
    fn name(self) -> &'static str {
        match self {
            Sub::None => "none",
            Sub::Sse => "sse",
            Sub::Ws => "ws",
        }
    }

    /// Attaches this subscriber to `relay`, its answers taken.
    fn attach(self, relay: &mut Sim) -> Option<ConnId> {
        let k = match self {
            Sub::None => return None,
            Sub::Sse => {
                let k = relay.connect(None);
                relay.feed(k, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", false);
                let head = relay.take_output(k).expect("open");
                assert!(head.starts_with(b"HTTP/1.1 200"), "SSE stream refused");
                k
            }
            Sub::Ws => {
                let k = relay.connect(None);
                upgrade(relay, k, "consumer");
                let mut frames = Vec::new();
                let subscribe = br#"{"type":"subscribe","id":"all"}"#;
                client_frame(0x81, subscribe, Some([5, 6, 7, 8]), &mut frames);
                relay.feed(k, &frames, false);
                let out = relay.take_output(k).expect("hello and subscribed");
                assert!(
                    out.windows(10).any(|w| w == b"subscribed"),
                    "subscribe failed"
                );
                k
            }
        };
        Some(k)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Http,
    Core,
    Ws,
}

/// Upgrades connection `k` to a WebSocket and sends `hello` with `role`; the answers
/// are taken.
fn upgrade(relay: &mut Sim, k: ConnId, role: &str) {
    relay.feed(
        k,
        b"GET /socket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        false,
    );
    let head = relay.take_output(k).expect("open");
    assert!(head.starts_with(b"HTTP/1.1 101"), "upgrade failed");
    let hello = format!(
        r#"{{"type":"hello","versions":["0.1"],"role":"{role}","identity":{{"agent":"claude-code"}}}}"#
    );
    let mut frames = Vec::new();
    client_frame(0x81, hello.as_bytes(), Some([1, 2, 3, 4]), &mut frames);
    relay.feed(k, &frames, false);
    let out = relay.take_output(k).expect("hello answered");
    assert!(
        out.windows(14).any(|w| w == br#""type":"hello""#),
        "hello refused: {}",
        String::from_utf8_lossy(&out)
    );
}

/// Allocations and bytes asked for while `f` runs.
fn counted<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    let (a, b) = (alloc::allocs(), alloc::asked_bytes());
    let out = f();
    (out, alloc::allocs() - a, alloc::asked_bytes() - b)
}

struct Run {
    relay: Sim,
    emitter: ConnId,
    subs: Vec<ConnId>,
    next: u64,
}

impl Run {
    fn new(sub: Sub, path: Path) -> Run {
        let mut relay = Sim::new(config(BUFFER, 16)).expect("relay");
        let subs = sub.attach(&mut relay).into_iter().collect();
        let emitter = relay.connect(None);
        if path == Path::Ws {
            upgrade(&mut relay, emitter, "emitter");
        }
        Run {
            relay,
            emitter,
            subs,
            next: 0,
        }
    }

    /// Ingests one body of `batch` Events of `size` bytes by `path`; returns the
    /// allocations and bytes asked for during the relay's calls only.
    fn body(&mut self, path: Path, batch: usize, size: usize) -> (usize, usize) {
        let body = support::ndjson(self.next, batch, "s_alloc", size);
        self.next += batch as u64;
        let (a, b) = match path {
            Path::Http => {
                let req = support::post_ndjson(&body);
                let ((), a, b) = counted(|| {
                    self.relay.feed(self.emitter, &req, false);
                });
                let resp = self.relay.take_output(self.emitter).expect("open");
                assert!(resp.starts_with(b"HTTP/1.1 202"), "ingest refused");
                (a, b)
            }
            Path::Core => {
                let body = bytes::Bytes::from(body);
                let (n, a, b) = counted(|| self.relay.ingest(body));
                assert_eq!(n.expect("ingest accepted"), batch);
                (a, b)
            }
            Path::Ws => {
                let mut frames = Vec::with_capacity(body.len() + 16 * batch);
                for (i, line) in body
                    .split(|&c| c == b'\n')
                    .filter(|l| !l.is_empty())
                    .enumerate()
                {
                    client_frame(0x81, line, Some([9, i as u8, 7, 3]), &mut frames);
                }
                let before = self.relay.core().ingested();
                let ((), a, b) = counted(|| {
                    self.relay.feed(self.emitter, &frames, false);
                });
                assert_eq!(
                    self.relay.core().ingested() - before,
                    batch as u64,
                    "every message admitted"
                );
                black_box(self.relay.take_output(self.emitter));
                (a, b)
            }
        };
        for &k in &self.subs {
            let out = self.relay.take_output(k).expect("subscriber open");
            assert!(out.len() >= batch * size, "the subscriber got every Event");
            black_box(out);
        }
        (a, b)
    }
}

fn allocations() {
    println!("ingest_alloc: allocations per admitted Event (steady state: buffer {BUFFER}, full, every admission evicts)");
    println!(
        "{:<5} {:>5} {:>5} {:>4} {:>8} {:>12} {:>12} {:>11}",
        "path", "batch", "size", "sub", "events", "allocs/Event", "bytes/Event", "allocs/body"
    );
    for (path, name) in [(Path::Http, "http"), (Path::Core, "core"), (Path::Ws, "ws")] {
        for (batch, size, events) in [(64, 580, 100_000), (1, 580, 100_000), (64, 4096, 20_000)] {
            for sub in [Sub::None, Sub::Sse, Sub::Ws] {
                let mut run = Run::new(sub, path);
                while run.next < 2 * BUFFER as u64 {
                    run.body(path, batch.max(64), size);
                }
                let before = run.relay.core().ingested();
                let (mut allocs, mut asked, mut bodies) = (0, 0, 0);
                let mut sent = 0;
                while sent < events {
                    let (a, b) = run.body(path, batch, size);
                    allocs += a;
                    asked += b;
                    bodies += 1;
                    sent += batch;
                }
                let admitted = (run.relay.core().ingested() - before) as usize;
                assert_eq!(admitted, sent, "every Event sent was admitted");
                println!(
                    "{name:<5} {batch:>5} {size:>5} {:>4} {admitted:>8} {:>12.3} {:>12.0} {:>11.2}",
                    sub.name(),
                    allocs as f64 / admitted as f64,
                    asked as f64 / admitted as f64,
                    allocs as f64 / bodies as f64,
                );
            }
        }
    }
}

/// `aep_buffered_bytes` and `aep_buffered_events` of `GET /metrics`.
fn buffered(relay: &mut Sim) -> (usize, usize) {
    let c = relay.connect(None);
    relay.feed(
        c,
        b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
        true,
    );
    let text = String::from_utf8(relay.take_output(c).expect("answered")).expect("UTF-8");
    let value = |name: &str| -> usize {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .parse::<f64>()
            .expect("a number") as usize
    };
    (value("aep_buffered_bytes"), value("aep_buffered_events"))
}

fn retained() {
    const SESSIONS: usize = 1_000;
    const PER_SESSION: usize = 1_000;
    const SIZE: usize = 580;
    let mut relay = Sim::new(config(PER_SESSION, SESSIONS)).expect("relay");
    let mut sum = 0usize;
    let before = alloc::live_bytes();
    for s in 0..SESSIONS {
        let body = support::ndjson(0, PER_SESSION, &format!("s_{s:04}"), SIZE);
        sum += body.len() - PER_SESSION; // without the newlines
        let n = relay.ingest(body.into()).expect("ingest accepted");
        assert_eq!(n, PER_SESSION);
    }
    let live = (alloc::live_bytes() - before) as f64;
    let (bytes, events) = buffered(&mut relay);
    assert_eq!(events, SESSIONS * PER_SESSION, "every Event is held");
    let per = live / events as f64;
    let mean = sum as f64 / events as f64;
    println!();
    println!("ingest_alloc: retained bytes per held Event ({SESSIONS} sessions x {PER_SESSION} Events of {SIZE} B, Core::ingest)");
    println!(
        "{:>9} {:>10} {:>9} {:>10} {:>9} {:>12}",
        "events", "live/Event", "mean size", "live-size", "live/size", "buffered/sum"
    );
    println!(
        "{events:>9} {per:>10.1} {mean:>9.1} {:>10.1} {:>9.3} {:>12.3}",
        per - mean,
        per / mean,
        bytes as f64 / sum as f64
    );
    black_box(relay);
}

fn main() {
    allocations();
    retained();
}
