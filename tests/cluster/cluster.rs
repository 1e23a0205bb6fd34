//! Cluster mode end to end: real `aep-relay` processes joined by a real nats-server with
//! JetStream, driven through their real interfaces: POST /events, SSE (`GET /stream`),
//! WebSocket (`GET /socket`), `/healthz`, `/readyz`, `/metrics`, and the JetStream API
//! itself for what only the engine knows (its message count, a relay's consumer).
//!
//! Each test starts its own nats-server (random port, its own store) and its own relays
//! (each its own `--relay-id`, all with the token [`TOKEN`] so that control works), and
//! waits for every relay's `/readyz` before it begins. "Exactly once" is proven the way
//! a consumer would see it: after the expected messages a sentinel Event is posted, and
//! the next message must be that sentinel (a duplicate or a stray would come before it,
//! since every relay admits in the stream's one order).
//!
//! Skips when nats-server is not on `PATH` (fails under `CI=true`). Every wait is bounded
//! by [`WAIT`] (the engine outage's degradation by two heartbeats) and fails with a
//! message.
#![cfg(all(feature = "cluster", feature = "cli"))]

use crate::support;

use serde_json::{json, Value};
use std::collections::HashSet;
use std::future::Future;
use std::io::Write;
use std::time::{Duration, Instant};
use support::nats::NatsServer;
use support::*;

/// The bearer token every relay of these tests takes (every scope: emit, watch, control).
const TOKEN: &str = "t";
/// The `Authorization` header for [`TOKEN`].
const AUTH: (&str, &str) = ("Authorization", "Bearer t");
/// The WebSocket query carrying [`TOKEN`].
const WS_AUTH: &str = "access_token=t";

// ---------------------------------------------------------------------------------------
// Relays and their clients
// ---------------------------------------------------------------------------------------

/// Spawns `aep-relay --cluster {nats} --relay-id {id} --token t {extra}` and waits for its
/// `/readyz`.
fn start_relay(nats: &NatsServer, id: &str, extra: &[&str]) -> RelayProcess {
    let url = nats.url();
    let mut args = vec!["--cluster", &url, "--relay-id", id, "--token", TOKEN];
    args.extend_from_slice(extra);
    let r = RelayProcess::spawn(&args);
    wait_ready(&r, id);
    r
}

/// `GET {path}` with the token: status and JSON body.
fn get_json(r: &RelayProcess, path: &str) -> (u16, Value) {
    status_json(agent().get(&r.url(path)).set(AUTH.0, AUTH.1).call())
}

/// `GET {path}` with the token: the body as text (a 200 asserted).
fn get_auth_text(r: &RelayProcess, path: &str) -> String {
    let resp = agent()
        .get(&r.url(path))
        .set(AUTH.0, AUTH.1)
        .call()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    resp.into_string().unwrap()
}

/// The `cluster` member of `/healthz`.
fn cluster_health(r: &RelayProcess) -> Value {
    let (status, body) = get_json(r, "/healthz");
    assert_eq!(status, 200, "/healthz answered {status} {body}");
    body["cluster"].clone()
}

/// Polls `/readyz` (a bounded loop over an awaited condition) until it answers 200
/// `{"ready":true,"cluster":"connected"}`.
fn wait_ready(r: &RelayProcess, id: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = get_json(r, "/readyz");
        if status == 200 {
            assert_eq!(body, json!({"ready": true, "cluster": "connected"}), "{id}");
            return;
        }
        assert_eq!(status, 503, "{id}: /readyz answered {status} {body}");
        assert!(
            Instant::now() < deadline,
            "{id}: /readyz still {status} {body} after {WAIT:?}; /healthz cluster {}",
            cluster_health(r)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `/healthz` until `pred` holds of its `cluster` member, at most until `deadline`;
/// returns it.
fn wait_health(
    r: &RelayProcess,
    id: &str,
    what: &str,
    deadline: Instant,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    loop {
        let c = cluster_health(r);
        if pred(&c) {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "{id}: /healthz cluster is not {what} in time; it says {c}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// POSTs `lines` as one NDJSON batch with the token: status and JSON body.
fn post(r: &RelayProcess, lines: &[impl AsRef<str>]) -> (u16, Value) {
    let mut body = String::new();
    for l in lines {
        body.push_str(l.as_ref());
        body.push('\n');
    }
    status_json(
        agent()
            .post(&r.url("/events"))
            .set("AEP-Version", "0.1")
            .set("Content-Type", "application/x-ndjson")
            .set(AUTH.0, AUTH.1)
            .send_string(&body),
    )
}

/// [`post`], asserting `202 {"accepted": n}` (the stream acknowledged them all).
fn post_ok(r: &RelayProcess, lines: &[impl AsRef<str>]) {
    let (status, body) = post(r, lines);
    assert_eq!(
        (status, &body),
        (202, &json!({"accepted": lines.len()})),
        "POST of {} Events",
        lines.len()
    );
}

/// Opens `GET /stream?{query}` with the token and `headers`.
fn sse(r: &RelayProcess, query: &str, headers: &[(&str, &str)]) -> SseStream {
    let mut h = vec![AUTH];
    h.extend_from_slice(headers);
    r.sse(query, &h)
}

/// The whole body of `GET /stream?from=all&live=0`, as sent.
fn replay_body(r: &RelayProcess) -> String {
    get_auth_text(r, "/stream?from=all&live=0")
}

/// The `data:` of every message of a replay body.
fn data_lines(body: &str) -> Vec<&str> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect()
}

/// A WebSocket consumer with the token, subscribed to everything (from now on).
fn watcher(r: &RelayProcess) -> Ws {
    let mut ws = Ws::hello(r, WS_AUTH, "consumer", json!({})).0;
    ws.subscribe("all", json!({}));
    ws
}

/// One `/metrics` sample (`name` or `name{labels}`), with the token.
fn metric(r: &RelayProcess, sample: &str) -> f64 {
    let text = get_auth_text(r, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("a number"))
        .unwrap_or_else(|| panic!("no sample {sample} in /metrics:\n{text}"))
}

/// A ping answered by a pong proves nothing else was queued for `ws` before it.
fn expect_quiet(ws: &mut Ws, who: &str) {
    ws.send_json(&json!({"type": "ping", "t": "q"}));
    let r = ws.recv();
    assert_eq!(
        r,
        json!({"type": "pong", "t": "q"}),
        "{who} got something more"
    );
}

/// The next `n` messages' data of an SSE stream.
fn take(s: &mut SseStream, n: usize) -> Vec<String> {
    (0..n).map(|_| s.expect().data).collect()
}

/// `(source, id)` of an Event's JSON text.
fn source_id(line: &str) -> (String, String) {
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    (
        v["source"].as_str().unwrap().to_owned(),
        v["id"].as_str().unwrap().to_owned(),
    )
}

/// A command (no `seq`: the sender does not own the target's order, AEP-0004 §2.2).
fn command(id: &str, ty: &str, session: &str) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{id}","type":"{ty}","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/sender","agent":"sender","session":"{session}","data":{{"scope":"session"}}}}"#
    )
}

/// A sentinel Event (its own agent and session), posted last to prove nothing else is
/// still coming.
fn sentinel(n: u64) -> String {
    ev("sentinel", "end", n)
}

// ---------------------------------------------------------------------------------------
// The JetStream API, for what only the engine knows
// ---------------------------------------------------------------------------------------

/// Runs `f` with a JetStream context on a fresh client of `url`, on a current-thread
/// runtime of its own.
fn jetstream<F: Future>(
    url: &str,
    f: impl FnOnce(async_nats::jetstream::Context) -> F,
) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = async_nats::connect(url)
            .await
            .expect("connecting the test's NATS client");
        f(async_nats::jetstream::new(client)).await
    })
}

/// Messages in the stream `AEP`.
fn stream_messages(nats: &NatsServer) -> u64 {
    jetstream(&nats.url(), |js| async move {
        let mut s = js.get_stream("AEP").await.expect("the stream AEP");
        s.info().await.expect("the stream's info").state.messages
    })
}

// ---------------------------------------------------------------------------------------
// The tests, one per guarantee of cluster mode
// ---------------------------------------------------------------------------------------

/// An Event POSTed at R1 reaches an SSE subscriber on R2 and a WS subscriber on R3
/// byte-identical, exactly once each; R1's own subscriber gets it exactly once too; a
/// non-matching filter gets nothing (AEP-0003 §3.3, §3.5, §6; AEP-0001 §7 #4).
#[test]
fn an_event_posted_at_one_relay_reaches_every_relay_once_byte_identical() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    let r3 = start_relay(&nats, "r3", &[]);
    let mut own = sse(&r1, "", &[]);
    let mut remote_sse = sse(&r2, "", &[]);
    let filter = enc(r#"{"type":["attention.*"]}"#);
    let mut filtered = sse(&r2, &format!("filter={filter}"), &[]);
    let mut remote_ws = watcher(&r3);

    // Odd spacing and escapes: only the original bytes compare equal.
    let line = event(
        "one",
        0,
        7,
        "tool.completed",
        r#", "subject" : "x\u00e9", "data":{"n":[1, 2.50]}"#,
    );
    post_ok(&r1, &[&line]);
    // The sentinel matches the filter: the filtered subscriber's first message.
    let end = event(
        "one",
        0,
        8,
        "attention.requested",
        r#","severity":"warning""#,
    );
    post_ok(&r3, &[&end]);

    for (name, s) in [("R1's own SSE", &mut own), ("R2's SSE", &mut remote_sse)] {
        let m = s.expect();
        assert_eq!(m.data, line, "{name}: byte-identical");
        assert_eq!(m.id.as_deref(), Some("one:0:7"), "{name}");
        assert_eq!(m.event.as_deref(), Some("tool.completed"), "{name}");
        assert_eq!(
            s.expect().data,
            end,
            "{name}: exactly once, then the sentinel"
        );
    }
    assert_eq!(remote_ws.recv_text(), line, "R3's WS: byte-identical");
    assert_eq!(
        remote_ws.recv_text(),
        end,
        "R3's WS: exactly once, then the sentinel"
    );
    expect_quiet(&mut remote_ws, "R3's WS");
    assert_eq!(
        filtered.expect().data,
        end,
        "the non-matching filter got nothing before the sentinel"
    );
}

/// Three emitters post N Events each, concurrently, one per relay. Every subscriber on
/// every relay gets exactly 3N, with no duplicate `(source, id)`, each emitter's Events
/// in its order (AEP-0001 §7 #1, #4), and since every relay admits in the stream's one
/// order, all in the same order.
#[test]
fn concurrent_emitters_on_three_relays_reach_every_subscriber_exactly_once_in_order() {
    const N: u64 = 60;
    const BATCH: u64 = 6;
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let relays = [
        start_relay(&nats, "r1", &[]),
        start_relay(&nats, "r2", &[]),
        start_relay(&nats, "r3", &[]),
    ];
    let mut sses: Vec<SseStream> = relays.iter().map(|r| sse(r, "", &[])).collect();
    let mut wss: Vec<Ws> = relays.iter().map(watcher).collect();

    // The same session name and ids for all three: only `source` tells them apart.
    let agents = ["e1", "e2", "e3"];
    std::thread::scope(|scope| {
        for (r, agent) in relays.iter().zip(agents) {
            scope.spawn(move || {
                for start in (0..N).step_by(BATCH as usize) {
                    let lines: Vec<String> =
                        (start..start + BATCH).map(|s| ev(agent, "c", s)).collect();
                    post_ok(r, &lines);
                }
            });
        }
    });
    post_ok(&relays[0], &[sentinel(0)]);

    let mut orders = Vec::new();
    for (i, s) in sses.iter_mut().enumerate() {
        orders.push((format!("R{}'s SSE", i + 1), take(s, 3 * N as usize)));
        assert_eq!(
            s.expect().data,
            sentinel(0),
            "R{}'s SSE: 3N, then the sentinel",
            i + 1
        );
    }
    for (i, ws) in wss.iter_mut().enumerate() {
        let got: Vec<String> = (0..3 * N).map(|_| ws.recv_text()).collect();
        orders.push((format!("R{}'s WS", i + 1), got));
        assert_eq!(
            ws.recv_text(),
            sentinel(0),
            "R{}'s WS: 3N, then the sentinel",
            i + 1
        );
    }
    for (name, got) in &orders {
        let ids: HashSet<(String, String)> = got.iter().map(|l| source_id(l)).collect();
        assert_eq!(ids.len(), got.len(), "{name}: a duplicate (source, id)");
        for agent in agents {
            let mine: Vec<&String> = got
                .iter()
                .filter(|l| l.contains(&format!(r#""agent":"{agent}""#)))
                .collect();
            let want: Vec<String> = (0..N).map(|s| ev(agent, "c", s)).collect();
            assert_eq!(
                mine,
                want.iter().collect::<Vec<_>>(),
                "{name}: {agent}'s Events, all and in its order"
            );
        }
    }
    let (first, order) = &orders[0];
    for (name, got) in &orders[1..] {
        assert!(
            got == order,
            "{name} and {first} got the Events in different orders (every relay admits in the stream's order)"
        );
    }
}

/// A consumer reads at R1 up to P, then resumes at R2 with `Last-Event-ID` and with
/// `from`, and gets exactly what follows P (AEP-0003 §3.3 #3, §7); `from=all&live=0`
/// bodies are byte-identical at R1, R2 and R3, backfill (AEP-0001 §7 #2), a command
/// (AEP-0004 §2.2) and `attention.routed` (AEP-0002 §7.3) included; `replay-exhausted`
/// names the same earliest position everywhere (AEP-0003 §5).
#[test]
fn resume_is_exact_at_any_relay_and_replays_are_byte_identical() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let buffer = ["--buffer", "8"];
    let r1 = start_relay(&nats, "r1", &buffer);
    let r2 = start_relay(&nats, "r2", &buffer);
    let r3 = start_relay(&nats, "r3", &buffer);
    let mut watch = [watcher(&r1), watcher(&r2), watcher(&r3)];
    let see_all = |watch: &mut [Ws; 3], line: &str, what: &str| {
        for (i, w) in watch.iter_mut().enumerate() {
            assert_eq!(w.recv_text(), line, "R{} watching: {what}", i + 1);
        }
    };

    // Resume: session r, 8 Events (the buffer's depth), read at R1 up to P = r:0:4.
    let rs: Vec<String> = (0..8).map(|s| ev("b", "r", s)).collect();
    let mut reader = sse(&r1, "", &[]);
    post_ok(&r1, &rs[..4]);
    post_ok(&r2, &rs[4..]);
    let mut last = None;
    for want in &rs[..5] {
        let m = reader.expect();
        assert_eq!(&m.data, want, "the reader at R1");
        last = m.id;
    }
    let p = last.expect("an id");
    assert_eq!(p, "r:0:4");
    for w in watch.iter_mut() {
        for want in &rs {
            assert_eq!(&w.recv_text(), want);
        }
    }
    let from = enc(r#"[{"session":"r","epoch":0,"seq":4}]"#);
    for (how, r, query, headers) in [
        (
            "Last-Event-ID at R2",
            &r2,
            "live=0".to_string(),
            vec![("Last-Event-ID", p.as_str())],
        ),
        ("from at R2", &r2, format!("from={from}&live=0"), vec![]),
        ("from at R3", &r3, format!("from={from}&live=0"), vec![]),
    ] {
        let got = sse(r, &query, &headers).rest();
        assert!(got.iter().all(|m| m.comments.is_empty()), "{how}: {got:?}");
        let data: Vec<&str> = got.iter().map(|m| m.data.as_str()).collect();
        assert_eq!(
            data,
            [&rs[5], &rs[6], &rs[7]],
            "{how}: exactly what follows P"
        );
    }

    // Session s: owned by a control-capable emitter at R1, with backfill, a command
    // routed to it and a foreign `attention.routed`.
    let mut claimant = Ws::emitter(
        &r1,
        WS_AUTH,
        "a",
        json!({"capabilities": {"control": {"accepts": ["control.cancel"]}}}),
    );
    for seq in [0, 1, 2, 4, 5] {
        let line = event("s", 0, seq, "tool.started", "");
        claimant.send(&line);
        see_all(&mut watch, &line, "the claimant's Events");
    }
    let backfill = event("s", 0, 3, "tool.started", r#","late":true"#);
    post_ok(&r2, &[&backfill]);
    see_all(&mut watch, &backfill, "the backfill");
    let routed = r#"{"aep":"0.1","id":"rt1","type":"attention.routed","subject":"q1","time":"2026-07-03T10:00:01Z","source":"aep://test/agent/router","agent":"router","session":"s"}"#;
    post_ok(&r3, &[routed]);
    see_all(&mut watch, routed, "attention.routed");
    let (mut sender, _) = Ws::hello(&r1, WS_AUTH, "consumer", json!({}));
    let cmd = command("cmd-1", "control.cancel", "s");
    sender.send(&cmd);
    assert_eq!(claimant.recv_text(), cmd, "the claimant gets the command");
    see_all(&mut watch, &cmd, "the command");
    expect_quiet(&mut sender, "the command's sender");

    // replay-exhausted: session x, 12 Events in a buffer of 8.
    let xs: Vec<String> = (0..12).map(|s| ev("c", "x", s)).collect();
    post_ok(&r2, &xs);
    for w in watch.iter_mut() {
        for want in &xs {
            assert_eq!(&w.recv_text(), want);
        }
    }
    for (i, r) in [&r1, &r2, &r3].into_iter().enumerate() {
        let got = sse(r, "live=0", &[("Last-Event-ID", "x:0:1")]).rest();
        assert_eq!(
            got.first().map(|m| m.comments.clone()),
            Some(vec!["replay-exhausted x 0:4".to_string()]),
            "R{}: the earliest held position of x",
            i + 1
        );
        let data: Vec<&String> = got.iter().map(|m| &m.data).collect();
        assert_eq!(data, xs[4..].iter().collect::<Vec<_>>(), "R{}", i + 1);
    }

    let bodies = [replay_body(&r1), replay_body(&r2), replay_body(&r3)];
    let data = data_lines(&bodies[0]);
    for want in [backfill.as_str(), routed, &cmd, &rs[7], &xs[11]] {
        assert_eq!(
            data.iter().filter(|d| **d == want).count(),
            1,
            "R1's from=all holds {want} once; it is:\n{}",
            bodies[0]
        );
    }
    assert_eq!(
        bodies[1], bodies[0],
        "R2's from=all&live=0 body differs from R1's"
    );
    assert_eq!(
        bodies[2], bodies[0],
        "R3's from=all&live=0 body differs from R1's"
    );
}

/// The same Event POSTed at R1 and at R2 (one after the other, and at once) is two
/// publishes, so two stream messages. Every live subscriber gets it as often as it was
/// sent (AEP-0003 §5: live fan-out forwards Events as received; redelivery MUST traverse
/// the hop), each replay buffer holds it once (admission dedupes on `(source, id)`,
/// AEP-0001 §7.4), and both POSTs are answered 202.
#[test]
fn one_event_posted_at_two_relays_is_held_once_and_delivered_live_as_sent() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    let r3 = start_relay(&nats, "r3", &[]);
    let relays = [&r1, &r2, &r3];
    let mut subs: Vec<SseStream> = relays.iter().map(|r| sse(r, "", &[])).collect();

    // One after the other: a retry sent to a second relay.
    let line = ev("a", "dup", 0);
    post_ok(&r1, &[&line]);
    post_ok(&r2, &[&line]);
    post_ok(&r3, &[sentinel(0)]);
    for (i, s) in subs.iter_mut().enumerate() {
        assert_eq!(
            take(s, 2),
            [line.as_str(), line.as_str()],
            "R{}: both deliveries",
            i + 1
        );
        assert_eq!(
            s.expect().data,
            sentinel(0),
            "R{}: two deliveries, then the sentinel",
            i + 1
        );
    }
    assert_eq!(stream_messages(&nats), 3, "two publishes and the sentinel");

    // At once, from two threads.
    let line2 = ev("a", "dup", 1);
    std::thread::scope(|scope| {
        for r in [&r1, &r2] {
            let l = &line2;
            scope.spawn(move || post_ok(r, &[l]));
        }
    });
    post_ok(&r3, &[sentinel(1)]);
    for (i, s) in subs.iter_mut().enumerate() {
        assert_eq!(take(s, 2), [line2.as_str(), line2.as_str()], "R{}", i + 1);
        assert_eq!(
            s.expect().data,
            sentinel(1),
            "R{}: two deliveries, then the sentinel",
            i + 1
        );
    }
    assert_eq!(stream_messages(&nats), 6);
    let bodies: Vec<String> = relays.iter().map(|r| replay_body(r)).collect();
    for (i, body) in bodies.iter().enumerate() {
        let d = data_lines(body);
        assert_eq!(
            (
                d.iter().filter(|l| **l == line).count(),
                d.iter().filter(|l| **l == line2).count()
            ),
            (1, 1),
            "R{}'s buffer holds each once:\n{body}",
            i + 1
        );
        assert_eq!(*body, bodies[0], "R{}'s replay differs from R1's", i + 1);
    }
}

/// Waits until the relay's roster (asked on `ws`) holds exactly the entries `want`, in
/// any order (AEP-0003 §4.1 gives entries no order); a bounded loop over the claims
/// bucket's propagation.
fn wait_roster(ws: &mut Ws, who: &str, want: &[Value]) {
    let key = |v: &Value| v.to_string();
    let mut want = want.to_vec();
    want.sort_by_key(key);
    let deadline = Instant::now() + WAIT;
    for n in 0.. {
        let id = format!("roster-{n}");
        ws.send_json(&json!({"type": "roster", "id": id}));
        let r = ws.recv();
        assert_eq!(
            (r["type"].as_str(), r["id"].as_str()),
            (Some("roster"), Some(id.as_str())),
            "{r}"
        );
        let mut entries = r["entries"].as_array().cloned().unwrap_or_default();
        entries.sort_by_key(key);
        if entries == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{who}: the roster is not {want:?} within {WAIT:?}; it is {}",
            r["entries"]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An emitter at `r` for `agent` accepting `accepts`, claiming `session` with one
/// sequenced Event, seen by every one of `watch` (so the claim is in place at its relay,
/// and nothing of it is left in the watchers' queues).
fn claimant(
    r: &RelayProcess,
    agent: &str,
    session: &str,
    accepts: &[&str],
    watch: &mut [&mut Ws],
) -> Ws {
    let mut ws = Ws::emitter(
        r,
        WS_AUTH,
        agent,
        json!({"capabilities": {"control": {"accepts": accepts}}}),
    );
    let line = envelope_of(agent, session);
    ws.send(&line);
    for w in watch.iter_mut() {
        assert_eq!(w.recv_text(), line, "the claim's Event fans out");
    }
    ws
}

/// The sequenced Event with which `agent` claims `session`.
fn envelope_of(agent: &str, session: &str) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{agent}-claim","type":"session.started","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/{agent}/session/{session}","agent":"{agent}","session":"{session}","seq":0,"epoch":0}}"#
    )
}

/// An emitter claims S on R1; a command sent at R3 reaches it byte-identically and
/// observers on R2 see it; a type outside `accepts` is `unsupported`; after the emitter
/// leaves the result is `no-route`; with claimants on R1 and R2 it is `ambiguous`; the
/// roster at R3 lists R1's claim (AEP-0004 §4.2, §4.5; AEP-0003 §4.1).
#[test]
fn commands_reach_their_claimant_on_another_relay() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    let r3 = start_relay(&nats, "r3", &[]);
    let mut watch1 = watcher(&r1);
    let mut watch2 = watcher(&r2);
    let (mut sender, _) = Ws::hello(&r3, WS_AUTH, "consumer", json!({}));

    let mut target = claimant(
        &r1,
        "a",
        "S",
        &["control.cancel"],
        &mut [&mut watch1, &mut watch2],
    );
    let entry = json!({"session": "S", "agent": "a", "control": {"accepts": ["control.cancel"]}});
    wait_roster(&mut sender, "R3", &[entry]);
    assert_eq!(cluster_health(&r3)["remote_claims"], 1);

    // Routed to R1, delivered byte-identically, seen by observers everywhere.
    let cmd =
        command("cmd-1", "control.cancel", "S").replacen(r#""id":"cmd-1""#, r#""id" : "cmd-1""#, 1);
    sender.send(&cmd);
    assert_eq!(
        target.recv_text(),
        cmd,
        "the claimant at R1: byte-identical"
    );
    assert_eq!(watch2.recv_text(), cmd, "an observer at R2");
    assert_eq!(watch1.recv_text(), cmd, "an observer at R1");
    expect_quiet(&mut target, "the claimant (the command once)");
    expect_quiet(&mut sender, "the sender (no error)");

    let refuse = |sender: &mut Ws, id: &str, ty: &str, code: &str| {
        sender.send(&command(id, ty, "S"));
        let r = sender.recv();
        assert_eq!(
            (r["type"].as_str(), r["cause"].as_str(), r["code"].as_str()),
            (Some("error"), Some(id), Some(code)),
            "{r}"
        );
        assert!(r.get("seq").is_none(), "{r}");
    };
    refuse(&mut sender, "cmd-2", "control.pause", "unsupported");
    expect_quiet(&mut target, "the claimant (an unsupported command)");

    target.close();
    wait_roster(&mut sender, "R3", &[]);
    refuse(&mut sender, "cmd-3", "control.cancel", "no-route");

    let _a = claimant(
        &r1,
        "a1",
        "S",
        &["control.cancel"],
        &mut [&mut watch1, &mut watch2],
    );
    let _b = claimant(
        &r2,
        "b1",
        "S",
        &["control.cancel"],
        &mut [&mut watch1, &mut watch2],
    );
    wait_roster(
        &mut sender,
        "R3",
        &[
            json!({"session": "S", "agent": "a1", "control": {"accepts": ["control.cancel"]}}),
            json!({"session": "S", "agent": "b1", "control": {"accepts": ["control.cancel"]}}),
        ],
    );
    refuse(&mut sender, "cmd-4", "control.cancel", "ambiguous");
    // None of the refused commands entered history anywhere.
    for (i, r) in [&r1, &r2, &r3].into_iter().enumerate() {
        let body = replay_body(r);
        let cmds: Vec<&str> = data_lines(&body)
            .into_iter()
            .filter(|l| l.contains(r#""type":"control."#))
            .collect();
        assert_eq!(
            cmds,
            [cmd.as_str()],
            "R{}'s history holds the delivered command only",
            i + 1
        );
    }
}

/// The engine killed: within two idle heartbeats every `/healthz` says `degraded` and
/// `/readyz` 503; local POSTs still reach local subscribers (AEP-0003 §3.1); after a
/// restart remote subscribers get the outage's Events exactly once, the origin's
/// subscribers get no second copy (AEP-0001 §7 #4), and replays agree byte for byte again
/// (AEP-0003 §5).
#[test]
fn engine_down_serves_locally_then_catches_up_without_duplicates() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let relays = [
        start_relay(&nats, "r1", &[]),
        start_relay(&nats, "r2", &[]),
        start_relay(&nats, "r3", &[]),
    ];
    // R4 refuses ingest while degraded (`--cluster-degrade refuse`).
    let r4 = start_relay(&nats, "r4", &["--cluster-degrade", "refuse"]);
    let all = [&relays[0], &relays[1], &relays[2], &r4];
    let mut subs: Vec<SseStream> = relays.iter().map(|r| sse(r, "", &[])).collect();
    let before = ev("p", "before", 0);
    post_ok(&relays[0], &[&before]);
    for s in subs.iter_mut() {
        assert_eq!(s.expect().data, before);
    }

    nats.kill();
    let killed = Instant::now();
    let heartbeat = aep_relay::bridge::HEARTBEAT;
    for (i, r) in all.iter().enumerate() {
        wait_health(
            r,
            &format!("R{}", i + 1),
            "degraded",
            killed + heartbeat * 2,
            |c| c["state"] == "degraded",
        );
    }
    eprintln!("every relay degraded {:?} after the kill", killed.elapsed());
    for r in all {
        assert_eq!(
            get_json(r, "/readyz"),
            (503, json!({"ready": false, "cluster": "degraded"}))
        );
        assert_eq!(metric(r, r#"aep_cluster_state{state="degraded"}"#), 1.0);
    }

    // R1 and R2 take Events meanwhile; their own subscribers get them at once. Each
    // takes a session of its own (one name, two emitters) and a foreign Event for the
    // session that existed before (AEP-0001 §5.2), so that both the order of sessions and
    // the order within one are at stake.
    let routed = |router: &str| {
        format!(
            r#"{{"aep":"0.1","id":"{router}-1","type":"attention.routed","subject":"q1","time":"2026-07-03T10:00:01Z","source":"aep://test/agent/{router}","agent":"{router}","session":"before"}}"#
        )
    };
    let o1: Vec<String> = (0..5)
        .map(|s| ev("o1", "out", s))
        .chain([routed("router1")])
        .collect();
    let o2: Vec<String> = (0..5)
        .map(|s| ev("o2", "out", s))
        .chain([routed("router2")])
        .collect();
    post_ok(&relays[0], &o1);
    post_ok(&relays[1], &o2);
    assert_eq!(
        take(&mut subs[0], 6),
        o1,
        "R1's subscriber, during the outage"
    );
    assert_eq!(
        take(&mut subs[1], 6),
        o2,
        "R2's subscriber, during the outage"
    );
    assert_eq!(cluster_health(&relays[0])["outbox"], 6);
    assert_eq!(cluster_health(&relays[1])["outbox"], 6);
    assert_eq!(metric(&relays[0], "aep_cluster_outbox_events"), 6.0);
    let (status, body) = post(&r4, &[ev("o4", "out", 0)]);
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("cluster-unavailable")),
        "R4 refuses: {body}"
    );
    assert_eq!(cluster_health(&r4)["outbox"], 0);

    nats.restart();
    for (i, r) in all.iter().enumerate() {
        let id = format!("R{}", i + 1);
        wait_ready(r, &id);
        // The outbox is in the stream once it is empty: the sentinel comes after it.
        wait_health(r, &id, "with an empty outbox", Instant::now() + WAIT, |c| {
            c["outbox"] == 0
        });
    }
    post_ok(&relays[2], &[sentinel(0)]);
    let until_sentinel = |s: &mut SseStream| -> Vec<String> {
        let mut got = Vec::new();
        loop {
            let d = s.expect().data;
            if d == sentinel(0) {
                return got;
            }
            got.push(d);
        }
    };
    assert_eq!(
        until_sentinel(&mut subs[0]),
        o2,
        "R1's subscriber: R2's outage Events once, its own not again"
    );
    assert_eq!(
        until_sentinel(&mut subs[1]),
        o1,
        "R2's subscriber: R1's outage Events once, its own not again"
    );
    let mut got3 = until_sentinel(&mut subs[2]);
    let o1_at_3: Vec<String> = got3.iter().filter(|l| o1.contains(l)).cloned().collect();
    assert_eq!(
        o1_at_3, o1,
        "R3's subscriber: R1's outage Events once, in order"
    );
    got3.retain(|l| !o1.contains(l));
    assert_eq!(
        got3, o2,
        "R3's subscriber: R2's outage Events once, in order, and nothing else"
    );

    for (i, r) in all.iter().enumerate() {
        assert!(
            metric(r, "aep_cluster_reconnects_total") >= 1.0,
            "R{}",
            i + 1
        );
        assert_eq!(
            metric(r, r#"aep_cluster_state{state="connected"}"#),
            1.0,
            "R{}",
            i + 1
        );
        assert_eq!(metric(r, "aep_cluster_outbox_events"), 0.0, "R{}", i + 1);
    }
    let bodies: Vec<String> = all.iter().map(|r| replay_body(r)).collect();
    assert_eq!(
        data_lines(&bodies[0]).len(),
        14,
        "before, o1, o2 and the sentinel:\n{}",
        bodies[0]
    );
    // The replays must agree byte for byte after the outage. R3 and R4 admitted
    // everything from the stream; R1 and R2 admitted their own outage Events first, in
    // their own order (`from=all` lists the streams least-recently-written first, and a
    // ring holds foreign Events in admission order), and rebuild their stores in stream
    // order once their outboxes are back through the stream.
    let order = |b: &str| -> Vec<String> {
        data_lines(b)
            .iter()
            .map(|l| {
                let (source, id) = source_id(l);
                format!("{} {id}", source.trim_start_matches("aep://test/agent/"))
            })
            .collect()
    };
    let orders: Vec<Vec<String>> = bodies.iter().map(|b| order(b)).collect();
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "the from=all&live=0 bodies differ after the outage; in order of (source, id):\n\
         R1: {:?}\nR2: {:?}\nR3: {:?}\nR4: {:?}",
        orders[0],
        orders[1],
        orders[2],
        orders[3]
    );
}

/// R2 killed with SIGKILL and restarted, and R3 started after 1,000 Events: both rebuild
/// their replay buffers from the stream, and once `/readyz` says so their `from=all`
/// matches R1's byte for byte (AEP-0003 §5, §7).
#[test]
fn a_killed_and_a_late_relay_rebuild_from_the_stream() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let mut r2 = start_relay(&nats, "r2", &[]);
    // 10 sessions of 100 Events, 50 per POST; the first half split over R1 and R2.
    let batch = |k: u64| -> Vec<String> {
        let (session, from) = (k % 10, (k / 10) * 50);
        (from..from + 50)
            .map(|s| ev("k", &format!("s{session}"), s))
            .collect()
    };
    for k in 0..10 {
        post_ok(if k % 2 == 0 { &r1 } else { &r2 }, &batch(k));
    }
    r2.kill();
    for k in 10..20 {
        post_ok(&r1, &batch(k));
    }
    // One stream message per POST (its 50 Events share a session).
    assert_eq!(stream_messages(&nats), 20);
    let r2 = start_relay(&nats, "r2", &[]);
    let r3 = start_relay(&nats, "r3", &[]);
    // R1 took part throughout: it has applied the whole stream once its consumer did.
    wait_health(
        &r1,
        "R1",
        "applied through 20",
        Instant::now() + WAIT,
        |c| c["applied"] == 20,
    );
    let want = replay_body(&r1);
    assert_eq!(data_lines(&want).len(), 1000);
    // Ready means caught up: no further wait.
    assert!(
        replay_body(&r2) == want,
        "R2 restarted: its from=all differs from R1's"
    );
    assert!(
        replay_body(&r3) == want,
        "R3 started late: its from=all differs from R1's"
    );
}

/// A relay's ordered consumer deleted mid-stream (by the JetStream API) is recreated
/// after the last stream sequence it delivered, with no loss and no duplicate at that
/// relay's subscriber (AEP-0001 §7 #4; AEP-0003 §7).
#[test]
fn a_deleted_consumer_is_recreated_without_loss_or_duplicate() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    let mut sub = sse(&r2, "", &[]);
    let evs: Vec<String> = (0..90).map(|s| ev("d", "del", s)).collect();
    post_ok(&r1, &evs[..20]);
    assert_eq!(
        take(&mut sub, 20),
        evs[..20],
        "R2's subscriber before the deletion"
    );

    // Mid-stream: one Event per POST from another thread while the consumer is deleted.
    std::thread::scope(|scope| {
        let poster = scope.spawn(|| {
            for e in &evs[20..80] {
                post_ok(&r1, &[e]);
            }
        });
        assert_eq!(take(&mut sub, 10), evs[20..30], "R2's subscriber, flowing");
        assert_eq!(nats.consumers_of("r2", true), 1, "R2 has one consumer");
        eprintln!(
            "consumer deleted; the poster {} done",
            if poster.is_finished() {
                "was"
            } else {
                "was not yet"
            }
        );
        let deadline = Instant::now() + WAIT;
        while metric(&r2, "aep_cluster_consumer_resets_total") < 1.0 {
            assert!(
                Instant::now() < deadline,
                "R2 did not recreate its consumer within {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        poster.join().expect("the poster");
    });
    post_ok(&r1, &evs[80..]);
    post_ok(&r1, &[sentinel(0)]);
    assert_eq!(
        take(&mut sub, 60),
        evs[30..],
        "R2's subscriber: no loss, in order"
    );
    assert_eq!(
        sub.expect().data,
        sentinel(0),
        "R2's subscriber: no duplicate"
    );
    assert_eq!(
        metric(&r1, "aep_cluster_consumer_resets_total"),
        0.0,
        "R1's consumer stayed"
    );
    assert_eq!(
        nats.consumers_of("r2", false),
        1,
        "R2 has one consumer again"
    );
    // One stream message per POST: 1 + 60 + 1, and the sentinel.
    let last = stream_messages(&nats);
    assert_eq!(last, 63);
    wait_health(
        &r1,
        "R1",
        "applied through 63",
        Instant::now() + WAIT,
        |c| c["applied"] == last,
    );
    wait_health(
        &r2,
        "R2",
        "applied through 63",
        Instant::now() + WAIT,
        |c| c["applied"] == last,
    );
    let (b1, b2) = (replay_body(&r1), replay_body(&r2));
    assert_eq!(data_lines(&b2).len(), 91, "{b2}");
    assert_eq!(b2, b1, "R2's from=all differs from R1's");
}

// ---------------------------------------------------------------------------------------
// Redelivery traverses the cluster (AEP-0003 §5)
// ---------------------------------------------------------------------------------------

/// The same Event POSTed twice at R1 reaches a live SSE subscriber at R2 twice and a WS
/// subscriber at R1 twice, byte-identical (AEP-0003 §5: "live fan-out forwards Events as
/// received: at-least-once redelivery MUST be able to traverse the hop"), and
/// `from=all&live=0` at every relay replays it once, the bodies byte-identical (admission
/// dedupes on `(source, id)`, AEP-0001 §7.4).
#[test]
fn the_same_event_posted_twice_reaches_live_subscribers_twice_and_is_held_once() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    let r3 = start_relay(&nats, "r3", &[]);
    let mut remote_sse = sse(&r2, "", &[]);
    let mut local_ws = watcher(&r1);
    // Odd spacing and escapes: only the original bytes compare equal.
    let line = event(
        "redo",
        0,
        1,
        "tool.completed",
        r#", "subject" : "x\u00e9", "data":{"n":[1, 2.50]}"#,
    );
    post_ok(&r1, &[&line]);
    post_ok(&r1, &[&line]);
    post_ok(&r1, &[sentinel(0)]);
    for n in 1..=2 {
        let m = remote_sse.expect();
        assert_eq!(m.data, line, "R2's SSE, delivery {n}: byte-identical");
        assert_eq!(m.id.as_deref(), Some("redo:0:1"), "R2's SSE, delivery {n}");
        assert_eq!(
            local_ws.recv_text(),
            line,
            "R1's WS, delivery {n}: byte-identical"
        );
    }
    assert_eq!(
        remote_sse.expect().data,
        sentinel(0),
        "R2's SSE: twice, then the sentinel"
    );
    assert_eq!(
        local_ws.recv_text(),
        sentinel(0),
        "R1's WS: twice, then the sentinel"
    );
    expect_quiet(&mut local_ws, "R1's WS");
    wait_health(&r3, "R3", "applied through 3", Instant::now() + WAIT, |c| {
        c["applied"] == 3
    });
    wait_health(&r2, "R2", "applied through 3", Instant::now() + WAIT, |c| {
        c["applied"] == 3
    });
    let bodies = [replay_body(&r1), replay_body(&r2), replay_body(&r3)];
    assert_eq!(
        data_lines(&bodies[0]),
        [line.as_str(), sentinel(0).as_str()],
        "R1's from=all holds the Event once"
    );
    assert_eq!(bodies[1], bodies[0], "R2's replay differs from R1's");
    assert_eq!(bodies[2], bodies[0], "R3's replay differs from R1's");
}

/// Redelivery of commands traverses too: a sender at R1 retransmits a command to a
/// claimant at R2 (AEP-0004 §2.3); the claimant gets each delivery and re-emits its
/// recorded acknowledgement byte-identically (AEP-0004 §3); the sender, subscribed at R1,
/// gets the acknowledgement once per delivery, and nothing more; every relay's replay
/// holds it once.
#[test]
fn a_retransmitted_commands_reacknowledgement_reaches_the_sender_once_per_delivery() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    let (mut sender, _) = Ws::hello(&r1, WS_AUTH, "consumer", json!({}));
    sender.subscribe("acks", json!({"filter": {"type": ["control.accepted"]}}));
    let mut target = claimant(&r2, "a", "S", &["control.cancel"], &mut []);
    let entry = json!({"session": "S", "agent": "a", "control": {"accepts": ["control.cancel"]}});
    wait_roster(&mut sender, "R1", &[entry]);

    let cmd = command("cmd-9", "control.cancel", "S");
    let ack = r#"{"aep":"0.1","id":"ack-9","type":"control.accepted","time":"2026-07-03T10:00:01Z","source":"aep://test/agent/a/session/S","agent":"a","session":"S","seq":1,"epoch":0,"cause":"cmd-9","data":{}}"#;
    for delivery in 1..=2 {
        sender.send(&cmd);
        assert_eq!(
            target.recv_text(),
            cmd,
            "the claimant at R2, delivery {delivery}"
        );
        // The recorded acknowledgement, byte-identical every time (AEP-0004 §3).
        target.send(ack);
        assert_eq!(
            sender.recv_text(),
            ack,
            "the sender at R1, acknowledgement of delivery {delivery}"
        );
    }
    // Once per delivery, and nothing more: the next acknowledgement is a sentinel.
    let end = ack
        .replace("ack-9", "ack-end")
        .replace("cmd-9", "cmd-end")
        .replace(r#""seq":1"#, r#""seq":2"#);
    post_ok(&r2, &[&end]);
    assert_eq!(
        sender.recv_text(),
        end,
        "the sender: two acknowledgements, then the sentinel"
    );
    expect_quiet(&mut target, "the claimant (two deliveries)");
    for (i, r) in [&r1, &r2].into_iter().enumerate() {
        let body = replay_body(r);
        let d = data_lines(&body);
        assert_eq!(
            d.iter().filter(|l| **l == ack).count(),
            1,
            "R{}'s buffer holds the acknowledgement once:\n{body}",
            i + 1
        );
    }
}

/// Polls `/readyz` (a bounded loop over an awaited condition) until it answers `status`,
/// at most until `deadline`; returns its body.
fn wait_readyz(r: &RelayProcess, id: &str, status: u16, deadline: Instant) -> Value {
    loop {
        let (got, body) = get_json(r, "/readyz");
        if got == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{id}: /readyz still {got} {body}, not {status}, in time; /healthz cluster {}",
            cluster_health(r)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With no ingest at R2, an engine frozen with SIGSTOP (its connections stay open, it
/// answers nothing) makes R2's `/readyz` answer 503 `degraded` within 15 s, from the
/// bridge's own probes; SIGCONT makes it 200 again within 15 s. Nothing is posted
/// meanwhile at either relay.
#[test]
fn an_idle_relay_notices_a_stalled_engine_and_its_recovery() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    post_ok(&r1, &[ev("i", "idle", 0)]);
    wait_health(&r2, "R2", "applied through 1", Instant::now() + WAIT, |c| {
        c["applied"] == 1
    });

    nats.pause();
    let paused = Instant::now();
    let body = wait_readyz(&r2, "R2", 503, paused + Duration::from_secs(15));
    eprintln!("R2 degraded {:?} after SIGSTOP", paused.elapsed());
    assert_eq!(body, json!({"ready": false, "cluster": "degraded"}));
    assert_eq!(metric(&r2, r#"aep_cluster_state{state="degraded"}"#), 1.0);
    assert_eq!(metric(&r2, r#"aep_cluster_state{state="connected"}"#), 0.0);

    nats.resume();
    let resumed = Instant::now();
    let body = wait_readyz(&r2, "R2", 200, resumed + Duration::from_secs(15));
    eprintln!("R2 ready {:?} after SIGCONT", resumed.elapsed());
    assert_eq!(body, json!({"ready": true, "cluster": "connected"}));
    assert_eq!(metric(&r2, r#"aep_cluster_state{state="connected"}"#), 1.0);
    // And it still takes part: an Event posted at R1 now reaches R2's subscriber.
    let mut sub = sse(&r2, "", &[]);
    let after = ev("i", "idle", 1);
    post_ok(&r1, &[&after]);
    assert_eq!(sub.expect().data, after, "R2's subscriber after the stall");
}

/// A relay whose engine is not there yet at start reports `catching-up`, not `degraded`,
/// until it is connected and caught up (and `/readyz` 503 meanwhile); then `connected`.
#[test]
fn a_starting_relay_reports_catching_up_until_connected() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let url = nats.url();
    nats.kill();
    let r = RelayProcess::spawn(&["--cluster", &url, "--relay-id", "late", "--token", TOKEN]);
    let deadline = Instant::now() + WAIT;
    let (status, body) = loop {
        match agent().get(&r.url("/readyz")).set(AUTH.0, AUTH.1).call() {
            Err(ureq::Error::Transport(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => break status_json(other),
        }
    };
    assert_eq!(
        (status, body),
        (503, json!({"ready": false, "cluster": "catching-up"})),
        "before the engine is there"
    );
    assert_eq!(cluster_health(&r)["state"], "catching-up");
    assert_eq!(metric(&r, r#"aep_cluster_state{state="catching-up"}"#), 1.0);
    assert_eq!(metric(&r, r#"aep_cluster_state{state="degraded"}"#), 0.0);
    nats.restart();
    wait_ready(&r, "late");
}

// ---------------------------------------------------------------------------------------
// One stream message per ingest unit and subject
// ---------------------------------------------------------------------------------------

/// `(source, id)` and session of every Event a message of `data` holds, in order, per
/// session.
fn per_session(lines: &[String]) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut m: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap();
        m.entry(v["session"].as_str().unwrap_or("").to_owned())
            .or_default()
            .push(l.clone());
    }
    m
}

/// One POSTed body of three interleaved sessions travels as one stream message per
/// session (its subject), and every relay admits it in order per session
/// (AEP-0001 §7 #1), all relays in the same order, with identical replays; a relay
/// killed and restarted rebuilds the same buffers from the batched messages
/// (AEP-0003 §5, §7).
#[test]
fn a_batch_of_mixed_sessions_is_one_message_per_session_in_order_everywhere() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    let mut r3 = start_relay(&nats, "r3", &[]);
    let mut subs = [sse(&r1, "", &[]), sse(&r2, "", &[]), sse(&r3, "", &[])];
    let body: Vec<String> = (0..60)
        .map(|i| ev("m", &format!("s{}", i % 3), i / 3))
        .collect();
    post_ok(&r1, &body);
    assert_eq!(stream_messages(&nats), 3, "one message per session");
    post_ok(&r2, &[sentinel(0)]);
    let want = per_session(&body);
    let mut orders = Vec::new();
    for (i, s) in subs.iter_mut().enumerate() {
        let got = take(s, body.len());
        assert_eq!(
            s.expect().data,
            sentinel(0),
            "R{}: all, then the sentinel",
            i + 1
        );
        assert_eq!(per_session(&got), want, "R{}: each session in order", i + 1);
        orders.push(got);
    }
    assert_eq!(orders[1], orders[0], "R2 admitted in another order than R1");
    assert_eq!(orders[2], orders[0], "R3 admitted in another order than R1");
    let replay = replay_body(&r1);
    assert_eq!(data_lines(&replay).len(), body.len() + 1);
    assert!(
        replay_body(&r2) == replay,
        "R2's from=all differs from R1's"
    );

    // A restart rebuilds from the batched messages.
    r3.kill();
    let more: Vec<String> = (60..90)
        .map(|i| ev("m", &format!("s{}", i % 3), i / 3))
        .collect();
    post_ok(&r2, &more);
    // 3 messages, the sentinel, 3 more.
    assert_eq!(
        stream_messages(&nats),
        7,
        "one message per session and POST"
    );
    let r3 = start_relay(&nats, "r3", &[]);
    wait_health(&r1, "R1", "applied through 7", Instant::now() + WAIT, |c| {
        c["applied"] == 7
    });
    let replay = replay_body(&r1);
    assert_eq!(data_lines(&replay).len(), body.len() + more.len() + 1);
    assert!(
        replay_body(&r3) == replay,
        "R3 restarted: its from=all differs from R1's"
    );
}

/// A body bigger than the server's `max_payload` (1 MiB by default) in one session splits
/// into several messages, each under it, and arrives whole and in order at another relay.
#[test]
fn a_batch_bigger_than_max_payload_splits_and_arrives_whole() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    let mut sub = sse(&r2, "", &[]);
    let pad = "x".repeat(600);
    let body: Vec<String> = (0..3000)
        .map(|i| {
            event(
                "big",
                0,
                i,
                "tool.completed",
                &format!(r#","data":{{"pad":"{pad}"}}"#),
            )
        })
        .collect();
    let bytes: usize = body.iter().map(|l| l.len() + 1).sum();
    assert!(
        bytes > 2 << 20,
        "the body is {bytes} bytes, over twice max_payload"
    );
    post_ok(&r1, &body);
    let messages = stream_messages(&nats);
    assert!(
        (3..=5).contains(&messages),
        "{bytes} bytes in {messages} messages: split under 1 MiB each, and few"
    );
    post_ok(&r1, &[sentinel(0)]);
    let got = take(&mut sub, body.len());
    assert!(got == body, "R2's subscriber: not all, or not in order");
    assert_eq!(sub.expect().data, sentinel(0), "R2: all, then the sentinel");
}

/// A batch with one invalid line is refused whole (400) and nothing of it is published:
/// no stream message, no delivery anywhere.
#[test]
fn a_batch_with_one_invalid_line_is_refused_whole_and_nothing_is_published() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    let mut subs = [sse(&r1, "", &[]), sse(&r2, "", &[])];
    let mut body: Vec<String> = (0..10).map(|i| ev("bad", "b", i)).collect();
    body[6] = body[6].replace(r#""type":"tool.completed""#, r#""type":"Not A Type""#);
    let (status, answer) = post(&r1, &body);
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid-event")),
        "{answer}"
    );
    assert_eq!(stream_messages(&nats), 0, "nothing published");
    post_ok(&r1, &[sentinel(0)]);
    for (i, s) in subs.iter_mut().enumerate() {
        assert_eq!(
            s.expect().data,
            sentinel(0),
            "R{}: nothing of the refused batch",
            i + 1
        );
    }
}

/// One pipelined `POST /events` request of `lines` (NDJSON), with the token.
fn post_request(lines: &[String]) -> String {
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    format!(
        "POST /events HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\r\nAEP-Version: 0.1\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The `POST`s an emitter pipelines on one connection and the relay reads in one turn
/// travel as one stream message per subject, and are still answered one by one, in
/// request order (RFC 9112 §9.3), a refused one and a request of another kind among them:
/// an invalid body gets its 400 between the 202s, and `GET /healthz` behind them is
/// answered last. Every relay then delivers them in order, once, and replays them
/// identically (AEP-0003 §5, §6).
#[test]
fn pipelined_posts_of_one_turn_are_one_message_answered_in_order() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    let mut sub = sse(&r2, "", &[]);
    let first: Vec<String> = (0..5).map(|i| ev("p", "pipe", i)).collect();
    let second: Vec<String> = (5..12).map(|i| ev("p", "pipe", i)).collect();
    let mut bad = vec![ev("p", "pipe", 99)];
    bad[0] = bad[0].replace(r#""type":"tool.completed""#, r#""type":"Not A Type""#);
    let mut wire = post_request(&first);
    wire.push_str(&post_request(&bad));
    wire.push_str(&post_request(&second));
    wire.push_str("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut s = r1.tcp();
    // One write: the relay reads all four requests in one turn.
    s.write_all(wire.as_bytes()).unwrap();
    let mut answers = Vec::new();
    for _ in 0..4 {
        let (status, _, body) = read_response(&mut s);
        answers.push((
            status,
            serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null),
        ));
    }
    assert_eq!(answers[0], (202, json!({"accepted": 5})), "{answers:?}");
    assert_eq!(
        (answers[1].0, answers[1].1["error"].as_str()),
        (400, Some("invalid-event")),
        "{answers:?}"
    );
    assert_eq!(answers[2], (202, json!({"accepted": 7})), "{answers:?}");
    assert_eq!(answers[3].0, 200, "GET /healthz answered last: {answers:?}");
    assert_eq!(
        stream_messages(&nats),
        1,
        "the two POSTs of one turn travel as one stream message"
    );
    let want: Vec<String> = first.iter().chain(&second).cloned().collect();
    assert_eq!(take(&mut sub, want.len()), want, "R2: all, in order");
    post_ok(&r1, &[sentinel(0)]);
    assert_eq!(
        sub.expect().data,
        sentinel(0),
        "R2: nothing more before the sentinel"
    );
    // R1 admits the sentinel when the stream delivers it back, which may be after R2
    // delivered it.
    wait_settled(&r1, "R1", stream_messages(&nats));
    let replay = replay_body(&r1);
    assert_eq!(data_lines(&replay).len(), want.len() + 1);
    assert!(
        replay_body(&r2) == replay,
        "R2's from=all differs from R1's"
    );
}

// ---------------------------------------------------------------------------------------
// An outbox that survives (compound faults)
// ---------------------------------------------------------------------------------------

/// After recovery: every Event of `want` is in each relay's `from=all` replay exactly
/// once, and the replays are byte-identical across the relays (AEP-0003 §5).
fn assert_all_once_and_identical(relays: &[(&str, &RelayProcess)], want: &[String]) {
    let bodies: Vec<String> = relays.iter().map(|(_, r)| replay_body(r)).collect();
    for ((name, _), body) in relays.iter().zip(&bodies) {
        let d = data_lines(body);
        for w in want {
            assert_eq!(
                d.iter().filter(|l| **l == w.as_str()).count(),
                1,
                "{name}'s from=all holds {w} not exactly once:\n{body}"
            );
        }
    }
    for ((name, _), body) in relays.iter().zip(&bodies).skip(1) {
        assert!(
            *body == bodies[0],
            "{name}'s from=all differs from {}'s:\n{body}\n---\n{}",
            relays[0].0,
            bodies[0]
        );
    }
}

/// Waits until `r` has applied the stream's last message (`last`) and its outbox is
/// empty.
fn wait_settled(r: &RelayProcess, id: &str, last: u64) {
    wait_health(r, id, "settled", Instant::now() + WAIT, |c| {
        c["applied"] == last && c["outbox"] == 0 && c["state"] == "connected"
    });
}

/// The engine killed, then SIGTERM of a relay (with `--history`) whose outbox holds
/// Events answered 202. It waits, bounded, for the engine, exits saying how many stay in
/// its outbox on disk; restarted after the engine, it publishes them, and every Event
/// answered 202 is in every relay's `from=all` exactly once, the replays byte-identical.
#[test]
fn engine_killed_then_sigterm_of_a_relay_with_an_outbox_loses_nothing() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let dir = temp_dir("outbox-term");
    let dir_s = dir.to_str().unwrap();
    let hist = ["--history", dir_s, "--shutdown-deadline-secs", "2"];
    let r1 = start_relay(&nats, "r1", &hist);
    let r2 = start_relay(&nats, "r2", &[]);
    let before: Vec<String> = (0..5).map(|s| ev("c", "pre", s)).collect();
    post_ok(&r1, &before);

    nats.kill();
    for (id, r) in [("R1", &r1), ("R2", &r2)] {
        wait_health(r, id, "degraded", Instant::now() + WAIT, |c| {
            c["state"] == "degraded"
        });
    }
    let during: Vec<String> = (0..40).map(|s| ev("c", "out", s)).collect();
    for chunk in during.chunks(8) {
        post_ok(&r1, chunk);
    }
    assert_eq!(cluster_health(&r1)["outbox"], 40);
    r1.signal("TERM");
    let (status, log) = r1.wait();
    assert!(status.success(), "R1 exited {status}:\n{log}");
    assert!(
        log.contains(
            "40 Events of the cluster outbox did not reach the stream in time; they stay in"
        ),
        "R1 says how many stay in its outbox:\n{log}"
    );

    nats.restart();
    recover_and_compare(&nats, &r2, &hist, &[before, during].concat());
}

/// After a compound fault: R1 restarted with `hist`, both relays settled on the stream's
/// end (a sentinel posted at R2 marks it); every Event of `want` is in both relays'
/// `from=all` exactly once, the replays byte-identical.
fn recover_and_compare(nats: &NatsServer, r2: &RelayProcess, hist: &[&str], want: &[String]) {
    wait_ready(r2, "R2");
    let r1 = start_relay(nats, "r1", hist);
    post_ok(r2, &[sentinel(0)]);
    let last = stream_messages(nats);
    wait_settled(&r1, "R1", last);
    wait_settled(r2, "R2", last);
    assert_all_once_and_identical(&[("R1", &r1), ("R2", r2)], want);
}

/// The engine frozen (SIGSTOP), a relay (with `--history`) notices, serves POSTs locally
/// (answered 202, outbox non-empty), and is killed with SIGKILL; the engine thawed and
/// the relay restarted, every Event answered 202 is in every relay's `from=all` exactly
/// once, the replays byte-identical.
#[test]
fn engine_stopped_then_kill_9_of_a_relay_with_an_outbox_loses_nothing() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let dir = temp_dir("outbox-kill");
    let dir_s = dir.to_str().unwrap();
    let hist = ["--history", dir_s];
    let mut r1 = start_relay(&nats, "r1", &hist);
    let r2 = start_relay(&nats, "r2", &[]);
    let before: Vec<String> = (0..5).map(|s| ev("k", "pre", s)).collect();
    post_ok(&r1, &before);

    nats.pause();
    wait_health(&r1, "R1", "degraded", Instant::now() + WAIT, |c| {
        c["state"] == "degraded"
    });
    let during: Vec<String> = (0..30).map(|s| ev("k", "out", s)).collect();
    for chunk in during.chunks(6) {
        post_ok(&r1, chunk);
    }
    assert_eq!(cluster_health(&r1)["outbox"], 30);
    r1.kill();
    nats.resume();
    recover_and_compare(&nats, &r2, &hist, &[before, during].concat());
}

/// A relay killed (kill -9) while four emitters POST batches to it at once loses nothing
/// that was answered 202: a 202 comes only once the stream has stored the whole batch, so
/// every such Event is in the other relay's `from=all`, once.
#[test]
fn kill_9_during_concurrent_batch_posts_loses_nothing_answered_202() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let mut r1 = start_relay(&nats, "r1", &[]);
    let r2 = start_relay(&nats, "r2", &[]);
    let url = r1.url("/events");
    let accepted = std::sync::Mutex::new(Vec::<String>::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (url, accepted, stop) = (&url, &accepted, &stop);
            scope.spawn(move || {
                for k in 0.. {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        return;
                    }
                    let lines: Vec<String> = (0..16)
                        .map(|i| ev("p", &format!("t{t}"), k * 16 + i))
                        .collect();
                    let body = lines.join("\n") + "\n";
                    let r = agent()
                        .post(url)
                        .set("AEP-Version", "0.1")
                        .set("Content-Type", "application/x-ndjson")
                        .set(AUTH.0, AUTH.1)
                        .send_string(&body);
                    match r {
                        Ok(resp) if resp.status() == 202 => accepted.lock().unwrap().extend(lines),
                        Ok(resp) => panic!("POST answered {}", resp.status()),
                        // The relay is gone: what was not answered 202 promises nothing.
                        Err(_) => return,
                    }
                }
            });
        }
        let deadline = Instant::now() + WAIT;
        while accepted.lock().unwrap().len() < 640 {
            assert!(Instant::now() < deadline, "the emitters are too slow");
            std::thread::sleep(Duration::from_millis(5));
        }
        r1.kill();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let accepted = accepted.into_inner().unwrap();
    eprintln!("{} Events answered 202 before the kill", accepted.len());
    post_ok(&r2, &[sentinel(0)]);
    let last = stream_messages(&nats);
    wait_settled(&r2, "R2", last);
    let body = replay_body(&r2);
    let held: std::collections::HashMap<&str, usize> =
        data_lines(&body)
            .into_iter()
            .fold(Default::default(), |mut m, l| {
                *m.entry(l).or_default() += 1;
                m
            });
    for l in &accepted {
        assert_eq!(
            held.get(l.as_str()),
            Some(&1),
            "answered 202, not in R2's from=all once: {l}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Grants across relays
// ---------------------------------------------------------------------------------------

/// The tokens file both relays of [`grants_hold_across_relays`] read (never a secret).
const TENANTS: &str = r#"
tenant-a  watch filter={"agent": "a"}
tenant-b  watch filter={"agent": "b"}
bot-a     emit agent=a
"#;

/// POSTs `line` with `token`: status and JSON body.
fn post_as(r: &RelayProcess, token: &str, line: &str) -> (u16, Value) {
    status_json(
        agent()
            .post(&r.url("/events"))
            .set("AEP-Version", "0.1")
            .set("Content-Type", "application/json")
            .set("Authorization", &format!("Bearer {token}"))
            .send_string(line),
    )
}

/// A token's grants hold for Events that arrive from another relay (docs/operating.md,
/// "Multi-tenant relay"): on R2, an Event of agent `a` posted at R1 reaches the
/// subscribers whose grant filter admits it and not the one whose grant excludes it
/// (AEP-0003 §6.1); and an emitter granted `agent=a` at R1 cannot emit as `b`, by POST
/// (403) or on its socket (`unauthorized`), so nothing of it is published: R2's
/// subscribers, the stream and R2's history see only the sentinel after it.
#[test]
fn grants_hold_across_relays() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let dir = temp_dir("cluster-grants");
    let file = dir.join("tenants");
    std::fs::write(&file, TENANTS).unwrap();
    let tokens = ["--tokens-file", file.to_str().unwrap()];
    let r1 = start_relay(&nats, "r1", &tokens);
    let r2 = start_relay(&nats, "r2", &tokens);
    let mut admits = r2.sse("", &[("Authorization", "Bearer tenant-a")]);
    let mut excludes = r2.sse("", &[("Authorization", "Bearer tenant-b")]);
    let mut excludes_ws = Ws::hello(&r2, "access_token=tenant-b", "consumer", json!({})).0;
    excludes_ws.subscribe("all", json!({}));
    let mut everything = watcher(&r2);

    // Agent a's Event, emitted at R1 by the token granted `agent=a`.
    let of_a = ev("a", "sa", 1);
    assert_eq!(post_as(&r1, "bot-a", &of_a).0, 202);
    // The same token emitting as b: refused at R1, by POST and on a socket.
    let forged = ev("b", "sb", 1);
    let (status, body) = post_as(&r1, "bot-a", &forged);
    assert_eq!(
        (status, &body["error"]),
        (403, &json!("forbidden")),
        "{body}"
    );
    let mut bot = Ws::emitter(&r1, "access_token=bot-a", "a", json!({}));
    bot.send(&ev("b", "sb", 2));
    let refused = bot.recv();
    assert_eq!(
        (&refused["type"], &refused["code"], &refused["id"]),
        (&json!("error"), &json!("unauthorized"), &json!("sb-0-2")),
        "{refused}"
    );
    // The sentinel, of agent b: what the tenant-b subscribers may see.
    let end = ev("b", "end", 1);
    post_ok(&r1, &[&end]);

    assert_eq!(admits.expect().data, of_a, "tenant-a on R2: admitted");
    assert_eq!(
        excludes.expect().data,
        end,
        "tenant-b on R2 (SSE): neither a's Event nor the forged b's before the sentinel"
    );
    assert_eq!(
        excludes_ws.recv_text(),
        end,
        "tenant-b on R2 (WebSocket): the sentinel first"
    );
    assert_eq!(everything.recv_text(), of_a, "R2's unfiltered watcher");
    assert_eq!(
        everything.recv_text(),
        end,
        "R2's unfiltered watcher: nothing forged before the sentinel"
    );
    assert_eq!(stream_messages(&nats), 2, "a's Event and the sentinel only");
    assert_eq!(
        data_lines(&replay_body(&r2)),
        [of_a.as_str(), end.as_str()],
        "R2's history"
    );
}
