//! `GET /stream` through the real server: byte identity, filters, capture ceilings,
//! resume and replay (AEP-0003 §3.3, §5, §6, §7).

use crate::support;
use std::io::{BufRead, BufReader, Write};
use support::*;

fn ev(session: &str, seq: u64) -> String {
    event(session, 0, seq, "tool.completed", "")
}

#[test]
fn a_posted_line_arrives_byte_for_byte_with_event_and_id() {
    let relay = TestRelay::start();
    let mut stream = relay.sse("", &[]);
    let line = event(
        "s_8f2c",
        2,
        187,
        "tool.completed",
        r#","severity":"info","acmeregion":"eu-1","data":{"tool":{"name":"Bash"},"status":"success"}"#,
    );
    relay.post_ok(&[&line]);
    let m = stream.expect();
    assert_eq!(m.data, line, "data: is the Event's original bytes");
    assert_eq!(m.event.as_deref(), Some("tool.completed"));
    assert_eq!(m.id.as_deref(), Some("s_8f2c:2:187"));
}

#[test]
fn a_multi_line_event_is_sent_on_one_data_line() {
    let relay = TestRelay::start();
    let mut stream = relay.sse("", &[]);
    let pretty = ev("s", 0).replace(",\"", ",\n  \"");
    let (status, _) = relay.post("application/json", &pretty);
    assert_eq!(status, 202);
    let m = stream.expect();
    assert_eq!(m.data, pretty.replace('\n', " "));
    let v: serde_json::Value = serde_json::from_str(&m.data).unwrap();
    assert_eq!(v["seq"], 0);
}

#[test]
fn agent_scoped_events_carry_no_id() {
    let relay = TestRelay::start();
    let mut stream = relay.sse("", &[]);
    let hb = r#"{"aep":"0.1","id":"h1","type":"agent.heartbeat","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a","agent":"a"}"#;
    relay.post_ok(&[hb]);
    let m = stream.expect();
    assert_eq!((m.data.as_str(), m.id), (hb, None));
    // Agent-scoped Events are never buffered (AEP-0003 §5 via the store rules).
    assert!(relay.replay_all().is_empty());
}

#[test]
fn filter_selects_events() {
    let relay = TestRelay::start();
    let filter = enc(r#"{"type":["attention.*"],"severity":{"gte":"notice"}}"#);
    let mut stream = relay.sse(&format!("filter={filter}"), &[]);
    let miss_type = ev("s", 0);
    let miss_sev = event("s", 0, 1, "attention.requested", r#","severity":"info""#);
    let hit = event("s", 0, 2, "attention.requested", r#","severity":"warning""#);
    let sentinel = event("s", 0, 3, "attention.resolved", r#","severity":"critical""#);
    relay.post_ok(&[&miss_type, &miss_sev, &hit, &sentinel]);
    assert_eq!(stream.expect().data, hit);
    assert_eq!(stream.expect().data, sentinel);
}

#[test]
fn bad_filter_capture_or_from_is_400_before_stream_headers() {
    let relay = TestRelay::with(|c| c.max_from_positions = 2);
    let three = enc(r#"[{"session":"a","seq":1},{"session":"b","seq":1},{"session":"c","seq":1}]"#);
    let cases = [
        format!("filter={}", enc(r#"{"seq":5}"#)),
        format!("filter={}", enc(r#"{"type":"*"}"#)),
        "filter=notjson".to_string(),
        "capture=everything".to_string(),
        format!("from={}", enc(r#"[{"session":"s"}]"#)),
        "from=some".to_string(),
        "live=maybe".to_string(),
    ];
    for q in &cases {
        let (status, json) =
            status_json(agent().get(&format!("{}?{q}", relay.url("/stream"))).call());
        assert_eq!(status, 400, "{q}");
        assert_eq!(json["error"], "invalid-filter", "{q}");
    }
    let (status, json) = status_json(
        agent()
            .get(&format!("{}?from={three}", relay.url("/stream")))
            .call(),
    );
    assert_eq!(status, 400);
    assert!(
        json["detail"].as_str().unwrap().contains("AEP_MAX_FROM"),
        "{json}"
    );
    let (status, _) = status_json(
        agent()
            .get(&relay.url("/stream"))
            .set("Last-Event-ID", "garbage")
            .call(),
    );
    assert_eq!(status, 400);
}

#[test]
fn resume_with_last_event_id_has_no_gap_and_no_duplicate() {
    let relay = TestRelay::start();
    let evs: Vec<String> = (0..8).map(|i| ev("s1", i)).collect();
    let refs: Vec<&str> = evs.iter().map(|s| s.as_str()).collect();
    relay.post_ok(&refs[..5]);
    let mut stream = relay.sse("", &[("Last-Event-ID", "s1:0:2")]);
    // Replay strictly after the position…
    for want in &evs[3..5] {
        assert_eq!(&stream.expect().data, want);
    }
    // …then live, continuing without gap or duplicate.
    relay.post_ok(&refs[5..8]);
    for want in &evs[5..8] {
        assert_eq!(&stream.expect().data, want);
    }
}

#[test]
fn from_takes_precedence_over_last_event_id_and_covers_many_sessions() {
    let relay = TestRelay::start();
    relay.post_ok(&[
        &ev("a", 0),
        &ev("b", 0),
        &ev("a", 1),
        &ev("b", 1),
        &ev("c", 0),
    ]);
    let from = enc(r#"[{"session":"a","epoch":0,"seq":0},{"session":"b","seq":0}]"#);
    let got: Vec<String> = relay
        .sse(
            &format!("from={from}&live=0"),
            &[("Last-Event-ID", "c:0:0")],
        )
        .rest()
        .into_iter()
        .map(|m| m.data)
        .collect();
    assert_eq!(got, vec![ev("a", 1), ev("b", 1)]);
}

#[test]
fn backfill_is_replayed_in_epoch_seq_order() {
    let relay = TestRelay::start();
    let e = |epoch, seq| event("s", epoch, seq, "tool.completed", "");
    relay.post_ok(&[&e(0, 1), &e(1, 0), &e(0, 3), &e(0, 2)]);
    let got: Vec<String> = relay.replay_all();
    assert_eq!(got, vec![e(0, 1), e(0, 2), e(0, 3), e(1, 0)]);
}

#[test]
fn redelivery_is_forwarded_live_but_buffered_once() {
    let relay = TestRelay::start();
    let mut stream = relay.sse("", &[]);
    relay.post_ok(&[&ev("s", 0)]);
    relay.post_ok(&[&ev("s", 0)]);
    relay.post_ok(&[&ev("s", 1)]);
    let live: Vec<String> = (0..3).map(|_| stream.expect().data).collect();
    assert_eq!(
        live,
        vec![ev("s", 0), ev("s", 0), ev("s", 1)],
        "live fan-out forwards redelivery (AEP-0003 §5)"
    );
    let replay: Vec<String> = relay.replay_all();
    assert_eq!(
        replay,
        vec![ev("s", 0), ev("s", 1)],
        "admission dedupes on (source, id)"
    );
}

#[test]
fn a_position_older_than_the_buffer_gets_replay_exhausted_first() {
    let relay = TestRelay::with(|c| c.buffer_per_session = 3);
    let evs: Vec<String> = (0..10).map(|i| ev("s1", i)).collect();
    let refs: Vec<&str> = evs.iter().map(|s| s.as_str()).collect();
    relay.post_ok(&refs);
    let mut stream = relay.sse("live=0", &[("Last-Event-ID", "s1:0:1")]);
    let first = stream.expect();
    assert_eq!(first.comments, vec!["replay-exhausted s1 0:7".to_string()]);
    assert_eq!(first.data, evs[7]);
    assert_eq!(stream.expect().data, evs[8]);
    assert_eq!(stream.expect().data, evs[9]);
    assert!(
        stream.next().is_none(),
        "live=0 ends the stream after the replay"
    );
    // A position inside the buffer gets no marker.
    let mut stream = relay.sse("live=0", &[("Last-Event-ID", "s1:0:7")]);
    let m = stream.expect();
    assert!(m.comments.is_empty());
    assert_eq!(m.data, evs[8]);
}

#[test]
fn from_all_replays_every_session_without_markers() {
    let relay = TestRelay::with(|c| c.buffer_per_session = 2);
    relay.post_ok(&[&ev("a", 0), &ev("a", 1), &ev("a", 2), &ev("b", 5)]);
    let got = relay.sse("from=all&live=0", &[]).rest();
    assert!(got.iter().all(|m| m.comments.is_empty()));
    let mut data: Vec<String> = got.into_iter().map(|m| m.data).collect();
    data.sort();
    let mut want = vec![ev("a", 1), ev("a", 2), ev("b", 5)];
    want.sort();
    assert_eq!(data, want);
}

#[test]
fn replay_then_live_with_a_filter_applies_the_filter_to_both() {
    let relay = TestRelay::start();
    relay.post_ok(&[&ev("a", 0), &ev("b", 0)]);
    let filter = enc(r#"{"session":"b"}"#);
    let mut stream = relay.sse(&format!("from=all&filter={filter}"), &[]);
    assert_eq!(stream.expect().data, ev("b", 0));
    relay.post_ok(&[&ev("a", 1), &ev("b", 1)]);
    assert_eq!(stream.expect().data, ev("b", 1));
}

#[test]
fn session_cap_evicts_the_least_recently_written_session() {
    let relay = TestRelay::with(|c| c.max_sessions = 2);
    relay.post_ok(&[&ev("a", 0), &ev("b", 0), &ev("a", 1), &ev("c", 0)]);
    let mut got: Vec<String> = relay.replay_all();
    got.sort();
    let mut want = vec![ev("a", 0), ev("a", 1), ev("c", 0)];
    want.sort();
    assert_eq!(got, want, "b was least recently written");
}

#[test]
fn capture_ceiling_downlevels_and_never_uplevels() {
    let relay = TestRelay::start();
    let full = event(
        "s",
        0,
        0,
        "tool.completed",
        r#","capture":"full","data":{"tool":{"name":"Bash"},"status":"success","result":"secret output"}"#,
    );
    let meta = event(
        "s",
        0,
        1,
        "tool.completed",
        r#","capture":"metadata","data":{"tool":{"name":"Bash"},"status":"success"}"#,
    );
    relay.post_ok(&[&full, &meta]);
    let got = relay.sse("from=all&live=0&capture=metadata", &[]).rest();
    let first: serde_json::Value = serde_json::from_str(&got[0].data).unwrap();
    assert_eq!(first["capture"], "metadata");
    assert!(
        first["data"].get("result").is_none(),
        "a full field never reaches a metadata ceiling"
    );
    assert_eq!(first["data"]["status"], "success");
    assert_eq!(
        got[1].data, meta,
        "an Event at or under the ceiling is forwarded byte-identical"
    );
    let none = relay.sse("from=all&live=0&capture=none", &[]).rest();
    let v: serde_json::Value = serde_json::from_str(&none[0].data).unwrap();
    assert_eq!(v["capture"], "none");
    assert!(v.get("data").is_none(), "none = envelope only");
    let redacted = relay.sse("from=all&live=0&capture=redacted", &[]).rest();
    let v: serde_json::Value = serde_json::from_str(&redacted[0].data).unwrap();
    assert_eq!(
        v["capture"], "metadata",
        "a full Event under a redacted ceiling lands on metadata (AEP-0001 §8.2(e))"
    );
}

#[test]
fn heartbeat_comments_keep_idle_streams_alive() {
    // Whole seconds on a real socket; the exact instants are in tests/sans_io/virtual_time.rs.
    let relay = TestRelay::with(|c| c.heartbeat = std::time::Duration::from_secs(1));
    let mut s = relay.tcp();
    s.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(s);
    let mut pings = 0;
    let mut line = String::new();
    while pings < 1 {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "stream ended");
        if line == ": ping\n" {
            pings += 1;
        }
    }
}

#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn golden_events_stream_back_byte_identical() {
    let golden = fixture("aep-fixtures/golden/golden.jsonl");
    let relay = TestRelay::start();
    let mut stream = relay.sse("", &[]);
    let lines: Vec<&str> = golden.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut sent = Vec::new();
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let ty = v["type"].as_str().unwrap();
        let (status, body) = relay.post("application/json", line);
        // Every golden Event is valid; only commands are refused over HTTP, 403
        // (AEP-0004 §4.1: control needs an authenticated duplex binding).
        if aep_relay::wire::envelope::is_command_type(ty) {
            assert_eq!(status, 403, "{ty}: {body}");
        } else {
            assert_eq!(status, 202, "{ty}: {body}");
            sent.push(line.to_string());
        }
    }
    // The upstream golden corpus: 64 Events, two of them commands.
    assert_eq!((lines.len(), sent.len()), (64, 62));
    for want in &sent {
        assert_eq!(&stream.expect().data, want);
    }
    // Nothing else was delivered in between (a refused command, a duplicate): the next
    // message is one posted after the corpus.
    let last = ev("after-golden", 0);
    relay.post_ok(&[&last]);
    assert_eq!(stream.expect().data, last);
}

/// The `data:` lines of a whole SSE body, in order.
fn data_lines(body: &str) -> Vec<&str> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect()
}

/// A sequenced Event of session `session` from emitter `source` at (0, `seq`).
fn from_source(source: &str, session: &str, seq: u64, extra: &str) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{source}-{seq}","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://{source}/agent/a","agent":"a","session":"{session}","seq":{seq}{extra}}}"#
    )
}

/// `live=0` naming no position: the held history of the session the filter names
/// exactly, every owning stream of that name (AEP-0001 §5.2) from its earliest Event,
/// then `: replay-complete` and the end. What the official SDK's
/// `subscribe(filter={"session": …}, live=False)` and `aep timeline` read (AEP-0003 §5
/// leaves `live=0` open).
#[test]
fn replay_only_reads_the_history_of_the_filters_session() {
    let relay = TestRelay::start();
    let a: Vec<String> = (0..3).map(|q| from_source("h1", "s", q, "")).collect();
    let b: Vec<String> = (0..2).map(|q| from_source("h2", "s", q, "")).collect();
    let other = from_source("h1", "t", 0, "");
    relay.post_ok(&[&a[0], &b[0], &other, &a[1], &b[1], &a[2]]);

    let filter = |f: &str| format!("filter={}&live=0", enc(f));
    let body = relay.get_text(&format!("/stream?{}", filter(r#"{"session":"s"}"#)));
    // Streams in creation order, each in stream order.
    let want: Vec<&str> = a.iter().chain(&b).map(String::as_str).collect();
    assert_eq!(data_lines(&body), want);
    assert!(body.ends_with("\n\n: replay-complete\n\n"), "{body:?}");

    // An array of names replays each.
    let body = relay.get_text(&format!("/stream?{}", filter(r#"{"session":["t","s"]}"#)));
    assert_eq!(data_lines(&body).len(), 6);
    // A request that names positions is a resume: it gets exactly what they name, so a
    // name given to `from` is replayed from its position only, and the filter's other
    // names are not added from their start (the SDK splits many positions over several
    // `live=0` requests; each would otherwise bring Events from before the others').
    let from = enc(r#"[{"session":"s","seq":1}]"#);
    let body = relay.get_text(&format!(
        "/stream?{}&from={from}",
        filter(r#"{"session":["s","t"]}"#)
    ));
    assert_eq!(data_lines(&body), [&a[2]]);
    assert!(body.ends_with("\n\n: replay-complete\n\n"), "{body:?}");
    let resp = agent()
        .get(&relay.url(&format!("/stream?{}", filter(r#"{"session":["s","t"]}"#))))
        .set("Last-Event-ID", "t:0:0")
        .call()
        .unwrap();
    assert!(data_lines(&resp.into_string().unwrap()).is_empty());
    // `from=all` with a session filter: each held Event once (streams in `from=all`'s
    // least-recently-written order).
    let body = relay.get_text(&format!(
        "/stream?{}&from=all",
        filter(r#"{"session":"s"}"#)
    ));
    let (mut got, mut sorted) = (data_lines(&body), want.clone());
    got.sort();
    sorted.sort();
    assert_eq!(got, sorted);

    // The filter still applies, and a capture ceiling down-levels.
    let full = from_source(
        "h3",
        "c",
        0,
        r#","capture":"full","data":{"tool":{"name":"Bash"},"status":"success","result":"secret"}"#,
    );
    relay.post_ok(&[&full]);
    let body = relay.get_text(&format!(
        "/stream?{}&capture=metadata",
        filter(r#"{"session":"c"}"#)
    ));
    let got = data_lines(&body);
    assert_eq!(got.len(), 1);
    let v: serde_json::Value = serde_json::from_str(got[0]).unwrap();
    assert_eq!(v["capture"], "metadata");
    assert!(v["data"].get("result").is_none());
    let body = relay.get_text(&format!(
        "/stream?{}",
        filter(r#"{"session":"s","agent":"nobody"}"#)
    ));
    assert!(data_lines(&body).is_empty());

    // A name the relay does not hold: no Events, no error, the same ending.
    let body = relay.get_text(&format!("/stream?{}", filter(r#"{"session":"gone"}"#)));
    assert_eq!(body, ": aep-relay stream open\n\n: replay-complete\n\n");
    // Live streams are unchanged: the filter's session is no replay request there.
    let mut live = relay.sse(&format!("filter={}", enc(r#"{"session":"s"}"#)), &[]);
    let next = from_source("h1", "s", 3, "");
    relay.post_ok(&[&next]);
    assert_eq!(live.expect().data, next);
}

/// Every replay-only stream ends with `: replay-complete`: after `from`, after
/// `from=all`, after `Last-Event-ID`, and with nothing to replay.
#[test]
fn every_replay_only_stream_ends_with_replay_complete() {
    let relay = TestRelay::start();
    relay.post_ok(&[ev("s", 0), ev("s", 1)]);
    let from = enc(r#"[{"session":"s","seq":0}]"#);
    for q in [
        "live=0".to_string(),
        "from=all&live=0".to_string(),
        format!("from={from}&live=0"),
    ] {
        let body = relay.get_text(&format!("/stream?{q}"));
        assert!(body.ends_with(": replay-complete\n\n"), "{q}: {body:?}");
        assert_eq!(body.matches("replay-complete").count(), 1, "{q}");
    }
    let resp = agent()
        .get(&relay.url("/stream?live=0"))
        .set("Last-Event-ID", "s:0:0")
        .call()
        .unwrap();
    let body = resp.into_string().unwrap();
    assert_eq!(data_lines(&body), [ev("s", 1)]);
    assert!(body.ends_with("\n\n: replay-complete\n\n"), "{body:?}");
}

/// Bad input keeps its answers with `live=0`: `live` other than 0 or 1, a filter that is
/// not an object, and a `session` array longer than the `from` limit (AEP-0003 §6.5).
#[test]
fn replay_only_refusals_name_what_is_wrong() {
    let relay = TestRelay::with(|c| c.max_from_positions = 2);
    let get = |q: &str| status_json(agent().get(&format!("{}?{q}", relay.url("/stream"))).call());
    let (status, json) = get("live=2");
    assert_eq!(
        (status, json["error"].as_str()),
        (400, Some("invalid-filter"))
    );
    let (status, json) = get(&format!("filter={}&live=0", enc(r#"["s"]"#)));
    assert_eq!(
        (status, json["error"].as_str()),
        (400, Some("invalid-filter"))
    );
    let (status, json) = get(&format!(
        "filter={}&live=0",
        enc(r#"{"session":["a","b","c"]}"#)
    ));
    assert_eq!(status, 400);
    assert_eq!(json["error"], "limit-exceeded", "{json}");
    let detail = json["detail"].as_str().unwrap();
    assert!(
        detail.contains("at most 2") && detail.contains("AEP_MAX_FROM"),
        "{detail}"
    );
    // With positions or `all` the names only filter: no limit of their own.
    for from in [
        "from=all",
        "from=%5B%7B%22session%22%3A%22a%22%2C%22seq%22%3A0%7D%5D",
    ] {
        let q = format!(
            "filter={}&live=0&{from}",
            enc(r#"{"session":["a","b","c","d"]}"#)
        );
        let body = relay.get_text(&format!("/stream?{q}"));
        assert!(body.ends_with(": replay-complete\n\n"), "{q}: {body:?}");
    }
    // Within the limit it is a replay; live, the same filter is only a filter.
    let within = format!("filter={}&live=0", enc(r#"{"session":["a","b"]}"#));
    let body = relay.get_text(&format!("/stream?{within}"));
    assert!(body.ends_with(": replay-complete\n\n"), "{body:?}");
}
