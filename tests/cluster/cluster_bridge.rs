//! The cluster bridge against a real nats-server: two [`Bridge`]s (relays A and B) on one
//! server, driven as the reactor drives them, through a `mio::Poll` woken by the bridge's
//! `Waker` (a bridge that forgot to wake would time these tests out).
//!
//! - publishes are pipelined, acknowledged one by one, and reach both relays in one
//!   stream order; the same msg id twice is one stream message (`duplicate` on the second
//!   ack);
//! - a claim put at A is seen at B, a deletion and an expiry too, and a relay started
//!   later sees the current claims;
//! - a request from B reaches A and A's reply comes back; a request to no relay is
//!   `no-responders` at once;
//! - the engine killed: `Disconnected` at both; restarted: `Connected` again and each
//!   consumer goes on with no loss and no duplicate;
//! - a relay's consumer deleted mid-stream: `ConsumerReset`, then no loss and no duplicate;
//!   the same when a stalled engine (SIGSTOP) misses heartbeats;
//! - bad settings are refused at start; without an engine, publishes and requests fail
//!   at once and the bridge stops at once.
//!
//! Skips when nats-server is not on `PATH` (fails under `CI=true`). Every wait is bounded
//! by [`WAIT`].
#![cfg(feature = "cluster")]

use crate::support;

use aep_relay::bridge::Bridge;
use aep_relay::cluster::{event_subject, kv_key, publish_id, ClusterConfig, FromBus, ToBus};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::nats::NatsServer;
use support::WAIT;

/// A relay's end of a bridge, as the reactor holds it: the bridge, the `Poll` its waker
/// wakes, and everything taken from it so far.
struct Relay {
    name: String,
    bridge: Bridge,
    poll: mio::Poll,
    events: mio::Events,
    /// Every value taken, in order.
    seen: Vec<FromBus>,
    /// How many of `seen` the waits have consumed.
    cursor: usize,
}

fn config(url: &str, relay: &str) -> ClusterConfig {
    ClusterConfig {
        urls: vec![url.to_string()],
        relay_id: relay.to_string(),
        claim_ttl: Duration::from_secs(2),
        request_timeout: Duration::from_secs(2),
        ..ClusterConfig::default()
    }
}

impl Relay {
    fn start(cfg: ClusterConfig) -> Relay {
        // The bridge's log (`RUST_LOG=aep_relay=debug`) when a test fails.
        #[cfg(feature = "cli")]
        let _ = env_logger::builder().is_test(true).try_init();
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let name = cfg.relay_id.clone();
        let bridge = Bridge::start(cfg, waker).expect("starting the bridge");
        Relay {
            name,
            bridge,
            poll,
            events: mio::Events::with_capacity(8),
            seen: Vec::new(),
            cursor: 0,
        }
    }

    /// Takes what is queued; when nothing is, waits for the waker (at most until
    /// `deadline`). Returns whether anything was taken.
    fn pump(&mut self, deadline: Instant) -> bool {
        let before = self.seen.len();
        while let Some(v) = self.bridge.try_recv() {
            self.seen.push(v);
        }
        if self.seen.len() == before {
            let left = deadline.saturating_duration_since(Instant::now());
            self.poll.poll(&mut self.events, Some(left)).unwrap();
            while let Some(v) = self.bridge.try_recv() {
                self.seen.push(v);
            }
        }
        self.seen.len() > before
    }

    /// The first value from the cursor on that `pred` accepts; the cursor moves past it.
    fn wait_for(&mut self, what: &str, pred: impl Fn(&FromBus) -> bool) -> FromBus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(i) = self.seen[self.cursor..].iter().position(&pred) {
                self.cursor += i + 1;
                return self.seen[self.cursor - 1].clone();
            }
            if Instant::now() >= deadline {
                panic!(
                    "{}: no {what} within {WAIT:?}; since the last wait it saw {:?}",
                    self.name,
                    &self.seen[self.cursor..]
                );
            }
            self.pump(deadline);
        }
    }

    /// Sends `msg`, taking values meanwhile while the bridge's queue is full.
    fn send(&mut self, mut msg: ToBus) {
        let deadline = Instant::now() + WAIT;
        loop {
            match self.bridge.send(msg) {
                Ok(()) => return,
                Err(back) => msg = back,
            }
            assert!(
                Instant::now() < deadline,
                "{}: the bridge takes nothing",
                self.name
            );
            self.pump(Instant::now() + Duration::from_millis(50));
        }
    }

    fn connected(&mut self) -> u64 {
        match self.wait_for("Connected", |v| matches!(v, FromBus::Connected { .. })) {
            FromBus::Connected {
                max_payload,
                last_seq,
            } => {
                assert!(max_payload >= 1024, "max_payload {max_payload}");
                last_seq
            }
            _ => unreachable!(),
        }
    }

    /// Waits until Messages up to `stream_seq` have come, looking at everything taken
    /// (a Message may come before the ack of its own publish); the cursor stays.
    fn messages_through(&mut self, stream_seq: u64) {
        let deadline = Instant::now() + WAIT;
        while !self.messages().iter().any(|(s, _)| *s >= stream_seq) {
            if Instant::now() >= deadline {
                panic!(
                    "{}: no Message {stream_seq} within {WAIT:?}; it saw {:?}",
                    self.name,
                    &self.seen[self.cursor..]
                );
            }
            self.pump(deadline);
        }
    }

    /// Every Message taken so far: stream sequence and payload.
    fn messages(&self) -> Vec<(u64, Bytes)> {
        self.seen
            .iter()
            .filter_map(|v| match v {
                FromBus::Message {
                    stream_seq,
                    payload,
                    ..
                } => Some((*stream_seq, payload.clone())),
                _ => None,
            })
            .collect()
    }

    /// Waits for the acks of `tickets`: ticket → (stream sequence, duplicate).
    fn acks(&mut self, tickets: impl IntoIterator<Item = u64>) -> BTreeMap<u64, (u64, bool)> {
        let mut want: std::collections::BTreeSet<u64> = tickets.into_iter().collect();
        let mut got = BTreeMap::new();
        while !want.is_empty() {
            let v = self.wait_for("an ack", |v| {
                matches!(v, FromBus::Acked { .. } | FromBus::PublishFailed { .. })
            });
            match v {
                FromBus::Acked {
                    ticket,
                    stream_seq,
                    duplicate,
                } => {
                    assert!(want.remove(&ticket), "an unexpected ack of {ticket}");
                    got.insert(ticket, (stream_seq, duplicate));
                }
                FromBus::PublishFailed { ticket, error } => {
                    panic!("{}: publish {ticket} failed: {error}", self.name)
                }
                _ => unreachable!(),
            }
        }
        got
    }

    fn count(&self, pred: impl Fn(&FromBus) -> bool) -> usize {
        self.seen.iter().filter(|v| pred(v)).count()
    }
}

/// A valid Event (AEP-0001 §5) of agent `a`, session `s`, at `seq`.
fn event(seq: u64) -> Bytes {
    Bytes::from(format!(
        r#"{{"aep":"0.1","id":"e{seq}","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/a/session/s","agent":"a","session":"s","seq":{seq}}}"#
    ))
}

fn publish(ticket: u64, seq: u64) -> ToBus {
    ToBus::Publish {
        ticket,
        subject: event_subject("aep", "a", "s"),
        msg_id: publish_id("A", 1, seq),
        payload: event(seq),
    }
}

/// Every Message exactly once, in stream order: the sequences strictly increase and are
/// exactly `expected`.
fn assert_exact(r: &Relay, expected: &[u64]) {
    let seqs: Vec<u64> = r.messages().iter().map(|(s, _)| *s).collect();
    assert_eq!(
        seqs, expected,
        "{}: the Messages are not each stream sequence once, in order",
        r.name
    );
}

#[test]
fn publishes_are_pipelined_ordered_and_deduplicated() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let mut a = Relay::start(config(&server.url(), "A"));
    let mut b = Relay::start(config(&server.url(), "B"));
    assert_eq!(a.connected(), 0);
    assert_eq!(b.connected(), 0);

    // N publishes sent without waiting for any ack.
    const N: u64 = 500;
    for i in 1..=N {
        a.send(publish(i, i));
    }
    let acks = a.acks(1..=N);
    // Sent in order on one connection: the stream holds them in that order.
    for (ticket, (seq, dup)) in &acks {
        assert_eq!((*seq, *dup), (*ticket, false), "ack of {ticket}");
    }
    for r in [&mut a, &mut b] {
        r.messages_through(N);
        assert_exact(r, &(1..=N).collect::<Vec<_>>());
        let payloads: Vec<Bytes> = r.messages().into_iter().map(|(_, p)| p).collect();
        assert_eq!(
            payloads,
            (1..=N).map(event).collect::<Vec<_>>(),
            "{}",
            r.name
        );
        // Connected came before the first Message.
        let first_msg = r
            .seen
            .iter()
            .position(|v| matches!(v, FromBus::Message { .. }));
        let connected = r
            .seen
            .iter()
            .position(|v| matches!(v, FromBus::Connected { .. }));
        assert!(
            connected < first_msg,
            "{}: Connected after a Message",
            r.name
        );
    }
    // `pending` counts down to 0 at the last message.
    assert!(matches!(
        a.seen
            .iter()
            .rev()
            .find(|v| matches!(v, FromBus::Message { .. })),
        Some(FromBus::Message { pending: 0, .. })
    ));

    // The same msg id again (a retry of one publish, here sent through B's connection)
    // is acknowledged as a duplicate of the first and not stored again.
    b.send(publish(9001, 1));
    assert_eq!(b.acks([9001])[&9001], (1, true));
    b.send(publish(9002, N + 1));
    assert_eq!(b.acks([9002])[&9002], (N + 1, false));
    for r in [&mut a, &mut b] {
        r.messages_through(N + 1);
        assert_exact(r, &(1..=N + 1).collect::<Vec<_>>());
    }
    a.bridge.shutdown();
    b.bridge.shutdown();
}

#[test]
fn claims_and_requests_cross_relays() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let mut a = Relay::start(config(&server.url(), "A"));
    let mut b = Relay::start(config(&server.url(), "B"));
    a.connected();
    b.connected();

    // A claim put at A is seen at B (and at A itself), then its deletion.
    let key = kv_key(&["A", "aep://test/agent/a/session/s", "s"]);
    a.send(ToBus::PutClaim {
        key: key.clone(),
        value: Bytes::from_static(b"claim-1"),
    });
    let k = key.clone();
    b.wait_for(
        "the claim",
        |v| matches!(v, FromBus::Claim { key, value: Some(val) } if *key == k && val == "claim-1"),
    );
    // A refresh with another value is seen as such.
    a.send(ToBus::PutClaim {
        key: key.clone(),
        value: Bytes::from_static(b"claim-1b"),
    });
    let k = key.clone();
    b.wait_for(
        "the refreshed claim",
        |v| matches!(v, FromBus::Claim { key, value: Some(val) } if *key == k && val == "claim-1b"),
    );
    // A relay started now gets the current claims.
    let mut c = Relay::start(config(&server.url(), "C"));
    c.connected();
    let k = key.clone();
    c.wait_for(
        "the current claim",
        |v| matches!(v, FromBus::Claim { key, value: Some(val) } if *key == k && val == "claim-1b"),
    );
    a.send(ToBus::DeleteClaim { key: key.clone() });
    let k = key.clone();
    b.wait_for(
        "the deletion",
        |v| matches!(v, FromBus::Claim { key, value: None } if *key == k),
    );

    // A claim not refreshed is gone after its TTL (2 s here), though the engine says
    // nothing: the bridge reports it.
    let key2 = kv_key(&["A", "other"]);
    let put_at = Instant::now();
    a.send(ToBus::PutClaim {
        key: key2.clone(),
        value: Bytes::from_static(b"claim-2"),
    });
    let k = key2.clone();
    b.wait_for(
        "the second claim",
        |v| matches!(v, FromBus::Claim { key, value: Some(_) } if *key == k),
    );
    let k = key2.clone();
    b.wait_for(
        "the second claim's expiry",
        |v| matches!(v, FromBus::Claim { key, value: None } if *key == k),
    );
    assert!(
        put_at.elapsed() >= Duration::from_secs(2),
        "expired before its TTL: {:?}",
        put_at.elapsed()
    );

    // B asks A; A answers.
    b.send(ToBus::Request {
        ticket: 7,
        relay: "A".into(),
        payload: Bytes::from_static(b"command bytes"),
    });
    let reply = match a.wait_for("the request", |v| matches!(v, FromBus::Request { .. })) {
        FromBus::Request { reply, payload } => {
            assert_eq!(payload, "command bytes");
            reply
        }
        _ => unreachable!(),
    };
    a.send(ToBus::Reply {
        reply,
        payload: Bytes::from_static(b"accepted"),
    });
    let r = b.wait_for("the response", |v| matches!(v, FromBus::Response { .. }));
    assert_eq!(
        r,
        FromBus::Response {
            ticket: 7,
            result: Ok(Bytes::from_static(b"accepted"))
        }
    );

    // No relay listens: no-responders, well before the request timeout.
    let asked = Instant::now();
    b.send(ToBus::Request {
        ticket: 8,
        relay: "nobody".into(),
        payload: Bytes::from_static(b"x"),
    });
    let r = b.wait_for("the no-responders", |v| {
        matches!(v, FromBus::Response { .. })
    });
    assert_eq!(
        r,
        FromBus::Response {
            ticket: 8,
            result: Err("no-responders".into())
        }
    );
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
}

#[test]
fn engine_restart_loses_and_repeats_nothing() {
    let Some(mut server) = NatsServer::start() else {
        return;
    };
    let mut a = Relay::start(config(&server.url(), "A"));
    let mut b = Relay::start(config(&server.url(), "B"));
    a.connected();
    b.connected();
    for i in 1..=50 {
        a.send(publish(i, i));
    }
    a.acks(1..=50);
    a.messages_through(50);
    b.messages_through(50);

    let key = kv_key(&["A", "s"]);
    a.send(ToBus::PutClaim {
        key: key.clone(),
        value: Bytes::from_static(b"claim"),
    });
    let k = key.clone();
    b.wait_for(
        "the claim",
        |v| matches!(v, FromBus::Claim { key, .. } if *key == k),
    );

    server.kill();
    for r in [&mut a, &mut b] {
        r.wait_for("Disconnected", |v| {
            matches!(v, FromBus::Disconnected { .. })
        });
    }
    // During the outage a publish fails at once: the core keeps it in its outbox.
    a.send(publish(777, 51));
    assert_eq!(
        a.wait_for("PublishFailed", |v| matches!(
            v,
            FromBus::PublishFailed { .. }
        )),
        FromBus::PublishFailed {
            ticket: 777,
            error: "not-connected".into()
        }
    );
    let down_at = [a.cursor, b.cursor];
    server.restart();
    for (r, down_at) in [&mut a, &mut b].into_iter().zip(down_at) {
        assert_eq!(
            r.connected(),
            50,
            "{}: the stream survived the restart",
            r.name
        );
        assert!(
            !r.seen[down_at..r.cursor]
                .iter()
                .any(|v| matches!(v, FromBus::Message { .. })),
            "{}: a Message between Disconnected and Connected",
            r.name
        );
        r.wait_for("ConsumerReset", |v| matches!(v, FromBus::ConsumerReset));
    }
    // The claims are given again on reconnect, and requests flow again.
    let k = key.clone();
    b.wait_for(
        "the claim again",
        |v| matches!(v, FromBus::Claim { key, value: Some(_) } if *key == k),
    );
    b.send(ToBus::Request {
        ticket: 1,
        relay: "A".into(),
        payload: Bytes::from_static(b"after the restart"),
    });
    let reply = match a.wait_for("the request", |v| matches!(v, FromBus::Request { .. })) {
        FromBus::Request { reply, .. } => reply,
        _ => unreachable!(),
    };
    a.send(ToBus::Reply {
        reply,
        payload: Bytes::from_static(b"ok"),
    });
    let r = b.wait_for("the response", |v| matches!(v, FromBus::Response { .. }));
    assert_eq!(
        r,
        FromBus::Response {
            ticket: 1,
            result: Ok(Bytes::from_static(b"ok"))
        }
    );
    for i in 51..=100 {
        b.send(publish(i, i));
    }
    let acks = b.acks(51..=100);
    assert!(
        acks.values().all(|&(s, d)| (51..=100).contains(&s) && !d),
        "{acks:?}"
    );
    for r in [&mut a, &mut b] {
        r.messages_through(100);
        assert_exact(r, &(1..=100).collect::<Vec<_>>());
    }
}

#[test]
fn bad_settings_are_refused_and_a_bridge_without_engine_stops_promptly() {
    let poll = mio::Poll::new().unwrap();
    let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
    let err = |cfg: ClusterConfig| match Bridge::start(cfg, waker.clone()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    assert!(err(config("nats://127.0.0.1:1", "")).contains("relay id"));
    assert!(err(ClusterConfig {
        urls: vec![],
        ..config("", "A")
    })
    .contains("no server URL"));
    assert!(err(config("nats://127.0.0.1:99999", "A")).contains("99999"));

    // Port 1 on loopback: nothing listens. The bridge retries in the background, fails
    // publishes and requests at once, and stops at once.
    let mut r = Relay::start(config("nats://127.0.0.1:1", "A"));
    r.send(publish(1, 1));
    assert_eq!(
        r.wait_for("PublishFailed", |v| matches!(
            v,
            FromBus::PublishFailed { .. }
        )),
        FromBus::PublishFailed {
            ticket: 1,
            error: "not-connected".into()
        }
    );
    r.send(ToBus::Request {
        ticket: 2,
        relay: "B".into(),
        payload: Bytes::new(),
    });
    assert_eq!(
        r.wait_for("Response", |v| matches!(v, FromBus::Response { .. })),
        FromBus::Response {
            ticket: 2,
            result: Err("not-connected".into())
        }
    );
    assert_eq!(r.seen.len(), 2, "{:?}", r.seen);
    let t = Instant::now();
    r.bridge.shutdown();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn deleted_consumer_is_recreated_without_loss_or_duplicate() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let mut a = Relay::start(config(&server.url(), "A"));
    let mut b = Relay::start(config(&server.url(), "B"));
    a.connected();
    b.connected();
    for i in 1..=20 {
        b.send(publish(i, i));
    }
    b.acks(1..=20);
    a.messages_through(20);

    assert_eq!(server.consumers_of("A", true), 1);
    // Published while A has no consumer, then after it has a new one.
    for i in 21..=30 {
        b.send(publish(i, i));
    }
    b.acks(21..=30);
    a.wait_for("ConsumerReset", |v| matches!(v, FromBus::ConsumerReset));
    for i in 31..=40 {
        b.send(publish(i, i));
    }
    b.acks(31..=40);
    for r in [&mut a, &mut b] {
        r.messages_through(40);
        assert_exact(r, &(1..=40).collect::<Vec<_>>());
    }
    assert_eq!(b.count(|v| matches!(v, FromBus::ConsumerReset)), 0);
}

#[test]
fn stalled_engine_missed_heartbeats_recreate_the_consumer_without_loss() {
    let Some(server) = NatsServer::start() else {
        return;
    };
    let mut a = Relay::start(config(&server.url(), "A"));
    let mut b = Relay::start(config(&server.url(), "B"));
    a.connected();
    b.connected();
    for i in 1..=10 {
        b.send(publish(i, i));
    }
    b.acks(1..=10);
    a.messages_through(10);

    // Stalled for longer than two idle heartbeats: the connection stays, the
    // heartbeats stop. The stall's length is the fault itself, not a synchronisation.
    server.pause();
    for i in 11..=20 {
        b.send(publish(i, i));
    }
    std::thread::sleep(aep_relay::bridge::HEARTBEAT * 3);
    server.resume();
    a.wait_for("ConsumerReset", |v| matches!(v, FromBus::ConsumerReset));
    b.acks(11..=20);
    for r in [&mut a, &mut b] {
        r.messages_through(20);
        assert_exact(r, &(1..=20).collect::<Vec<_>>());
    }
}
