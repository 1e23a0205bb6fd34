//! Ingests Events in-process, without a socket, with `Relay::ingest`: the same validation,
//! replay buffering and fan-out as `POST /events` with `application/x-ndjson`. Network
//! subscribers (SSE, WebSocket) receive them as usual; here the relay is never polled, so
//! we only show what ingest answers.
//!
//! ```sh
//! cargo run --example in_process
//! ```

use aep_relay::{Config, Refusal, Relay};
use bytes::Bytes;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut relay = Relay::bind(Config {
        listen: "127.0.0.1:0".parse()?,
        ..Config::default()
    })?;
    let batch = concat!(
        r#"{"aep":"0.1","id":"a1","type":"session.started","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/demo","agent":"demo","session":"s1","seq":0}"#,
        "\n",
        r#"{"aep":"0.1","id":"a2","type":"run.started","time":"2026-07-03T10:00:01Z","source":"aep://h/agent/demo","agent":"demo","session":"s1","seq":1}"#,
        "\n"
    );
    let n = relay.ingest(Bytes::from_static(batch.as_bytes()))?;
    println!("accepted {n} Events");

    // A bad batch is refused whole, with the line and the rule it broke.
    let bad = Bytes::from_static(br#"{"aep":"0.1","id":"x","type":"run.started"}"#);
    match relay.ingest(bad) {
        Err(Refusal::InvalidEvent { line, detail }) => println!("refused line {line}: {detail}"),
        other => println!("unexpected: {other:?}"),
    }
    Ok(())
}
