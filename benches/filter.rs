//! `filter`: attr-match cost, in **ns per Event** (Throughput: Events/s).
//!
//! - `filter/eval/*`: `Filter::matches` of one compiled, typical filter over every Event
//!   of a corpus (the golden corpus when `../shared` is present, else generated Events).
//! - `filter/index/{pin}/{n}`: `SubscriptionIndex::matching` for one Event with `n`
//!   subscriptions (10, 100, 1k, 100k). `session`, `agent` and `type` subscriptions each
//!   pin a distinct exact value, one of which is the Event's (so exactly one matches):
//!   the cost should not grow with `n`. `unpinned` subscriptions (`{"type":"tool.*",
//!   "acmeregion":"r{k}"}`) must each be evaluated: linear in `n`, shown for contrast.
//!   The output vector is reused, as the hub does.

use std::sync::Arc;

use aep_relay::fanout::index::SubscriptionIndex;
use aep_relay::filter::Filter;
use aep_relay::wire::envelope::Event;
use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

mod support;

const TYPICAL: [(&str, &str); 6] = [
    ("match_all", r#"{}"#),
    ("type_prefix", r#"{"type":"tool.*"}"#),
    (
        "attention_or_error_notice_up",
        r#"{"type":["attention.*","error.*"],"severity":{"gte":"notice"}}"#,
    ),
    ("session", r#"{"session":"s_8f2c"}"#),
    (
        "agent_and_extension",
        r#"{"agent":"claude-code","acmeregion":["eu-1","us-1"]}"#,
    ),
    (
        "five_members",
        r#"{"session":["s_8f2c","s_9"],"agent":"claude-code","type":["tool.*","run.*"],"severity":{"gte":"info","lte":"error"},"capture":["metadata","redacted"]}"#,
    ),
];

fn corpus() -> Vec<Event> {
    let lines = support::golden_lines().unwrap_or_else(|| {
        (0..64)
            .map(|n| support::event(n, "s_8f2c", 600).into_bytes())
            .collect()
    });
    lines
        .into_iter()
        .map(|l| Event::parse(Bytes::from(l)).expect("corpus Event"))
        .collect()
}

fn eval(c: &mut Criterion<support::CpuTime>) {
    let events = corpus();
    let mut g = c.benchmark_group("filter/eval");
    g.throughput(Throughput::Elements(events.len() as u64));
    for (name, json) in TYPICAL {
        let f = Filter::parse(json.as_bytes()).expect("filter");
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut hits = 0usize;
                for e in &events {
                    hits += usize::from(f.matches(black_box(e)));
                }
                hits
            })
        });
    }
    g.finish();
}

fn filter_for(pin: &str, k: usize) -> String {
    match pin {
        "session" => format!(r#"{{"session":"s{k}","severity":{{"gte":"info"}}}}"#),
        "agent" => format!(r#"{{"agent":"a{k}","type":"tool.*"}}"#),
        "type" => format!(r#"{{"type":"x.vendor.tool.t{k}"}}"#),
        _ => format!(r#"{{"type":"tool.*","acmeregion":"r{k}"}}"#),
    }
}

fn event_for(pin: &str, k: usize) -> Event {
    let (ty, session, agent, region) = match pin {
        "session" => (
            "tool.completed".to_string(),
            format!("s{k}"),
            "cc".into(),
            "x",
        ),
        "agent" => ("tool.completed".into(), "s".into(), format!("a{k}"), "x"),
        "type" => (format!("x.vendor.tool.t{k}"), "s".into(), "cc".into(), "x"),
        _ => ("tool.completed".into(), "s".into(), "cc".into(), "r7"),
    };
    let json = format!(
        r#"{{"aep":"0.1","id":"e1","type":"{ty}","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/{agent}/session/{session}","agent":"{agent}","session":"{session}","seq":1,"acmeregion":"{region}","data":{{}}}}"#
    );
    Event::parse(Bytes::from(json)).expect("index Event")
}

fn index(c: &mut Criterion<support::CpuTime>) {
    for pin in ["session", "agent", "type", "unpinned"] {
        let mut g = c.benchmark_group(format!("filter/index/{pin}"));
        g.throughput(Throughput::Elements(1));
        for n in [10usize, 100, 1_000, 100_000] {
            let mut idx = SubscriptionIndex::new();
            for k in 0..n {
                let f = Filter::parse(filter_for(pin, k).as_bytes()).expect("filter");
                idx.insert(k, Arc::new(f));
            }
            let ev = event_for(pin, 7);
            let mut out = Vec::with_capacity(n);
            out.clear();
            idx.matching(&ev, &mut out);
            assert_eq!(out, vec![7], "{pin}/{n}: exactly one subscription matches");
            g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                b.iter(|| {
                    out.clear();
                    idx.matching(black_box(&ev), &mut out);
                    out.len()
                })
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = filter;
    config = support::config();
    targets = eval, index
}
criterion_main!(filter);
