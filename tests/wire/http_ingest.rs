//! `POST /events` and the HTTP/1.1 layer through the real server over TCP
//! (AEP-0003 §3.2, §3.4; AEP-0004 §4.1).

use crate::support;
use serde_json::Value;
use std::io::Write;
use support::*;

fn ev(seq: u64) -> String {
    event("s1", 0, seq, "tool.completed", "")
}

#[test]
fn single_event_is_accepted_202() {
    let relay = TestRelay::start();
    let (status, json) = relay.post("application/json", &ev(0));
    assert_eq!(status, 202);
    assert_eq!(json, serde_json::json!({"accepted": 1}));
}

#[test]
fn content_type_parameters_are_ignored() {
    let relay = TestRelay::start();
    let (status, _) = relay.post("application/json; charset=utf-8", &ev(0));
    assert_eq!(status, 202);
}

#[test]
fn ndjson_batch_keeps_order_and_allows_a_final_newline() {
    let relay = TestRelay::start();
    let lines: Vec<String> = (0..20).map(ev).collect();
    let (status, json) = relay.post("application/x-ndjson", &(lines.join("\n") + "\n"));
    assert_eq!((status, json["accepted"].as_u64()), (202, Some(20)));
    let got = relay.replay_all();
    assert_eq!(got, lines, "batch order is preserved (AEP-0003 §3.2.1)");
}

#[test]
fn missing_aep_version_is_400_naming_the_header() {
    let relay = TestRelay::start();
    let resp = agent()
        .post(&relay.url("/events"))
        .set("Content-Type", "application/json")
        .send_string(&ev(0));
    let (status, json) = status_json(resp);
    assert_eq!(status, 400);
    assert!(
        json["detail"].as_str().unwrap().contains("AEP-Version"),
        "{json}"
    );
}

#[test]
fn unsupported_major_version_is_426_with_versions() {
    let relay = TestRelay::start();
    let resp = agent()
        .post(&relay.url("/events"))
        .set("AEP-Version", "1.0")
        .set("Content-Type", "application/json")
        .send_string(&ev(0));
    let (status, json) = status_json(resp);
    assert_eq!(status, 426);
    assert_eq!(json["versions"], serde_json::json!(["0.1"]));
    assert_eq!(json["error"], "version-unsupported");
}

#[test]
fn other_content_types_are_415() {
    let relay = TestRelay::start();
    let (status, json) = relay.post("text/plain", &ev(0));
    assert_eq!(status, 415);
    assert_eq!(json["error"], "unsupported-media-type");
}

#[test]
fn invalid_event_is_400_with_line_and_the_batch_is_rejected_whole() {
    let relay = TestRelay::start();
    let body = [ev(0), ev(1), r#"{"aep":"0.1"}"#.to_string(), ev(3)].join("\n");
    let (status, json) = relay.post("application/x-ndjson", &body);
    assert_eq!(status, 400);
    assert_eq!(json["error"], "invalid-event");
    assert_eq!(json["line"], 3);
    assert!(json["detail"].is_string());
    // Nothing from the batch was ingested.
    relay.post_ok(&[&ev(9)]);
    let got = relay.sse("from=all&live=0", &[]).rest();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].data, ev(9));
}

#[test]
fn not_json_is_400_invalid_event() {
    let relay = TestRelay::start();
    for body in ["", "nope", "[1,2]", "{\"a\":1} {}"] {
        let (status, json) = relay.post("application/json", body);
        assert_eq!(status, 400, "{body:?}");
        assert_eq!(json["error"], "invalid-event");
        assert_eq!(json["line"], 1);
    }
}

#[test]
fn batch_over_max_batch_is_413_and_nothing_is_ingested() {
    let relay = TestRelay::with(|c| c.max_batch_events = 5);
    let lines: Vec<String> = (0..6).map(ev).collect();
    let (status, json) = relay.post("application/x-ndjson", &lines.join("\n"));
    assert_eq!(status, 413);
    assert_eq!(json["error"], "too-many-events");
    assert!(relay.replay_all().is_empty());
    // Exactly at the limit is fine.
    let (status, _) = relay.post("application/x-ndjson", &lines[..5].join("\n"));
    assert_eq!(status, 202);
}

/// The bound is judged on the whole body, before any line's validity (AEP-0003
/// §3.2.2): an oversized batch is `too-many-events` with its real count, even when an
/// early line is invalid or a command; blank lines are not Events and do not count.
#[test]
fn too_many_events_wins_over_a_bad_line_and_counts_only_events() {
    let relay = TestRelay::with(|c| c.max_batch_events = 5);
    let good: Vec<String> = (0..7).map(ev).collect();
    let cmd = r#"{"aep":"0.1","id":"c1","type":"control.cancel","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/ops","agent":"ops","session":"s1","data":{"scope":"run"}}"#;
    for bad in ["{not json", cmd] {
        for at in [0, 4, 6] {
            let mut lines = good.clone();
            lines[at] = bad.to_string();
            let (status, json) = relay.post("application/x-ndjson", &lines.join("\n"));
            assert_eq!(status, 413, "bad line {at}: {json}");
            assert_eq!(json["error"], "too-many-events");
            assert!(json["detail"].as_str().unwrap().contains('7'), "{json}");
        }
    }
    // Five Events among blank lines are within the bound; a bad line among them is
    // that line's refusal.
    let spaced = format!("\n\n{}\n  \n\n", good[..5].join("\n\n"));
    let (status, _) = relay.post("application/x-ndjson", &spaced);
    assert_eq!(status, 202);
    let mut lines = good[..5].to_vec();
    lines[4] = "{not json".to_string();
    let (status, json) = relay.post("application/x-ndjson", &lines.join("\n"));
    assert_eq!((status, json["line"].as_u64()), (400, Some(5)));
    assert!(
        relay.replay_all().len() == 5,
        "only the spaced batch was ingested"
    );
}

#[test]
fn commands_are_refused_over_http_403() {
    let relay = TestRelay::start();
    let cmd = r#"{"aep":"0.1","id":"c1","type":"control.cancel","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/ops","agent":"ops","session":"s1","data":{"scope":"run"}}"#;
    let (status, json) = relay.post("application/json", cmd);
    assert_eq!(status, 403);
    let detail = json["detail"].as_str().unwrap();
    assert!(
        detail.contains("AEP-0004 §4.1") && detail.contains("duplex"),
        "{detail}"
    );
    // In a batch too, and nothing of the batch is ingested.
    let (status, json) = relay.post("application/x-ndjson", &format!("{}\n{cmd}\n", ev(0)));
    assert_eq!((status, json["line"].as_u64()), (403, Some(2)));
    assert!(relay.replay_all().is_empty());
}

#[test]
fn foreign_emitter_events_without_seq_are_accepted() {
    let relay = TestRelay::start();
    let routed = r#"{"aep":"0.1","id":"r1","type":"attention.routed","subject":"q1","time":"2026-07-03T10:00:01Z","source":"aep://h/agent/router","agent":"router","session":"s1"}"#;
    relay.post_ok(&[&ev(0), routed, &ev(1)]);
    let got: Vec<String> = relay.replay_all();
    assert_eq!(
        got,
        vec![ev(0), routed.to_string(), ev(1)],
        "kept in arrival order"
    );
}

#[test]
fn body_over_max_body_is_413_before_the_body_is_read() {
    let relay = TestRelay::with(|c| c.max_body_bytes = 1000);
    // Only the head is sent: the answer must come without the body.
    let (status, headers, json) = raw_request(
        &relay,
        b"POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n",
    );
    assert_eq!(status, 413);
    assert_eq!(json["error"], "body-too-large");
    assert!(headers
        .iter()
        .any(|(k, v)| k == "connection" && v == "close"));
}

#[test]
fn chunked_body_over_max_body_is_413() {
    let relay = TestRelay::with(|c| c.max_body_bytes = 1000);
    let mut req = b"POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    req.extend_from_slice(b"800\r\n");
    req.extend_from_slice(&[b' '; 0x800]);
    let (status, _, json) = raw_request(&relay, &req);
    assert_eq!(status, 413);
    assert_eq!(json["error"], "body-too-large");
}

#[test]
fn head_over_the_limit_is_431() {
    let relay = TestRelay::with(|c| c.max_head_bytes = 1024);
    let mut req = b"GET /events HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    req.extend_from_slice(&[b'a'; 2000]);
    req.extend_from_slice(b"\r\n\r\n");
    let (status, _, json) = raw_request(&relay, &req);
    assert_eq!(status, 431);
    assert_eq!(json["error"], "head-too-large");
}

#[test]
fn unknown_path_is_404_and_wrong_method_405_with_allow() {
    let relay = TestRelay::start();
    let (status, json) = status_json(agent().get(&relay.url("/nope")).call());
    assert_eq!((status, json["error"].as_str()), (404, Some("not-found")));
    let (status, headers, json) =
        raw_request(&relay, b"DELETE /events HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 405);
    assert_eq!(json["error"], "method-not-allowed");
    let allow = headers
        .iter()
        .find(|(k, _)| k == "allow")
        .map(|(_, v)| v.as_str());
    assert_eq!(allow, Some("GET, POST"));
    let (status, headers, _) = raw_request(
        &relay,
        b"POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(status, 405);
    assert!(headers.iter().any(|(k, v)| k == "allow" && v == "GET"));
}

#[test]
fn keep_alive_and_pipelined_requests_answer_in_order() {
    let relay = TestRelay::start();
    let e0 = ev(0);
    let e1 = ev(1);
    let mut wire = Vec::new();
    for (i, e) in [&e0, &e1].iter().enumerate() {
        wire.extend_from_slice(
            format!(
                "POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
                e.len(),
                e
            )
            .as_bytes(),
        );
        if i == 0 {
            wire.extend_from_slice(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
        }
    }
    wire.extend_from_slice(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut s = relay.tcp();
    s.write_all(&wire).unwrap();
    let statuses: Vec<u16> = (0..4).map(|_| read_response(&mut s).0).collect();
    assert_eq!(statuses, vec![202, 404, 202, 200]);
}

#[test]
fn chunked_request_bodies_are_read() {
    let relay = TestRelay::start();
    let body = format!("{}\n{}\n", ev(0), ev(1));
    let (a, b) = body.split_at(10);
    let req = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x};ext=1\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    let (status, _, json) = raw_request(&relay, req.as_bytes());
    assert_eq!((status, json["accepted"].as_u64()), (202, Some(2)));
}

#[test]
fn expect_100_continue_is_answered_before_the_body() {
    let relay = TestRelay::start();
    let e = ev(0);
    let mut s = relay.tcp();
    write!(
        s,
        "POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        e.len()
    )
    .unwrap();
    let (status, _, _) = read_response(&mut s);
    assert_eq!(status, 100);
    s.write_all(e.as_bytes()).unwrap();
    let (status, _, _) = read_response(&mut s);
    assert_eq!(status, 202);
}

#[test]
fn an_early_refusal_skips_the_body_and_keeps_the_connection() {
    let relay = TestRelay::start();
    let e = ev(0);
    let mut s = relay.tcp();
    write!(s, "POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{e}", e.len()).unwrap();
    assert_eq!(read_response(&mut s).0, 400);
    s.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut s).0, 200);
}

#[test]
fn malformed_request_head_is_400() {
    let relay = TestRelay::start();
    let (status, _, json) = raw_request(&relay, b"GET /events HTTP/1.1\r\nBad Header\r\n\r\n");
    assert_eq!(status, 400);
    assert_eq!(json["error"], "bad-request");
}

#[test]
fn discovery_document_at_both_urls() {
    let relay = TestRelay::with(|c| c.buffer_per_session = 77);
    for path in ["/events", "/.well-known/aep"] {
        let resp = agent().get(&relay.url(path)).call().unwrap();
        assert_eq!(resp.content_type(), "application/json");
        let doc: Value = serde_json::from_str(&resp.into_string().unwrap()).unwrap();
        assert_eq!(doc["aep"], serde_json::json!(["0.1"]));
        assert_eq!(doc["endpoints"]["events"], "/events");
        assert_eq!(doc["endpoints"]["stream"], "/stream");
        assert_eq!(
            doc["capabilities"]["filters"],
            serde_json::json!(["attr-match"])
        );
        assert_eq!(doc["capabilities"]["replay"]["buffer"], 77);
        assert_eq!(doc["capabilities"]["replay"]["all"], true);
    }
}

#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn golden_events_post_202_and_commands_403() {
    let golden = fixture("aep-fixtures/golden/golden.jsonl");
    let relay = TestRelay::start();
    let mut seen = 0;
    for line in golden.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).unwrap();
        let ty = v["type"].as_str().unwrap();
        let is_command = aep_relay::wire::envelope::is_command_type(ty);
        let (status, json) = relay.post("application/json", line);
        let want = if is_command { 403 } else { 202 };
        assert_eq!(status, want, "{ty}: {json}");
        seen += 1;
    }
    assert_eq!(seen, 64, "the golden corpus has 64 Events");
}

/// Which upstream invalid cases are envelope-level (a relay's to enforce) is decided in
/// tests/sans_io/envelope_fixtures.rs; here every one of those must answer 400 over HTTP.
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn envelope_invalid_cases_answer_400() {
    let text = fixture("aep-fixtures/invalid/cases.json");
    let cases: Value = serde_json::from_str(&text).unwrap();
    let relay = TestRelay::start();
    let mut n = 0;
    for case in cases["cases"].as_array().unwrap() {
        let rule = case["rule"].as_str().unwrap();
        if case.get("events").is_some()
            || rule.contains("payload schema")
            || rule.contains("field_spec")
        {
            continue; // stream or payload rules: not a relay's (AEP-0001 §5: routing never parses data)
        }
        let body = serde_json::to_string(&case["event"]).unwrap();
        let (status, json) = relay.post("application/json", &body);
        assert_eq!(status, 400, "{}: {json}", case["name"]);
        assert_eq!(json["error"], "invalid-event");
        n += 1;
    }
    assert!(n >= 17, "expected the 17 envelope-level cases, ran {n}");
}

#[test]
fn cors_headers_only_for_configured_origins() {
    let relay = TestRelay::with(|c| c.cors_origins = vec!["http://dash.example".into()]);
    let (_, headers, _) = raw_request(
        &relay,
        b"GET /events HTTP/1.1\r\nHost: x\r\nOrigin: http://dash.example\r\n\r\n",
    );
    assert!(headers
        .iter()
        .any(|(k, v)| k == "access-control-allow-origin" && v == "http://dash.example"));
    let (_, headers, _) = raw_request(
        &relay,
        b"GET /events HTTP/1.1\r\nHost: x\r\nOrigin: http://evil.example\r\n\r\n",
    );
    assert!(!headers
        .iter()
        .any(|(k, _)| k == "access-control-allow-origin"));
    let (status, headers, _) = raw_request(
        &relay,
        b"OPTIONS /events HTTP/1.1\r\nHost: x\r\nOrigin: http://dash.example\r\nAccess-Control-Request-Method: POST\r\n\r\n",
    );
    assert_eq!(status, 204);
    assert!(headers
        .iter()
        .any(|(k, v)| k == "access-control-allow-headers" && v.contains("AEP-Version")));
    // The SSE stream head carries it too.
    let mut s = relay.tcp();
    s.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\nOrigin: http://dash.example\r\n\r\n")
        .unwrap();
    let mut head = [0u8; 120];
    let n = std::io::Read::read(&mut s, &mut head).unwrap();
    assert!(String::from_utf8_lossy(&head[..n])
        .contains("Access-Control-Allow-Origin: http://dash.example"));
}
