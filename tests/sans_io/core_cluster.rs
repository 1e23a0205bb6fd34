//! Cluster mode's core logic, driven with `aep_sim` (no socket, no engine, virtual time):
//! the bridge's reports are handed in as `FromBus` values and what the core asks of it is
//! read back as `ToBus` values. The end-to-end behaviour with a real nats-server is
//! `tests/cluster/cluster.rs`; this is the sequencing a bridge cannot show: a
//! `POST /events` answered only after the stream acknowledged it (pipelined requests
//! waiting behind it), admission once per stream sequence, the degraded outbox.

use aep_relay::cluster::{ClusterConfig, Degrade, FromBus, ToBus};
use aep_relay::{Config, ConnId};
use aep_sim::Sim;
use bytes::Bytes;
use std::collections::HashSet;

use crate::support;
use support::sim::{masked, ws_frames, Frame};

fn event(id: &str, seq: u64) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{id}","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a/session/s","agent":"a","session":"s","seq":{seq}}}"#
    )
}

fn post(ev: &str) -> Vec<u8> {
    format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{ev}",
        ev.len()
    )
    .into_bytes()
}

fn relay(degrade: Degrade) -> Sim {
    let c = Config {
        cluster: Some(ClusterConfig {
            relay_id: "r1".into(),
            degrade,
            outbox: 2,
            ..ClusterConfig::default()
        }),
        ..Config::default()
    };
    Sim::new(c).expect("config")
}

fn connected(sim: &mut Sim) {
    sim.bus(FromBus::Connected {
        max_payload: 1 << 20,
        last_seq: 0,
    });
}

/// A live SSE subscriber; returns it with the stream head taken.
fn subscriber(sim: &mut Sim) -> ConnId {
    let s = sim.connect(None);
    sim.feed(s, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", false);
    sim.take_output(s);
    s
}

fn text(sim: &mut Sim, c: ConnId) -> String {
    String::from_utf8(sim.take_output(c).unwrap_or_default()).unwrap()
}

/// The publishes among `out`: (ticket, subject, payload).
fn publishes(out: Vec<ToBus>) -> Vec<(u64, String, Bytes)> {
    publishes_with_ids(out)
        .into_iter()
        .map(|(t, s, p, _)| (t, s, p))
        .collect()
}

/// The publishes among `out`: (ticket, subject, payload, msg id).
fn publishes_with_ids(out: Vec<ToBus>) -> Vec<(u64, String, Bytes, String)> {
    out.into_iter()
        .filter_map(|m| match m {
            ToBus::Publish {
                ticket,
                subject,
                payload,
                msg_id,
            } => Some((ticket, subject, payload, msg_id)),
            _ => None,
        })
        .collect()
}

/// A POST is answered 202 only once the stream acknowledged its Event; nothing is fanned
/// out at ingest: the subscriber gets the Event when the stream delivers it, once, even
/// when the stream delivers that sequence twice (one stream, one order).
#[test]
fn a_post_waits_for_the_ack_and_admission_comes_from_the_stream_once() {
    let mut sim = relay(Degrade::Local);
    connected(&mut sim);
    let sub = subscriber(&mut sim);
    let c = sim.connect(None);
    let ev = event("e1", 0);
    sim.feed(c, &post(&ev), false);
    assert_eq!(text(&mut sim, c), "", "no answer before the ack");
    let p = publishes(sim.take_bus());
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].1, "aep.ev.a.s");
    assert_eq!(&p[0].2[..], ev.as_bytes(), "published byte-identical");
    assert_eq!(text(&mut sim, sub), "", "nothing fanned out at ingest");
    sim.bus(FromBus::Acked {
        ticket: p[0].0,
        stream_seq: 1,
        duplicate: false,
    });
    let answer = text(&mut sim, c);
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    assert!(answer.ends_with(r#"{"accepted":1}"#), "{answer}");
    for _ in 0..2 {
        sim.bus(FromBus::Message {
            stream_seq: 1,
            pending: 0,
            payload: p[0].2.clone(),
            own_id: None,
        });
    }
    let got = text(&mut sim, sub);
    assert_eq!(got.matches("data: ").count(), 1, "{got}");
    assert!(got.contains(&format!("data: {ev}\n")), "{got}");
    // The same Event at another stream sequence (a re-send, another publish) is forwarded
    // live as received, as a single relay forwards it (AEP-0003 §5: redelivery MUST
    // traverse the hop), and held once (buffer admission dedupes on (source, id),
    // AEP-0001 §7.4).
    sim.bus(FromBus::Message {
        stream_seq: 2,
        pending: 0,
        payload: p[0].2.clone(),
        own_id: None,
    });
    assert_eq!(
        text(&mut sim, sub),
        format!("event: tool.completed\nid: s:0:0\ndata: {ev}\n\n")
    );
    let r = sim.connect(None);
    sim.feed(
        r,
        b"GET /stream?from=all&live=0 HTTP/1.1\r\nHost: x\r\n\r\n",
        false,
    );
    let replay = text(&mut sim, r);
    assert_eq!(replay.matches("data: ").count(), 1, "held once: {replay}");
}

/// A request pipelined behind a waiting POST is read only once that POST is answered:
/// answers stay in request order (RFC 9112 §9.3).
#[test]
fn a_request_behind_a_waiting_post_is_answered_after_it() {
    let mut sim = relay(Degrade::Local);
    connected(&mut sim);
    let c = sim.connect(None);
    let mut bytes = post(&event("e1", 0));
    bytes.extend_from_slice(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    sim.feed(c, &bytes, false);
    assert_eq!(text(&mut sim, c), "");
    let p = publishes(sim.take_bus());
    sim.bus(FromBus::Acked {
        ticket: p[0].0,
        stream_seq: 1,
        duplicate: false,
    });
    let out = text(&mut sim, c);
    let first = out.find("HTTP/1.1 202").expect("the 202");
    let second = out.find("HTTP/1.1 200").expect("then the health answer");
    assert!(first < second, "{out}");
}

/// A publish that fails is kept locally (degrade `local`): the POST is still answered
/// 202 and the local subscriber gets the Event at once; on reconnect the outbox is
/// published, and when the stream delivers it the subscriber gets no second copy.
#[test]
fn degraded_ingest_is_local_then_the_outbox_goes_out_without_a_second_delivery() {
    let mut sim = relay(Degrade::Local);
    let sub = subscriber(&mut sim);
    let c = sim.connect(None);
    let ev = event("e1", 0);
    // Not connected yet: degraded.
    sim.feed(c, &post(&ev), false);
    let answer = text(&mut sim, c);
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    assert_eq!(text(&mut sim, sub).matches("data: ").count(), 1);
    assert!(
        publishes(sim.take_bus()).is_empty(),
        "nothing published while degraded"
    );
    connected(&mut sim);
    let p = publishes_with_ids(sim.take_bus());
    assert_eq!(p.len(), 1, "the outbox is published on connect");
    assert_eq!(&p[0].2[..], ev.as_bytes());
    assert!(p[0].3.starts_with("r1."), "a publish id of r1: {}", p[0].3);
    sim.bus(FromBus::Acked {
        ticket: p[0].0,
        stream_seq: 1,
        duplicate: false,
    });
    // The bridge names this relay's own publish when the stream delivers it.
    sim.bus(FromBus::Message {
        stream_seq: 1,
        pending: 0,
        payload: p[0].2.clone(),
        own_id: Some(p[0].3.clone()),
    });
    assert_eq!(
        text(&mut sim, sub),
        "",
        "no second delivery to the origin's subscribers"
    );
    // The outbox is bounded (2 here): past it, 503 cluster-unavailable.
    sim.bus(FromBus::Disconnected {
        reason: "test".into(),
    });
    for (i, want) in [(1, "202"), (2, "202"), (3, "503")] {
        sim.feed(c, &post(&event(&format!("d{i}"), i)), false);
        let a = text(&mut sim, c);
        assert!(a.starts_with(&format!("HTTP/1.1 {want}")), "{i}: {a}");
        if want == "503" {
            assert!(a.contains(r#""error":"cluster-unavailable""#), "{a}");
        }
    }
}

/// With `--cluster-degrade refuse`, ingest while the engine is unreachable answers 503
/// `cluster-unavailable`, and an Event over the engine's `max_payload` is refused with
/// 413 `event-too-large` when connected.
#[test]
fn refuse_mode_answers_503_and_an_event_over_max_payload_413() {
    let mut sim = relay(Degrade::Refuse);
    let c = sim.connect(None);
    sim.feed(c, &post(&event("e1", 0)), false);
    let a = text(&mut sim, c);
    assert!(a.starts_with("HTTP/1.1 503"), "{a}");
    assert!(a.contains(r#""error":"cluster-unavailable""#), "{a}");
    sim.bus(FromBus::Connected {
        max_payload: 600,
        last_seq: 0,
    });
    let big = event("e2", 1).replace(
        "\"seq\":1",
        &format!("\"seq\":1,\"data\":{{\"x\":\"{}\"}}", "y".repeat(200)),
    );
    sim.feed(c, &post(&big), false);
    let a = text(&mut sim, c);
    assert!(a.starts_with("HTTP/1.1 413"), "{a}");
    assert!(a.contains(r#""error":"event-too-large""#), "{a}");
}

/// The whole answer to `GET {path}` on connection `c`.
fn get(sim: &mut Sim, c: aep_relay::ConnId, path: &str) -> String {
    sim.feed(
        c,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        false,
    );
    text(sim, c)
}

/// `/readyz` answers 503 until the relay is connected and has caught up with the stream
/// as it stood at the connection; `/healthz` says where it stands.
#[test]
fn readyz_waits_for_catching_up() {
    let mut sim = relay(Degrade::Local);
    let c = sim.connect(None);
    let ask = |sim: &mut Sim, path: &str| get(sim, c, path);
    assert!(ask(&mut sim, "/readyz").starts_with("HTTP/1.1 503"));
    // Never connected yet: catching-up, not degraded.
    let h = ask(&mut sim, "/healthz");
    assert!(h.contains(r#""state":"catching-up""#), "{h}");
    sim.bus(FromBus::Connected {
        max_payload: 1 << 20,
        last_seq: 2,
    });
    let h = ask(&mut sim, "/healthz");
    assert!(h.contains(r#""state":"catching-up""#), "{h}");
    assert!(ask(&mut sim, "/readyz").starts_with("HTTP/1.1 503"));
    for seq in 1..=2 {
        sim.bus(FromBus::Message {
            stream_seq: seq,
            pending: 2 - seq,
            payload: Bytes::from(event(&format!("e{seq}"), seq)),
            own_id: None,
        });
    }
    assert!(ask(&mut sim, "/readyz").starts_with("HTTP/1.1 200"));
    let h = ask(&mut sim, "/healthz");
    assert!(h.contains(r#""state":"connected""#), "{h}");
    sim.bus(FromBus::Disconnected {
        reason: "test".into(),
    });
    assert!(ask(&mut sim, "/healthz").contains(r#""state":"degraded""#));
    assert!(ask(&mut sim, "/readyz").starts_with("HTTP/1.1 503"));
}

/// A WebSocket emitter's Event that the stream does not store, on a relay that refuses
/// to keep it locally (`--cluster-degrade refuse`), is not lost silently: the emitter gets
/// an in-band `error` naming it (AEP-0003 §6.5), `cluster-unavailable`.
#[test]
fn a_websocket_event_the_stream_refuses_gets_an_error_frame() {
    let mut sim = relay(Degrade::Refuse);
    connected(&mut sim);
    let c = sim.connect(None);
    sim.feed(
        c,
        b"GET /socket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        false,
    );
    sim.feed(
        c,
        &masked(r#"{"type":"hello","versions":["0.1"],"role":"emitter","identity":{"agent":"a"}}"#),
        false,
    );
    sim.take_output(c);
    sim.feed(c, &masked(&event("w1", 0)), false);
    let p = publishes(sim.take_bus());
    assert_eq!(p.len(), 1, "the Event goes to the stream");
    sim.bus(FromBus::PublishFailed {
        ticket: p[0].0,
        error: "timeout".into(),
    });
    let errors: Vec<_> = ws_frames(&sim.take_output(c).unwrap())
        .into_iter()
        .filter_map(|f| match f {
            Frame::Text(v) if v["type"] == "error" => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["code"], "cluster-unavailable");
    assert_eq!(errors[0]["id"], "w1");
}

/// An ack that times out while the connection stays up (a stalled engine): the POST is
/// still answered 202 (the Event kept locally and in the outbox), the relay says it is
/// degraded, the outbox is retried on the claim refresh without waiting for a
/// reconnect, and the first acknowledgement brings the relay back (without that retry,
/// an Event answered 202 would stay out of the stream until the next reconnect).
#[test]
fn a_stalled_engine_degrades_and_the_outbox_is_retried_without_a_reconnect() {
    let mut sim = relay(Degrade::Local);
    connected(&mut sim);
    let c = sim.connect(None);
    sim.feed(c, &post(&event("e1", 0)), false);
    let p = publishes(sim.take_bus());
    sim.bus(FromBus::PublishFailed {
        ticket: p[0].0,
        error: "timeout".into(),
    });
    let a = text(&mut sim, c);
    assert!(a.starts_with("HTTP/1.1 202"), "{a}");
    sim.feed(c, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false);
    let h = text(&mut sim, c);
    assert!(
        h.contains(r#""state":"degraded""#) && h.contains(r#""outbox":1"#),
        "{h}"
    );
    // The claim refresh (a third of the 10 s claim TTL) publishes the outbox again.
    sim.advance(std::time::Duration::from_secs(4));
    let retry = publishes(sim.take_bus());
    assert_eq!(
        retry.len(),
        1,
        "the outbox is published again while connected"
    );
    assert_eq!(retry[0].2, p[0].2);
    sim.bus(FromBus::Acked {
        ticket: retry[0].0,
        stream_seq: 1,
        duplicate: false,
    });
    sim.feed(c, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false);
    let h = text(&mut sim, c);
    assert!(
        h.contains(r#""state":"connected""#) && h.contains(r#""outbox":0"#),
        "{h}"
    );
}

/// While a relay rebuilds its replay buffers from the stream, a new subscription is
/// refused with 503 `cluster-unavailable` and `Retry-After` (it would get history as
/// live Events, and a resume could not be exact yet); once caught up it is served.
#[test]
fn a_subscription_waits_until_the_relay_has_caught_up() {
    let mut sim = relay(Degrade::Local);
    sim.bus(FromBus::Connected {
        max_payload: 1 << 20,
        last_seq: 1,
    });
    let s = sim.connect(None);
    sim.feed(s, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", false);
    let a = text(&mut sim, s);
    assert!(a.starts_with("HTTP/1.1 503"), "{a}");
    assert!(
        a.contains("Retry-After: 1") && a.contains("cluster-unavailable"),
        "{a}"
    );
    sim.bus(FromBus::Message {
        stream_seq: 1,
        pending: 0,
        payload: Bytes::from(event("e1", 0)),
        own_id: None,
    });
    let s = sim.connect(None);
    sim.feed(
        s,
        b"GET /stream?from=all HTTP/1.1\r\nHost: x\r\n\r\n",
        false,
    );
    let a = text(&mut sim, s);
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert!(a.contains(r#""id":"e1""#), "{a}");
}

/// The bridge's probes say the engine stalled (no ingest involved): degraded, `/readyz`
/// 503, ingest served locally into the outbox; when they say it answers again: connected,
/// and the outbox goes out at once.
#[test]
fn a_stall_reported_by_the_probes_degrades_and_answering_again_reconnects() {
    let mut sim = relay(Degrade::Local);
    connected(&mut sim);
    let c = sim.connect(None);
    let ask = |sim: &mut Sim, path: &str| get(sim, c, path);
    assert!(ask(&mut sim, "/readyz").starts_with("HTTP/1.1 200"));
    sim.bus(FromBus::Stalled {
        reason: "3 probes in a row unanswered".into(),
    });
    let r = ask(&mut sim, "/readyz");
    assert!(
        r.starts_with("HTTP/1.1 503") && r.contains(r#""cluster":"degraded""#),
        "{r}"
    );
    sim.feed(c, &post(&event("e1", 0)), false);
    assert!(text(&mut sim, c).starts_with("HTTP/1.1 202"));
    assert!(publishes(sim.take_bus()).is_empty(), "kept in the outbox");
    sim.bus(FromBus::Answering);
    let r = ask(&mut sim, "/readyz");
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains(r#""cluster":"connected""#),
        "{r}"
    );
    let p = publishes(sim.take_bus());
    assert_eq!(
        p.len(),
        1,
        "the outbox goes out when the engine answers again"
    );
}

/// The Events of one POSTed body that share a subject are one publish, their bytes one
/// per line, unchanged, in the body's order per subject; a stream message of several
/// Events is admitted whole, each Event fanned out as received; an Event with a raw line
/// break travels alone and comes back whole.
#[test]
fn a_batch_is_one_publish_per_subject_and_a_message_of_several_events_is_admitted_whole() {
    let mut sim = relay(Degrade::Local);
    connected(&mut sim);
    let sub = subscriber(&mut sim);
    let c = sim.connect(None);
    let (e1, e2) = (event("e1", 0), event("e2", 1));
    let t1 = event("t1", 0).replace(r#""session":"s""#, r#""session":"t""#);
    // Pretty-printed: a raw line break between tokens.
    let e3 = event("e3", 2).replacen(',', ",\n  ", 1);
    let body = format!("{e1}\n{t1}\n{e2}\n");
    let req = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    sim.feed(c, req.as_bytes(), false);
    let mut p = publishes_with_ids(sim.take_bus());
    let ack = |sim: &mut Sim, p: &[(u64, String, Bytes, String)], from: u64| {
        for (i, (ticket, ..)) in p.iter().enumerate() {
            sim.bus(FromBus::Acked {
                ticket: *ticket,
                stream_seq: from + i as u64,
                duplicate: false,
            });
        }
    };
    ack(&mut sim, &p, 1);
    let answer = text(&mut sim, c);
    assert!(answer.ends_with(r#"{"accepted":3}"#), "{answer}");
    // A pretty-printed Event (application/json) travels alone.
    sim.feed(c, &post(&e3), false);
    let alone = publishes_with_ids(sim.take_bus());
    ack(&mut sim, &alone, 3);
    assert!(text(&mut sim, c).ends_with(r#"{"accepted":1}"#));
    p.extend(alone);
    let got: Vec<(&str, String)> = p
        .iter()
        .map(|(_, s, b, _)| (s.as_str(), String::from_utf8(b.to_vec()).unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("aep.ev.a.s", format!("{e1}\n{e2}")),
            ("aep.ev.a.t", t1.clone()),
            ("aep.ev.a.s", e3.clone()),
        ],
        "one message per subject and body, the pretty-printed Event alone"
    );
    let ids: HashSet<&String> = p.iter().map(|x| &x.3).collect();
    assert_eq!(ids.len(), 3, "a publish id per message");
    for (i, (_, _, payload, _)) in p.iter().enumerate() {
        sim.bus(FromBus::Message {
            stream_seq: i as u64 + 1,
            pending: 0,
            payload: payload.clone(),
            own_id: None,
        });
    }
    let out = text(&mut sim, sub);
    let ids: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("id: ")).collect();
    assert_eq!(ids, ["s:0:0", "s:0:1", "t:0:0", "s:0:2"], "{out}");
}

/// Before the first connection the server's `max_payload` is unknown: an Event over its
/// default (1 MiB) is refused with 413 rather than kept in the outbox, where it could
/// never be published.
#[test]
fn before_the_first_connection_an_event_over_the_default_max_payload_is_refused() {
    let mut sim = relay(Degrade::Local);
    let c = sim.connect(None);
    let big = event("e1", 0).replace(
        "\"seq\":0",
        &format!("\"seq\":0,\"data\":{{\"x\":\"{}\"}}", "y".repeat(1 << 20)),
    );
    sim.feed(c, &post(&big), false);
    let a = text(&mut sim, c);
    assert!(a.starts_with("HTTP/1.1 413"), "{}", &a[..a.len().min(300)]);
    assert!(a.contains(r#""error":"event-too-large""#), "{a}");
    sim.feed(c, &post(&event("e2", 1)), false);
    assert!(
        text(&mut sim, c).starts_with("HTTP/1.1 202"),
        "a small one is kept locally"
    );
}

/// A `POST` still waiting for the stream when a graceful shutdown begins is answered
/// once the stream acknowledges it, with `Connection: close`, and its connection then
/// ends: the shutdown neither drops it unanswered (its client could not tell whether
/// the Event was kept) nor keeps it open after the answer.
#[test]
fn a_post_waiting_for_the_stream_at_a_shutdown_is_answered_then_closed() {
    let mut sim = relay(Degrade::Local);
    connected(&mut sim);
    let c = sim.connect(None);
    sim.feed(c, &post(&event("e1", 0)), false);
    let p = publishes(sim.take_bus());
    sim.shutdown();
    assert!(sim.is_open(c), "not dropped while it waits for the stream");
    sim.bus(FromBus::Acked {
        ticket: p[0].0,
        stream_seq: 1,
        duplicate: false,
    });
    let answer = text(&mut sim, c);
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    assert!(answer.contains("Connection: close\r\n"), "{answer}");
    assert!(sim.is_shut(c), "half-closed after its answer");
    sim.feed(c, b"", true);
    assert!(!sim.is_open(c));
}
