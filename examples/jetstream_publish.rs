//! The engine's own ceiling, for `benches/cluster.sh`'s engine row: raw
//! JetStream publishes of the relay's benchmark Event, straight from async-nats, with no
//! relay in between. It shows what the stream itself takes on this machine, one Event per
//! message and many per message, so the cluster's figures can be read against it.
//!
//! ```text
//! cargo run --release --example jetstream_publish -- NATS_URL EVENTS PER_MESSAGE [WINDOW] [SIZE]
//! ```
//!
//! - `NATS_URL`: a nats-server with JetStream (`-js -sd DIR`), e.g. `nats://127.0.0.1:4222`.
//! - `EVENTS`: Events to publish; `PER_MESSAGE`: Events per stream message, one per line
//!   (the relay's batching); `WINDOW`: publishes awaiting their acknowledgement at most
//!   (256, the bridge's window); `SIZE`: bytes per Event (580).
//!
//! The stream is `BENCH` (subjects `bench.>`, file storage, limits retention, fields
//! nats-server 2.9 knows), created when missing; each message carries a `Nats-Msg-Id` as
//! the relay's publishes do. Prints one JSON line: `messages_per_s`, `events_per_s`,
//! `seconds`, the arguments.
//!
//! Needs the `cluster` feature (on by default).

use async_nats::jetstream;
use bytes::Bytes;
use std::collections::VecDeque;
use std::time::Instant;

/// The benchmark Event of `aep-load` (a session-scoped `tool.completed`), `size` bytes.
fn event(n: u64, size: usize) -> String {
    let head = format!(
        r#"{{"aep":"0.1","id":"01JXENGINE{n:016}","type":"tool.completed","time":"2026-07-03T10:15:04.221Z","source":"aep://host-a/agent/bench/session/s_bench","agent":"bench","session":"s_bench","seq":{n},"data":{{"output":""#
    );
    let tail = r#""}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    format!("{head}{}{tail}", "x".repeat(pad))
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: Option<T>) -> T {
    match args.get(i).map(|s| s.parse::<T>()) {
        Some(Ok(v)) => v,
        None if default.is_some() => default.unwrap_or_else(|| unreachable!()),
        _ => {
            eprintln!(
                "usage: jetstream_publish NATS_URL EVENTS PER_MESSAGE [WINDOW] [SIZE] (argument {i} missing or not a number)"
            );
            std::process::exit(2);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(url) = args.get(1).cloned() else {
        eprintln!("usage: jetstream_publish NATS_URL EVENTS PER_MESSAGE [WINDOW] [SIZE]");
        std::process::exit(2);
    };
    let events: u64 = arg(&args, 2, None);
    let per: u64 = arg::<u64>(&args, 3, None).max(1);
    let window: usize = arg(&args, 4, Some(256usize)).max(1);
    let size: usize = arg(&args, 5, Some(580usize));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    if let Err(e) = rt.block_on(run(&url, events, per, window, size)) {
        eprintln!("jetstream_publish: {e}");
        std::process::exit(1);
    }
}

async fn run(
    url: &str,
    events: u64,
    per: u64,
    window: usize,
    size: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let client = async_nats::connect(url).await?;
    let js = jetstream::new(client);
    js.get_or_create_stream(jetstream::stream::Config {
        name: "BENCH".into(),
        subjects: vec!["bench.>".into()],
        storage: jetstream::stream::StorageType::File,
        retention: jetstream::stream::RetentionPolicy::Limits,
        discard: jetstream::stream::DiscardPolicy::Old,
        max_messages: -1,
        max_bytes: -1,
        max_consumers: -1,
        num_replicas: 1,
        ..Default::default()
    })
    .await?;
    // The payloads, built before the clock starts.
    let messages: Vec<Bytes> = (0..events.div_ceil(per))
        .map(|m| {
            let first = m * per;
            let last = (first + per).min(events);
            let lines: Vec<String> = (first..last).map(|n| event(n, size)).collect();
            Bytes::from(lines.join("\n"))
        })
        .collect();
    let start = Instant::now();
    let mut in_flight = VecDeque::with_capacity(window);
    for (i, payload) in messages.iter().enumerate() {
        if in_flight.len() == window {
            if let Some(ack) = in_flight.pop_front() {
                let _: jetstream::publish::PublishAck = ack.await?;
            }
        }
        let msg = jetstream::message::PublishMessage::build()
            .payload(payload.clone())
            .message_id(format!("bench.{i}"));
        in_flight.push_back(js.send_publish("bench.s_bench", msg).await?);
    }
    while let Some(ack) = in_flight.pop_front() {
        ack.await?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let n = messages.len() as f64;
    println!(
        "{{\"target\":\"engine\",\"events\":{events},\"per_message\":{per},\"window\":{window},\"size\":{size},\"messages\":{},\"seconds\":{seconds:.3},\"messages_per_s\":{:.0},\"events_per_s\":{:.0}}}",
        messages.len(),
        n / seconds,
        events as f64 / seconds
    );
    Ok(())
}
