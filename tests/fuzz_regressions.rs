//! Every fault the fuzz targets (`fuzz/`, see `fuzz/README.md`) found, kept as a test with
//! the minimized input, plus a case or two of the same class around it.
//!
//! Each test names the target that found it and the fault class; the fix lives in the
//! module the test exercises.

use std::time::{Duration, Instant};

use aep_relay::http::RequestHead;
use aep_relay::sse::{self, From, Position};
use aep_relay::{Config, Relay};

fn relay() -> Relay {
    let mut c = Config::default();
    c.listen = "127.0.0.1:0".parse().unwrap();
    Relay::bind(c).unwrap()
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

/// `sse_query`: `Last-Event-ID: t:3:+5` resumed at seq 5. Rust's `u64::from_str` takes a
/// leading `+`; the id the relay writes (AEP-0003 §3.3.2) is digits only, so anything
/// else is refused like any other malformed id.
#[test]
fn last_event_id_numbers_are_decimal_digits_only() {
    for bad in [
        "t:3:+5", "t:+3:5", "t:3: 5", "t:3:5 ", "t:-0:5", "t::5", "t:3:", "t:0x1:2",
    ] {
        assert_eq!(sse::parse_last_event_id(bad), None, "{bad:?}");
        assert!(sse::parse_request(&stream_request("", Some(bad)), 10).is_err());
    }
    assert_eq!(
        sse::parse_last_event_id("a:b:007:18446744073709551615"),
        Some(Position {
            session: "a:b".into(),
            epoch: 7,
            seq: u64::MAX
        })
    );
    assert_eq!(sse::parse_last_event_id("t:0:18446744073709551616"), None);
}

/// `sse_query`: `from=[{"session":"s","session":"s","seq":3}]` was read last-wins. A
/// duplicated member in `from` is refused (`invalid-filter`, AEP-0003 §6.5), as it is in
/// `filter`: two readers could resume different sessions.
#[test]
fn from_refuses_duplicate_members() {
    for q in [
        r#"from=[{"session":"s","session":"s","seq":3}]"#,
        r#"from=[{"session":"a","seq":1,"session":"b"}]"#,
        r#"from=[{"session":"s","seq":1,"seq":2}]"#,
        r#"from=[{"session":"s","epoch":0,"epoch":1,"seq":2}]"#,
    ] {
        let e = sse::parse_request(&stream_request(q, None), 10).unwrap_err();
        assert_eq!(e.code, "invalid-filter", "{q}");
        assert!(e.detail.contains("duplicate"), "{q}: {}", e.detail);
    }
    let ok = sse::parse_request(
        &stream_request(
            r#"from=[{"session":"s","seq":3},{"session":"s","seq":4}]"#,
            None,
        ),
        10,
    )
    .unwrap();
    assert!(matches!(ok.from, From::Positions(ref p) if p.len() == 2));
}

/// `http`: a peer that pipelines requests, never reads the answers and half-closes left
/// its connection open forever (`close_after_flush` set outside the `Closing` phase, so
/// no timer reaped it). After EOF the connection is closing and the linger timer ends it.
#[test]
fn half_closed_peer_that_never_reads_is_reaped() {
    for input in [
        &b"GET /events HTTP/1.1\r\n\r\n"[..],
        b"GET /events HTTP/1.1\r\n\r\nGET /events HTTP/1.1\r\n\r\nGET /events HTTP/1.1\r\n\r\n",
        // A request cut short: nothing to answer, and the answer to the first is unread.
        b"GET /events HTTP/1.1\r\n\r\nPOST /events HTTP/1.1\r\nContent-Length: 10\r\n\r\n{",
    ] {
        let mut relay = relay();
        let c = relay.connect_memory(Some(0)); // a consumer that stopped reading
        relay.feed(c, input, true);
        assert!(relay.is_open(c), "the answer is still queued");
        relay.tick_at(Instant::now() + Duration::from_secs(3600));
        assert!(!relay.is_open(c), "{:?}", String::from_utf8_lossy(input));
    }
    // A peer that does read gets its answers and the close.
    let mut relay = relay();
    let c = relay.connect_memory(None);
    relay.feed(c, b"GET /events HTTP/1.1\r\n\r\n", true);
    assert!(!relay.is_open(c));
    let out = relay.take_output(c).unwrap();
    assert!(out.starts_with(b"HTTP/1.1 200 OK\r\n"));
}
