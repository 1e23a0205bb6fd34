//! `aep-load`: a fan-out load generator for the relay and, with the same measurement
//! code, for Redis pub/sub, core NATS and Mosquitto (MQTT 3.1.1).
//!
//! N subscribers connect and subscribe (SSE `GET /stream`, WebSocket `GET /socket` with
//! `hello` and `subscribe`, Redis `SUBSCRIBE`, NATS `SUB`, MQTT `SUBSCRIBE`); one
//! publisher (over `--publishers` connections, one by default) then sends M Events (HTTP `POST /events` NDJSON, WebSocket text frames,
//! Redis `PUBLISH`, NATS `PUB`, MQTT `PUBLISH` QoS 0), `--batch` per write, paced by
//! `--rate` and/or a window of Events in flight. Every Event is the same valid AEP Event of `--size`
//! bytes carrying its send time in the integer extension attribute `loadts` (AEP-0001
//! §5.4), always 19 digits (`10^18 +` nanoseconds since the tool started), so the
//! payload is byte-identical in size for every protocol. One reader thread (a `mio`
//! poll over every subscriber socket) finds each `"loadts":` in the byte stream,
//! whatever the framing, and records the delivery latency.
//!
//! Reports deliveries/s, delivery latency p50/p99/max, loss (expected − received),
//! subscribers the server dropped, the load tool's own CPU seconds, and, with
//! `--server-pid`, the server's CPU seconds, current and peak resident memory and (with
//! `--syscalls`, through `perf stat`) its write syscalls during the fan-out; `--json`
//! prints one machine-readable line.
//!
//! The `ceiling` target and `--serve` measure the load tool itself: `aep-load --serve`
//! is a trivial forwarder (no parsing, no per-Event work: each chunk of the publisher's
//! complete lines goes to every subscriber, usually in one `write` each), so the deliveries/s that
//! `--target ceiling` reaches against it is about the most this reader can absorb on
//! this machine under the same publisher, window and framing-agnostic scan.
//!
//! `--tls` (with `--cacert FILE`, or the system's roots) runs every target but MQTT and
//! the ceiling over TLS with rustls: HTTPS SSE and WSS subscribers and publishers for
//! the relay, Redis with TLS from the first byte (`--tls-port`), NATS reading the
//! plaintext `INFO` and then upgrading (NATS 2.9's `tls_required`). The reader decrypts
//! with one rustls connection per subscriber on the same poll.
//!
//! `--reconnect-storm` measures handshakes instead of fan-out: N subscribers connect and
//! subscribe (`--storm-threads` at a time), all drop at once, and all reconnect at once,
//! twice: with each subscriber's own TLS session cache (TLS 1.3 resumption, when the
//! server offers tickets) and with a fresh one (full handshakes). It reports per round
//! the time until every subscriber is subscribed again, handshakes per second, how many
//! handshakes were resumptions, and the server's CPU seconds.
//!
//! `--reconnect-storm --resume` (SSE or WS, plain) measures resumption instead: N
//! subscribers caught up on one session, all dropped and reconnecting with their position
//! (SSE `Last-Event-ID`, WS `subscribe.from`) while one Event is POSTed every 1/`--rate`
//! s; it reports the time until all are subscribed and caught up again, whether each
//! resumed exactly, and the POST latency before and during the storm, as the publisher
//! saw it and as the kernel received the answer (`resume.rs`).
//!
//! Targets are loopback addresses only; counts and durations are bounded and the tool
//! always stops by itself (`--timeout`).

use std::io::{self, BufRead, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};

mod resume;
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
    /// Core NATS pub/sub (no JetStream): `CONNECT`, `SUB`, `PUB`, answering `PING`.
    Nats,
    /// `aep-load --serve`, the trivial forwarder: the load tool's own ceiling.
    Ceiling,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Sse => "relay-sse",
            Target::Ws => "relay-ws",
            Target::Mqtt => "mqtt",
            Target::Redis => "redis",
            Target::Nats => "nats",
            Target::Ceiling => "ceiling",
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
    /// Publisher connections (1..=64): each `--batch` goes to the next in turn, all
    /// under the one window. A server that reads a bounded amount per connection per
    /// loop turn (Redis: 16 KiB) handles this many reads' PUBLISH before it writes to
    /// its subscribers. Not for the `sse` publisher (its answer latencies pair POSTs
    /// with answers on one connection).
    #[arg(long, default_value_t = 1)]
    publishers: usize,
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
    /// Publish to this address instead of `--addr` (loopback only): another relay of a
    /// cluster, for the latency from a POST at one relay to a subscriber at another.
    #[arg(long)]
    publish_addr: Option<SocketAddr>,
    /// Publish nothing: count the deliveries of `--events` Events that another instance
    /// publishes (at another relay of a cluster), from the first one on.
    #[arg(long)]
    subscribe_only: bool,
    /// Count the server's write syscalls (`write`, `writev`, `sendmsg`, `sendto`) during
    /// the fan-out with `perf stat` (needs `--server-pid`, perf on PATH and tracepoint
    /// access, i.e. root or `perf_event_paranoid` ≤ -1). Enabling syscall tracepoints
    /// puts every syscall of the machine on the traced path, a small cost per syscall.
    #[arg(long)]
    syscalls: bool,
    /// Run the ceiling target's trivial forwarder on `--addr` instead of the load, until
    /// `--timeout` seconds have passed.
    #[arg(long)]
    serve: bool,
    /// MQTT topic / Redis channel / NATS subject (`/` becomes `.` for NATS).
    #[arg(long, default_value = "aep/load")]
    topic: String,
    /// Print one JSON line instead of text.
    #[arg(long)]
    json: bool,
    /// Speak TLS to the server (not for mqtt and ceiling): rustls, TLS 1.2 or 1.3.
    #[arg(long)]
    tls: bool,
    /// With --tls: trust exactly the certificates of this PEM file (else the system's).
    #[arg(long, value_name = "FILE")]
    cacert: Option<std::path::PathBuf>,
    /// With --tls: the name the server's certificate must list (default: the address's
    /// IP).
    #[arg(long, value_name = "NAME")]
    tls_name: Option<String>,
    /// With --tls: offer only this TLS 1.3 cipher suite (aes128: TLS13_AES_128_GCM_SHA256,
    /// aes256: TLS13_AES_256_GCM_SHA384, chacha20: TLS13_CHACHA20_POLY1305_SHA256), so
    /// every server negotiates the same; `any` offers rustls' list (TLS 1.2 too).
    #[arg(long, default_value = "aes128", value_name = "SUITE")]
    tls_suite: String,
    /// Measure a reconnection storm instead of a fan-out (see the module docs).
    #[arg(long)]
    reconnect_storm: bool,
    /// With --reconnect-storm: subscribers connecting at the same time (threads).
    #[arg(long, default_value_t = 64)]
    storm_threads: usize,
    /// With --reconnect-storm (SSE or WS, plain): the subscribers resume after their
    /// last Event (SSE `Last-Event-ID`, WS `subscribe.from`) while one Event is POSTed
    /// every 1/--rate s (default 200 a second); reports the time to all resumed, whether
    /// each resumed exactly, and the POST latency during the storm.
    #[arg(long)]
    resume: bool,
    /// With --reconnect-storm --resume (SSE): each subscriber first waits the `retry:`
    /// its stream was sent, as an `EventSource` does (else all reconnect at once).
    #[arg(long)]
    storm_honor_retry: bool,
    /// With --reconnect-storm --resume: run the publisher thread under `SCHED_FIFO`
    /// priority 50 (root or `CAP_SYS_NICE`), so that its POST latency is not its wait
    /// for a CPU behind the subscribers' reader; the report says whether it took effect.
    #[arg(long)]
    publisher_fifo: bool,
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
    for addr in std::iter::once(args.addr).chain(args.publish_addr) {
        let loopback = match addr.ip() {
            IpAddr::V4(a) => a.is_loopback(),
            IpAddr::V6(a) => a.is_loopback(),
        };
        if !loopback {
            fail(format!("{addr} is not a loopback address"));
        }
    }
    if args.serve {
        if !(1..=3600).contains(&args.timeout) {
            fail("--timeout must be 1..=3600 with --serve");
        }
        return;
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
    if args.syscalls && args.server_pid.is_none() {
        fail("--syscalls needs --server-pid");
    }
    let relay = |t: Target| matches!(t, Target::Sse | Target::Ws);
    if args
        .publisher
        .is_some_and(|p| !relay(p) || !relay(args.target))
    {
        fail("--publisher mixes the relay's bindings only (sse, ws)");
    }
    if !(1..=64).contains(&args.publishers) {
        fail("--publishers must be 1..=64");
    }
    if args.publishers > 1 && args.publisher.unwrap_or(args.target) == Target::Sse {
        fail("--publishers above 1 is not for the sse publisher");
    }
    if args.window != 0 && args.window < args.batch as u64 {
        fail("--window must be 0 or at least --batch");
    }
    let plain_only = |t: Target| matches!(t, Target::Mqtt | Target::Ceiling);
    if args.tls && (plain_only(args.target) || args.publisher.is_some_and(plain_only)) {
        fail("--tls is for the sse, ws, redis and nats targets");
    }
    if !args.tls && (args.cacert.is_some() || args.tls_name.is_some()) {
        fail("--cacert and --tls-name need --tls");
    }
    if args.reconnect_storm && (args.subscribers == 0 || !(1..=1024).contains(&args.storm_threads))
    {
        fail("--reconnect-storm needs --subscribers >= 1 and --storm-threads 1..=1024");
    }
    if (args.storm_honor_retry || args.publisher_fifo) && !(args.reconnect_storm && args.resume) {
        fail("--storm-honor-retry and --publisher-fifo are for --reconnect-storm --resume");
    }
    if args.reconnect_storm
        && args.resume
        && (!matches!(args.target, Target::Sse | Target::Ws) || args.tls)
    {
        fail("--reconnect-storm --resume: --target sse or ws, without --tls");
    }
    if args.storm_honor_retry && args.target != Target::Sse {
        fail("--storm-honor-retry: only SSE streams are sent a `retry:`");
    }
}

// ---------------------------------------------------------------------------------------
// TLS (`--tls`): a rustls client over the same sockets.

/// The TLS client of `--tls`, set once in `main`.
static TLS: OnceLock<Option<aep_check::tls::Client>> = OnceLock::new();

fn tls_client() -> Option<&'static aep_check::tls::Client> {
    TLS.get().and_then(Option::as_ref)
}

/// The name to verify: `--tls-name`, else the address's IP.
static TLS_NAME: OnceLock<String> = OnceLock::new();

/// What the first TLS handshake negotiated: `TLSv1_3 TLS13_AES_256_GCM_SHA384`.
static TLS_SEEN: OnceLock<String> = OnceLock::new();

fn tls_seen() -> &'static str {
    TLS_SEEN.get().map_or("", String::as_str)
}

/// A connection while it is set up (blocking): TCP, or TLS over it (the checker's type).
type Conn = aep_check::tls::Stream;

/// What the load tool asks of a [`Conn`] beyond reading and writing.
trait ConnExt: Sized {
    fn upgrade(tcp: TcpStream, config: &Arc<rustls::ClientConfig>) -> Conn;
    fn into_parts(self) -> (TcpStream, Option<rustls::ClientConnection>);
    fn resumed(&self) -> bool;
}

impl ConnExt for Conn {
    /// The TLS handshake over `tcp` with `config` (blocking).
    fn upgrade(tcp: TcpStream, config: &Arc<rustls::ClientConfig>) -> Conn {
        let client = aep_check::tls::Client {
            config: config.clone(),
            from_file: tls_client().is_some_and(|c| c.from_file),
        };
        let name = TLS_NAME.get().map_or("localhost", String::as_str);
        match client.handshake(name, tcp) {
            Ok(s) => {
                TLS_SEEN.get_or_init(|| {
                    let v = s
                        .conn
                        .protocol_version()
                        .map_or("?".into(), |v| format!("{v:?}"));
                    let c = s
                        .conn
                        .negotiated_cipher_suite()
                        .map_or("?".into(), |c| format!("{:?}", c.suite()));
                    format!("{v} {c}")
                });
                Conn::Tls(Box::new(s))
            }
            Err(e) => match aep_check::tls::failure(&e) {
                Some(f) => fail(f),
                None => fail(format!("TLS handshake: {e}")),
            },
        }
    }

    /// The socket and, over TLS, the session (which may hold bytes already received).
    fn into_parts(self) -> (TcpStream, Option<rustls::ClientConnection>) {
        match self {
            Conn::Plain(s) => (s, None),
            Conn::Tls(s) => {
                let s = *s;
                (s.sock, Some(s.conn))
            }
        }
    }

    /// Whether the handshake resumed a session (TLS 1.3 ticket or TLS 1.2 session id).
    fn resumed(&self) -> bool {
        match self {
            Conn::Plain(_) => false,
            Conn::Tls(s) => s.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
        }
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

fn read_until(s: &mut impl Read, done: impl Fn(&[u8]) -> bool, what: &str) -> Vec<u8> {
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

fn mqtt_connect(s: &mut impl ReadWrite, client_id: &str) {
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

/// The NATS subject for `--topic` (subject tokens are separated by `.`).
fn nats_subject(topic: &str) -> String {
    topic.replace('/', ".")
}

/// Reads the server's `INFO` line (always in plaintext), upgrades to TLS with `tls`
/// (NATS 2.9: the client starts the handshake after `INFO`), and sends `CONNECT` (NATS
/// client protocol; `verbose` off, so no `+OK` per command).
fn nats_connect(mut s: TcpStream, tls: Option<&Arc<rustls::ClientConfig>>) -> Conn {
    let info = read_until(&mut s, |b| b.ends_with(b"\r\n"), "nats info");
    if !info.starts_with(b"INFO ") {
        fail(format!(
            "nats: expected INFO, got {}",
            String::from_utf8_lossy(&info)
        ));
    }
    let required = memmem::find(&info, b"\"tls_required\":true").is_some();
    let mut c = match tls {
        Some(config) => Conn::upgrade(s, config),
        None if required => fail("nats: the server requires TLS (--tls)"),
        None => Conn::Plain(s),
    };
    let connect = format!(
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"tls_required\":{}}}\r\n",
        tls.is_some()
    );
    c.write_all(connect.as_bytes())
        .unwrap_or_else(|e| fail(format!("nats connect: {e}")));
    c
}

/// What the set-up code reads and writes: a [`Conn`] (or a plain socket).
trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn nats_publish(subject: &[u8], payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(b"PUB ");
    out.extend_from_slice(subject);
    out.extend_from_slice(format!(" {}\r\n", payload.len()).as_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
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
fn ws_open(s: &mut impl ReadWrite, addr: SocketAddr, role: &str) {
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

/// Connects to `addr` for `via`: over TLS with `tls` from the first byte, except NATS
/// (TLS after `INFO`) whose whole opening this does.
fn open(addr: SocketAddr, via: Target, tls: Option<&Arc<rustls::ClientConfig>>) -> Conn {
    let s = connect(addr);
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    match (via, tls) {
        (Target::Nats, _) => nats_connect(s, tls),
        (_, Some(config)) => Conn::upgrade(s, config),
        (_, None) => Conn::Plain(s),
    }
}

/// Opens one subscriber and returns it subscribed (TLS with `tls`).
fn subscribe(args: &Args, i: usize, tls: Option<&Arc<rustls::ClientConfig>>) -> Conn {
    let mut s = open(args.addr, args.target, tls);
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
        Target::Nats => {
            // The PONG to this PING says the SUB before it is in place.
            let p = format!("SUB {} {}\r\nPING\r\n", nats_subject(&args.topic), i + 1);
            s.write_all(p.as_bytes())
                .unwrap_or_else(|e| fail(format!("nats subscribe: {e}")));
            let got = read_until(
                &mut s,
                |b| memmem::find(b, b"PONG\r\n").is_some() || memmem::find(b, b"-ERR").is_some(),
                "nats subscribe",
            );
            if memmem::find(&got, b"-ERR").is_some() {
                fail(format!(
                    "nats subscribe refused: {}",
                    String::from_utf8_lossy(&got)
                ));
            }
        }
        Target::Ceiling => {
            s.write_all(b"SUB\n")
                .unwrap_or_else(|e| fail(format!("ceiling subscribe: {e}")));
            read_until(&mut s, |b| b.ends_with(b"OK\n"), "ceiling subscribe");
        }
    }
    s.tcp().set_read_timeout(None).ok();
    s
}

// ---------------------------------------------------------------------------------------
// The reader: one poll over every subscriber.

struct Sub {
    sock: mio::net::TcpStream,
    /// Over TLS: the session; reads decrypt through it.
    tls: Option<rustls::ClientConnection>,
    /// The unscanned end of the stream (a record cut by a read boundary).
    carry: Vec<u8>,
    received: u64,
    open: bool,
    /// NATS: the last bytes read, for a `PING` cut by a read boundary.
    tail: Vec<u8>,
}

impl Sub {
    /// Reads plaintext: from the socket, or over TLS what the session decrypts (reading
    /// the socket when it holds none). `Ok(0)` is the end of the stream.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(c) = &mut self.tls else {
            return self.sock.read(buf);
        };
        loop {
            match c.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if c.read_tls(&mut self.sock)? == 0 {
                return Ok(0);
            }
            c.process_new_packets().map_err(io::Error::other)?;
        }
    }

    /// Writes `data` (a NATS `PONG`), sealed over TLS; best effort.
    fn write(&mut self, data: &[u8]) {
        match &mut self.tls {
            None => {
                let _ = self.sock.write(data);
            }
            Some(c) => {
                let _ = c.writer().write_all(data);
                while c.wants_write() {
                    if c.write_tls(&mut self.sock).is_err() {
                        break;
                    }
                }
            }
        }
    }
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

/// What the reader saw: the latency histogram, deliveries per subscriber, and how many
/// subscribers the server closed (or reset) before the end: a server that drops slow
/// consumers shows up here, never as a silently lower count.
struct ReaderResult {
    hist: Hist,
    per_sub: Vec<u64>,
    dropped: usize,
}

/// Counts `PING\r\n` in `data`, including one that began in `tail` (the last bytes of
/// the previous read), and keeps the last 5 bytes as the new tail.
fn nats_pings(tail: &mut Vec<u8>, data: &[u8]) -> usize {
    const PING: &[u8] = b"PING\r\n";
    const KEEP: usize = PING.len() - 1;
    let mut n = memmem::find_iter(data, PING).count();
    let old = tail.len();
    if old > 0 {
        tail.extend_from_slice(&data[..data.len().min(KEEP)]);
        n += memmem::find_iter(tail.as_slice(), PING)
            .filter(|&i| i < old)
            .count();
    }
    if data.len() >= KEEP {
        tail.clear();
        tail.extend_from_slice(&data[data.len() - KEEP..]);
    } else {
        if old == 0 {
            tail.extend_from_slice(data);
        }
        let cut = tail.len().saturating_sub(KEEP);
        tail.drain(..cut);
    }
    n
}

fn reader(mut subs: Vec<Sub>, shared: Arc<Shared>, nats: bool) -> ReaderResult {
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
                let n = match s.read(&mut buf) {
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
                if nats {
                    // Keep-alive: an unanswered PING gets the subscriber dropped.
                    for _ in 0..nats_pings(&mut s.tail, &buf[..n]) {
                        s.write(b"PONG\r\n");
                    }
                }
                // A short read emptied the socket: a later arrival raises a new edge, so
                // skip the read that would only say WouldBlock (half the syscalls). Not
                // over TLS: a short plaintext read says nothing of the socket.
                let drained = s.tls.is_none() && n < buf.len();
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
    ReaderResult {
        hist: h,
        per_sub: subs.iter().map(|s| s.received).collect(),
        dropped: subs.iter().filter(|s| !s.open).count(),
    }
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
    /// HTTP: when each request not yet answered was written (answers come in order).
    sent_at: std::sync::Mutex<std::collections::VecDeque<u64>>,
    /// HTTP: each request's answer latency, ns (written to status line read).
    answer_ns: std::sync::Mutex<Vec<u64>>,
}

/// The publisher's connection, shared by the thread that writes Events and the one that
/// reads answers. Over TLS the session sits behind a lock: each write seals and sends
/// under it (records go out in sequence order), each read takes what the socket gave
/// (outside the lock) and decrypts it under the lock.
struct PubConn {
    tcp: TcpStream,
    tls: Option<Arc<std::sync::Mutex<rustls::ClientConnection>>>,
    /// Decrypted bytes not yet returned by `read`.
    pending: Vec<u8>,
    raw: Vec<u8>,
    eof: bool,
}

impl PubConn {
    fn new(c: Conn) -> PubConn {
        let (tcp, tls) = c.into_parts();
        PubConn {
            tcp,
            tls: tls.map(|c| Arc::new(std::sync::Mutex::new(c))),
            pending: Vec::new(),
            raw: Vec::new(),
            eof: false,
        }
    }

    fn try_clone(&self) -> PubConn {
        PubConn {
            tcp: self.tcp.try_clone().unwrap_or_else(|e| fail(e)),
            tls: self.tls.clone(),
            pending: Vec::new(),
            raw: vec![0; 64 * 1024],
            eof: false,
        }
    }

    fn write_all(&self, data: &[u8]) -> io::Result<()> {
        let Some(tls) = &self.tls else {
            return (&self.tcp).write_all(data);
        };
        let mut c = tls.lock().unwrap_or_else(|e| e.into_inner());
        let mut off = 0;
        let mut tcp = &self.tcp;
        loop {
            // rustls takes what fits under its buffer limit: send, then seal the rest.
            off += c.writer().write(&data[off..])?;
            while c.wants_write() {
                c.write_tls(&mut tcp)?;
            }
            if off == data.len() {
                return Ok(());
            }
        }
    }

    /// Reads plaintext (`Ok(0)`: the end); the socket's read timeout applies.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(tls) = &self.tls else {
            return (&self.tcp).read(buf);
        };
        loop {
            if !self.pending.is_empty() {
                let n = buf.len().min(self.pending.len());
                buf[..n].copy_from_slice(&self.pending[..n]);
                self.pending.drain(..n);
                return Ok(n);
            }
            if self.eof {
                return Ok(0);
            }
            let n = (&self.tcp).read(&mut self.raw)?;
            if n == 0 {
                return Ok(0);
            }
            let mut c = tls.lock().unwrap_or_else(|e| e.into_inner());
            let mut rd = &self.raw[..n];
            let mut chunk = [0u8; 16 * 1024];
            while !rd.is_empty() {
                c.read_tls(&mut rd)?;
                c.process_new_packets().map_err(io::Error::other)?;
                loop {
                    match c.reader().read(&mut chunk) {
                        Ok(0) => {
                            self.eof = true;
                            break;
                        }
                        Ok(k) => self.pending.extend_from_slice(&chunk[..k]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
            }
            let mut tcp = &self.tcp;
            while c.wants_write() {
                c.write_tls(&mut tcp)?;
            }
        }
    }

    /// Ends the sending side (`close_notify` first over TLS).
    fn shutdown_write(&self) {
        if let Some(tls) = &self.tls {
            let mut c = tls.lock().unwrap_or_else(|e| e.into_inner());
            c.send_close_notify();
            let mut tcp = &self.tcp;
            while c.wants_write() && c.write_tls(&mut tcp).is_ok() {}
        }
        let _ = self.tcp.shutdown(std::net::Shutdown::Write);
    }
}

fn answers(
    mut s: PubConn,
    target: Target,
    state: Arc<Answers>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut carry: Vec<u8> = Vec::new();
        s.tcp.set_read_timeout(Some(Duration::from_millis(20))).ok();
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
                            let now = clock();
                            let mut q = state.sent_at.lock().unwrap();
                            let mut lat = state.answer_ns.lock().unwrap();
                            for _ in 0..all {
                                if let Some(t) = q.pop_front() {
                                    lat.push(now.saturating_sub(t));
                                }
                            }
                        } else if matches!(target, Target::Nats | Target::Ceiling) {
                            // The PONG to the PING after the last PUB; `-ERR` lines; and
                            // the server's own keep-alive PING, answered.
                            for l in lines.split(|&b| b == b'\n') {
                                if l.starts_with(b"PONG") {
                                    ok += 1;
                                } else if l.starts_with(b"-ERR") {
                                    bad += 1;
                                } else if l.starts_with(b"PING") {
                                    let _ = s.write_all(b"PONG\r\n");
                                }
                            }
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
    /// HTTP publisher: p50 and p99 of the time from writing a POST to reading its
    /// status line, ns (0 for the other bindings).
    answer_p50_ns: u64,
    answer_p99_ns: u64,
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
    let addr = args.publish_addr.unwrap_or(args.addr);
    let tls = tls_client().map(|c| c.config.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let state = Arc::new(Answers::default());
    let mut conns = Vec::with_capacity(args.publishers);
    let mut readers = Vec::with_capacity(args.publishers);
    for k in 0..args.publishers {
        let mut c = open(addr, via, tls.as_ref());
        match via {
            Target::Mqtt => mqtt_connect(&mut c, &format!("aepload-pub{k}")),
            Target::Ws => ws_open(&mut c, addr, "emitter"),
            Target::Ceiling => c
                .write_all(b"PUB\n")
                .unwrap_or_else(|e| fail(format!("ceiling publisher: {e}"))),
            Target::Sse | Target::Redis | Target::Nats => {}
        }
        c.tcp().set_read_timeout(None).ok();
        let s = PubConn::new(c);
        readers.push(answers(s.try_clone(), via, state.clone(), stop.clone()));
        conns.push(s);
    }
    let markers = conns.len() as u64;
    let tpl = Template::new(args.size);
    let topic = args.topic.as_bytes();
    let subject = nats_subject(&args.topic);
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
                Target::Nats => {
                    event.clear();
                    tpl.write(sent + i, ts, &mut event);
                    nats_publish(subject.as_bytes(), &event, &mut out);
                }
                Target::Ceiling => {
                    tpl.write(sent + i, ts, &mut out);
                    out.push(b'\n');
                }
            }
        }
        if via == Target::Sse {
            out.extend_from_slice(
                format!(
                    "POST /events HTTP/1.1\r\nHost: {}\r\nAEP-Version: 0.1\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n",
                    addr,
                    body.len()
                )
                .as_bytes(),
            );
            out.extend_from_slice(&body);
            state.sent_at.lock().unwrap().push_back(clock());
        }
        if let Err(e) = conns[requests as usize % conns.len()].write_all(&out) {
            fail(format!("publish: {e}"));
        }
        sent += n;
        requests += 1;
    }
    let written = clock();
    // One end marker per connection: each answer stands for that connection's Events.
    let marker: Vec<u8> = match via {
        Target::Sse | Target::Redis => Vec::new(),
        Target::Mqtt => vec![0xC0, 0x00], // PINGREQ
        Target::Ws => {
            // Frames are handled in order: the pong stands for every Event before it.
            let mut p = Vec::new();
            ws_frame(br#"{"type":"ping","t":1}"#, &mut p);
            p
        }
        // Likewise the PONG: NATS handles a connection's commands in order.
        Target::Nats => b"PING\r\n".to_vec(),
        Target::Ceiling => b"PING\n".to_vec(),
    };
    let want = match via {
        Target::Sse => requests,
        Target::Redis => sent,
        _ => {
            for s in &conns {
                let _ = s.write_all(&marker);
            }
            markers
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
    for s in &conns {
        if via == Target::Mqtt {
            let _ = s.write_all(&[0xE0, 0x00]); // DISCONNECT
        }
    }
    stop.store(true, Ordering::Relaxed);
    for s in &conns {
        s.shutdown_write();
    }
    for r in readers {
        let _ = r.join();
    }
    let (mut ok, bad) = (
        state.ok.load(Ordering::Relaxed),
        state.bad.load(Ordering::Relaxed),
    );
    match via {
        // One 202 answers a whole batch.
        Target::Sse => ok = (ok * args.batch as u64).min(sent),
        // Each connection's PINGRESP (pong) stands for every PUBLISH (Event) before it.
        Target::Mqtt | Target::Ws | Target::Nats | Target::Ceiling => {
            ok = if ok >= markers { sent } else { 0 }
        }
        Target::Redis => {}
    }
    let mut lat = std::mem::take(&mut *state.answer_ns.lock().unwrap());
    lat.sort_unstable();
    let q = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Published {
        started,
        written,
        finished,
        ok,
        bad,
        answer_p50_ns: q(0.50),
        answer_p99_ns: q(0.99),
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

/// A `/proc/PID/status` memory line in KiB: `VmRSS:` (resident now) or `VmHWM:` (the
/// peak resident set since the process started).
fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

// ---------------------------------------------------------------------------------------
// The server's write syscalls, counted by `perf stat` on its syscall tracepoints.

/// The syscalls that write to a socket.
const WRITE_SYSCALLS: [&str; 4] = ["write", "writev", "sendmsg", "sendto"];

/// A `perf stat -p PID` started with its counters disabled, driven through its control
/// FIFOs (`--control fifo:ctl,ack`) so that it counts exactly the fan-out phase.
struct PerfStat {
    child: Child,
    ctl: std::fs::File,
    acks: std::sync::mpsc::Receiver<()>,
    dir: std::path::PathBuf,
}

impl PerfStat {
    /// Starts perf attached to `pid`; `None` (with a message) when it cannot.
    fn start(pid: u32) -> Option<PerfStat> {
        let dir = std::env::temp_dir().join(format!("aep-load-perf.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).ok()?;
        let (ctl, ack) = (dir.join("ctl"), dir.join("ack"));
        let made = Command::new("mkfifo").arg(&ctl).arg(&ack).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("aep-load: --syscalls: mkfifo failed");
            return None;
        }
        let events: Vec<String> = WRITE_SYSCALLS
            .iter()
            .map(|c| format!("syscalls:sys_enter_{c}"))
            .collect();
        let child = Command::new("perf")
            .args(["stat", "-x", ",", "-D", "-1", "-o"])
            .arg(dir.join("out"))
            .arg(format!(
                "--control=fifo:{},{}",
                ctl.display(),
                ack.display()
            ))
            .arg("-e")
            .arg(events.join(","))
            .arg("-p")
            .arg(pid.to_string())
            // perf stops when this workload exits: when its stdin is closed.
            .arg("--")
            .arg("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(dir.join("err")).ok()?))
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                eprintln!("aep-load: --syscalls: cannot run perf: {e}");
                return None;
            }
        };
        // Opened read-write, a FIFO never blocks on open (Linux), whether or not perf
        // has opened its end yet.
        let rw = |p: &std::path::Path| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .ok()
        };
        let ctl = rw(&ctl)?;
        let ack = rw(&ack)?;
        let (tx, acks) = std::sync::mpsc::channel();
        thread::spawn(move || {
            for line in io::BufReader::new(ack).lines() {
                match line {
                    // perf writes "ack\n\0": the NUL starts the next line.
                    Ok(l) if l.trim_start_matches('\0').starts_with("ack") => {
                        if tx.send(()).is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        Some(PerfStat {
            child,
            ctl,
            acks,
            dir,
        })
    }

    /// Sends one control command and waits for perf's `ack`.
    fn command(&mut self, cmd: &str) -> bool {
        // One write per command: perf parses what one read returns.
        if self.ctl.write_all(format!("{cmd}\n").as_bytes()).is_err() {
            return false;
        }
        let acked = self.acks.recv_timeout(Duration::from_secs(10)).is_ok();
        if !acked {
            eprintln!("aep-load: --syscalls: perf did not acknowledge {cmd:?}");
        }
        acked
    }

    /// Stops perf and returns the count of each of [`WRITE_SYSCALLS`].
    fn finish(mut self) -> Option<[u64; 4]> {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
        let out = std::fs::read_to_string(self.dir.join("out")).unwrap_or_default();
        let mut counts = [None; 4];
        for line in out.lines() {
            let f: Vec<&str> = line.split(',').collect();
            if f.len() < 3 {
                continue;
            }
            let Some(i) = WRITE_SYSCALLS
                .iter()
                .position(|c| f[2] == format!("syscalls:sys_enter_{c}"))
            else {
                continue;
            };
            counts[i] = match f[0] {
                "<not counted>" => Some(0),
                v => v.parse().ok(),
            };
        }
        let err = std::fs::read_to_string(self.dir.join("err")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&self.dir);
        if counts.iter().any(Option::is_none) {
            eprintln!(
                "aep-load: --syscalls: no counts from perf: {}",
                err.trim().lines().last().unwrap_or("")
            );
            return None;
        }
        Some(counts.map(|c| c.unwrap_or(0)))
    }
}

// ---------------------------------------------------------------------------------------
// `--serve`: the ceiling target's trivial forwarder.

/// Accepts subscribers (a connection whose first line is `SUB`, answered `OK`) and
/// publishers (`PUB`): each chunk of a publisher's complete lines (one `read`, up to
/// 256 KiB) is written as it is to every subscriber, with non-blocking writes so that no
/// subscriber waits for another, before the next chunk is read; a `PING` line (the
/// publisher's last) is answered `PONG` once everything before it was written. No
/// parsing, no per-Event work, one chunk in flight. After the publisher hangs up, the
/// next subscriber to connect starts a new run (the previous run's subscribers are closed
/// then). Exits after `timeout` seconds.
fn serve(addr: SocketAddr, timeout: u64) -> ! {
    let listener = TcpListener::bind(addr).unwrap_or_else(|e| fail(format!("bind {addr}: {e}")));
    thread::spawn(move || {
        thread::sleep(Duration::from_secs(timeout));
        std::process::exit(0)
    });
    let mut poll = Poll::new().unwrap_or_else(|e| fail(format!("poll: {e}")));
    let mut events = Events::with_capacity(1024);
    let mut subs: Vec<mio::net::TcpStream> = Vec::new();
    let mut ended = false;
    let mut buf = vec![0u8; 256 * 1024];
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { continue };
        let _ = s.set_nodelay(true);
        let mut first = [0u8; 4];
        if s.read_exact(&mut first).is_err() {
            continue;
        }
        match &first {
            b"SUB\n" => {
                if ended {
                    // The first subscriber of the next run: close the last run's.
                    for mut sub in subs.drain(..) {
                        let _ = poll.registry().deregister(&mut sub);
                    }
                    ended = false;
                }
                if s.write_all(b"OK\n").is_err() || s.set_nonblocking(true).is_err() {
                    continue;
                }
                let mut sub = mio::net::TcpStream::from_std(s);
                poll.registry()
                    .register(&mut sub, Token(subs.len()), Interest::WRITABLE)
                    .unwrap_or_else(|e| fail(format!("register: {e}")));
                subs.push(sub);
            }
            b"PUB\n" => {
                let mut have = 0;
                let mut offs = vec![0usize; subs.len()];
                let mut open = vec![true; subs.len()];
                let mut left: Vec<usize> = Vec::with_capacity(subs.len());
                let mut ready = vec![false; subs.len()];
                loop {
                    let n = match s.read(&mut buf[have..]) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    have += n;
                    let Some(nl) = memchr::memrchr(b'\n', &buf[..have]) else {
                        if have == buf.len() {
                            break; // no line fits: not our publisher
                        }
                        continue;
                    };
                    let lines = &buf[..=nl];
                    let n_subs = subs.len();
                    offs.fill(0);
                    ready.fill(false);
                    // Writes what sub `i` takes now; true while some of `lines` is left.
                    let mut write = |i: usize| loop {
                        if !open[i] {
                            return false;
                        }
                        match subs[i].write(&lines[offs[i]..]) {
                            Ok(k) => {
                                offs[i] += k;
                                if offs[i] == lines.len() {
                                    return false;
                                }
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(_) => {
                                open[i] = false;
                                return false;
                            }
                        }
                    };
                    left.clear();
                    for i in 0..n_subs {
                        if write(i) {
                            left.push(i);
                        }
                    }
                    while !left.is_empty() {
                        if let Err(e) = poll.poll(&mut events, Some(Duration::from_secs(1))) {
                            if e.kind() != io::ErrorKind::Interrupted {
                                fail(format!("poll: {e}"));
                            }
                        }
                        for ev in events.iter() {
                            if let Some(r) = ready.get_mut(ev.token().0) {
                                *r = true;
                            }
                        }
                        left.retain(|&i| {
                            if !std::mem::take(&mut ready[i]) {
                                return true;
                            }
                            write(i)
                        });
                    }
                    if lines.ends_with(b"PING\n") {
                        let _ = s.write_all(b"PONG\n");
                    }
                    buf.copy_within(nl + 1..have, 0);
                    have -= nl + 1;
                }
                // Subscribers stay open (a closed one counts as dropped) until the next
                // run's first subscriber connects.
                ended = true;
            }
            _ => {}
        }
    }
    fail("accept failed")
}

// ---------------------------------------------------------------------------------------
// `--reconnect-storm`: handshakes per second and time to all-resumed.

/// One storm round: every subscriber connects and subscribes, `threads` at a time.
struct Round {
    conns: Vec<Conn>,
    seconds: f64,
    resumed: usize,
    /// Per subscriber, connect to subscribed, µs: p50, p99, max.
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    server_cpu_s: f64,
    client_cpu_s: f64,
}

fn storm_round(args: &Args, configs: &[Option<Arc<rustls::ClientConfig>>]) -> Round {
    let threads = args.storm_threads.min(configs.len());
    let cpu0 = args.server_pid.and_then(cpu_seconds);
    let self0 = cpu_seconds(std::process::id());
    let t = Instant::now();
    let mut got: Vec<(usize, Conn, u64)> = thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                sc.spawn(move || {
                    (k..configs.len())
                        .step_by(threads)
                        .map(|i| {
                            let t = Instant::now();
                            let c = subscribe(args, i, configs[i].as_ref());
                            (i, c, t.elapsed().as_micros() as u64)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|_| fail("a storm thread panicked")))
            .collect()
    });
    let seconds = t.elapsed().as_secs_f64();
    let cpu = match (cpu0, args.server_pid.and_then(cpu_seconds)) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    let client = match (self0, cpu_seconds(std::process::id())) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    got.sort_by_key(|g| g.0);
    let mut lat: Vec<u64> = got.iter().map(|g| g.2).collect();
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64;
    Round {
        resumed: got.iter().filter(|g| g.1.resumed()).count(),
        p50_us: q(0.5),
        p99_us: q(0.99),
        max_us: lat.last().copied().unwrap_or(0) as f64,
        conns: got.into_iter().map(|g| g.1).collect(),
        seconds,
        server_cpu_s: cpu,
        client_cpu_s: client,
    }
}

/// Connects every subscriber (first handshakes), drops them all at once and reconnects
/// them all at once with their session caches (resumption), then again with fresh caches
/// (full handshakes under the same storm); prints one line per round (`--json`: one
/// object).
fn storm(args: &Args) {
    let n = args.subscribers;
    // One session cache per subscriber, as each real client has its own: a shared cache
    // keeps at most 8 TLS 1.3 tickets per server name.
    let own = || -> Vec<Option<Arc<rustls::ClientConfig>>> {
        (0..n)
            .map(|_| {
                tls_client().map(|c| {
                    let mut cfg = (*c.config).clone();
                    cfg.resumption = rustls::client::Resumption::in_memory_sessions(4);
                    Arc::new(cfg)
                })
            })
            .collect()
    };
    let mine = own();
    let mut rounds = Vec::new();
    let first = storm_round(args, &mine);
    let rss_first = args.server_pid.and_then(rss_kib);
    drop(first.conns);
    rounds.push((
        "first",
        first.seconds,
        first.resumed,
        first.p50_us,
        first.p99_us,
        first.max_us,
        first.server_cpu_s,
        first.client_cpu_s,
    ));
    let again = storm_round(args, &mine);
    drop(again.conns);
    rounds.push((
        "resume",
        again.seconds,
        again.resumed,
        again.p50_us,
        again.p99_us,
        again.max_us,
        again.server_cpu_s,
        again.client_cpu_s,
    ));
    let fresh = storm_round(args, &own());
    drop(fresh.conns);
    rounds.push((
        "full",
        fresh.seconds,
        fresh.resumed,
        fresh.p50_us,
        fresh.p99_us,
        fresh.max_us,
        fresh.server_cpu_s,
        fresh.client_cpu_s,
    ));
    let rss_mib = rss_first.map_or(f64::NAN, |k| k as f64 / 1024.0);
    let peak_mib = args
        .server_pid
        .and_then(|p| status_kib(p, "VmHWM:"))
        .map_or(f64::NAN, |k| k as f64 / 1024.0);
    let per_s = |secs: f64| n as f64 / secs;
    if args.json {
        let rs: Vec<String> = rounds
            .iter()
            .map(|(name, secs, resumed, p50, p99, max, cpu, client)| {
                format!(
                    "{{\"round\":\"{name}\",\"seconds\":{secs:.3},\"handshakes_per_s\":{:.0},\"resumed\":{resumed},\"p50_us\":{p50:.0},\"p99_us\":{p99:.0},\"max_us\":{max:.0},\"server_cpu_s\":{cpu:.2},\"server_cpu_ms_per_handshake\":{:.3},\"client_cpu_s\":{client:.2}}}",
                    per_s(*secs),
                    cpu * 1000.0 / n as f64
                )
            })
            .collect();
        println!(
            "{{\"target\":\"{}\",\"mode\":\"reconnect-storm\",\"tls\":\"{}\",\"subscribers\":{n},\"threads\":{},\"server_rss_mib\":{rss_mib:.1},\"server_peak_rss_mib\":{peak_mib:.1},\"rounds\":[{}]}}",
            args.target.name(),
            tls_seen(),
            args.storm_threads,
            rs.join(",")
        );
    } else {
        println!(
            "{} reconnect storm: {n} subscribers{}, {} at a time; server RSS {rss_mib:.1} MiB connected (peak {peak_mib:.1})",
            args.target.name(),
            if args.tls { " over TLS" } else { "" },
            args.storm_threads
        );
        for (name, secs, resumed, p50, p99, max, cpu, client) in &rounds {
            println!(
                "  {name:>6}: all subscribed in {secs:.3} s ({:.0} handshakes/s), {resumed} resumed; per subscriber p50 {p50:.0} µs, p99 {p99:.0} µs, max {max:.0} µs; server {cpu:.2} CPU s ({:.3} ms per handshake), load tool {client:.2} CPU s",
                per_s(*secs),
                cpu * 1000.0 / n as f64
            );
        }
    }
}

fn main() {
    let args = Args::parse();
    check(&args);
    if args.serve {
        serve(args.addr, args.timeout);
    }
    if args.tls {
        use rustls::crypto::ring::cipher_suite as cs;
        let suite = match args.tls_suite.as_str() {
            "aes128" => Some(cs::TLS13_AES_128_GCM_SHA256),
            "aes256" => Some(cs::TLS13_AES_256_GCM_SHA384),
            "chacha20" => Some(cs::TLS13_CHACHA20_POLY1305_SHA256),
            "any" => None,
            other => fail(format!(
                "--tls-suite takes aes128, aes256, chacha20 or any, got {other:?}"
            )),
        };
        match aep_check::tls::Client::with_suites(args.cacert.as_deref(), suite.map(|s| vec![s])) {
            Ok(c) => {
                let _ = TLS.set(Some(c));
            }
            Err(e) => fail(e),
        }
        let name = args
            .tls_name
            .clone()
            .unwrap_or_else(|| args.addr.ip().to_string());
        let _ = TLS_NAME.set(name);
    }
    clock();
    if args.reconnect_storm {
        // Bounded like every run: the watchdog ends a storm that outlives --timeout.
        let limit = args.timeout;
        thread::spawn(move || {
            thread::sleep(Duration::from_secs(limit));
            fail(format!(
                "--reconnect-storm: not done within --timeout {limit} s"
            ))
        });
        if args.resume {
            resume::storm_resume(&args);
        } else {
            storm(&args);
        }
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let rss_before = args.server_pid.and_then(rss_kib);

    let t = Instant::now();
    let tls = tls_client().map(|c| c.config.clone());
    let socks: Vec<Conn> = (0..args.subscribers)
        .map(|i| subscribe(&args, i, tls.as_ref()))
        .collect();
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
        .map(|c| {
            let (s, tls) = c.into_parts();
            s.set_nonblocking(true)
                .unwrap_or_else(|e| fail(format!("nonblocking: {e}")));
            Sub {
                sock: mio::net::TcpStream::from_std(s),
                tls,
                carry: Vec::new(),
                received: 0,
                open: true,
                tail: Vec::new(),
            }
        })
        .collect();
    let shared = Arc::new(Shared {
        delivered: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        last_delivery: AtomicU64::new(0),
    });
    let n_subs = subs.len() as u64;
    let nats = args.target == Target::Nats;
    let reader_thread = {
        let shared = shared.clone();
        thread::spawn(move || reader(subs, shared, nats))
    };
    let mut perf = match args.server_pid {
        Some(pid) if args.syscalls => PerfStat::start(pid),
        _ => None,
    };
    if let Some(mut p) = perf.take() {
        if p.command("enable") {
            perf = Some(p);
        } else {
            eprintln!("aep-load: --syscalls: perf did not start counting");
            let _ = p.finish();
        }
    }
    let self_before = cpu_seconds(std::process::id());
    let cpu_before = args.server_pid.and_then(cpu_seconds);
    let preempt_before = args.server_pid.and_then(preempted);
    let published = if args.subscribe_only {
        // Another instance publishes (at another relay of a cluster): the run starts at
        // the first delivery. Its latencies mean nothing here (the send times are that
        // instance's clock); its deliveries/s do.
        while shared.delivered.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_micros(200));
        }
        let t = clock();
        Published {
            answer_p50_ns: 0,
            answer_p99_ns: 0,
            started: t,
            written: t,
            finished: t,
            ok: 0,
            bad: 0,
        }
    } else {
        publish(&args, &shared, n_subs, deadline)
    };
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
    let self_after = cpu_seconds(std::process::id());
    let syscalls = perf.and_then(|mut p| {
        let counted = p.command("disable");
        let counts = p.finish();
        if counted {
            counts
        } else {
            None
        }
    });
    let preemptions = match (preempt_before, args.server_pid.and_then(preempted)) {
        (Some(a), Some(b)) => b.saturating_sub(a) as i64,
        _ => -1,
    };
    let rss = args.server_pid.and_then(rss_kib);
    let peak_rss = args.server_pid.and_then(|p| status_kib(p, "VmHWM:"));
    shared.stop.store(true, Ordering::Relaxed);
    let ReaderResult {
        hist: h,
        per_sub,
        dropped,
    } = reader_thread
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
    let peak_mib = peak_rss.map_or(f64::NAN, |k| k as f64 / 1024.0);
    let client_cpu = match (self_before, self_after) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    // How busy each side's core was over the measured interval (1.0: saturated).
    let busy = |cpu: f64| if secs > 0.0 { cpu / secs } else { f64::NAN };
    let (server_busy, client_busy) = (busy(cpu), busy(client_cpu));
    let write_calls = syscalls.map(|c| c.iter().sum::<u64>());
    let per_delivery = match write_calls {
        Some(w) if received > 0 => w as f64 / received as f64,
        _ => f64::NAN,
    };
    let syscall_json = match syscalls {
        Some(c) => format!(
            "\"write_syscalls\":{},\"syscalls\":{{\"write\":{},\"writev\":{},\"sendmsg\":{},\"sendto\":{}}},\"write_syscalls_per_delivery\":{per_delivery:.4}",
            c.iter().sum::<u64>(),
            c[0],
            c[1],
            c[2],
            c[3]
        ),
        None => "\"write_syscalls\":null,\"write_syscalls_per_delivery\":null".to_string(),
    };
    let write_s = (published.written - published.started) as f64 / 1e9;
    if args.json {
        println!(
            "{{\"target\":\"{}\",\"tls\":\"{}\",\"subscribers\":{},\"events\":{},\"size\":{},\"batch\":{},\"rate\":{},\"window\":{},\"publishers\":{},\
             \"expected\":{expected},\"deliveries\":{received},\"loss\":{loss},\"min_per_subscriber\":{min_sub},\
             \"connect_s\":{connect_s:.3},\"seconds\":{secs:.3},\"publish_seconds\":{publish_s:.3},\"write_seconds\":{write_s:.3},\"deliveries_per_s\":{rate:.0},\"events_per_s\":{events_rate:.0},\
             \"p50_us\":{p50:.1},\"p99_us\":{p99:.1},\"max_us\":{max:.1},\"publish_ok\":{},\"publish_errors\":{},\"post_p50_us\":{:.1},\"post_p99_us\":{:.1},\
             \"dropped_subscribers\":{dropped},\"client_cpu_s\":{client_cpu:.2},\"client_busy\":{client_busy:.2},\
             \"server_cpu_s\":{cpu:.2},\"server_busy\":{server_busy:.2},\"deliveries_per_server_cpu_s\":{per_cpu:.0},\"events_per_server_cpu_s\":{events_per_cpu:.0},\"server_preempted\":{preemptions},\"server_rss_mib\":{rss_mib:.1},\"server_peak_rss_mib\":{peak_mib:.1},{syscall_json}}}",
            args.target.name(),
            tls_seen(),
            n_subs,
            args.events,
            args.size,
            args.batch,
            args.rate,
            args.window,
            args.publishers,
            published.ok,
            published.bad,
            published.answer_p50_ns as f64 / 1e3,
            published.answer_p99_ns as f64 / 1e3,
        );
    } else {
        println!(
            "{}{}: {} subscribers, {} Events of {} bytes (batch {}, rate {}, window {}, {} publisher connections)",
            args.target.name(),
            if args.tls {
                format!(" over {}", tls_seen())
            } else {
                String::new()
            },
            n_subs,
            args.events,
            args.size,
            args.batch,
            args.rate,
            args.window,
            args.publishers
        );
        println!(
            "  deliveries {received}/{expected} (loss {loss}, {dropped} subscribers dropped) in {secs:.3} s: {rate:.0} deliveries/s, {events_rate:.0} Events/s"
        );
        println!("  load tool: {client_cpu:.2} CPU s ({client_busy:.2} of its core)");
        println!("  latency p50 {p50:.1} µs, p99 {p99:.1} µs, max {max:.1} µs");
        println!(
            "  publisher: writes {write_s:.3} s, answered after {publish_s:.3} s, ok {} / errors {}; POST answered p50 {:.1} µs, p99 {:.1} µs",
            published.ok,
            published.bad,
            published.answer_p50_ns as f64 / 1e3,
            published.answer_p99_ns as f64 / 1e3
        );
        if args.server_pid.is_some() {
            println!(
                "  server: {cpu:.2} CPU s ({server_busy:.2} of its core; {per_cpu:.0} deliveries, {events_per_cpu:.0} Events per CPU s), preempted {preemptions} times, RSS {rss_mib:.1} MiB (peak {peak_mib:.1})"
            );
            if let (Some(w), Some(c)) = (write_calls, syscalls) {
                println!(
                    "  server write syscalls: {w} ({per_delivery:.4} per delivery; write {}, writev {}, sendmsg {}, sendto {})",
                    c[0], c[1], c[2], c[3]
                );
            }
        }
    }
    if dropped > 0 {
        eprintln!("aep-load: the server closed {dropped} of {n_subs} subscribers");
    }
    if loss > 0 || published.bad > 0 || dropped > 0 {
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::nats_pings;

    /// Every `PING\r\n` is counted once, wherever the reads cut the stream.
    #[test]
    fn nats_pings_across_read_boundaries() {
        let stream: &[u8] = b"MSG a.b 1 3\r\nabc\r\nPING\r\nMSG a.b 1 1\r\nx\r\nPING\r\nPING\r\n";
        for cut in 1..stream.len() {
            let mut tail = Vec::new();
            let mut n = 0;
            for piece in stream.chunks(cut) {
                n += nats_pings(&mut tail, piece);
            }
            assert_eq!(n, 3, "reads of {cut} bytes");
        }
    }
}
