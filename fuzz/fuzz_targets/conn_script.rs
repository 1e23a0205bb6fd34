//! A script of operations over a few connections, played into the sans-IO `Core` through
//! `aep_sim::Sim` (in-memory peers, virtual time): connections open and close in any
//! order, send bytes, half-close, reset, read some or all of their output or stop
//! reading, Events are ingested beside them, the clock moves by deltas from the script,
//! a graceful shutdown starts at any point. What it checks is the core's bookkeeping
//! across connections and time, not one protocol (`http` and `ws` do that).
//!
//! Input layout: a sequence of operations, each an opcode byte (`op % 10`) and its
//! argument bytes (missing ones read as 0); at most 256 operations. `slot` is one of 6
//! script slots (`byte % 6`), each holding at most one connection.
//! - `0 open [slot, kind, limit]`: opens a connection in a free slot (a refused one, at
//!   `max_connections` 4 or during a shutdown, leaves it free). `limit`: 255 a peer that
//!   reads everything, else a peer that holds at most `limit * 16` untaken bytes (0: never
//!   reads). `kind % 4`: 0 and 3 plain HTTP (nothing sent); 1 WebSocket (the upgrade
//!   request is sent, and with `kind` bit 4 a `hello` with role `both`); 2 SSE, the
//!   request from `kind >> 2 & 3`: `from=all`, live only, `from=all&live=0`, a
//!   `severity >= notice` filter with `from=all`.
//! - `1 send [slot, len, len bytes]`: on a WebSocket slot one masked client frame of those
//!   bytes (a first byte below 0x20 gives the opcode in its low nibble and FIN when bit 4
//!   is clear, as in `ws`; anything else a text frame), else the raw bytes.
//! - `2 eof [slot]`: the peer half-closes (`handle_eof` once the core reads it).
//! - `3 reset [slot]`: the socket fails (`handle_reset`).
//! - `4 take [slot, n]`: the peer reads everything written so far (`n` 0) or `n * 64`
//!   bytes of it.
//! - `5 advance [d]`: virtual time moves by `d * 100 ms` (0: past every timeout), every
//!   deadline on the way run at its own time (`harness::delta`; heartbeat 4 s, request
//!   timeout 3 s, idle 5 s, WebSocket idle 6 s, shutdown deadline 3 s).
//! - `6 ingest [session, k]`: the next `k % 4 + 1` Events of session `s{session % 4}`
//!   are published as one unit (pre-parsed; every third one about 3 KiB, severities and
//!   types vary; past 32 a session's seqs start again, so duplicates arrive too).
//! - `7 shutdown []`: a graceful shutdown begins (`begin_shutdown`).
//! - `8 prefill []`: every replay buffer is filled (`harness::prefill`, 80 KiB in all).
//! - `9 request [slot, which]`: a canned request on a non-WebSocket slot (`which % 6`):
//!   `GET /healthz`, `GET /events`, `POST /events` of one Event, `GET /status`,
//!   `GET /stream?from=all`, `GET /metrics`.
//!
//! After the script every open connection sends EOF and the clock jumps twice past
//! every timeout.
//!
//! Invariants asserted:
//! 1. `poll_timeout` advances strictly: after every `handle_timeout(t)` (and the outputs
//!    it caused), the next deadline is `None` or later than `t`; after every other
//!    operation, later than the time now. A deadline at or before now would make the
//!    reactor spin.
//! 2. The core and its reactor agree on the connections: `connections()` equals the
//!    connections `Sim` holds open (every close was announced with `Output::Close`).
//! 3. Output plus replay backlog stay within their bound after every operation, per
//!    connection (AEP-0003 §8.4): queued output at most `max_output_bytes` plus one
//!    answer, and queued plus held behind a replay (`backlog`) at most `2 *
//!    max_output_bytes` plus one answer (as `http`'s `bounded`); for a connection that
//!    may be a WebSocket (opened as one, or sent `websocket` in its bytes) one
//!    `max_output_bytes` more each (as `ws`'s: replies on top of a paced replay). A
//!    replay page counts like any other output: it ends once it fills the queue to the
//!    bound (queueing a page whole, the seed `crash-replay-page-over-the-bound-regression`
//!    would queue 114,382 bytes). When a stream ends (a shutdown, a WebSocket
//!    close) the live frames held behind its replay were counted as delivered and go
//!    into the queue before the last frame: a connection that held a backlog may then
//!    have all of the second bound in its queue, until it drains back within the first
//!    (the seed `crash-replay-backlog-moved-whole-regression`: 36,437 queued and 45,550
//!    held become 82,004 queued).
//! 4. After EOF on every connection and a long clock advance, nothing remains:
//!    `connections() == 0`, `armed_deadlines() == 0`, `poll_timeout() == None` (a
//!    shutdown in progress ends once its last connection is gone).
//! 5. Determinism: the same script gives a byte-identical transcript (everything the
//!    peers read, queue sizes, which connections were open); one input in 8 runs twice
//!    (`harness::deterministic`).
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aep_relay::wire::envelope::Event;
use aep_relay::wire::ws::rfc6455::client_frame;
use aep_relay::{Config, ConnId};
use aep_relay_fuzz::harness;
use aep_sim::Sim;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

const SLOTS: usize = 6;
const MAX_OPS: usize = 256;
const MAX_CONNECTIONS: usize = 4;
const MAX_HEAD: usize = 1024;
const MAX_BODY: usize = 2048;
const MAX_OUTPUT: usize = 64 * 1024;
const MAX_WS_MESSAGE: usize = 4096;
/// Seqs per pool session before they start again.
const POOL_SEQS: usize = 32;
const POOL_SESSIONS: usize = 4;
/// One WebSocket reply: an error echoing (part of) a message, or one Event frame.
const ONE_WS: usize = 4 * MAX_WS_MESSAGE + 1024;

const HANDSHAKE: &[u8] = b"GET /socket HTTP/1.1\r\nHost: r\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
const HELLO: &[u8] =
    br#"{"type":"hello","versions":["0.1"],"role":"both","identity":{"agent":"fuzz"}}"#;
const STREAMS: [&[u8]; 4] = [
    b"GET /stream?from=all HTTP/1.1\r\nHost: r\r\n\r\n",
    b"GET /stream HTTP/1.1\r\nHost: r\r\n\r\n",
    b"GET /stream?from=all&live=0 HTTP/1.1\r\nHost: r\r\n\r\n",
    b"GET /stream?from=all&filter=%7B%22severity%22%3A%7B%22gte%22%3A%22notice%22%7D%7D HTTP/1.1\r\nHost: r\r\n\r\n",
];
const POST_ONE: &str = r#"{"aep":"0.1","id":"req-1","type":"tool.started","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a/session/r","agent":"a","session":"r","seq":1}"#;

fn config() -> Config {
    let mut c = harness::timeouts(Config::default());
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.buffer_per_session = harness::BUFFER;
    c.max_sessions = harness::SESSIONS;
    c.max_body_bytes = MAX_BODY;
    c.max_batch_events = 4;
    c.max_from_positions = 4;
    c.max_head_bytes = MAX_HEAD;
    c.max_output_bytes = MAX_OUTPUT;
    c.max_ws_message_bytes = MAX_WS_MESSAGE;
    c.max_connections = MAX_CONNECTIONS;
    c.max_subscriptions_per_conn = 2;
    c
}

/// The Events `ingest` publishes: `POOL_SESSIONS` sessions of `POOL_SEQS` each, parsed
/// once per process (immutable, shared: no state carried between inputs).
fn pool() -> &'static [Vec<Event>] {
    static POOL: OnceLock<Vec<Vec<Event>>> = OnceLock::new();
    POOL.get_or_init(|| {
        const TYPES: [&str; 4] = [
            "tool.started",
            "tool.completed",
            "attention.requested",
            "error.raised",
        ];
        const SEVERITIES: [&str; 4] = ["debug", "info", "notice", "error"];
        (0..POOL_SESSIONS)
            .map(|s| {
                (0..POOL_SEQS)
                    .map(|q| {
                        let pad = if q % 3 == 2 { 3000 } else { 40 };
                        let line = format!(
                            r#"{{"aep":"0.1","id":"s{s}-{q}","type":"{}","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a/session/s{s}","agent":"a","session":"s{s}","seq":{q},"severity":"{}","data":{{"pad":"{}"}}}}"#,
                            TYPES[(q + s) % 4],
                            SEVERITIES[q % 4],
                            "y".repeat(pad)
                        );
                        Event::parse(Bytes::from(line)).expect("pool Events are valid")
                    })
                    .collect()
            })
            .collect()
    })
}

/// One script slot's connection.
struct Slot {
    id: ConnId,
    /// May be (or become) a WebSocket: its bound is the WebSocket one.
    ws_bound: bool,
    /// Held live frames behind a replay since the queue was last within its plain bound
    /// with no backlog: they may join the queue when the stream ends (invariant 3).
    backlog_seen: bool,
    /// Frames go masked (opened as a WebSocket).
    framed: bool,
}

/// Reads the script's bytes; missing ones are 0.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

struct Run {
    sim: Sim,
    slots: [Option<Slot>; SLOTS],
    /// Next seq per pool session.
    next_seq: [usize; POOL_SESSIONS],
    transcript: Vec<u8>,
}

impl Run {
    /// Invariant 1 after anything but a deadline: nothing is due at or before now.
    fn check_timeout(&mut self, what: &str) {
        let now = self.sim.now();
        if let Some(t) = self.sim.core().poll_timeout() {
            assert!(
                t > now,
                "{what}: poll_timeout() is {:?} at or before now",
                now - t
            );
        }
    }

    /// Invariants 2 and 3.
    fn check_bounds(&mut self) {
        let mut open = 0;
        for slot in self.slots.iter_mut().flatten() {
            if !self.sim.is_open(slot.id) {
                continue;
            }
            open += 1;
            let q = self.sim.queued_output(slot.id).expect("open in the core");
            let held = self.sim.queued_backlog(slot.id).unwrap_or(0);
            let (one, extra) = if slot.ws_bound {
                (ONE_WS, MAX_OUTPUT)
            } else {
                (harness::one_http_answer(MAX_HEAD, MAX_BODY), 0)
            };
            // A backlog (itself within `max_output_bytes`) may have joined the queue at
            // a stream's end; the allowance lasts until the queue is back within its
            // plain bound with no backlog.
            let plain = MAX_OUTPUT + extra + one;
            slot.backlog_seen |= held > 0;
            let joined = if slot.backlog_seen { MAX_OUTPUT } else { 0 };
            if held == 0 && q <= plain {
                slot.backlog_seen = false;
            }
            assert!(
                q <= plain + joined,
                "{}: {q} bytes queued, over max_output_bytes {MAX_OUTPUT} (+ {extra}) + one answer",
                slot.id
            );
            assert!(
                q + held <= 2 * MAX_OUTPUT + extra + one,
                "{}: {q} bytes queued and {held} held behind a replay, over 2 * max_output_bytes {MAX_OUTPUT} (+ {extra}) + one answer",
                slot.id
            );
            self.transcript
                .extend_from_slice(&((q + held) as u32).to_le_bytes());
        }
        let core = self.sim.core().connections();
        assert_eq!(
            core, open,
            "the core holds {core} connections, the reactor {open} sockets"
        );
    }

    /// Moves virtual time by `d`, checking invariant 1 after every deadline.
    fn advance(&mut self, d: Duration) {
        let end: Instant = self.sim.now() + d;
        while let Some(t) = self.sim.step(end) {
            if let Some(next) = self.sim.core().poll_timeout() {
                assert!(
                    next > t,
                    "after handle_timeout(t), poll_timeout() is {:?} at or before t",
                    t - next
                );
            }
        }
        self.sim.advance(end - self.sim.now());
        self.check_timeout("advance");
    }

    /// The slot's connection if it is still open; a closed one's final output goes to the
    /// transcript and the slot is freed (the core reuses ids).
    fn live(&mut self, i: usize) -> Option<ConnId> {
        let id = self.slots[i].as_ref()?.id;
        if self.sim.is_open(id) {
            return Some(id);
        }
        self.slots[i] = None;
        let out = self.sim.take_output(id).unwrap_or_default();
        self.transcript.push(b'C');
        self.transcript.extend(out);
        None
    }

    fn prune(&mut self) {
        for i in 0..SLOTS {
            self.live(i);
        }
    }

    fn send(&mut self, i: usize, bytes: &[u8]) {
        let Some(id) = self.live(i) else {
            return;
        };
        let slot = self.slots[i].as_mut().expect("live");
        if slot.framed {
            let mut frame = Vec::with_capacity(bytes.len() + 14);
            let (first, body) = match bytes.first() {
                Some(&c) if c < 0x20 => {
                    let fin = if c & 0x10 == 0 { 0x80 } else { 0 };
                    (fin | (c & 0x0F), &bytes[1..])
                }
                _ => (0x81, bytes),
            };
            client_frame(
                first,
                body,
                Some([0x37, 0xfa, 0x21, body.len() as u8]),
                &mut frame,
            );
            self.sim.feed(id, &frame, false);
        } else {
            if bytes
                .windows(9)
                .any(|w| w.eq_ignore_ascii_case(b"websocket"))
            {
                slot.ws_bound = true;
            }
            self.sim.feed(id, bytes, false);
        }
    }

    fn take(&mut self, i: usize, n: u8) {
        let Some(id) = self.live(i) else {
            return;
        };
        let max = if n == 0 {
            usize::MAX
        } else {
            usize::from(n) * 64
        };
        let out = self.sim.take_some(id, max).unwrap_or_default();
        self.transcript.push(b'T');
        self.transcript
            .extend_from_slice(&(out.len() as u32).to_le_bytes());
        self.transcript.extend(out);
    }

    fn open(&mut self, i: usize, kind: u8, limit: u8) {
        self.prune();
        if self.slots[i].is_some() {
            return;
        }
        let limit = (limit != 255).then(|| usize::from(limit) * 16);
        let Some(id) = self.sim.try_connect(limit) else {
            self.transcript.push(b'R');
            return;
        };
        self.transcript.push(b'O');
        let ws = kind % 4 == 1;
        self.slots[i] = Some(Slot {
            id,
            ws_bound: ws,
            backlog_seen: false,
            framed: ws,
        });
        match kind % 4 {
            1 => {
                self.sim.feed(id, HANDSHAKE, false);
                if kind & 0x10 != 0 {
                    self.send(i, HELLO);
                }
            }
            2 => {
                self.sim
                    .feed(id, STREAMS[usize::from(kind >> 2 & 3)], false);
            }
            _ => {}
        }
    }

    fn request(&mut self, i: usize, which: u8) {
        if self.slots[i].as_ref().is_none_or(|s| s.framed) {
            return;
        }
        let post;
        let req: &[u8] = match which % 6 {
            0 => b"GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n",
            1 => b"GET /events HTTP/1.1\r\nHost: r\r\n\r\n",
            2 => {
                post = format!(
                    "POST /events HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{POST_ONE}",
                    POST_ONE.len()
                );
                post.as_bytes()
            }
            3 => b"GET /status HTTP/1.1\r\nHost: r\r\n\r\n",
            4 => STREAMS[0],
            _ => b"GET /metrics HTTP/1.1\r\nHost: r\r\n\r\n",
        };
        self.send(i, req);
    }

    fn ingest(&mut self, session: u8, k: u8) {
        let s = usize::from(session) % POOL_SESSIONS;
        let k = usize::from(k % 4) + 1;
        let from = self.next_seq[s];
        self.next_seq[s] = (from + k) % POOL_SEQS;
        let evs: Vec<Event> = (from..from + k)
            .map(|q| pool()[s][q % POOL_SEQS].clone())
            .collect();
        self.sim.publish_events(&evs).expect("no journal to fail");
    }
}

fn play(data: &[u8]) -> Vec<u8> {
    let mut run = Run {
        sim: Sim::new(config()).expect("config"),
        slots: Default::default(),
        next_seq: [0; POOL_SESSIONS],
        transcript: Vec::new(),
    };
    let mut c = Cursor(data);
    let mut ops = 0;
    while !c.0.is_empty() && ops < MAX_OPS {
        ops += 1;
        let op = c.byte() % 10;
        run.transcript.push(op);
        match op {
            0 => {
                let (slot, kind, limit) = (c.byte(), c.byte(), c.byte());
                run.open(usize::from(slot) % SLOTS, kind, limit);
            }
            1 => {
                let slot = usize::from(c.byte()) % SLOTS;
                let len = usize::from(c.byte());
                let bytes = c.bytes(len);
                run.send(slot, bytes);
            }
            2 => {
                let slot = usize::from(c.byte()) % SLOTS;
                if let Some(id) = run.live(slot) {
                    run.sim.feed(id, &[], true);
                }
            }
            3 => {
                let slot = usize::from(c.byte()) % SLOTS;
                if let Some(id) = run.live(slot) {
                    run.sim.reset(id);
                }
            }
            4 => {
                let (slot, n) = (c.byte(), c.byte());
                run.take(usize::from(slot) % SLOTS, n);
            }
            5 => {
                let d = c.byte();
                run.advance(harness::delta(d));
            }
            6 => {
                let (session, k) = (c.byte(), c.byte());
                run.ingest(session, k);
            }
            7 => run.sim.shutdown(),
            8 => run
                .sim
                .publish_events(harness::prefill())
                .expect("no journal to fail"),
            _ => {
                let (slot, which) = (c.byte(), c.byte());
                run.request(usize::from(slot) % SLOTS, which);
            }
        }
        if op != 5 {
            run.check_timeout("an operation");
        }
        run.check_bounds();
    }

    // Invariant 4: EOF everywhere, then every timeout passes.
    for i in 0..SLOTS {
        if let Some(id) = run.live(i) {
            run.sim.feed(id, &[], true);
        }
    }
    run.check_bounds();
    run.advance(harness::JUMP);
    run.advance(harness::JUMP);
    run.prune();
    let core = run.sim.core();
    assert_eq!(
        core.connections(),
        0,
        "connections remain after EOF on every one and {:?}",
        2 * harness::JUMP
    );
    assert_eq!(
        core.armed_deadlines(),
        0,
        "deadlines remain with no connection"
    );
    assert_eq!(core.poll_timeout(), None, "a deadline with no connection");
    run.transcript
        .extend_from_slice(format!("{:?}", run.sim.stopped()).as_bytes());
    run.transcript
}

fuzz_target!(|data: &[u8]| harness::deterministic(data, play));
