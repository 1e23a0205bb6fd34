//! Every fault the fuzz targets (`fuzz/`, see `fuzz/README.md`) found, kept as a test with
//! the minimized input, plus a case or two of the same class around it.
//!
//! Each test names the target that found it and the fault class; the rule it pins is
//! kept in the module the test exercises.

use aep_sim::Sim;
use std::time::Duration;

use aep_relay::subscription::{self, Position, Resume};
use aep_relay::wire::http::RequestHead;
use aep_relay::wire::sse;
use aep_relay::Config;

fn config() -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        max_output_bytes: 64 * 1024,
        ..Config::default()
    }
}

fn relay() -> Sim {
    Sim::new(config()).unwrap()
}

fn stream_request(query: &str, last_event_id: Option<&str>) -> RequestHead {
    RequestHead {
        method: "GET".into(),
        path: "/stream".into(),
        query: query.into(),
        minor_version: 1,
        headers: last_event_id
            .map(|v| vec![("last-event-id".to_owned(), v.to_owned())])
            .unwrap_or_default(),
    }
}

/// `sse_query`: `Last-Event-ID: t:3:+5` must not resume at seq 5, though Rust's
/// `u64::from_str` takes a leading `+`: the id the relay writes (AEP-0003 §3.3.2) is
/// digits only, so anything else is refused like any other malformed id.
#[test]
fn last_event_id_numbers_are_decimal_digits_only() {
    for bad in [
        "t:3:+5", "t:+3:5", "t:3: 5", "t:3:5 ", "t:-0:5", "t::5", "t:3:", "t:0x1:2",
    ] {
        assert_eq!(subscription::parse_last_event_id(bad), None, "{bad:?}");
        assert!(subscription::parse_stream_request(&stream_request("", Some(bad)), 10).is_err());
    }
    assert_eq!(
        subscription::parse_last_event_id("a:b:007:18446744073709551615"),
        Some(Position {
            session: "a:b".into(),
            epoch: 7,
            seq: u64::MAX
        })
    );
    assert_eq!(
        subscription::parse_last_event_id("t:0:18446744073709551616"),
        None
    );
}

/// `sse_query`: `from=[{"session":"s","session":"s","seq":3}]` must not be read
/// last-wins. A duplicated member in `from` is refused (`invalid-filter`, AEP-0003
/// §6.5), as it is in `filter`: two readers could resume different sessions.
#[test]
fn from_refuses_duplicate_members() {
    for q in [
        r#"from=[{"session":"s","session":"s","seq":3}]"#,
        r#"from=[{"session":"a","seq":1,"session":"b"}]"#,
        r#"from=[{"session":"s","seq":1,"seq":2}]"#,
        r#"from=[{"session":"s","epoch":0,"epoch":1,"seq":2}]"#,
    ] {
        let e = subscription::parse_stream_request(&stream_request(q, None), 10).unwrap_err();
        assert_eq!(e.code.as_str(), "invalid-filter", "{q}");
        assert!(e.detail.contains("duplicate"), "{q}: {}", e.detail);
    }
    let ok = subscription::parse_stream_request(
        &stream_request(
            r#"from=[{"session":"s","seq":3},{"session":"s","seq":4}]"#,
            None,
        ),
        10,
    )
    .unwrap();
    assert!(matches!(ok.from, Resume::Positions(ref p) if p.len() == 2));
}

/// `http`: a peer that pipelines requests, never reads the answers and half-closes must
/// not keep its connection open forever (with `close_after_flush` set outside the
/// `Closing` phase, no timer would reap it). After EOF the connection is closing and the
/// linger timer ends it.
#[test]
fn half_closed_peer_that_never_reads_is_reaped() {
    for input in [
        &b"GET /events HTTP/1.1\r\n\r\n"[..],
        b"GET /events HTTP/1.1\r\n\r\nGET /events HTTP/1.1\r\n\r\nGET /events HTTP/1.1\r\n\r\n",
        // A request cut short: nothing to answer, and the answer to the first is unread.
        b"GET /events HTTP/1.1\r\n\r\nPOST /events HTTP/1.1\r\nContent-Length: 10\r\n\r\n{",
    ] {
        let mut relay = relay();
        let c = relay.connect(Some(0)); // a consumer that stopped reading
        relay.feed(c, input, true);
        assert!(relay.is_open(c), "the answer is still queued");
        relay.advance(Duration::from_secs(3600));
        assert!(!relay.is_open(c), "{:?}", String::from_utf8_lossy(input));
    }
    // A peer that does read gets its answers and the close.
    let mut relay = relay();
    let c = relay.connect(None);
    relay.feed(c, b"GET /events HTTP/1.1\r\n\r\n", true);
    assert!(!relay.is_open(c));
    let out = relay.take_output(c).unwrap();
    assert!(out.starts_with(b"HTTP/1.1 200 OK\r\n"));
}

/// `http` (bound invariant: `queued_output <= max_output_bytes` + one answer): a peer
/// that pipelines requests and never reads the answers would grow an unbounded output
/// queue by about 14 bytes per byte sent (5000 `GET /events`: 1.7 MB against a 64 KiB
/// bound). Reading and request processing pause at the bound and resume as the queue
/// drains, so the peer's own send buffer pushes back (TCP flow control).
#[test]
fn pipelined_requests_pause_at_the_output_bound() {
    let max = config().max_output_bytes;
    let mut relay = relay();
    let requests = "GET /events HTTP/1.1\r\n\r\n".repeat(5000);
    let answers = |out: &[u8]| {
        out.windows(17)
            .filter(|w| w == b"HTTP/1.1 200 OK\r\n")
            .count()
    };

    // Never reads: the queue stops at the bound (plus the answer that crossed it).
    let stalled = relay.connect(Some(0));
    relay.feed(stalled, requests.as_bytes(), false);
    let queued = relay.queued_output(stalled).unwrap();
    assert!(queued >= max && queued < max + 1024, "{queued}");

    // Reads slowly, 4 KiB at a time: every request is answered, in order, and the queue
    // never passes the bound.
    let slow = relay.connect(Some(4096));
    relay.feed(slow, requests.as_bytes(), true);
    let mut out = Vec::new();
    while relay.is_open(slow) {
        assert!(relay.queued_output(slow).unwrap() < max + 1024);
        out.extend(relay.take_output(slow).unwrap());
    }
    out.extend(relay.take_output(slow).unwrap());
    assert_eq!(answers(&out), 5000);
}

/// Events of about 1 KiB: `count` per session for `sessions` sessions, alternately `info`
/// and `notice`, ids `p{session}-{seq}`.
fn padded_events(sessions: usize, count: usize, first_seq: usize) -> Vec<bytes::Bytes> {
    let pad = "x".repeat(900);
    let mut out = Vec::new();
    for s in 0..sessions {
        for q in first_seq..first_seq + count {
            let sev = if q % 2 == 0 { "info" } else { "notice" };
            out.push(bytes::Bytes::from(format!(
                r#"{{"aep":"0.1","id":"p{s}-{q}","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a/session/p{s}","agent":"a","session":"p{s}","seq":{q},"severity":"{sev}","data":{{"pad":"{pad}"}}}}"#
            )));
        }
    }
    out
}

/// The ids of the Events in an SSE stream, in order.
fn stream_ids(out: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| {
            serde_json::from_str::<serde_json::Value>(d).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// `http` (bound invariant, with the replay store filled first): `GET /stream?from=all`
/// must not frame the whole replay into the output queue at once, past
/// `max_output_bytes` (~145 KiB against 64 KiB here; with the defaults, a copy of the
/// whole store per subscriber). Replay is paced by the consumer's reading; this pins
/// that under the fuzz target's scenario: a stalled reader, a slow reader with live
/// Events arriving mid-replay (all delivered, in order, once), and `live=0`.
#[test]
fn replay_is_paced_by_the_output_bound() {
    let c = Config {
        buffer_per_session: 16,
        max_sessions: 8,
        ..config()
    };
    let max = c.max_output_bytes;
    let mut relay = Sim::new(c).unwrap();
    for ev in padded_events(8, 16, 0) {
        relay.ingest(ev).unwrap();
    }
    let replayed: Vec<String> = (0..8)
        .flat_map(|s| (0..16).map(move |q| format!("p{s}-{q}")))
        .collect();

    // A reader that never reads: the queue stops at the bound, plus one frame.
    let stalled = relay.connect(Some(0));
    relay.feed(stalled, b"GET /stream?from=all HTTP/1.1\r\n\r\n", false);
    let queued = relay.queued_output(stalled).unwrap();
    assert!(queued < max + 2048, "{queued}");

    // A slow reader with live Events arriving mid-replay: everything, in order, once.
    let slow = relay.connect(Some(4096));
    relay.feed(slow, b"GET /stream?from=all HTTP/1.1\r\n\r\n", false);
    let mut out = relay.take_output(slow).unwrap();
    let live = padded_events(1, 4, 16); // p0-16 .. p0-19
    for ev in live {
        relay.ingest(ev).unwrap();
        out.extend(relay.take_output(slow).unwrap());
    }
    loop {
        assert!(relay.queued_output(slow).unwrap() < max + 2048);
        let more = relay.take_output(slow).unwrap();
        if more.is_empty() {
            break;
        }
        out.extend(more);
    }
    let mut want = replayed.clone();
    want.extend((16..20).map(|q| format!("p0-{q}")));
    assert_eq!(stream_ids(&out), want);

    // `live=0`: the whole replay, then the stream ends.
    let once = relay.connect(Some(4096));
    relay.feed(once, b"GET /stream?from=all&live=0 HTTP/1.1\r\n\r\n", false);
    let mut out = Vec::new();
    while relay.is_open(once) {
        let more = relay.take_output(once).unwrap();
        if more.is_empty() {
            break;
        }
        out.extend(more);
    }
    // The relay half-closed after the last Event; the reader closes too.
    relay.feed(once, b"", true);
    assert!(!relay.is_open(once));
    out.extend(relay.take_output(once).unwrap_or_default());
    // The store now holds p0-4 .. p0-19 for session p0 (its buffer is 16 deep).
    assert_eq!(stream_ids(&out).len(), 8 * 16);
}

/// Same class as `from_refuses_duplicate_members`: with
/// `filter={"session":"a"}&filter={}`, a proxy that checks the first `filter` and a relay
/// that kept the last would disagree on whether the stream is limited to session `a` (the
/// last is match-all). Repeated subscription parameters are refused.
#[test]
fn repeated_subscription_parameters_are_refused() {
    for q in [
        r#"filter={"session":"a"}&filter={}"#,
        "capture=none&capture=full",
        "from=all&from=all",
        "live=0&live=1",
        "filter=%7B%7D&live=1&filter=%7B%7D",
    ] {
        let e = subscription::parse_stream_request(&stream_request(q, None), 10).unwrap_err();
        assert_eq!(e.code.as_str(), "invalid-filter", "{q}");
        assert!(e.detail.contains("more than once"), "{q}: {}", e.detail);
    }
    // `access_token` is read by auth, not here; any other parameter is refused
    // (`sse_hostile::unknown_stream_parameters_are_refused_naming_the_known_ones`).
    let q = "access_token=a&access_token=b&capture=none";
    let ok = subscription::parse_stream_request(&stream_request(q, None), 10).unwrap();
    assert_eq!(ok.ceiling, Some(aep_relay::wire::envelope::Capture::None));
    let e = subscription::parse_stream_request(&stream_request("x=1&capture=none", None), 10)
        .unwrap_err();
    assert_eq!(e.code.as_str(), "invalid-filter");
}

/// `http` (reference framer: no more responses than requests): a POST refused early
/// (415, its body to be skipped) whose chunked body then turns out malformed draws no
/// second answer (400) to the same request: the connection closes after the one answer.
#[test]
fn a_malformed_body_after_an_early_refusal_gets_no_second_answer() {
    let mut relay = Sim::new(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Config::default()
    })
    .unwrap();
    let c = relay.connect(None);
    relay.feed(
        c,
        b"POST /events HTTP/1.1\r\nAEP-Version: 0.1\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcdXX2\r\n",
        true,
    );
    let out = String::from_utf8(relay.take_output(c).unwrap()).unwrap();
    assert_eq!(out.matches("HTTP/1.1 ").count(), 1, "{out}");
    assert!(out.starts_with("HTTP/1.1 415 "), "{out}");
    assert!(!relay.is_open(c));
}

/// Final responses in what a connection wrote (status lines at response starts; the
/// bodies here are short JSON without CRLF).
fn final_statuses(out: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(out)
        .split("HTTP/1.1 ")
        .skip(1)
        .map(|r| r[..3].to_owned())
        .filter(|code| !code.starts_with('1'))
        .collect()
}

/// `http` (reference framer: no more final responses than requests): a request answered
/// before its body was read (here 400 `version-required`) has the body skipped, and a
/// malformed chunk in that body must not draw a second 400, nor a body too large (413)
/// or too slow (408). One request, two answers: a client or a proxy would pair the extra
/// one with its next request. The connection just closes after the first answer.
#[test]
fn a_skipped_body_never_draws_a_second_answer() {
    let head = "POST /events HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    for body in [
        "a\u{17}\r\nc\"z,\"\0o", // the fuzzer's input, minimized to its class
        "zz\r\n",
        "5\r\nabcdeXY",    // no CRLF after the data
        "fffffffffff\r\n", // over max_body_bytes
        "1;ext\nx",        // bare LF in a chunk line
    ] {
        let mut r = relay();
        let c = r.connect(None);
        r.feed(c, format!("{head}{body}").as_bytes(), false);
        let out = r.take_output(c).unwrap();
        assert_eq!(
            final_statuses(&out),
            ["400"],
            "{body:?}: {}",
            String::from_utf8_lossy(&out)
        );
        r.feed(c, b"", true);
        assert!(!r.is_open(c), "{body:?}");
        assert!(final_statuses(&r.take_output(c).unwrap()).is_empty());
    }
    // Too slow: the rest of the skipped body never comes; no 408 for an answered request.
    let mut r = relay();
    let c = r.connect(None);
    r.feed(c, format!("{head}10\r\nabc").as_bytes(), false);
    r.advance(Duration::from_secs(3600));
    r.advance(Duration::from_secs(7200));
    assert!(!r.is_open(c));
    let out = r.take_output(c).unwrap();
    assert_eq!(
        final_statuses(&out),
        ["400"],
        "{}",
        String::from_utf8_lossy(&out)
    );
    // A well-formed skipped body keeps the connection for the next request.
    let mut r = relay();
    let c = r.connect(None);
    r.feed(
        c,
        format!("{head}3\r\nabc\r\n0\r\n\r\nGET /events HTTP/1.1\r\n\r\n").as_bytes(),
        false,
    );
    assert_eq!(final_statuses(&r.take_output(c).unwrap()), ["400", "200"]);
}

/// `conn_script` (determinism: the same input gives the same output): `GET /metrics`
/// (`aep_uptime_seconds`) and `GET /status` (`uptime_s`) must not read the real clock
/// inside the core (`self.started.elapsed()`): two runs of one script would answer with
/// different bytes (even different `Content-Length`s), and an uptime on virtual time
/// would be wrong. The uptime is the `now` of the call minus the `now` given to
/// `Core::new` (`Core::uptime`); every fuzz input is compared for determinism.
#[test]
fn uptime_is_virtual_time() {
    let get = |r: &mut Sim, path: &str| {
        let c = r.connect(None);
        r.feed(
            c,
            format!("GET {path} HTTP/1.1\r\nHost: r\r\n\r\n").as_bytes(),
            true,
        );
        let out = r.take_output(c).unwrap();
        let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        String::from_utf8(out[at..].to_vec()).unwrap()
    };
    let mut r = relay();
    r.advance(Duration::from_secs(10));
    assert_eq!(r.core().uptime(), Duration::from_secs(10));
    let metrics = get(&mut r, "/metrics");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("aep_uptime_seconds "))
        .expect("an uptime sample");
    let uptime: f64 = line["aep_uptime_seconds ".len()..].parse().unwrap();
    assert_eq!(uptime, 10.0, "{line}");
    let status: serde_json::Value = serde_json::from_str(&get(&mut r, "/status")).unwrap();
    assert_eq!(status["uptime_s"], 10.0, "{status}");
}

/// `conn_script` (bound invariant: queued output at most `max_output_bytes` plus one
/// frame, replay pages aside, `Core::queued`): live Events that arrive while a replay is
/// in progress wait in the connection's backlog (up to `max_output_bytes`); when the
/// replay's last page has gone and the queue is below half its bound, `pump_replay`
/// (src/core/replay.rs) moves the backlog into the output queue. Moved whole in one
/// `move_to`, it would take the queue to about `max_output_bytes / 2 + max_output_bytes`
/// (78 052 bytes against a 64 KiB bound in the fuzzer's script: prefill, a subscriber
/// `from=all` that reads 3 952 bytes, 45 KiB of live Events, one more read; 75 971 bytes
/// here). So the backlog drains into the queue only as far as the bound allows, the
/// rest staying behind, in order (`OutQueue::move_until`).
#[test]
fn a_finished_replay_drains_its_backlog_within_the_bound() {
    let c = Config {
        buffer_per_session: 16,
        max_sessions: 9,
        ..config()
    };
    let max = c.max_output_bytes;
    let mut relay = Sim::new(c).unwrap();
    for ev in padded_events(8, 16, 0) {
        relay.ingest(ev).unwrap(); // p0 .. p7: 128 KiB held, over the bound
    }
    // A consumer that reads 4 KiB at a time, and only when asked.
    let slow = relay.connect(Some(4096));
    relay.feed(slow, b"GET /stream?from=all HTTP/1.1\r\n\r\n", false);
    // Live Events of a session not being replayed (p8) wait in the backlog, short of
    // the bound (where backpressure would drop the consumer).
    let mut live = 0;
    for ev in padded_events(9, 60, 0).split_off(8 * 60) {
        if relay.queued_backlog(slow).unwrap() > max * 3 / 4 {
            break;
        }
        relay.ingest(ev).unwrap();
        live += 1;
    }
    assert!(
        relay.queued_backlog(slow).unwrap() > max / 2,
        "the backlog filled"
    );
    let mut out = Vec::new();
    loop {
        let q = relay.queued_output(slow).expect("still connected");
        assert!(
            q <= max + 2048,
            "{q} bytes queued (backlog {}), over max_output_bytes {max} + one frame",
            relay.queued_backlog(slow).unwrap()
        );
        let more = relay.take_output(slow).unwrap();
        if more.is_empty() {
            break;
        }
        out.extend_from_slice(&more);
    }
    // Whatever the pacing, every Event arrives, once.
    assert_eq!(stream_ids(&out).len(), 8 * 16 + live);
}

/// Server frames (RFC 6455 §5.2) in `b`, as far as complete: `(opcode, payload)`.
fn server_frames(mut b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    while b.len() >= 2 {
        let (len, head) = match b[1] & 0x7F {
            126 if b.len() >= 4 => (usize::from(u16::from_be_bytes([b[2], b[3]])), 4),
            127 if b.len() >= 10 => (
                u64::from_be_bytes(b[2..10].try_into().unwrap()) as usize,
                10,
            ),
            126 | 127 => break,
            n => (usize::from(n), 2),
        };
        if b.len() < head + len {
            break;
        }
        frames.push((b[0] & 0x0F, b[head..head + len].to_vec()));
        b = &b[head + len..];
    }
    frames
}

/// `ws` (nothing after the close frame, RFC 6455 §5.5.1; nothing after `closing`,
/// AEP-0003 §3.5 #4): a WebSocket closed by the relay (here 1007 for a text message
/// that is not UTF-8) while its `subscribe` `from=all` replay is in progress receives no
/// replay page after its `closing` and close frames. `ws_shut` (src/core/socket) ends the
/// phase; any replay jobs and live backlog the connection kept, `write_to` would go on
/// pumping (`pump_replay`, src/core/replay.rs) as the peer reads. The fuzzer's input,
/// minimized: `hello`, `subscribe` `from=all` over a full store, then a text frame
/// `\xff`. Closing a connection (WS close, and the SSE `: shutting-down` of a graceful
/// shutdown, checked below too) drops its replay and backlog (`Conn::end_streaming`).
#[test]
fn nothing_follows_a_close_frame_not_even_a_replay() {
    use aep_relay::wire::ws::rfc6455::client_frame;
    let mut r = relay();
    for ev in padded_events(8, 16, 0) {
        r.ingest(ev).unwrap(); // 128 KiB held: the replay is paced
    }
    let c = r.connect(None);
    r.feed(c, b"GET /socket HTTP/1.1\r\nHost: r\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", false);
    let answer = r.take_output(c).unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 101 "));
    let mut client = Vec::new();
    for (first, payload) in [
        (
            0x81,
            &br#"{"type":"hello","versions":["0.1"],"role":"both","identity":{"agent":"t"}}"#[..],
        ),
        (0x81, br#"{"type":"subscribe","id":"0","from":"all"}"#),
        (0x81, b"\xff"),
    ] {
        client_frame(first, payload, Some([1, 2, 3, 4]), &mut client);
    }
    r.feed(c, &client, false);
    let mut out = Vec::new();
    while r.is_open(c) {
        let more = r.take_output(c).unwrap();
        if more.is_empty() {
            break;
        }
        out.extend(more);
    }
    out.extend(r.take_output(c).unwrap_or_default());
    let frames = server_frames(&out);
    let close = frames
        .iter()
        .position(|(op, _)| *op == 0x8)
        .expect("a close frame");
    assert_eq!(&frames[close].1[..2], &1007u16.to_be_bytes());
    assert_eq!(
        close + 1,
        frames.len(),
        "{} frames after the close frame",
        frames.len() - close - 1
    );

    // SSE: a graceful shutdown during a replay ends the stream with `: shutting-down`.
    let mut r = relay();
    for ev in padded_events(8, 16, 0) {
        r.ingest(ev).unwrap();
    }
    let c = r.connect(Some(4096));
    r.feed(c, b"GET /stream?from=all HTTP/1.1\r\n\r\n", false);
    r.shutdown();
    let mut out = Vec::new();
    while r.is_open(c) {
        let more = r.take_output(c).unwrap();
        if more.is_empty() {
            break;
        }
        out.extend(more);
    }
    out.extend(r.take_output(c).unwrap_or_default());
    let end = memchr_find(&out, sse::SHUTTING_DOWN).expect("the stream says it ends");
    assert_eq!(
        end + sse::SHUTTING_DOWN.len(),
        out.len(),
        "{} bytes after `: shutting-down`",
        out.len() - end - sse::SHUTTING_DOWN.len()
    );
}

fn memchr_find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
