//! In-memory connections run the same HTTP/SSE state machine as TCP ones (the surface
//! fuzz targets and benchmarks drive).

use aep_relay::Config;
use aep_sim::Sim;

fn relay() -> Sim {
    Sim::new(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Config::default()
    })
    .unwrap()
}

const EV: &str = r#"{"aep":"0.1","id":"e1","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a","agent":"a","session":"s","seq":1}"#;

#[test]
fn post_and_stream_over_memory_connections() {
    let mut relay = relay();
    let sub = relay.connect(None);
    assert!(relay.feed(sub, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", false));
    let head = String::from_utf8(relay.take_output(sub).unwrap()).unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");

    let emitter = relay.connect(None);
    let req = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{EV}",
        EV.len()
    );
    // Byte by byte: the state machine must not care how input is split.
    for b in req.as_bytes() {
        relay.feed(emitter, std::slice::from_ref(b), false);
    }
    let resp = String::from_utf8(relay.take_output(emitter).unwrap()).unwrap();
    assert!(resp.starts_with("HTTP/1.1 202 Accepted\r\n"), "{resp}");
    let got = String::from_utf8(relay.take_output(sub).unwrap()).unwrap();
    assert_eq!(
        got,
        format!("event: tool.completed\nid: s:0:1\ndata: {EV}\n\n")
    );
}

#[test]
fn a_closed_memory_connection_keeps_its_last_answer_once() {
    let mut relay = relay();
    let c = relay.connect(None);
    relay.feed(c, b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n", true);
    let out = String::from_utf8(relay.take_output(c).unwrap()).unwrap();
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");
}

/// A batch larger than a connection's output bound is fanned out before the reactor's
/// next write; a consumer whose socket takes everything must still get every Event
/// (the queue offers its socket the backlog before dropping anything, AEP-0003 §8.4).
#[test]
fn a_batch_larger_than_the_output_bound_reaches_a_consumer_that_keeps_up() {
    let mut relay = Sim::new(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        max_output_bytes: 64 * 1024,
        ..Config::default()
    })
    .unwrap();
    let sub = relay.connect(None);
    relay.feed(sub, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", false);
    relay.take_output(sub).unwrap();
    let pad = "p".repeat(2000);
    let batch: String = (0..1000)
        .map(|i| {
            format!(
                r#"{{"aep":"0.1","id":"b{i}","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a","agent":"a","session":"s","seq":{i},"severity":"info","pad":"{pad}"}}"#
            ) + "\n"
        })
        .collect();
    assert!(batch.len() > 30 * 64 * 1024);
    assert_eq!(relay.ingest(bytes::Bytes::from(batch)).unwrap(), 1000);
    let out = String::from_utf8(relay.take_output(sub).unwrap()).unwrap();
    let ids = out.lines().filter(|l| l.starts_with("id: ")).count();
    assert_eq!(ids, 1000, "nothing dropped for a consumer that keeps up");
}
