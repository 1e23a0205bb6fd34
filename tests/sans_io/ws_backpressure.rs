//! A WebSocket consumer that stops reading is closed deliberately (AEP-0003 §3.5 #4,
//! §8.4): everything queued, then `closing` with the last position delivered per
//! subscription, then close 1013, so it can resume exactly. Driven through the relay's
//! in-memory connection (a pipe that stops taking output), so the stall is exact and
//! needs no timing.

use aep_relay::wire::ws::rfc6455::client_frame;
use aep_relay::{Config, ConnId};
use aep_sim::Sim;
use bytes::Bytes;
use serde_json::{json, Value};

fn masked(payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    client_frame(0x81, payload, Some([9, 8, 7, 6]), &mut f);
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

/// A relay with a 64 KiB output bound and an in-memory consumer whose pipe takes
/// `pipe` bytes before it stops reading; the upgrade and `hello` are done.
fn stalled_consumer(pipe: usize) -> (Sim, ConnId) {
    let c = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        max_output_bytes: 64 * 1024,
        ..Config::default()
    };
    let mut relay = Sim::new(c).unwrap();
    let k = relay.connect(Some(pipe));
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
    (relay, k)
}

/// Everything the relay still sends to `k`, until it closes the connection.
fn drain_to_close(relay: &mut Sim, k: ConnId) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while relay.is_open(k) {
        let chunk = relay.take_output(k).unwrap();
        if chunk.is_empty() {
            relay.feed(k, b"", true);
        }
        out.extend(chunk);
    }
    out.extend(relay.take_output(k).unwrap_or_default());
    frames(&out)
}

fn close_code(f: &(u8, Vec<u8>)) -> u16 {
    assert_eq!(f.0, 0x88, "a close frame");
    u16::from_be_bytes([f.1[0], f.1[1]])
}

#[test]
fn a_peer_that_floods_requests_without_reading_is_closed() {
    let (mut relay, k) = stalled_consumer(2048);
    let ping = masked(br#"{"type":"ping","t":1}"#);
    let flood: Vec<u8> = ping
        .iter()
        .copied()
        .cycle()
        .take(ping.len() * 5000)
        .collect();
    relay.feed(k, &flood, false);
    assert!(
        relay.queued_output(k).unwrap() < 80 * 1024,
        "bounded memory"
    );
    let got = drain_to_close(&mut relay, k);
    assert_eq!(close_code(got.last().unwrap()), 1013);
}

#[test]
fn a_large_replay_is_paced_and_requests_are_still_answered() {
    let (mut relay, k) = stalled_consumer(2048);
    let pad = "x".repeat(900);
    let lines: String = (1..=200)
        .map(|seq| {
            format!(
                r#"{{"aep":"0.1","id":"e{seq}","type":"tool.started","time":"2026-07-03T10:00:00Z","source":"aep://t/agent/a/session/s","agent":"a","session":"s","seq":{seq},"xpad":"{pad}"}}"#
            ) + "\n"
        })
        .collect();
    relay.ingest(Bytes::from(lines)).unwrap();
    relay.feed(
        k,
        &masked(br#"{"type":"subscribe","id":"r","from":"all"}"#),
        false,
    );
    // Replay is paced by the consumer (relay::replay): it tops the queue up to half its
    // bound plus at most one page (64 Events), never the whole store.
    assert!(
        relay.queued_output(k).unwrap() <= 32 * 1024 + 64 * 1100,
        "the replay is paced"
    );
    relay.feed(
        k,
        &masked(br#"{"type":"subscribe","id":"more","filter":{}}"#),
        false,
    );
    relay.feed(k, &masked(br#"{"type":"ping","t":7}"#), false);
    let mut out = Vec::new();
    while out.len() < 240 * 1024 {
        let chunk = relay.take_output(k).unwrap();
        assert!(!chunk.is_empty(), "the connection stays open and drains");
        out.extend(chunk);
        if frames_complete(&out) && frames(&out).len() == 2 + 200 + 2 {
            break;
        }
    }
    let got = frames(&out);
    let texts: Vec<Value> = got
        .iter()
        .map(|(_, p)| serde_json::from_slice(p).unwrap())
        .collect();
    assert_eq!(texts[0]["type"], "hello");
    assert_eq!(texts[1], json!({"type": "subscribed", "id": "r"}));
    assert_eq!(texts.len(), 2 + 200 + 2);
    // Replies are answered at once, between replay frames; the replay itself stays in
    // order and complete.
    assert!(texts.contains(&json!({"type": "subscribed", "id": "more"})));
    assert!(texts.contains(&json!({"type": "pong", "t": 7})));
    let seqs: Vec<u64> = texts.iter().filter_map(|t| t["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=200).collect::<Vec<_>>());
}

/// Whether `b` ends at a frame boundary.
fn frames_complete(mut b: &[u8]) -> bool {
    while b.len() >= 2 {
        let (len, head) = match b[1] & 0x7f {
            126 if b.len() >= 4 => (u16::from_be_bytes([b[2], b[3]]) as usize, 4),
            127 if b.len() >= 10 => (
                u64::from_be_bytes(b[2..10].try_into().unwrap()) as usize,
                10,
            ),
            126 | 127 => return false,
            n => (n as usize, 2),
        };
        if b.len() < head + len {
            return false;
        }
        b = &b[head + len..];
    }
    b.is_empty()
}

#[test]
fn a_stalled_consumer_gets_closing_with_exact_positions_then_1013() {
    let (mut relay, k) = stalled_consumer(2048);
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
    let got = drain_to_close(&mut relay, k);
    assert_eq!(close_code(got.last().unwrap()), 1013);
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
        json!([{"sub": "n", "session": "s", "source": last["source"], "epoch": 0, "seq": last["seq"]}]),
        "closing names exactly the last Event delivered"
    );
}

#[test]
fn info_events_are_dropped_and_the_count_reaches_the_closing_frame() {
    let (mut relay, k) = stalled_consumer(2048);
    relay.feed(
        k,
        &masked(br#"{"type":"subscribe","id":"n","filter":{}}"#),
        false,
    );
    assert_eq!(frames(&relay.take_output(k).unwrap()).len(), 2);
    let pad = "x".repeat(900);
    let line = |seq: u64, severity: &str| {
        format!(
            r#"{{"aep":"0.1","id":"e{seq}","type":"tool.started","time":"2026-07-03T10:00:00Z","source":"aep://t/agent/a/session/s","agent":"a","session":"s","seq":{seq},"severity":"{severity}","xpad":"{pad}"}}"#
        ) + "\n"
    };
    // `info` past three quarters of the queue is dropped, not queued (AEP-0003 §8.4)…
    for seq in 1..=200 {
        relay.ingest(Bytes::from(line(seq, "info"))).unwrap();
    }
    assert!(relay.queued_output(k).unwrap() <= 48 * 1024);
    // …`notice` Events take the quarter left, and the first that cannot be queued closes
    // the connection, telling it how many were dropped.
    for seq in 201..=240 {
        relay.ingest(Bytes::from(line(seq, "notice"))).unwrap();
    }
    let got = drain_to_close(&mut relay, k);
    assert_eq!(close_code(got.last().unwrap()), 1013);
    let closing: Value = serde_json::from_slice(&got[got.len() - 2].1).unwrap();
    assert_eq!(closing["type"], "closing");
    let events: Vec<Value> = got[..got.len() - 2]
        .iter()
        .map(|(_, p)| serde_json::from_slice(p).unwrap())
        .collect();
    let info = events.iter().filter(|e| e["severity"] == "info").count() as u64;
    assert!(
        events.iter().any(|e| e["severity"] == "notice"),
        "notices fit above the info mark"
    );
    assert_eq!(
        closing["dropped"],
        200 - info,
        "every undelivered info Event is counted"
    );
    assert!(closing["detail"]
        .as_str()
        .unwrap()
        .contains("AEP-0003 §8.4"));
}
