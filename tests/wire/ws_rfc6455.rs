//! RFC 6455 on `/socket`, through a raw TCP client that writes frames byte by byte:
//! fragmentation with control frames in between, ping/pong, the close handshake, and
//! the failure closes (1002 unmasked, 1003 binary, 1007 bad UTF-8, 1009 too big).

use crate::support;

use support::{Raw, TestRelay, Ws};

#[test]
fn a_fragmented_message_is_reassembled_around_a_ping() {
    let relay = TestRelay::start();
    let mut raw = Raw::connect(&relay);
    let hello = br#"{"type":"hello","versions":["0.1"],"role":"consumer"}"#;
    raw.send(0x01, &hello[..10]); // text, not final
    raw.send(0x89, b"are you there"); // ping between fragments
    raw.send(0x00, &hello[10..30]); // continuation
    raw.send(0x80, &hello[30..]); // final continuation
    assert_eq!(raw.read(), (0x8A, b"are you there".to_vec()), "pong first");
    let (op, p) = raw.read();
    assert_eq!(op, 0x81);
    let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
    assert_eq!(v["type"], "hello");
}

#[test]
fn frames_split_across_tcp_writes_are_decoded() {
    let relay = TestRelay::start();
    let mut raw = Raw::connect(&relay);
    raw.hello();
    let f = Raw::frame(0x81, br#"{"type":"ping","t":"x"}"#, Some([1, 2, 3, 4]));
    for b in &f {
        raw.send_bytes(&[*b]);
    }
    let (op, p) = raw.read();
    assert_eq!((op, &p[..]), (0x81, &br#"{"type":"pong","t":"x"}"#[..]));
}

#[test]
fn a_binary_frame_closes_with_1003() {
    let relay = TestRelay::start();
    let mut raw = Raw::connect(&relay);
    raw.hello();
    raw.send(0x82, b"\x00\x01");
    assert_eq!(raw.expect_close(), 1003);
}

#[test]
fn invalid_utf8_closes_with_1007() {
    let relay = TestRelay::start();
    let mut raw = Raw::connect(&relay);
    raw.hello();
    raw.send(0x81, b"{\"type\":\"ping\",\"t\":\"\xff\xfe\"}");
    assert_eq!(raw.expect_close(), 1007);
}

#[test]
fn a_message_over_the_limit_closes_with_1009() {
    let relay = TestRelay::with(|c| c.max_ws_message_bytes = 1024);
    let mut raw = Raw::connect(&relay);
    raw.hello();
    // Two fragments that only together pass the limit.
    raw.send(0x01, &[b' '; 600]);
    raw.send(0x80, &[b' '; 600]);
    assert_eq!(raw.expect_close(), 1009);
    // Refused from the header alone: the announced length is enough.
    let mut raw = Raw::connect(&relay);
    raw.hello();
    let f = Raw::frame(0x81, &vec![b' '; 1 << 20], Some([1, 2, 3, 4]));
    raw.send_bytes(&f[..14]);
    assert_eq!(raw.expect_close(), 1009);
}

#[test]
fn an_unmasked_client_frame_closes_with_1002() {
    let relay = TestRelay::start();
    let mut raw = Raw::connect(&relay);
    raw.send_bytes(&Raw::frame(
        0x81,
        br#"{"type":"hello","versions":["0.1"],"role":"consumer"}"#,
        None,
    ));
    assert_eq!(raw.expect_close(), 1002);
}

#[test]
fn a_continuation_without_a_message_closes_with_1002() {
    let relay = TestRelay::start();
    let mut raw = Raw::connect(&relay);
    raw.hello();
    raw.send(0x80, b"{}");
    assert_eq!(raw.expect_close(), 1002);
}

#[test]
fn the_close_handshake_completes() {
    let relay = TestRelay::start();
    let mut raw = Raw::connect(&relay);
    raw.hello();
    raw.send(0x88, b"\x03\xe8bye");
    let (op, p) = raw.read();
    assert_eq!(
        (op, &p[..2]),
        (0x88, &[0x03, 0xe8][..]),
        "the code is echoed"
    );
    let mut rest = Vec::new();
    use std::io::Read;
    raw.tcp.read_to_end(&mut rest).unwrap();
    assert!(
        rest.is_empty(),
        "nothing after the close frame, then end of stream"
    );
    // And with tungstenite's client.
    Ws::consumer(&relay).close();
}
