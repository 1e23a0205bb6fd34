//! Minimal reproductions against the real server of what a README walk-through and
//! adversarial probing run into.

use crate::support;
use std::io::Write;
use support::*;

/// The smuggled request hidden in a body: a POST of one Event.
fn smuggled_post() -> String {
    let ev = event("s_smuggled", 0, 0, "tool.completed", "");
    format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{ev}",
        ev.len()
    )
}

fn ingested(relay: &TestRelay) -> serde_json::Value {
    let (status, doc) = status_json(agent().get(&relay.url("/status")).call());
    assert_eq!(status, 200);
    doc["ingested"].clone()
}

/// A GET with a `Content-Length` body: RFC 9112 §6.3 frames the body by its
/// `Content-Length` whatever the method. A relay that answered the GET and then parsed
/// the body as the next request on the connection would execute a body that is itself a
/// request (here a POST of an Event): a request-smuggling desync behind any proxy that
/// frames by `Content-Length`. So the body is skipped and the GET refused with 400.
#[test]
fn get_with_content_length_body_is_not_parsed_as_a_request() {
    let relay = TestRelay::start();
    let inner = smuggled_post();
    let req = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{inner}GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        inner.len()
    );
    let mut s = relay.tcp();
    s.write_all(req.as_bytes()).unwrap();
    let (first, _, body) = read_response(&mut s);
    assert_eq!(first, 400, "{}", String::from_utf8_lossy(&body));
    let (second, _, body) = read_response(&mut s);
    assert_eq!(
        second,
        200,
        "the request after the skipped body is the /healthz: {}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(ingested(&relay), 0, "the body's POST must never run");
}

/// The same with a chunked body on `GET /events` (the discovery document).
#[test]
fn get_with_chunked_body_is_not_parsed_as_a_request() {
    let relay = TestRelay::start();
    let inner = smuggled_post();
    let req = format!(
        "GET /events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{inner}\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        inner.len()
    );
    let mut s = relay.tcp();
    s.write_all(req.as_bytes()).unwrap();
    let (first, _, body) = read_response(&mut s);
    assert_eq!(first, 400, "{}", String::from_utf8_lossy(&body));
    let (second, _, _) = read_response(&mut s);
    assert_eq!(second, 200);
    assert_eq!(ingested(&relay), 0, "the body's POST must never run");
}
