//! `aep-load`: a fan-out load generator for the relay and, with the same measurement
//! code, for Mosquitto (MQTT 3.1.1) and Redis pub/sub.
//!
//! N subscribers connect and subscribe (SSE `GET /stream`, WebSocket `GET /socket` with
//! `hello` and `subscribe`, MQTT `SUBSCRIBE`, Redis `SUBSCRIBE`); one publisher then sends
//! M Events (HTTP `POST /events` NDJSON, WebSocket text frames, MQTT `PUBLISH` QoS 0,
//! Redis `PUBLISH`), `--batch` per write, paced by `--rate` and/or a
//! window of Events in flight. Every Event is the same valid AEP Event of `--size`
//! bytes carrying its send time in the integer extension attribute `loadts` (AEP-0001
//! §5.4), always 19 digits (`10^18 +` nanoseconds since the tool started), so the
//! payload is byte-identical in size for every protocol. One reader thread (a `mio`
//! poll over every subscriber socket) finds each `"loadts":` in the byte stream,
//! whatever the framing, and records the delivery latency.
//!
//! Reports deliveries/s, delivery latency p50/p99/max, loss (expected − received), and,
//! with `--server-pid`, the server's CPU seconds and resident memory; `--json` prints one
//! machine-readable line. Targets are loopback addresses only; counts and durations are
//! bounded and the tool always stops by itself (`--timeout`).

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use memchr::memmem;
use mio::{Events, Interest, Poll, Token};

/// What the subscribers and the publisher talk to.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Target {
    /// The relay: SSE subscribers, HTTP NDJSON publisher.
    Sse,
    /// The relay: WebSocket (`GET /socket`) subscribers and publisher.
    Ws,
    /// An MQTT 3.1.1 broker (Mosquitto): QoS 0 subscribe and publish.
    Mqtt,
    /// Redis pub/sub.
    Redis,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Sse => "relay-sse",
            Target::Ws => "relay-ws",
            Target::Mqtt => "mqtt",
            Target::Redis => "redis",
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "aep-load",
    about = "Fan-out load generator: N subscribers, one publisher, latency and loss"
)]
struct Args {
    /// Protocol and server kind.
    #[arg(long, value_enum, default_value = "sse")]
    target: Target,
    /// Server address (loopback only).
    #[arg(long, default_value = "127.0.0.1:8787")]
    addr: SocketAddr,
    /// Subscribers (1..=20000).
    #[arg(long, default_value_t = 100)]
    subscribers: usize,
    /// Events to publish (1..=10000000).
    #[arg(long, default_value_t = 10_000)]
    events: u64,
    /// Bytes per Event (200..=65536).
    #[arg(long, default_value_t = 600)]
    size: usize,
    /// Events per publisher write (one NDJSON body, or that many PUBLISH packets).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Target publish rate in Events/s; 0 publishes as fast as the window allows.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Most Events in flight (published, not yet delivered to every subscriber) before
    /// the publisher waits; 0 for open loop.
    #[arg(long, default_value_t = 256)]
    window: u64,
    /// Give up after this many seconds in total (1..=600).
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// After publishing, stop waiting once no delivery arrived for this long (ms).
    #[arg(long, default_value_t = 2000)]
    drain_ms: u64,
    /// Only connect the subscribers, hold them idle this many seconds, then exit
    /// (memory measurements; reports the server's RSS with --server-pid).
    #[arg(long)]
    idle: Option<u64>,
    /// The server's process id, to report its CPU time and RSS.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Publish over another relay binding than the subscribers use (`sse` is HTTP
    /// NDJSON, `ws` WebSocket frames), e.g. WS subscribers fed by HTTP; relay only.
    #[arg(long, value_enum)]
    publisher: Option<Target>,
    /// MQTT topic / Redis channel.
    #[arg(long, default_value = "aep/load")]
    topic: String,
    /// Print one JSON line instead of text.
    #[arg(long)]
    json: bool,
}

/// `"loadts":` followed by exactly this many digits.
const MARK: &[u8] = b"\"loadts\":";
const TS_DIGITS: usize = 19;
const RECORD: usize = MARK.len() + TS_DIGITS;
const TS_BASE: u64 = 1_000_000_000_000_000_000;

fn clock() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("aep-load: {msg}");
    std::process::exit(2)
}

fn check(args: &Args) {
    let loopback = match args.addr.ip() {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback(),
    };
    if !loopback {
        fail(format!("{} is not a loopback address", args.addr));
    }
    if args.subscribers > 20_000 || (args.subscribers == 0 && args.idle.is_some()) {
        fail("--subscribers must be 0..=20000 (1..=20000 with --idle)");
    }
    if !(1..=10_000_000).contains(&args.events) {
        fail("--events must be 1..=10000000");
    }
    if !(200..=65_536).contains(&args.size) {
        fail("--size must be 200..=65536");
    }
    if !(1..=10_000).contains(&args.batch) {
        fail("--batch must be 1..=10000");
    }
    if !(1..=600).contains(&args.timeout) {
        fail("--timeout must be 1..=600");
    }
    let relay = |t: Target| matches!(t, Target::Sse | Target::Ws);
    if args
        .publisher
        .is_some_and(|p| !relay(p) || !relay(args.target))
    {
        fail("--publisher mixes the relay's bindings only (sse, ws)");
    }
    if args.window != 0 && args.window < args.batch as u64 {
        fail("--window must be 0 or at least --batch");
    }
}

// ---------------------------------------------------------------------------------------
// The Event template: digits are overwritten in place, so building one costs a copy.

struct Template {
    bytes: Vec<u8>,
    id_at: usize,
    seq_at: usize,
    ts_at: usize,
}

const COUNTER_DIGITS: usize = 13;
const COUNTER_BASE: u64 = 1_000_000_000_000;

impl Template {
    fn new(size: usize) -> Template {
        let session = format!("s_load{:x}", std::process::id());
        let zeros = "0".repeat(COUNTER_DIGITS);
        let ts = "0".repeat(TS_DIGITS);
        let head = format!(
            r#"{{"aep":"0.1","id":"L{zeros}","type":"tool.completed","time":"2026-07-03T10:15:04.221Z","source":"aep://127.0.0.1/agent/aep-load/session/{session}","agent":"aep-load","session":"{session}","seq":{zeros},"severity":"info","capture":"metadata","loadts":{ts},"data":{{"tool":{{"name":"Bash"}},"status":"success","output":""#
        );
        let tail = r#""}}"#;
        let pad = size.saturating_sub(head.len() + tail.len());
        let mut bytes = head.into_bytes();
        bytes.extend(std::iter::repeat_n(b'x', pad));
        bytes.extend_from_slice(tail.as_bytes());
        let find = |pat: &[u8]| memmem::find(&bytes, pat).expect("template") + pat.len();
        let id_at = find(b"\"id\":\"L");
        let seq_at = find(b"\"seq\":");
        let ts_at = find(MARK);
        Template {
            bytes,
            id_at,
            seq_at,
            ts_at,
        }
    }

    /// Appends Event `n` stamped `ts` to `out`.
    fn write(&self, n: u64, ts: u64, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&self.bytes);
        let e = &mut out[at..];
        digits(
            &mut e[self.id_at..self.id_at + COUNTER_DIGITS],
            COUNTER_BASE + n,
        );
        digits(
            &mut e[self.seq_at..self.seq_at + COUNTER_DIGITS],
            COUNTER_BASE + n,
        );
        digits(&mut e[self.ts_at..self.ts_at + TS_DIGITS], TS_BASE + ts);
    }
}

fn digits(dst: &mut [u8], mut v: u64) {
    for d in dst.iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

// ---------------------------------------------------------------------------------------
// Latency histogram: log-linear, 128 sub-buckets per power of two (< 0.8% error).

const SUB_BITS: u32 = 7;

struct Hist {
    counts: Vec<u64>,
    n: u64,
    max: u64,
}

impl Hist {
    fn new() -> Hist {
        Hist {
            counts: vec![0; (64 - SUB_BITS as usize + 1) << SUB_BITS],
            n: 0,
            max: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < 1 << SUB_BITS {
            return v as usize;
        }
        let e = 63 - v.leading_zeros();
        let g = (e - SUB_BITS + 1) as usize;
        let m = ((v >> (e - SUB_BITS)) - (1 << SUB_BITS)) as usize;
        (g << SUB_BITS) + m
    }

    fn value(i: usize) -> u64 {
        let (g, m) = (i >> SUB_BITS, (i & ((1 << SUB_BITS) - 1)) as u64);
        if g == 0 {
            m
        } else {
            (m + (1 << SUB_BITS)) << (g - 1)
        }
    }

    fn record(&mut self, v: u64) {
        self.counts[Hist::index(v)] += 1;
        self.n += 1;
        self.max = self.max.max(v);
    }

    fn quantile(&self, q: f64) -> u64 {
        let want = ((self.n as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Hist::value(i);
            }
        }
        self.max
    }
}

// ---------------------------------------------------------------------------------------
// Protocol handshakes (blocking, before the measurement).

fn read_until(s: &mut TcpStream, done: impl Fn(&[u8]) -> bool, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !done(&got) {
        match s.read(&mut buf) {
            Ok(0) => fail(format!("{what}: the server closed the connection")),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => fail(format!("{what}: {e}")),
        }
        if got.len() > 1 << 20 {
            fail(format!("{what}: unexpected answer"));
        }
    }
    got
}

fn mqtt_remaining_length(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            break;
        }
    }
}

fn mqtt_str(s: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s);
}

fn mqtt_connect(s: &mut TcpStream, client_id: &str) {
    let mut body = Vec::new();
    mqtt_str(b"MQTT", &mut body);
    body.push(4); // protocol level 3.1.1
    body.push(0x02); // clean session
    body.extend_from_slice(&0u16.to_be_bytes()); // no keep-alive
    mqtt_str(client_id.as_bytes(), &mut body);
    let mut p = vec![0x10];
    mqtt_remaining_length(body.len(), &mut p);
    p.extend_from_slice(&body);
    s.write_all(&p)
        .unwrap_or_else(|e| fail(format!("mqtt connect: {e}")));
    let ack = read_until(s, |b| b.len() >= 4, "mqtt connack");
    if ack[0] != 0x20 || ack[3] != 0 {
        fail(format!("mqtt connack refused: {ack:?}"));
    }
}

fn mqtt_publish(topic: &[u8], payload: &[u8], out: &mut Vec<u8>) {
    out.push(0x30);
    mqtt_remaining_length(2 + topic.len() + payload.len(), out);
    mqtt_str(topic, out);
    out.extend_from_slice(payload);
}

fn redis_command(parts: &[&[u8]], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", parts.len()).as_bytes());
    for p in parts {
        out.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
}

/// One client-to-server WebSocket text frame (RFC 6455 §5.2). The mask bit is set, with
/// the key 0: XOR with zeros leaves the payload as it is, which spares the copy.
fn ws_frame(payload: &[u8], out: &mut Vec<u8>) {
    out.push(0x81);
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= 0xFFFF => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(payload);
}

/// The upgrade to `GET /socket` and the `hello` exchange (AEP-0003 §3.5).
fn ws_open(s: &mut TcpStream, addr: SocketAddr, role: &str) {
    let req = format!(
        "GET /socket HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .unwrap_or_else(|e| fail(format!("ws upgrade: {e}")));
    let got = read_until(s, |b| memmem::find(b, b"\r\n\r\n").is_some(), "ws upgrade");
    if !got.starts_with(b"HTTP/1.1 101") {
        fail(format!(
            "ws upgrade refused: {}",
            String::from_utf8_lossy(&got)
        ));
    }
    let mut hello = Vec::new();
    let body = format!(
        r#"{{"type":"hello","versions":["0.1"],"role":"{role}","identity":{{"agent":"aep-load","instance":"aep-load/{}"}}}}"#,
        std::process::id()
    );
    ws_frame(body.as_bytes(), &mut hello);
    s.write_all(&hello)
        .unwrap_or_else(|e| fail(format!("ws hello: {e}")));
    let mut seen = got;
    while memmem::find(&seen, b"\"type\":\"hello\"").is_none() {
        seen.extend(read_until(s, |b| !b.is_empty(), "ws hello"));
        if memmem::find(&seen, b"\"type\":\"error\"").is_some() {
            fail(format!(
                "ws hello refused: {}",
                String::from_utf8_lossy(&seen)
            ));
        }
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| fail(format!("connect {addr}: {e}")));
    let _ = s.set_nodelay(true);
    s
}

/// Opens one subscriber and returns it subscribed.
fn subscribe(args: &Args, i: usize) -> TcpStream {
    let mut s = connect(args.addr);
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    match args.target {
        Target::Sse => {
            let req = format!("GET /stream HTTP/1.1\r\nHost: {}\r\n\r\n", args.addr);
            s.write_all(req.as_bytes())
                .unwrap_or_else(|e| fail(format!("subscribe: {e}")));
            let head = read_until(
                &mut s,
                |b| memmem::find(b, b"\r\n\r\n").is_some(),
                "sse head",
            );
            if !head.starts_with(b"HTTP/1.1 200") {
                fail(format!(
                    "subscribe refused: {}",
                    String::from_utf8_lossy(&head)
                ));
            }
        }
        Target::Ws => {
            ws_open(&mut s, args.addr, "consumer");
            let mut p = Vec::new();
            ws_frame(br#"{"type":"subscribe","id":"load","filter":{}}"#, &mut p);
            s.write_all(&p)
                .unwrap_or_else(|e| fail(format!("ws subscribe: {e}")));
            let got = read_until(
                &mut s,
                |b| {
                    memmem::find(b, b"\"subscribed\"").is_some()
                        || memmem::find(b, b"\"error\"").is_some()
                },
                "ws subscribe",
            );
            if memmem::find(&got, b"\"subscribed\"").is_none() {
                fail(format!(
                    "ws subscribe refused: {}",
                    String::from_utf8_lossy(&got)
                ));
            }
        }
        Target::Mqtt => {
            mqtt_connect(&mut s, &format!("aepload-s{i}"));
            let mut body = 1u16.to_be_bytes().to_vec();
            mqtt_str(args.topic.as_bytes(), &mut body);
            body.push(0); // QoS 0
            let mut p = vec![0x82];
            mqtt_remaining_length(body.len(), &mut p);
            p.extend_from_slice(&body);
            s.write_all(&p)
                .unwrap_or_else(|e| fail(format!("mqtt subscribe: {e}")));
            let ack = read_until(&mut s, |b| b.len() >= 5, "mqtt suback");
            if ack[0] != 0x90 || ack[4] > 2 {
                fail(format!("mqtt suback refused: {ack:?}"));
            }
        }
        Target::Redis => {
            let mut p = Vec::new();
            redis_command(&[b"SUBSCRIBE", args.topic.as_bytes()], &mut p);
            s.write_all(&p)
                .unwrap_or_else(|e| fail(format!("redis subscribe: {e}")));
            read_until(&mut s, |b| b.ends_with(b":1\r\n"), "redis subscribe");
        }
    }
    s.set_read_timeout(None).ok();
    s
}

// ---------------------------------------------------------------------------------------
// The reader: one poll over every subscriber.

struct Sub {
    sock: mio::net::TcpStream,
    /// The unscanned end of the stream (a record cut by a read boundary).
    carry: Vec<u8>,
    received: u64,
    open: bool,
}

struct Shared {
    delivered: AtomicU64,
    stop: AtomicBool,
    last_delivery: AtomicU64,
}

/// Scans `data` for complete records from `from`, recording each; returns where the
/// unscanned part starts (a possible record prefix, at most `RECORD - 1` bytes).
fn scan(
    data: &[u8],
    from: usize,
    now: u64,
    finder: &memmem::Finder<'_>,
    h: &mut Hist,
) -> (usize, u64) {
    let mut at = from;
    let mut n = 0;
    while let Some(i) = finder.find(&data[at..]) {
        let start = at + i;
        if start + RECORD > data.len() {
            return (start, n);
        }
        let mut ts = 0u64;
        for &d in &data[start + MARK.len()..start + RECORD] {
            ts = ts * 10 + u64::from(d.wrapping_sub(b'0'));
        }
        h.record(now.saturating_sub(ts.wrapping_sub(TS_BASE)));
        n += 1;
        at = start + RECORD;
    }
    (data.len().saturating_sub(RECORD - 1).max(at), n)
}

fn reader(mut subs: Vec<Sub>, shared: Arc<Shared>) -> (Hist, Vec<u64>) {
    let mut poll = Poll::new().unwrap_or_else(|e| fail(format!("poll: {e}")));
    for (i, s) in subs.iter_mut().enumerate() {
        poll.registry()
            .register(&mut s.sock, Token(i), Interest::READABLE)
            .unwrap_or_else(|e| fail(format!("register: {e}")));
    }
    let finder = memmem::Finder::new(MARK);
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; 256 * 1024];
    let mut joined = Vec::with_capacity(2 * RECORD);
    let mut h = Hist::new();
    while !shared.stop.load(Ordering::Relaxed) {
        if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(20))) {
            if e.kind() != io::ErrorKind::Interrupted {
                fail(format!("poll: {e}"));
            }
        }
        let mut got = 0;
        for ev in events.iter() {
            let s = &mut subs[ev.token().0];
            while s.open {
                let n = match s.sock.read(&mut buf) {
                    Ok(0) => {
                        s.open = false;
                        break;
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        s.open = false;
                        break;
                    }
                };
                let now = clock();
                // A short read emptied the socket: a later arrival raises a new edge, so
                // skip the read that would only say WouldBlock (half the syscalls).
                let drained = n < buf.len();
                let data = &buf[..n];
                let mut from = 0;
                if !s.carry.is_empty() {
                    // A record may straddle the read boundary: scan the carry joined to
                    // the first bytes of this read, counting only records that start in
                    // the carry.
                    let old = s.carry.len();
                    joined.clear();
                    joined.extend_from_slice(&s.carry);
                    joined.extend_from_slice(&data[..n.min(RECORD)]);
                    if let Some(i) = finder.find(&joined) {
                        if i < old && i + RECORD <= joined.len() {
                            let (_, k) = scan(&joined[..i + RECORD], i, now, &finder, &mut h);
                            s.received += k;
                            got += k;
                            from = i + RECORD - old;
                        } else if i < old {
                            // Still incomplete: keep the carry and the new bytes.
                            s.carry.extend_from_slice(data);
                            continue;
                        }
                    }
                    s.carry.clear();
                }
                let (rest, k) = scan(data, from, now, &finder, &mut h);
                s.received += k;
                got += k;
                s.carry.extend_from_slice(&data[rest..]);
                if drained {
                    break;
                }
            }
        }
        if got > 0 {
            shared.delivered.fetch_add(got, Ordering::Relaxed);
            shared.last_delivery.store(clock(), Ordering::Relaxed);
        }
    }
    (h, subs.iter().map(|s| s.received).collect())
}

// ---------------------------------------------------------------------------------------
// The publisher.

/// The publisher connection's answers: HTTP statuses (relay), Redis integer replies, or
/// the MQTT `PINGRESP` sent after the last `PUBLISH` (a broker handles one connection's
/// packets in order, so it marks the point where every `PUBLISH` was processed).
#[derive(Default)]
struct Answers {
    ok: AtomicU64,
    bad: AtomicU64,
    last: AtomicU64,
}

fn answers(
    mut s: TcpStream,
    target: Target,
    state: Arc<Answers>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut carry: Vec<u8> = Vec::new();
        s.set_read_timeout(Some(Duration::from_millis(20))).ok();
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let (mut ok, mut bad) = (0, 0);
                    if target == Target::Mqtt {
                        ok = buf[..n].iter().filter(|&&b| b == 0xD0).count() as u64;
                    } else if target == Target::Ws {
                        // Frames carry no newline: count the pong and error frames in
                        // the stream, keeping a tail that could hold a cut marker.
                        let old = carry.len();
                        carry.extend_from_slice(&buf[..n]);
                        let count = |pat: &[u8]| {
                            memmem::find_iter(&carry, pat)
                                .filter(|&i| i + pat.len() > old)
                                .count() as u64
                        };
                        ok = count(b"\"type\":\"pong\"");
                        bad = count(b"\"type\":\"error\"");
                        let keep = carry.len().saturating_sub(15);
                        carry.drain(..keep);
                    } else {
                        carry.extend_from_slice(&buf[..n]);
                        // Count in complete lines only: every status line and every
                        // Redis reply ends with CRLF.
                        let Some(nl) = memchr::memrchr(b'\n', &carry) else {
                            continue;
                        };
                        let lines = &carry[..=nl];
                        if target == Target::Sse {
                            let all = memmem::find_iter(lines, b"HTTP/1.1 ").count() as u64;
                            ok = memmem::find_iter(lines, b"HTTP/1.1 202").count() as u64;
                            bad = all - ok;
                        } else {
                            for l in lines.split(|&b| b == b'\n') {
                                match l.first() {
                                    Some(b':') => ok += 1,
                                    Some(b'-') => bad += 1,
                                    _ => {}
                                }
                            }
                        }
                        carry.drain(..=nl);
                    }
                    if ok + bad > 0 {
                        state.ok.fetch_add(ok, Ordering::Relaxed);
                        state.bad.fetch_add(bad, Ordering::Relaxed);
                        state.last.store(clock(), Ordering::Relaxed);
                    }
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    })
}

struct Published {
    started: u64,
    /// When the last write returned.
    written: u64,
    /// When the server had answered everything (or `written` when it did not).
    finished: u64,
    ok: u64,
    bad: u64,
}

fn publish(args: &Args, shared: &Shared, subscribers: u64, deadline: Instant) -> Published {
    let via = args.publisher.unwrap_or(args.target);
    let mut s = connect(args.addr);
    match via {
        Target::Mqtt => mqtt_connect(&mut s, "aepload-pub"),
        Target::Ws => ws_open(&mut s, args.addr, "emitter"),
        _ => {}
    }
    let stop = Arc::new(AtomicBool::new(false));
    let state = Arc::new(Answers::default());
    let reader = answers(
        s.try_clone().unwrap_or_else(|e| fail(e)),
        via,
        state.clone(),
        stop.clone(),
    );
    let tpl = Template::new(args.size);
    let topic = args.topic.as_bytes();
    let mut out = Vec::with_capacity(args.batch * (args.size + 128) + 256);
    let mut body = Vec::with_capacity(args.batch * (args.size + 1));
    let mut event = Vec::with_capacity(args.size + 64);
    let started = clock();
    let mut sent = 0u64;
    let mut requests = 0u64;
    while sent < args.events && Instant::now() < deadline {
        let n = (args.batch as u64).min(args.events - sent);
        if args.rate > 0 {
            let due = started + (sent as u128 * 1_000_000_000 / args.rate as u128) as u64;
            // Sleep, never spin: the reader shares the load core. An oversleep is made
            // up by the absolute schedule.
            let now = clock();
            if due > now {
                thread::sleep(Duration::from_nanos(due - now));
            }
        }
        if args.window > 0 && subscribers > 0 {
            let need = (sent + n).saturating_sub(args.window) * subscribers;
            while shared.delivered.load(Ordering::Relaxed) < need && Instant::now() < deadline {
                thread::sleep(Duration::from_micros(20));
            }
        }
        out.clear();
        body.clear();
        for i in 0..n {
            let ts = clock();
            match via {
                Target::Sse => {
                    tpl.write(sent + i, ts, &mut body);
                    body.push(b'\n');
                }
                Target::Mqtt => {
                    event.clear();
                    tpl.write(sent + i, ts, &mut event);
                    mqtt_publish(topic, &event, &mut out);
                }
                Target::Ws => {
                    event.clear();
                    tpl.write(sent + i, ts, &mut event);
                    ws_frame(&event, &mut out);
                }
                Target::Redis => {
                    event.clear();
                    tpl.write(sent + i, ts, &mut event);
                    redis_command(&[b"PUBLISH", topic, &event], &mut out);
                }
            }
        }
        if via == Target::Sse {
            out.extend_from_slice(
                format!(
                    "POST /events HTTP/1.1\r\nHost: {}\r\nAEP-Version: 0.1\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n",
                    args.addr,
                    body.len()
                )
                .as_bytes(),
            );
            out.extend_from_slice(&body);
        }
        if let Err(e) = s.write_all(&out) {
            fail(format!("publish: {e}"));
        }
        sent += n;
        requests += 1;
    }
    let written = clock();
    let want = match via {
        Target::Sse => requests,
        Target::Redis => sent,
        Target::Mqtt => {
            let _ = s.write_all(&[0xC0, 0x00]); // PINGREQ
            1
        }
        Target::Ws => {
            // Frames are handled in order: the pong stands for every Event before it.
            let mut p = Vec::new();
            ws_frame(br#"{"type":"ping","t":1}"#, &mut p);
            let _ = s.write_all(&p);
            1
        }
    };
    // Wait for every answer (or until they stop coming).
    let idle = args.drain_ms * 1_000_000;
    loop {
        let got = state.ok.load(Ordering::Relaxed) + state.bad.load(Ordering::Relaxed);
        let last = state.last.load(Ordering::Relaxed).max(written);
        if got >= want || Instant::now() >= deadline || clock().saturating_sub(last) > idle {
            break;
        }
        thread::sleep(Duration::from_micros(200));
    }
    let got = state.ok.load(Ordering::Relaxed) + state.bad.load(Ordering::Relaxed);
    let finished = if got >= want {
        state.last.load(Ordering::Relaxed).max(written)
    } else {
        written
    };
    if via == Target::Mqtt {
        let _ = s.write_all(&[0xE0, 0x00]); // DISCONNECT
    }
    stop.store(true, Ordering::Relaxed);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let _ = reader.join();
    let (mut ok, bad) = (
        state.ok.load(Ordering::Relaxed),
        state.bad.load(Ordering::Relaxed),
    );
    match via {
        // One 202 answers a whole batch.
        Target::Sse => ok = (ok * args.batch as u64).min(sent),
        // The PINGRESP (pong) stands for every PUBLISH (Event) before it.
        Target::Mqtt | Target::Ws => ok = if ok > 0 { sent } else { 0 },
        Target::Redis => {}
    }
    Published {
        started,
        written,
        finished,
        ok,
        bad,
    }
}

// ---------------------------------------------------------------------------------------
// The server's CPU time and RSS from /proc.

fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0) // USER_HZ is 100 on Linux
}

/// Times the server was preempted (`nonvoluntary_ctxt_switches`): other processes on its
/// core, which shows up as latency that is not the server's own.
fn preempted(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.starts_with("nonvoluntary_ctxt_switches:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    let args = Args::parse();
    check(&args);
    clock();
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let rss_before = args.server_pid.and_then(rss_kib);

    let t = Instant::now();
    let socks: Vec<TcpStream> = (0..args.subscribers).map(|i| subscribe(&args, i)).collect();
    let connect_s = t.elapsed().as_secs_f64();

    if let Some(hold) = args.idle {
        thread::sleep(Duration::from_millis(500));
        let rss = args.server_pid.and_then(rss_kib);
        let per_conn = match (rss, rss_before) {
            (Some(a), Some(b)) => (a as f64 - b as f64) * 1024.0 / args.subscribers as f64,
            _ => f64::NAN,
        };
        let rss_mib = rss.map_or(f64::NAN, |k| k as f64 / 1024.0);
        if args.json {
            println!(
                "{{\"target\":\"{}\",\"mode\":\"idle\",\"subscribers\":{},\"connect_s\":{connect_s:.3},\"server_rss_mib\":{rss_mib:.1},\"server_bytes_per_subscriber\":{per_conn:.0}}}",
                args.target.name(),
                args.subscribers
            );
        } else {
            println!(
                "{} idle: {} subscribers connected in {connect_s:.2} s; server RSS {rss_mib:.1} MiB ({per_conn:.0} bytes per subscriber)",
                args.target.name(),
                args.subscribers
            );
        }
        thread::sleep(Duration::from_secs(hold.min(600)));
        drop(socks);
        return;
    }

    let subs: Vec<Sub> = socks
        .into_iter()
        .map(|s| {
            s.set_nonblocking(true)
                .unwrap_or_else(|e| fail(format!("nonblocking: {e}")));
            Sub {
                sock: mio::net::TcpStream::from_std(s),
                carry: Vec::new(),
                received: 0,
                open: true,
            }
        })
        .collect();
    let shared = Arc::new(Shared {
        delivered: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        last_delivery: AtomicU64::new(0),
    });
    let n_subs = subs.len() as u64;
    let reader_thread = {
        let shared = shared.clone();
        thread::spawn(move || reader(subs, shared))
    };
    let cpu_before = args.server_pid.and_then(cpu_seconds);
    let preempt_before = args.server_pid.and_then(preempted);
    let published = publish(&args, &shared, n_subs, deadline);
    let expected = args.events * n_subs;
    // Wait for the deliveries: all of them, or until they stop coming.
    let drain = Duration::from_millis(args.drain_ms);
    loop {
        if shared.delivered.load(Ordering::Relaxed) >= expected || Instant::now() >= deadline {
            break;
        }
        let last = shared
            .last_delivery
            .load(Ordering::Relaxed)
            .max(published.finished);
        if clock().saturating_sub(last) > drain.as_nanos() as u64 {
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    let cpu_after = args.server_pid.and_then(cpu_seconds);
    let preemptions = match (preempt_before, args.server_pid.and_then(preempted)) {
        (Some(a), Some(b)) => b.saturating_sub(a) as i64,
        _ => -1,
    };
    let rss = args.server_pid.and_then(rss_kib);
    shared.stop.store(true, Ordering::Relaxed);
    let (h, per_sub) = reader_thread
        .join()
        .unwrap_or_else(|_| fail("reader panicked"));
    let received: u64 = per_sub.iter().sum();
    let publish_s = (published.finished - published.started) as f64 / 1e9;
    // With subscribers: from the first write to the last delivery. Without: until the
    // server answered the last write.
    let secs = if n_subs == 0 {
        publish_s
    } else {
        let last = shared.last_delivery.load(Ordering::Relaxed);
        last.saturating_sub(published.started) as f64 / 1e9
    };
    let rate = if secs > 0.0 {
        received as f64 / secs
    } else {
        0.0
    };
    let events_rate = if n_subs == 0 {
        published.ok as f64 / secs.max(1e-9)
    } else {
        rate / n_subs as f64
    };
    let loss = expected.saturating_sub(received);
    let min_sub = per_sub.iter().copied().min().unwrap_or(0);
    let us = |v: u64| v as f64 / 1000.0;
    let (p50, p99, max) = (us(h.quantile(0.50)), us(h.quantile(0.99)), us(h.max));
    let cpu = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    let per_cpu = if cpu > 0.0 {
        received as f64 / cpu
    } else {
        f64::NAN
    };
    // Events the server handled per CPU second: published ones without subscribers,
    // delivered ones (per subscriber) with.
    let events_per_cpu = if cpu <= 0.0 {
        f64::NAN
    } else if n_subs == 0 {
        published.ok as f64 / cpu
    } else {
        per_cpu / n_subs as f64
    };
    let rss_mib = rss.map_or(f64::NAN, |k| k as f64 / 1024.0);
    let write_s = (published.written - published.started) as f64 / 1e9;
    if args.json {
        println!(
            "{{\"target\":\"{}\",\"subscribers\":{},\"events\":{},\"size\":{},\"batch\":{},\"rate\":{},\"window\":{},\
             \"expected\":{expected},\"deliveries\":{received},\"loss\":{loss},\"min_per_subscriber\":{min_sub},\
             \"seconds\":{secs:.3},\"publish_seconds\":{publish_s:.3},\"write_seconds\":{write_s:.3},\"deliveries_per_s\":{rate:.0},\"events_per_s\":{events_rate:.0},\
             \"p50_us\":{p50:.1},\"p99_us\":{p99:.1},\"max_us\":{max:.1},\"publish_ok\":{},\"publish_errors\":{},\
             \"server_cpu_s\":{cpu:.2},\"deliveries_per_server_cpu_s\":{per_cpu:.0},\"events_per_server_cpu_s\":{events_per_cpu:.0},\"server_preempted\":{preemptions},\"server_rss_mib\":{rss_mib:.1}}}",
            args.target.name(),
            n_subs,
            args.events,
            args.size,
            args.batch,
            args.rate,
            args.window,
            published.ok,
            published.bad,
        );
    } else {
        println!(
            "{}: {} subscribers, {} Events of {} bytes (batch {}, rate {}, window {})",
            args.target.name(),
            n_subs,
            args.events,
            args.size,
            args.batch,
            args.rate,
            args.window
        );
        println!(
            "  deliveries {received}/{expected} (loss {loss}) in {secs:.3} s: {rate:.0} deliveries/s, {events_rate:.0} Events/s"
        );
        println!("  latency p50 {p50:.1} µs, p99 {p99:.1} µs, max {max:.1} µs");
        println!(
            "  publisher: writes {write_s:.3} s, answered after {publish_s:.3} s, ok {} / errors {}",
            published.ok, published.bad
        );
        if args.server_pid.is_some() {
            println!(
                "  server: {cpu:.2} CPU s ({per_cpu:.0} deliveries, {events_per_cpu:.0} Events per CPU s), preempted {preemptions} times, RSS {rss_mib:.1} MiB"
            );
        }
    }
    if loss > 0 || published.bad > 0 {
        std::process::exit(1);
    }
}
