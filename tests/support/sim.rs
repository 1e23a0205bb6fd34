//! Peers of the sans-IO core on virtual time ([`aep_sim::Sim`]): a WebSocket peer with
//! its upgrade and `hello` done, an SSE peer, and readers for what the core wrote. For the
//! tests of timers (heartbeats, pings, timeouts, linger), which must not depend on a real
//! clock.

use aep_relay::wire::ws::rfc6455::client_frame;
use aep_relay::ConnId;
use aep_sim::Sim;
use serde_json::Value;

/// A frame the core sent on a WebSocket.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A text frame, parsed.
    Text(Value),
    /// A close frame with its code.
    Close(u16),
    /// Any other frame: its opcode.
    Other(u8),
}

/// A masked client text frame.
pub fn masked(text: &str) -> Vec<u8> {
    let mut f = Vec::new();
    client_frame(0x81, text.as_bytes(), Some([7, 1, 7, 1]), &mut f);
    f
}

/// Opens a WebSocket on `sim`: the upgrade, then (with `hello` the inside of the JSON
/// object, e.g. `"role":"consumer"`) the `hello` exchange. The relay's answers are taken.
pub fn ws_peer(sim: &mut Sim, query: &str, hello: Option<&str>) -> ConnId {
    let c = sim.connect(None);
    let head = format!(
        "GET /socket{query} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    sim.feed(c, head.as_bytes(), false);
    let out = sim.take_output(c).expect("open");
    assert!(
        out.starts_with(b"HTTP/1.1 101 "),
        "{}",
        String::from_utf8_lossy(&out)
    );
    if let Some(h) = hello {
        let text = format!(r#"{{"type":"hello","versions":["0.1"],{h}}}"#);
        sim.feed(c, &masked(&text), false);
        let got = ws_frames(&sim.take_output(c).unwrap());
        assert!(
            matches!(&got[..], [Frame::Text(v)] if v["type"] == "hello"),
            "{got:?}"
        );
    }
    c
}

/// Sends one JSON text (a frame or an Event) from the peer.
pub fn ws_send(sim: &mut Sim, c: ConnId, text: &str) {
    sim.feed(c, &masked(text), false);
}

/// The server frames in `b`.
pub fn ws_frames(mut b: &[u8]) -> Vec<Frame> {
    let mut out = Vec::new();
    while b.len() >= 2 {
        let (len, head) = match b[1] & 0x7f {
            126 => (usize::from(u16::from_be_bytes([b[2], b[3]])), 4),
            127 => (
                u64::from_be_bytes(b[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (usize::from(n), 2),
        };
        let payload = &b[head..head + len];
        out.push(match b[0] & 0x0f {
            0x1 => Frame::Text(serde_json::from_slice(payload).expect("JSON text frame")),
            0x8 => Frame::Close(u16::from_be_bytes([payload[0], payload[1]])),
            op => Frame::Other(op),
        });
        b = &b[head + len..];
    }
    out
}

/// What `c` got since the last call, as frames.
pub fn ws_take(sim: &mut Sim, c: ConnId) -> Vec<Frame> {
    ws_frames(&sim.take_output(c).unwrap_or_default())
}

/// Opens `GET /stream?{query}` on `sim`; its response head is taken.
pub fn sse_peer(sim: &mut Sim, query: &str) -> ConnId {
    let c = sim.connect(None);
    let head = format!("GET /stream?{query} HTTP/1.1\r\nHost: x\r\n\r\n");
    sim.feed(c, head.as_bytes(), false);
    let out = String::from_utf8(sim.take_output(c).unwrap()).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    c
}

/// What `c` got since the last call, as text.
pub fn text(sim: &mut Sim, c: ConnId) -> String {
    String::from_utf8(sim.take_output(c).unwrap_or_default()).expect("UTF-8")
}
