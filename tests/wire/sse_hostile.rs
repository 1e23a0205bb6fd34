//! Producer strings in SSE lines and the `GET /stream` request surface, through the real
//! server over TCP, read with a WHATWG-conformant parser (`support::whatwg`) exactly as a
//! browser's `EventSource` reads it (AEP-0003 §3.3, §6.2, §7, §11).
//!
//! `session` is an arbitrary producer string (AEP-0001 §12): it must never add a field
//! or a message to a consumer's stream, and `Last-Event-ID` must resume exactly the
//! session it names, whatever its bytes.

use crate::support;
use std::io::{Read, Write};
use support::whatwg::{Message, Parser, Refused, Stream};
use support::*;

/// Hostile sessions and the exact session part of the `id:` the relay writes for each:
/// `%`, C0 controls, DEL, non-ASCII bytes and a leading space become `%XX`; everything
/// else (`:`, `\`, inner spaces, `{"`…) stays as it is.
const HOSTILE: &[(&str, &str)] = &[
    (
        "s1\ndata: {\"fake\":true}\n\nid: x",
        "s1%0Adata: {\"fake\":true}%0A%0Aid: x",
    ),
    ("a:b:0:1", "a:b:0:1"),
    ("50%", "50%25"),
    ("%0A", "%250A"),
    ("back\\slash\\n", "back\\slash\\n"),
    ("cr\rx", "cr%0Dx"),
    ("lf\nx", "lf%0Ax"),
    ("crlf\r\n\r\nx", "crlf%0D%0A%0D%0Ax"),
    ("nul\0x", "nul%00x"),
    (
        "séance 会话 𝄞",
        "s%C3%A9ance %E4%BC%9A%E8%AF%9D %F0%9D%84%9E",
    ),
    (" lead", "%20lead"),
    ("tab\tesc\u{1b}[31mdel\u{7f}", "tab%09esc%1B[31mdel%7F"),
    ("ls\u{2028}x", "ls%E2%80%A8x"),
];

/// Every hostile session with its expected escaped form, the 1 KiB ones included.
fn sessions() -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = HOSTILE
        .iter()
        .map(|(s, e)| (s.to_string(), e.to_string()))
        .collect();
    let plain = "k".repeat(1024);
    all.push((plain.clone(), plain));
    all.push(("\r\n%:é".repeat(171), "%0D%0A%25:%C3%A9".repeat(171)));
    all
}

/// A valid sequenced Event in `session` as exact JSON text (serde_json writes control
/// characters as `\n`, `\u0000`, …, so the relay decodes them into the session).
fn ev(tag: usize, session: &str, seq: u64) -> String {
    serde_json::json!({
        "aep": "0.1", "id": format!("e{tag}-{seq}"), "type": "tool.completed",
        "time": "2026-07-03T10:00:00Z", "source": "aep://test/agent/a/session/x",
        "agent": "a", "session": session, "seq": seq,
    })
    .to_string()
}

/// One message per Event: exactly the three fields `event`, `id`, `data`, once each,
/// carrying the type, `{escaped}:0:{seq}` and the posted line; no comment before it but
/// the stream's opening line, heartbeats and `replay-exhausted`.
fn assert_message(m: &Message, line: &str, id: &str) {
    let want = vec![
        ("event".to_string(), "tool.completed".to_string()),
        ("id".to_string(), id.to_string()),
        ("data".to_string(), line.to_string()),
    ];
    assert_eq!(m.fields, want, "the message's field lines");
    assert_eq!(m.event_type, "tool.completed");
    assert_eq!(m.data, line, "data is the posted line byte for byte");
    assert_eq!(m.last_event_id, id, "lastEventId is the id: written");
    assert!(
        m.comments.iter().all(|c| c == "ping"
            || c == "aep-relay stream open"
            || c.starts_with("replay-exhausted ")),
        "{:?}",
        m.comments
    );
}

fn resume(relay: &TestRelay, last_event_id: &str) -> Vec<Message> {
    Stream::open(
        relay.addr,
        "/stream?live=0",
        &[("Last-Event-ID", last_event_id)],
    )
    .unwrap_or_else(|r| panic!("Last-Event-ID {last_event_id:?} refused: {r:?}"))
    .rest()
}

#[test]
fn hostile_sessions_stay_inside_their_id_line_and_resume_exactly() {
    let relay = TestRelay::start();
    let mut live = Stream::open(relay.addr, "/stream", &[]).unwrap();
    let sessions = sessions();
    // Each hostile session, then a decoy whose literal name is the hostile one's escaped
    // form: a relay that did not unescape `Last-Event-ID` would resume the decoy.
    let mut posted: Vec<(String, String, String, u64)> = Vec::new(); // line, session, escaped, seq
    for (i, (session, escaped)) in sessions.iter().enumerate() {
        for seq in 1..=3 {
            posted.push((ev(i, session, seq), session.clone(), escaped.clone(), seq));
        }
        if escaped != session {
            // The decoy's name is printable ASCII: only its `%` are escaped.
            let decoy_escaped = escaped.replace('%', "%25");
            for seq in 1..=3 {
                posted.push((
                    ev(1000 + i, escaped, seq),
                    escaped.clone(),
                    decoy_escaped.clone(),
                    seq,
                ));
            }
        }
    }
    let lines: Vec<&str> = posted.iter().map(|(l, ..)| l.as_str()).collect();
    relay.post_ok(&lines);
    let sentinel = ev(9999, "sentinel", 0);
    relay.post_ok(&[&sentinel]);

    let mut ids = Vec::new();
    for (line, _, escaped, seq) in &posted {
        let m = live.expect();
        assert_message(&m, line, &format!("{escaped}:0:{seq}"));
        ids.push(m.last_event_id);
    }
    assert_message(&live.expect(), &sentinel, "sentinel:0:0");

    // Resume from the id each message carried: exactly that session's later Events.
    for ((_, session, _, seq), id) in posted.iter().zip(&ids) {
        if *seq == 3 {
            continue;
        }
        let got = resume(&relay, id);
        let want: Vec<_> = posted
            .iter()
            .filter(|(_, s, _, q)| s == session && q > seq)
            .collect();
        assert_eq!(got.len(), want.len(), "resume from {id:?}: {got:#?}");
        for (m, (line, _, escaped, q)) in got.iter().zip(want) {
            assert_message(m, line, &format!("{escaped}:0:{q}"));
        }
    }
}

#[test]
fn replay_exhausted_names_the_session_as_its_id_does() {
    let relay = TestRelay::with(|c| c.buffer_per_session = 2);
    for (i, (session, escaped)) in sessions().iter().enumerate() {
        let lines: Vec<String> = (1..=4).map(|q| ev(i, session, q)).collect();
        let refs: Vec<&str> = lines.iter().map(|l| l.as_str()).collect();
        relay.post_ok(&refs);
        let got = resume(&relay, &format!("{escaped}:0:1"));
        assert_eq!(got.len(), 2, "{got:#?}");
        let notes: Vec<&String> = got[0]
            .comments
            .iter()
            .filter(|c| *c != "ping" && *c != "aep-relay stream open")
            .collect();
        assert_eq!(
            notes,
            vec![&format!("replay-exhausted {escaped} 0:3")],
            "one comment line, naming the session escaped (AEP-0003 §3.3.3)"
        );
        assert_message(&got[0], &lines[2], &format!("{escaped}:0:3"));
        assert_message(&got[1], &lines[3], &format!("{escaped}:0:4"));
    }
}

#[test]
fn a_last_event_id_with_a_broken_escape_is_400() {
    let relay = TestRelay::start();
    relay.post_ok(&[&ev(0, "50%", 1), &ev(1, "50%", 2)]);
    for bad in ["50%:0:1", "50%2:0:1", "50%zz:0:1", "%C3:0:1"] {
        match Stream::open(relay.addr, "/stream", &[("Last-Event-ID", bad)]) {
            Err(Refused { status, body }) => {
                assert_eq!(status, 400, "{bad}");
                assert_eq!(body["error"], "invalid-filter", "{bad}");
                assert!(body["detail"].as_str().unwrap().contains("%XX"), "{body}");
            }
            Ok(_) => panic!("Last-Event-ID {bad:?} was accepted"),
        }
    }
    assert_eq!(resume(&relay, "50%25:0:1").len(), 1);
    assert_eq!(resume(&relay, "50%25:0:0").len(), 2);
    // Lenient in what it reads: either hex case, and raw UTF-8 (what a browser sends
    // back for an id an older relay wrote unescaped) reads as itself.
    relay.post_ok(&[&ev(2, "é", 1), &ev(3, "é", 2)]);
    assert_eq!(resume(&relay, "%c3%a9:0:0").len(), 2);
    assert_eq!(resume(&relay, "é:0:1").len(), 1);
}

#[test]
fn unknown_stream_parameters_are_refused_naming_the_known_ones() {
    let relay = TestRelay::start();
    let flt = enc(r#"{"session":"a"}"#);
    for q in [
        format!("fliter={flt}"),
        format!("filter={flt}&sesion=a"),
        format!("Filter={flt}"),
        "lastEventId=a:0:1".to_string(),
        "=x".to_string(),
    ] {
        let r = Stream::open(relay.addr, &format!("/stream?{q}"), &[]).err();
        let Some(Refused { status, body }) = r else {
            panic!("{q}: the stream opened (fail-open)");
        };
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid-filter")),
            "{q}"
        );
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains("filter, capture, from, live") && detail.contains("access_token"),
            "{q}: {detail}"
        );
    }
    // `live` is exactly `0` or `1`.
    for v in ["true", "false", "yes", "01", ""] {
        let r = Stream::open(relay.addr, &format!("/stream?live={v}"), &[]).err();
        let Some(Refused { status, body }) = r else {
            panic!("live={v} accepted");
        };
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid-filter"))
        );
        assert!(
            body["detail"].as_str().unwrap().contains("0 or 1"),
            "{body}"
        );
    }
    // The known ones (and `access_token`, read by auth) still open the stream.
    relay.post_ok(&[&ev(0, "a", 1), &ev(1, "b", 1)]);
    let all = enc(r#"[{"session":"a","seq":0},{"session":"b","seq":0}]"#);
    let mut s = Stream::open(
        relay.addr,
        &format!("/stream?filter={flt}&capture=full&from={all}&live=0&access_token=x"),
        &[],
    )
    .unwrap();
    assert_eq!(s.expect().data, ev(0, "a", 1));
    assert!(s.next().is_none());
}

#[test]
fn access_token_stays_allowed_with_auth_on() {
    let relay = TestRelay::with(|c| {
        c.auth = aep_relay::auth::Auth::new(Some("tok-1"), &[]);
    });
    let ok = Stream::open(relay.addr, "/stream?access_token=tok-1&live=0", &[]);
    assert!(ok.is_ok(), "{:?}", ok.err());
    let r = Stream::open(relay.addr, "/stream?access_token=tok-1&fliter=x", &[]).err();
    assert_eq!(r.map(|r| r.status), Some(400));
}

/// `n` positions of 64-byte sessions at `u64::MAX`, the widest the default head is sized
/// for, URL-encoded.
fn positions(n: usize) -> String {
    let v: Vec<serde_json::Value> = (0..n)
        .map(|i| serde_json::json!({"session": format!("{i:0>64}"), "epoch": u64::MAX, "seq": u64::MAX}))
        .collect();
    enc(&serde_json::Value::Array(v).to_string())
}

#[test]
fn max_from_positions_are_reachable_over_sse_with_the_default_config() {
    let relay = TestRelay::start();
    let ok = positions(aep_relay::config::DEFAULT_MAX_FROM);
    let mut s =
        Stream::open(relay.addr, &format!("/stream?live=0&from={ok}"), &[]).unwrap_or_else(|r| {
            panic!(
                "{} positions refused: {r:?}",
                aep_relay::config::DEFAULT_MAX_FROM
            )
        });
    assert!(s.next().is_none(), "nothing held, the replay ends");
    let over = positions(aep_relay::config::DEFAULT_MAX_FROM + 1);
    match Stream::open(relay.addr, &format!("/stream?live=0&from={over}"), &[]) {
        Err(Refused { status, body }) => {
            assert_eq!(
                (status, body["error"].as_str()),
                (400, Some("limit-exceeded")),
                "{body}"
            );
            assert!(
                body["detail"].as_str().unwrap().contains("AEP_MAX_FROM"),
                "{body}"
            );
        }
        Ok(_) => panic!("1001 positions accepted"),
    }
}

/// The head is parsed again only once a line feed arrives (linear work for a trickled
/// head): a head written a byte at a time, and one whose final LF comes alone, are
/// answered as usual, and garbage is refused before any line feed.
#[test]
fn a_head_trickled_byte_by_byte_is_answered() {
    let relay = TestRelay::start();
    let answer = |pieces: &[&[u8]]| -> u16 {
        let mut s = relay.tcp();
        s.set_nodelay(true).unwrap();
        for p in pieces {
            s.write_all(p).unwrap();
        }
        read_response(&mut s).0
    };
    let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: abc\r\n\r\n";
    let bytes: Vec<&[u8]> = head.chunks(1).collect();
    assert_eq!(answer(&bytes), 200);
    assert_eq!(answer(&[&head[..head.len() - 1], b"\n"]), 200);
    let mut s = relay.tcp();
    s.write_all(b"\x01\x02 garbage without a line feed")
        .unwrap();
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"HTTP/1.1 400");
}

#[test]
fn the_whatwg_parser_follows_the_standard() {
    let mut p = Parser::default();
    p.feed(b"\xEF\xBB\xBFevent: a\rid: 1\r\ndata: x\n\ndata:y\ndata\n\nid: 2\0\ndata: z\r\r: c\nfoo\ndata: w");
    let got: Vec<Message> = p.out.into_iter().collect();
    assert_eq!(
        got.len(),
        3,
        "the unfinished last message is not dispatched"
    );
    let view = |m: &Message| {
        (
            m.event_type.clone(),
            m.data.clone(),
            m.last_event_id.clone(),
        )
    };
    assert_eq!(view(&got[0]), ("a".into(), "x".into(), "1".into()));
    assert_eq!(view(&got[1]), ("message".into(), "y\n".into(), "1".into()));
    assert_eq!(
        view(&got[2]),
        ("message".into(), "z".into(), "1".into()),
        "a NUL id is ignored"
    );
    assert_eq!(got[2].fields[0], ("id".into(), "2\0".into()));
    // CRLF split across two reads is one line end.
    let mut p = Parser::default();
    p.feed(b"data: a\r");
    p.feed(b"\n\r\n");
    assert_eq!(p.out.len(), 1);
}

/// An empty `Last-Event-ID` names no session, so it is no resume position: the stream
/// opens live, as with no header (AEP-0003 §3.3 #3 "when present, is the resume position
/// for the session it names"; WHATWG SSE: an empty last event ID string means none).
/// A client that always sends the header, empty on its first connect, must not be
/// refused there.
#[test]
fn an_empty_last_event_id_opens_a_live_stream() {
    let relay = TestRelay::start();
    relay.post_ok(&[&ev(0, "held", 1)]);
    for empty in ["", " ", "\t"] {
        let got = Stream::open(relay.addr, "/stream?live=0", &[("Last-Event-ID", empty)])
            .unwrap_or_else(|r| panic!("Last-Event-ID {empty:?} refused: {r:?}"))
            .rest();
        assert!(got.is_empty(), "{empty:?} replayed {got:?}");
    }
}
