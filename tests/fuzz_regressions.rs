//! Every fault the fuzz targets (`fuzz/`, see `fuzz/README.md`) found, kept as a test with
//! the minimized input, plus a case or two of the same class around it.
//!
//! Each test names the target that found it and the fault class; the fix lives in the
//! module the test exercises.

use aep_relay::http::RequestHead;
use aep_relay::sse::{self, From, Position};

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
