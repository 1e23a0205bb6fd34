//! Operations: metrics, limits that answer, backpressure, graceful shutdown, logging
//! (AEP-0003 §8, §8.4, §11).

use crate::support;
use aep_relay::auth::{Auth, Scopes};
use std::io::{BufRead, BufReader, Read, Write};
use std::time::Duration;
use support::*;

fn metric(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name_and_labels} missing in:\n{text}"))
}

fn metrics(relay: &TestRelay, auth: Option<&str>) -> (u16, String) {
    let mut req = agent().get(&relay.url("/metrics"));
    if let Some(a) = auth {
        req = req.set("Authorization", a);
    }
    match req.call() {
        Ok(r) => {
            assert!(r.content_type().starts_with("text/plain"));
            (r.status(), r.into_string().unwrap())
        }
        Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap()),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn metrics_are_prometheus_text_and_need_watch() {
    let relay = TestRelay::with(|c| {
        c.auth = Auth::new(
            None,
            &[("w".into(), Scopes::WATCH), ("e".into(), Scopes::EMIT)],
        )
    });
    assert_eq!(metrics(&relay, None).0, 401);
    assert_eq!(metrics(&relay, Some("Bearer e")).0, 403);
    let post = |body: &str| {
        status_json(
            agent()
                .post(&relay.url("/events"))
                .set("Authorization", "Bearer e")
                .set("AEP-Version", "0.1")
                .set("Content-Type", "application/x-ndjson")
                .send_string(body),
        )
        .0
    };
    let _stream = relay.sse("access_token=w", &[]);
    assert_eq!(
        post(&format!(
            "{}\n{}\n",
            event("s", 0, 0, "run.started", ""),
            event("s", 0, 1, "run.finished", "")
        )),
        202
    );
    assert_eq!(post("nope"), 400);
    let (status, text) = metrics(&relay, Some("Bearer w"));
    assert_eq!(status, 200);
    assert_eq!(
        metric(&text, "aep_events_ingested_total{binding=\"http\"}"),
        2.0
    );
    assert_eq!(
        metric(&text, "aep_events_rejected_total{reason=\"invalid-event\"}"),
        1.0
    );
    assert!(metric(&text, "aep_events_rejected_total{reason=\"unauthorized\"}") >= 1.0);
    assert_eq!(metric(&text, "aep_deliveries_total{binding=\"sse\"}"), 2.0);
    assert_eq!(metric(&text, "aep_connections{binding=\"sse\"}"), 1.0);
    assert_eq!(metric(&text, "aep_sessions"), 1.0);
    assert_eq!(metric(&text, "aep_buffered_events"), 2.0);
    assert!(metric(&text, "aep_buffered_bytes") > 100.0);
    assert!(text.contains("# TYPE aep_deliveries_total counter"));
}

#[test]
fn connection_limit_answers_503_with_retry_after() {
    let relay = TestRelay::with(|c| c.max_connections = 2);
    let mut a = relay.tcp();
    let mut b = relay.tcp();
    // Make sure both are accepted before the third arrives.
    for s in [&mut a, &mut b] {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        assert_eq!(read_response(s).0, 200);
    }
    let mut c = relay.tcp();
    let (status, headers, body) = read_response(&mut c);
    assert_eq!(status, 503);
    assert!(headers.iter().any(|(k, _)| k == "retry-after"));
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"], "too-many-connections");
}

#[test]
fn a_request_that_trickles_in_too_slowly_gets_408() {
    // Whole seconds on a real socket; the exact instants, and the body that stops
    // arriving, are in tests/sans_io/virtual_time.rs.
    let relay = TestRelay::with(|c| c.request_timeout = Duration::from_secs(1));
    let mut s = relay.tcp();
    s.write_all(b"POST /events HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let (status, _, body) = read_response(&mut s);
    assert_eq!(status, 408);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"], "request-timeout");
}

/// A consumer that never reads costs bounded memory and never slows the others;
/// `info` toward it is dropped and counted; `notice` disconnects it, and it resumes
/// exactly from its last position (AEP-0003 §8.4).
#[test]
fn stalled_consumer_is_bounded_dropped_then_disconnected_and_resumes() {
    const MAX_OUTPUT: usize = 64 * 1024;
    let relay = TestRelay::with(|c| {
        c.max_output_bytes = MAX_OUTPUT;
        c.buffer_per_session = 100_000;
    });
    let mut stalled = relay.tcp();
    stalled
        .write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        .unwrap();
    let healthy = relay.sse("", &[]);
    // Make sure the stalled stream is live: its response head arrived.
    let mut first = [0u8; 15];
    stalled.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200 OK");

    // Small batches, each awaited by the healthy consumer before the next is posted.
    let (batches, per) = (800u64, 50u64);
    let mut healthy = flood_beside_a_stalled_consumer(healthy, batches, per, |lines| {
        let refs: Vec<&str> = lines.iter().map(|s| s.as_str()).collect();
        relay.post_ok(&refs);
    });

    let (_, text) = metrics(&relay, None);
    let dropped = metric(&text, r#"aep_dropped_events_total{severity="info"}"#);
    assert!(
        dropped > 0.0,
        "info Events toward the stalled consumer were dropped and counted"
    );
    assert!(
        text.contains("aep_connection_dropped_events_total{conn="),
        "per-connection drop count"
    );
    let queued = metric(&text, "aep_output_queued_bytes");
    assert!(
        queued <= (MAX_OUTPUT + 4096) as f64,
        "bounded memory: {queued} bytes queued"
    );

    // A notice cannot be dropped: the stalled consumer's queue has no room for it (info
    // Events filled it to three quarters, and the notice is larger than the quarter
    // left), so it is disconnected instead.
    let notice = backpressure_notice(batches * per);
    relay.post_ok(&[&notice]);
    assert_eq!(healthy.expect().data, notice, "others still get it");
    let (_, text) = metrics(&relay, None);
    assert_eq!(metric(&text, "aep_backpressure_disconnects_total"), 1.0);

    // The stalled consumer reads what it had and finds the stream ended…
    let mut got = String::new();
    BufReader::new(stalled).read_to_string(&mut got).unwrap();
    // …and resumes exactly after its last position, notice included, no duplicate.
    let resume = |id: &str| relay.sse("live=0", &[("Last-Event-ID", id)]);
    assert_resumes_exactly(&got, resume, &notice, batches * per);
}

/// `aep_backpressure_disconnects_total` counts consumers, once each (docs/operating.md metrics
/// table): a consumer that stops reading is disconnected once, however many Events of
/// the same batch meet it after it was doomed (AEP-0003 §8.4).
#[test]
fn a_slow_consumer_is_counted_once_however_many_events_meet_it() {
    let relay = TestRelay::with(|c| c.max_output_bytes = 64 * 1024);
    let mut stalled = relay.tcp();
    stalled
        .write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 15];
    stalled.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200 OK");

    // `notice` Events cannot be dropped, so the consumer that cannot take one is
    // disconnected. Each batch is 1,000 of them (about 1 MB): once the kernel's socket
    // buffers and the 64 KiB queue are full, hundreds of Events of one batch meet the
    // doomed connection before the core closes it.
    let pad = "n".repeat(900);
    let mut seq = 0u64;
    let mut batches = 0;
    let disconnects = loop {
        let lines: Vec<String> = (0..1000)
            .map(|_| {
                seq += 1;
                event(
                    "slow",
                    0,
                    seq,
                    "error.raised",
                    &format!(r#","severity":"notice","pad":"{pad}""#),
                )
            })
            .collect();
        relay.post_ok(&lines);
        batches += 1;
        let (_, text) = metrics(&relay, None);
        let n = metric(&text, "aep_backpressure_disconnects_total");
        if n > 0.0 || batches == 100 {
            break n;
        }
    };
    assert_eq!(
        disconnects, 1.0,
        "one consumer, one disconnect ({batches} batches)"
    );
    // It stays one: later Events find no such consumer.
    relay.post_ok(&[event(
        "slow",
        0,
        seq + 1,
        "error.raised",
        r#","severity":"notice""#,
    )]);
    let (_, text) = metrics(&relay, None);
    assert_eq!(metric(&text, "aep_backpressure_disconnects_total"), 1.0);
    // And it was really cut: its stream ends after what it had.
    stalled.set_read_timeout(Some(WAIT)).unwrap();
    let mut rest = Vec::new();
    BufReader::new(stalled).read_to_end(&mut rest).unwrap();
}

#[test]
fn sigterm_drains_sse_consumers_and_exits_0() {
    let relay = RelayProcess::spawn(&[]);
    let mut s = std::net::TcpStream::connect(relay.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while line != ": aep-relay stream open\n" {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0);
    }
    relay.signal("TERM");
    let mut rest = String::new();
    r.read_to_string(&mut rest).unwrap();
    assert!(rest.contains(": shutting-down\n"), "{rest:?}");
    let (status, stderr) = relay.wait();
    assert!(status.success(), "exit status {status}; stderr:\n{stderr}");
    assert!(stderr.contains("shutdown complete"), "{stderr}");
}

#[test]
fn query_tokens_never_reach_the_log_and_startup_states_posture() {
    let relay = RelayProcess::spawn_with(
        &[],
        &[("AEP_TOKEN", "right-token"), ("AEP_LOG", "debug")],
        false,
        "127.0.0.1:0",
    );
    let resp = agent()
        .get(&format!(
            "{}?access_token=WRONG-SECRET-QUERY",
            relay.url("/stream")
        ))
        .call();
    assert_eq!(status_json(resp).0, 401);
    let resp = agent()
        .get(&format!(
            "{}?access_token=right-token&live=0",
            relay.url("/stream")
        ))
        .call()
        .unwrap();
    assert_eq!(resp.status(), 200);
    relay.signal("TERM");
    let (status, stderr) = relay.wait();
    assert!(status.success());
    assert!(stderr.contains("auth: bearer tokens required"), "{stderr}");
    assert!(stderr.contains("TLS off"));
    // The refusal is logged with its path only: no query string at all.
    assert!(
        stderr.contains("refused GET /stream from ") && stderr.contains(": 401 unauthorized: "),
        "the refusal is logged: {stderr}"
    );
    assert!(!stderr.contains("access_token"), "{stderr}");
    assert!(
        !stderr.contains("WRONG-SECRET-QUERY") && !stderr.contains("right-token"),
        "{stderr}"
    );
}
