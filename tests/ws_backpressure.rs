//! A WebSocket consumer that stops reading is closed deliberately (AEP-0003 §3.5 #4,
//! §8.4): everything queued, then `closing` with the last position delivered per
//! subscription, then close 1013, so it can resume exactly. Driven through the relay's
//! in-memory connection (a pipe that stops taking output), so the stall is exact and
//! needs no timing.

use aep_relay::{Config, Relay};
use bytes::Bytes;
use serde_json::{json, Value};

fn masked(payload: &[u8]) -> Vec<u8> {
    let mask = [9u8, 8, 7, 6];
    let mut f = vec![0x81];
    if payload.len() < 126 {
        f.push(0x80 | payload.len() as u8);
    } else {
        f.push(0x80 | 126);
        f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
    f
}

/// Splits server output into (opcode byte, payload) frames.
fn frames(mut b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let (len, head) = match b[1] & 0x7f {
            126 => (u16::from_be_bytes([b[2], b[3]]) as usize, 4),
            127 => (
                u64::from_be_bytes(b[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (n as usize, 2),
        };
        out.push((b[0], b[head..head + len].to_vec()));
        b = &b[head + len..];
    }
    out
}

#[test]
fn a_stalled_consumer_gets_closing_with_exact_positions_then_1013() {
    let mut c = Config::default();
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.max_output_bytes = 64 * 1024;
    let mut relay = Relay::bind(c).unwrap();
    let k = relay.connect_memory(Some(2048));
    relay.feed(
        k,
        b"GET /socket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        false,
    );
    let head = relay.take_output(k).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 101 "));
    relay.feed(
        k,
        &masked(br#"{"type":"hello","versions":["0.1"],"role":"consumer"}"#),
        false,
    );
    relay.feed(
        k,
        &masked(br#"{"type":"subscribe","id":"n","filter":{}}"#),
        false,
    );
    let got = frames(&relay.take_output(k).unwrap());
    assert_eq!(got.len(), 2, "hello and subscribed");
    // The consumer stops reading: the pipe takes 2 KiB, the queue 64 KiB, then a
    // `notice` Event cannot be queued and may not be dropped.
    let pad = "x".repeat(900);
    // 200 Events of ~1.1 KiB: three times what the pipe and the queue hold together.
    let sent = 200u64;
    for seq in 1..=sent {
        let line = format!(
            r#"{{"aep":"0.1","id":"e{seq}","type":"tool.started","time":"2026-07-03T10:00:00Z","source":"aep://t/agent/a/session/s","agent":"a","session":"s","seq":{seq},"severity":"notice","xpad":"{pad}"}}"#
        );
        relay.ingest(Bytes::from(line + "\n")).unwrap();
    }
    assert!(
        relay.queued_output(k).unwrap() < 80 * 1024,
        "the stalled consumer costs bounded memory"
    );
    // Drain everything that was queued for it, then end the connection.
    let mut out = Vec::new();
    while relay.is_open(k) {
        let chunk = relay.take_output(k).unwrap();
        if chunk.is_empty() {
            relay.feed(k, b"", true);
        }
        out.extend(chunk);
    }
    out.extend(relay.take_output(k).unwrap_or_default());
    let got = frames(&out);
    let (close_op, close) = got.last().unwrap();
    assert_eq!(*close_op, 0x88);
    assert_eq!(u16::from_be_bytes([close[0], close[1]]), 1013);
    let (_, closing) = &got[got.len() - 2];
    let closing: Value = serde_json::from_slice(closing).unwrap();
    assert_eq!(closing["type"], "closing");
    assert!(closing["reason"].as_str().unwrap().contains("backpressure"));
    let events: Vec<Value> = got[..got.len() - 2]
        .iter()
        .map(|(_, p)| serde_json::from_slice(p).unwrap())
        .collect();
    let last = events.last().unwrap();
    assert!(
        last["seq"].as_u64().unwrap() < sent,
        "the Event that did not fit is absent"
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["seq"], i as u64 + 1, "no gap among what was delivered");
    }
    assert_eq!(
        closing["delivered"],
        json!([{"sub": "n", "session": "s", "epoch": 0, "seq": last["seq"]}]),
        "closing names exactly the last Event delivered"
    );
}
