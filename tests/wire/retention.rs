//! What the replay buffer keeps (AEP-0003 §5, AEP-0007 §5): a full buffer evicts its
//! `debug` Events before any durable fact, and a resume that lost a fact gets
//! `replay-exhausted`, also when its whole session was evicted by `--max-sessions`.

use crate::support;

use serde_json::{json, Value};
use support::{enc, Endpoint, TestRelay, Ws};

/// `(comments, data)` of a `live=0` stream resuming `session` after (0, `seq`), read
/// whole: every comment but the stream's own (open, `replay-complete`), in order, and
/// every Event.
fn resume(relay: &TestRelay, session: &str, seq: u64) -> (Vec<String>, Vec<String>) {
    let from = enc(&json!([{"session": session, "epoch": 0, "seq": seq}]).to_string());
    let text = relay.get_text(&format!("/stream?from={from}&live=0"));
    let mut comments = Vec::new();
    let mut data = Vec::new();
    for line in text.lines() {
        if let Some(c) = line.strip_prefix(": ") {
            if !c.starts_with("aep-relay") && c != "replay-complete" {
                comments.push(c.to_string());
            }
        } else if let Some(d) = line.strip_prefix("data: ") {
            data.push(d.to_string());
        }
    }
    (comments, data)
}

/// An Event of `session` at (0, `seq`) with `severity`.
fn at(session: &str, seq: u64, ty: &str, severity: &str) -> String {
    support::event(session, 0, seq, ty, &format!(r#","severity":"{severity}""#))
}

/// AEP-0007 §5 item 1: with `--buffer 8`, one `notice` `attention.requested` followed
/// by 100 `debug` deltas keeps the notice; a consumer resuming from before it learns it
/// was asked, and a resume from the notice reaches the next fact without a marker.
#[test]
fn a_full_ring_keeps_the_fact_and_sheds_deltas() {
    let relay = TestRelay::with(|c| c.buffer_per_session = 8);
    let ask = at("s", 1, "attention.requested", "notice");
    let deltas: Vec<String> = (2..=101)
        .map(|q| at("s", q, "x.agui.text_message.content", "debug"))
        .collect();
    let done = at("s", 102, "run.finished", "info");
    relay.post_ok(&[&ask]);
    for d in &deltas {
        relay.post_ok(&[d]);
    }
    relay.post_ok(&[&done]);

    let (comments, data) = resume(&relay, "s", 0);
    assert_eq!(
        comments,
        Vec::<String>::new(),
        "nothing a consumer is owed was lost"
    );
    assert_eq!(data.len(), 8);
    assert_eq!(data[0], ask, "the durable fact outlives the deltas");
    assert_eq!(data[7], done);
    assert_eq!(
        &data[1..7],
        &deltas[94..100],
        "the newest deltas fill the rest"
    );

    let (comments, data) = resume(&relay, "s", 1);
    assert!(comments.is_empty());
    assert_eq!(
        data.last(),
        Some(&done),
        "a resume from the fact reaches the next fact"
    );
}

/// AEP-0003 §5: a resume whose next fact was evicted gets `replay-exhausted` naming
/// the earliest held position; one that lost only `debug` Events gets none.
#[test]
fn an_evicted_fact_is_owed_a_marker() {
    let relay = TestRelay::with(|c| c.buffer_per_session = 3);
    let facts: Vec<String> = (1..=5)
        .map(|q| at("s", q, "tool.completed", "info"))
        .collect();
    let refs: Vec<&str> = facts.iter().map(String::as_str).collect();
    relay.post_ok(&refs);
    assert_eq!(
        resume(&relay, "s", 1),
        (
            vec!["replay-exhausted s 0:3".to_string()],
            facts[2..].to_vec()
        )
    );
    assert_eq!(resume(&relay, "s", 2), (vec![], facts[2..].to_vec()));

    let relay = TestRelay::with(|c| c.buffer_per_session = 3);
    let mut sent = vec![at("d", 1, "tool.completed", "info")];
    sent.extend((2..=6).map(|q| at("d", q, "x.agui.text_message.content", "debug")));
    let refs: Vec<&str> = sent.iter().map(String::as_str).collect();
    relay.post_ok(&refs);
    let (comments, data) = resume(&relay, "d", 0);
    assert!(
        comments.is_empty(),
        "only debug Events were evicted: {comments:?}"
    );
    assert_eq!(
        data,
        vec![sent[0].clone(), sent[4].clone(), sent[5].clone()]
    );
}

/// A session evicted whole: `--buffer 4 --max-sessions 1`: session `sA` seq 1-9, then
/// `sB`, then `sA` seq 20. A resume of `sA` after seq 3 gets `replay-exhausted` and seq
/// 20 (the relay held and evicted seq 4-9). Before seq 20 arrives, the same resume gets
/// the marker too, naming the position after the last one lost; over SSE and WS alike.
#[test]
fn session_eviction_keeps_the_marker_owed() {
    let relay = TestRelay::with(|c| {
        c.buffer_per_session = 4;
        c.max_sessions = 1;
    });
    let a: Vec<String> = (1..=9)
        .map(|q| at("sA", q, "tool.completed", "info"))
        .collect();
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    relay.post_ok(&refs);
    relay.post_ok(&[&at("sB", 1, "tool.completed", "info")]);

    assert_eq!(
        resume(&relay, "sA", 3),
        (vec!["replay-exhausted sA 0:10".to_string()], vec![])
    );
    assert_eq!(
        resume(&relay, "sA", 9),
        (vec![], vec![]),
        "nothing lost after 9"
    );
    let mut ws = Ws::consumer(&relay);
    ws.subscribe(
        "r",
        json!({"from": [{"session": "sA", "epoch": 0, "seq": 3}]}),
    );
    let marker: Value = ws.recv();
    assert_eq!(
        marker,
        json!({"type": "replay-exhausted", "sub": "r", "session": "sA",
               "earliest": {"epoch": 0, "seq": 10},
               "source": "aep://test/agent/a/session/sA"})
    );

    let a20 = at("sA", 20, "tool.completed", "info");
    relay.post_ok(&[&a20]);
    assert_eq!(ws.recv_text(), a20, "live, after the marker");
    assert_eq!(
        resume(&relay, "sA", 3),
        (
            vec!["replay-exhausted sA 0:20".to_string()],
            vec![a20.clone()]
        )
    );
}
