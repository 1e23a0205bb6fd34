//! `connections`: `GET /connections` answered in-process (no sockets) with 10 000 SSE
//! subscribers connected, in **time per request** (thread CPU time): every row built
//! (its filter in attr-match form, its counters), sorted by lag, and serialized. Half
//! the subscribers have a `session` filter and a `metadata` ceiling, so the rows carry
//! filters. The target: under 50 ms.

use aep_relay::ConnId;
use aep_sim::Sim;

use aep_relay::Config;
use criterion::{criterion_group, criterion_main, Criterion};

mod support;

const SUBSCRIBERS: usize = 10_000;

fn relay() -> (Sim, Vec<ConnId>) {
    let c = Config {
        listen: "127.0.0.1:0".parse().expect("addr"),
        ..Config::default()
    };
    let mut relay = Sim::new(c).expect("relay");
    let subs = (0..SUBSCRIBERS)
        .map(|i| {
            let query = if i % 2 == 0 {
                format!("?filter=%7B%22session%22%3A%22s{i}%22%7D&capture=metadata")
            } else {
                String::new()
            };
            let k = relay.connect(None);
            let req = format!("GET /stream{query} HTTP/1.1\r\nHost: x\r\n\r\n");
            relay.feed(k, req.as_bytes(), false);
            let head = relay.take_output(k).expect("open");
            assert!(head.starts_with(b"HTTP/1.1 200"), "subscribe failed");
            k
        })
        .collect();
    (relay, subs)
}

fn benches(c: &mut Criterion<support::CpuTime>) {
    let (mut relay, _subs) = relay();
    let admin = relay.connect(None);
    let req = b"GET /connections HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut ask = move || {
        relay.feed(admin, req, false);
        let out = relay.take_output(admin).expect("answered");
        assert!(out.starts_with(b"HTTP/1.1 200"), "GET /connections failed");
        out.len()
    };
    println!(
        "connections/answer: {} bytes for {SUBSCRIBERS} subscribers",
        ask()
    );
    let mut g = c.benchmark_group("connections");
    g.bench_function("get_10k_subscribers", |b| b.iter(&mut ask));
    g.finish();
}

criterion_group! {
    name = connections;
    config = support::config().sample_size(10);
    targets = benches
}
criterion_main!(connections);
