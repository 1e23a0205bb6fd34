//! Shedding by severity toward a slow consumer, over real sockets (AEP-0003 §8.4,
//! AEP-0007 §5 item 1): a consumer that reads more slowly than an emitter writes loses
//! `debug` Events first (past half of `--max-output`), never a `notice`, is never
//! disconnected while `notice`-and-above Events alone fit, and is told in its stream how
//! many Events were dropped, just where they are missing.
//!
//! The consumers read at about 1.6 MB/s (16 KiB, then 10 ms of sleep): the slowness is
//! the behaviour under test, not a synchronisation. Every wait is a read bounded by
//! `support::WAIT`.

use crate::support;
use serde_json::{json, Value};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use support::*;

/// `--max-output 1048576` (the flag takes bytes).
const MAX_OUTPUT: usize = 1 << 20;
/// Events posted, seq 1 to `EVENTS`, every `NOTICE_EVERY`th a `notice`, the rest
/// `debug` (19,960 of them).
const EVENTS: u64 = 20_000;
const NOTICE_EVERY: u64 = 500;
const NOTICES: u64 = EVENTS / NOTICE_EVERY;
const DEBUG: u64 = EVENTS - NOTICES;
/// Events per `POST /events`.
const BATCH: u64 = 1_000;
/// A slow reader takes `CHUNK` bytes, then sleeps `PAUSE`.
const CHUNK: usize = 16 * 1024;
const PAUSE: Duration = Duration::from_millis(10);

/// A reader (and writer) that reads at most [`CHUNK`] bytes per [`PAUSE`]: a consumer
/// slower than the relay's emitter.
struct Slow<S> {
    inner: S,
    taken: usize,
}

impl<S> Slow<S> {
    fn new(inner: S) -> Slow<S> {
        Slow { inner, taken: 0 }
    }
}

impl<S: Read> Read for Slow<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.taken >= CHUNK {
            std::thread::sleep(PAUSE);
            self.taken = 0;
        }
        let room = buf.len().min(CHUNK - self.taken);
        let n = self.inner.read(&mut buf[..room])?;
        self.taken += n;
        Ok(n)
    }
}

impl<S: Write> Write for Slow<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Event `seq` of the flood, about 900 bytes: a `notice` `message.agent.replied` every
/// [`NOTICE_EVERY`], otherwise a `debug` `progress.status` (a live view that may be shed,
/// AEP-0007 §5 item 1).
fn flood_event(seq: u64) -> String {
    let (ty, severity) = if seq.is_multiple_of(NOTICE_EVERY) {
        ("message.agent.replied", "notice")
    } else {
        ("progress.status", "debug")
    };
    let text = "d".repeat(640);
    let e = event(
        "shed",
        0,
        seq,
        ty,
        &format!(r#","severity":"{severity}","data":{{"text":"{text}"}}"#),
    );
    debug_assert!((850..950).contains(&e.len()), "{}", e.len());
    e
}

/// Posts the whole flood, [`BATCH`] Events a request.
fn post_flood(relay: &TestRelay) {
    for first in (1..=EVENTS).step_by(BATCH as usize) {
        let lines: Vec<String> = (first..first + BATCH).map(flood_event).collect();
        relay.post_ok(&lines);
    }
}

/// The `seq` of an Event's JSON text.
fn seq_of(data: &str) -> u64 {
    let at = data.find(r#""seq":"#).expect("a seq") + 6;
    let digits: String = data[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().unwrap()
}

/// What one consumer saw of the flood.
#[derive(Debug, Default)]
struct Seen {
    /// `debug` Events delivered.
    debug: u64,
    /// The seq of each `notice` delivered.
    notices: Vec<u64>,
    /// The drop notices: (n, debug, info) each.
    told: Vec<(u64, u64, u64)>,
    /// The seq of the last Event delivered.
    last: u64,
}

impl Seen {
    /// One Event delivered, `notice` the drop notice just before it, if any. The flood
    /// is one session in seq order, so the Events dropped before this one are exactly
    /// the seqs it skips: a notice must come just where some are missing, and name
    /// exactly how many.
    fn event(&mut self, data: &str, notice: Option<(u64, u64, u64)>) {
        let seq = seq_of(data);
        assert!(seq > self.last, "in order, once: {seq} after {}", self.last);
        let skipped = seq - self.last - 1;
        match notice {
            Some((n, debug, info)) => {
                assert_eq!(n, debug + info, "n = debug + info");
                assert_eq!(info, 0, "only debug Events were posted besides notices");
                assert_eq!(
                    n, skipped,
                    "the notice before seq {seq} names what it skips"
                );
                self.told.push((n, debug, info));
            }
            None => assert_eq!(skipped, 0, "seq {seq}: {skipped} dropped, untold"),
        }
        self.last = seq;
        if data.contains(r#""severity":"notice""#) {
            self.notices.push(seq);
        } else {
            self.debug += 1;
        }
    }

    fn told_debug(&self) -> u64 {
        self.told.iter().map(|t| t.1).sum()
    }

    /// Every notice arrived, and every debug Event was either delivered or named by a
    /// drop notice.
    fn check_complete(&self, who: &str) {
        eprintln!(
            "{who}: {} notices, {} debug Events delivered, {} dropped in {} gaps",
            self.notices.len(),
            self.debug,
            self.told_debug(),
            self.told.len()
        );
        let want: Vec<u64> = (1..=NOTICES).map(|i| i * NOTICE_EVERY).collect();
        assert_eq!(
            self.notices,
            want,
            "{who}: every notice, in order ({} of {NOTICES}; told of {} drops)",
            self.notices.len(),
            self.told_debug()
        );
        assert_eq!(
            self.debug + self.told_debug(),
            DEBUG,
            "{who}: delivered + dropped debug Events = {DEBUG}"
        );
        assert!(
            self.told_debug() > 0,
            "{who}: the consumer was slow enough to lose some debug Events"
        );
    }
}

/// `name{labels}`'s value in a Prometheus text.
fn metric(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {sample} in\n{text}"))
        .parse()
        .unwrap()
}

/// The consumer is still connected, was never disconnected, and the relay's drop
/// counters say what the consumer was told.
fn check_metrics(relay: &TestRelay, seen: &Seen, binding: &str) {
    let text = relay.get_text("/metrics");
    assert_eq!(metric(&text, "aep_backpressure_disconnects_total"), 0.0);
    let open = format!(r#"aep_connections{{binding="{binding}"}}"#);
    assert_eq!(metric(&text, &open), 1.0, "the consumer is still connected");
    let debug = r#"aep_dropped_events_total{severity="debug"}"#;
    assert_eq!(metric(&text, debug), seen.told_debug() as f64);
    let info = r#"aep_dropped_events_total{severity="info"}"#;
    assert_eq!(metric(&text, info), 0.0);
}

/// The `: dropped {n} debug={d} info={i}` comment (docs/consuming.md), parsed strictly.
fn parse_comment(c: &str) -> Option<(u64, u64, u64)> {
    let rest = c.strip_prefix("dropped ")?;
    let mut parts = rest.split(' ');
    let n = parts.next()?.parse().ok()?;
    let debug = parts.next()?.strip_prefix("debug=")?.parse().ok()?;
    let info = parts.next()?.strip_prefix("info=")?.parse().ok()?;
    assert!(parts.next().is_none(), "nothing after info=: {c:?}");
    Some((n, debug, info))
}

/// With `--max-output 1048576`, an SSE consumer reading about 1.6 MB/s and 19,960
/// `debug` Events of ~900 B with a `notice` every 500th: a queue filled with `debug`
/// Events would leave no room for a notice, and the consumer would be disconnected after
/// a few of the 40. `debug` stops at half the bound, so all 40 notices arrive, the
/// consumer stays connected, and `: dropped` comments name exactly the Events missing
/// where they are missing (AEP-0003 §8.4).
#[test]
fn a_slow_sse_consumer_gets_every_notice_and_is_told_what_was_shed() {
    let relay = TestRelay::with(|c| c.max_output_bytes = MAX_OUTPUT);
    let mut tcp = relay.tcp();
    tcp.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        .unwrap();
    let head = read_head(&mut tcp);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let reader = std::thread::spawn(move || {
        let mut stream = SseStream::new(Box::new(Slow::new(tcp)));
        let mut seen = Seen::default();
        while (seen.notices.len() as u64) < NOTICES {
            let Some(m) = stream.next() else {
                break; // disconnected: `check_complete` says what was missed
            };
            let mut told = None;
            for c in &m.comments {
                let t = parse_comment(c).unwrap_or_else(|| panic!("unexpected comment {c:?}"));
                assert!(told.replace(t).is_none(), "one comment per gap");
            }
            seen.event(&m.data, told);
        }
        (seen, stream)
    });
    post_flood(&relay);
    let (seen, _open) = reader.join().unwrap();
    seen.check_complete("SSE");
    check_metrics(&relay, &seen, "sse");
}

/// The same flood toward a WebSocket consumer that declared
/// `capabilities.experimental.dropped` in its `hello`: it gets every notice, stays
/// connected, and `{"type":"dropped",…}` frames name the Events missing where they are
/// missing.
#[test]
fn a_slow_websocket_consumer_gets_every_notice_and_dropped_frames() {
    use tungstenite::Message;
    let relay = TestRelay::with(|c| c.max_output_bytes = MAX_OUTPUT);
    let tcp = TcpStream::connect(relay.addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let url = format!("ws://{}/socket", relay.addr);
    let (mut ws, _) = tungstenite::client::client(url, Slow::new(tcp)).expect("handshake");
    let hello = json!({"type": "hello", "versions": ["0.1"], "role": "consumer",
        "capabilities": {"experimental": {"dropped": {}}}});
    ws.send(Message::text(hello.to_string())).unwrap();
    let next = move |ws: &mut tungstenite::WebSocket<Slow<TcpStream>>| loop {
        match ws.read() {
            Ok(Message::Text(t)) if t.starts_with(r#"{"type":"ping""#) => continue,
            Ok(Message::Text(t)) => return Some(t.to_string()),
            Ok(Message::Close(_)) => return None,
            Ok(_) => continue,
            Err(e) => panic!("read failed (waited {WAIT:?}?): {e}"),
        }
    };
    let reply: Value = serde_json::from_str(&next(&mut ws).unwrap()).unwrap();
    assert_eq!(reply["type"], "hello");
    ws.send(Message::text(r#"{"type":"subscribe","id":"all"}"#))
        .unwrap();
    assert_eq!(
        next(&mut ws).unwrap(),
        r#"{"type":"subscribed","id":"all"}"#
    );
    let reader = std::thread::spawn(move || {
        let mut seen = Seen::default();
        let mut told = None;
        while (seen.notices.len() as u64) < NOTICES {
            let Some(t) = next(&mut ws) else {
                break;
            };
            if t.starts_with(r#"{"type":"closing""#) {
                break; // disconnected: `check_complete` says what was missed
            }
            if t.starts_with(r#"{"type":"dropped""#) {
                let f: Value = serde_json::from_str(&t).unwrap();
                let n = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k} in {t}"));
                let t = (n("count"), n("debug"), n("info"));
                assert!(told.replace(t).is_none(), "one frame per gap");
                continue;
            }
            assert!(t.starts_with(r#"{"aep""#), "an Event: {t}");
            seen.event(&t, told.take());
        }
        (seen, ws)
    });
    post_flood(&relay);
    let (seen, _open) = reader.join().unwrap();
    seen.check_complete("WebSocket");
    check_metrics(&relay, &seen, "ws");
    assert_eq!(
        reply["capabilities"]["experimental"]["dropped"],
        json!({}),
        "the relay declares the frame it sent: {reply}"
    );
}
