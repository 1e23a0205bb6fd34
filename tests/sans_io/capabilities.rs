//! The discovery document (AEP-0003 §3.4) and the relay's WebSocket `hello` (AEP-0003
//! §4) are serialized from typed parts: pinned here byte for byte (member order
//! included) for the default configuration, so a change to either shows as a diff.

use aep_relay::wire::ws::rfc6455::client_frame;
use aep_relay::Config;
use aep_sim::Sim;

const CAPS: &str = r#""capabilities":{"filters":["attr-match"],"replay":{"buffer":10000,"per":"session","sessions":500,"all":true,"evicts":"debug-first"},"capture":["none","metadata","redacted","full"],"roster":{},"control":{"accepts":[],"routes":false},"experimental":{"dropped":{}}"#;

fn body(out: &[u8]) -> String {
    let text = String::from_utf8_lossy(out);
    let at = text.find("\r\n\r\n").expect("a complete head") + 4;
    text[at..].to_string()
}

#[test]
fn the_discovery_document_is_pinned() {
    let mut sim = Sim::new(Config::default()).unwrap();
    let c = sim.connect(None);
    sim.feed(c, b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n", false);
    let want = format!(
        r#"{{"aep":["0.1"],"role":"relay","endpoints":{{"events":"/events","stream":"/stream","socket":"/socket"}},{CAPS}}}}}"#
    );
    assert_eq!(body(&sim.take_output(c).unwrap()), want);
}

#[test]
fn the_hello_is_pinned() {
    let mut sim = Sim::new(Config::default()).unwrap();
    let c = sim.connect(None);
    sim.feed(
        c,
        b"GET /socket HTTP/1.1\r\nHost: r\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        false,
    );
    let _ = sim.take_output(c).unwrap();
    let mut frame = Vec::new();
    let hello = br#"{"type":"hello","versions":["0.1"],"role":"both","identity":{"agent":"t"}}"#;
    client_frame(0x81, hello, Some([1, 2, 3, 4]), &mut frame);
    sim.feed(c, &frame, false);
    let out = sim.take_output(c).unwrap();
    // One unmasked text frame with a 16-bit length (RFC 6455 §5.2).
    assert_eq!(&out[..2], &[0x81, 126]);
    let len = usize::from(u16::from_be_bytes([out[2], out[3]]));
    let want = format!(
        r#"{{"type":"hello","versions":["0.1"],"role":"both","identity":{{"agent":"aep-relay","instance":"aep-relay/{}"}},{CAPS},"limits":{{"subscriptions":256,"from":1000,"message_bytes":1048576}}}}}}"#,
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(String::from_utf8_lossy(&out[4..4 + len]), want);
}
