//! Harness pieces shared by the targets that drive the relay's sans-IO core through
//! `aep_sim::Sim` (`http`, `ws`, `conn_script`). Unlike the oracles in the crate root,
//! these call into the relay: they set a scene, they judge nothing.
//!
//! Virtual time: every target configures short timeouts ([`timeouts`]) and moves the
//! clock only by deltas read from its input, so a run never depends on the real clock
//! and costs a handful of deadlines, not the hours of heartbeats a default
//! configuration would step through.

use aep_relay::wire::envelope::Event;
use aep_relay::Config;
use aep_sim::Sim;
use bytes::Bytes;
use std::sync::OnceLock;
use std::time::Duration;

/// Replay depth per session in the targets' configurations (small: a fuzzed session
/// fills it and evicts quickly).
pub const BUFFER: usize = 4;
/// Sessions held at most in the targets' configurations.
pub const SESSIONS: usize = 4;

/// SSE heartbeat and WebSocket ping interval of the targets (virtual time).
pub const HEARTBEAT: Duration = Duration::from_secs(4);
/// Time a request may take to arrive before 408.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Keep-alive idle close.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// WebSocket idle close (must exceed the heartbeat, `Config::validate`).
pub const WS_IDLE_TIMEOUT: Duration = Duration::from_secs(6);
/// Graceful shutdown deadline.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(3);
/// A clock jump past every timeout and every chain of them (a 408, then its linger of
/// `max(request_timeout, 2 s)`; a half-closed peer's linger): what the targets use
/// where they once jumped an hour.
pub const JUMP: Duration = Duration::from_secs(20);
/// The unit of a clock delta read from an input byte: `b * TICK`, 0..=25.5 s, which
/// spans every configured timeout.
pub const TICK: Duration = Duration::from_millis(100);

/// `c` with the targets' short timeouts ([`HEARTBEAT`] and the rest).
pub fn timeouts(mut c: Config) -> Config {
    c.heartbeat = HEARTBEAT;
    c.request_timeout = REQUEST_TIMEOUT;
    c.idle_timeout = IDLE_TIMEOUT;
    c.ws_idle_timeout = WS_IDLE_TIMEOUT;
    c.shutdown_deadline = SHUTDOWN_DEADLINE;
    c
}

/// A clock delta from an input byte: `b * TICK`, and 0 for [`JUMP`] (past every
/// timeout).
pub fn delta(b: u8) -> Duration {
    if b == 0 {
        JUMP
    } else {
        TICK * u32::from(b)
    }
}

/// Every session's buffer full: `SESSIONS * BUFFER` (16) Events of about 5 KiB each
/// (80 KiB in all, more than the targets' 64 KiB output bound, so a `from=all` replay
/// must be paced), half `info` and half `notice`, sessions `p0`..`p3`, seq 0..3.
///
/// Few and large: what a prefill costs per input is mostly `Store::admit` per Event,
/// and 128 Events of 1 KiB cost 8 times 16 of 5 KiB. Parsed once per process and
/// shared: an `Event` is immutable, so handing clones of the same Events (sharing their
/// bytes) to every input's core cannot carry state from one input to the next.
pub fn prefill() -> &'static [Event] {
    static EVENTS: OnceLock<Vec<Event>> = OnceLock::new();
    EVENTS.get_or_init(|| {
        let pad = "x".repeat(4800);
        let mut out = Vec::new();
        for s in 0..SESSIONS {
            for q in 0..BUFFER {
                let sev = if q % 2 == 0 { "info" } else { "notice" };
                let line = format!(
                    r#"{{"aep":"0.1","id":"p{s}-{q}","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a/session/p{s}","agent":"a","session":"p{s}","seq":{q},"severity":"{sev}","data":{{"pad":"{pad}"}}}}"#
                );
                let ev = Event::parse(Bytes::from(line)).expect("prefill Events are valid");
                out.push(ev);
            }
        }
        out
    })
}

/// The configuration of the targets that fuzz HTTP (`http`, `floor`): the short
/// timeouts, and small limits so the fuzzer reaches them (`max_output_bytes` is given,
/// at least the 64 KiB `Config::validate` allows).
pub fn http_config(max_head: usize, max_body: usize, max_output: usize) -> Config {
    let mut c = timeouts(Config::default());
    c.listen = "127.0.0.1:0".parse().expect("address");
    c.buffer_per_session = BUFFER;
    c.max_sessions = SESSIONS;
    c.max_body_bytes = max_body;
    c.max_batch_events = 4;
    c.max_from_positions = 4;
    c.max_head_bytes = max_head;
    c.max_output_bytes = max_output;
    c
}

/// The largest single thing the relay queues at once on an HTTP or SSE connection with
/// these limits: a response echoing (part of) the head, one SSE message of one Event
/// (at most one body, or a prefill Event) with its `event:`/`id:` lines, or the status
/// page ([`status_page_answer`]; the seeds `crash-status-page-over-one-answer-*` found a
/// bound that left it out).
pub fn one_http_answer(max_head: usize, max_body: usize) -> usize {
    (3 * max_head + 3 * max_body + 1024).max(status_page_answer())
}

/// Bytes of the relay's answer to `GET /` (the status page, about 18 KiB): one answer
/// larger than any error or SSE message the targets' limits allow, so the output bound's
/// "plus one answer" must cover it. Measured once per process through a core, so the
/// bound follows the page as it changes.
pub fn status_page_answer() -> usize {
    static LEN: OnceLock<usize> = OnceLock::new();
    *LEN.get_or_init(|| {
        let mut sim = Sim::new(Config::default()).expect("default configuration");
        let c = sim.connect(None);
        sim.feed(c, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false);
        let out = sim.take_output(c).expect("open");
        assert!(
            out.starts_with(b"HTTP/1.1 200 "),
            "GET / answers the status page"
        );
        out.len()
    })
}

/// Whether this input also runs a second time to check that it gives byte-identical
/// output: one input in 8, chosen by a hash of its length and of its first and last 32
/// bytes (so a reproduction of a crash file makes the same choice; hashing every byte
/// cost 3% of an input, instrumented).
pub fn sampled(data: &[u8]) -> bool {
    let ends = data.len().min(32);
    let mut h: u32 = 0x811c_9dc5 ^ data.len() as u32;
    for b in data[..ends].iter().chain(&data[data.len() - ends..]) {
        h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    h.is_multiple_of(8)
}

/// Whether this input also runs a second time, which `AEP_FUZZ_TWICE=1` forces for
/// every input (for `cargo fuzz tmin` of a determinism failure: minimizing changes the
/// hash [`sampled`] draws on).
fn twice(data: &[u8]) -> bool {
    static ALWAYS: OnceLock<bool> = OnceLock::new();
    *ALWAYS.get_or_init(|| std::env::var_os("AEP_FUZZ_TWICE").is_some_and(|v| v == "1"))
        || sampled(data)
}

/// Runs `play` on `data`, and once more when [`sampled`] (or `AEP_FUZZ_TWICE=1`),
/// asserting both runs gave the same transcript: the clock and every other input come
/// from `data`, so nothing else (the real clock, a hash seed, state left by an earlier
/// input) may show.
pub fn deterministic(data: &[u8], play: impl Fn(&[u8]) -> Vec<u8>) {
    let first = play(data);
    if twice(data) {
        let second = play(data);
        if first != second {
            let at = first
                .iter()
                .zip(&second)
                .position(|(a, b)| a != b)
                .unwrap_or(first.len().min(second.len()));
            let show = |t: &[u8]| {
                String::from_utf8_lossy(&t[at.saturating_sub(80)..(at + 80).min(t.len())])
                    .into_owned()
            };
            panic!(
                "the same input gave different output (lengths {} and {}, first difference at byte {at}): {:?} vs {:?}",
                first.len(),
                second.len(),
                show(&first),
                show(&second)
            );
        }
    }
}
