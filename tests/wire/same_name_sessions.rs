//! Two emitters carrying the same `session` string are two sessions (AEP-0001 §5.2:
//! "distinct sessions that happen to share a name"; consumers key per-session state by
//! `(source, session)`). The relay keeps one replay buffer per owning stream
//! `(source, session)`, while a resume position still names the bare session
//! (AEP-0001 §7 #6) and applies to every stream of that name (AEP-0003 §7).
//!
//! The golden corpus carries exactly such a pair (`s_shared` from `alpha-agent` and from
//! `beta-agent`, both at seq 0): every sequenced golden Event must come back from
//! `from=all`, byte-identical, live and after a SIGKILL restart with `--history`.

use crate::support;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use support::{enc, Endpoint, TestRelay, Ws};

const A: &str = "aep://host-a/agent/a/session/s";
const B: &str = "aep://host-b/agent/a/session/s";

/// A sequenced Event of `source`'s stream of session `s` at (0, `seq`). Both emitters
/// mint the same ids (legal: ids are unique per emitter, AEP-0001 §5.1 #2).
fn of(source: &str, seq: u64) -> String {
    json!({
        "aep": "0.1", "id": format!("e{seq}"), "type": "tool.completed",
        "time": "2026-07-03T10:00:00Z", "source": source, "agent": "a",
        "session": "s", "seq": seq
    })
    .to_string()
}

/// `(comments, data)` of a `live=0` stream opened with `query`.
fn replay(relay: &TestRelay, query: &str, headers: &[(&str, &str)]) -> (Vec<String>, Vec<String>) {
    let msgs = relay.sse(&format!("{query}&live=0"), headers).rest();
    let comments = msgs.iter().flat_map(|m| m.comments.clone()).collect();
    (comments, msgs.into_iter().map(|m| m.data).collect())
}

fn from(session: &str, seq: u64) -> String {
    format!(
        "from={}",
        enc(&json!([{"session": session, "epoch": 0, "seq": seq}]).to_string())
    )
}

/// AEP-0001 §7 #6, AEP-0003 §3.3 #3, §6.5, §7: a bare resume position applies to every
/// owning stream of its name, strictly after it in each, on `from`, `Last-Event-ID` and
/// the WS `subscribe.from` alike.
#[test]
fn a_bare_position_resumes_every_stream_of_its_name() {
    let relay = TestRelay::start();
    let a: Vec<String> = (0..5).map(|q| of(A, q)).collect();
    let b: Vec<String> = (0..3).map(|q| of(B, q)).collect();
    let mut batch: Vec<&str> = a.iter().map(String::as_str).collect();
    batch.extend(b.iter().map(String::as_str));
    relay.post_ok(&batch);

    let want = vec![a[2].clone(), a[3].clone(), a[4].clone(), b[2].clone()];
    assert_eq!(replay(&relay, &from("s", 1), &[]), (vec![], want.clone()));
    assert_eq!(
        replay(&relay, "", &[("Last-Event-ID", "s:0:1")]),
        (vec![], want.clone())
    );
    // Named twice: each stream once, after the lower position (at-least-once).
    let twice = enc(&json!([{"session": "s", "seq": 3}, {"session": "s", "seq": 1}]).to_string());
    assert_eq!(
        replay(&relay, &format!("from={twice}"), &[]),
        (vec![], want.clone())
    );

    let mut ws = Ws::consumer(&relay);
    ws.subscribe(
        "r",
        json!({"from": [{"session": "s", "epoch": 0, "seq": 1}]}),
    );
    for line in &want {
        assert_eq!(&ws.recv_text(), line);
    }
    // Nothing else: the next frame is a later Event.
    let next = of(B, 9);
    relay.post_ok(&[&next]);
    assert_eq!(ws.recv_text(), next);
}

/// AEP-0003 §5: ring eviction and `replay-exhausted` are per owning stream. The busy
/// emitter's evictions mark its own stream only (the WS frame names its `source`); the
/// quiet emitter's stream of the same name replays whole, unmarked.
#[test]
fn eviction_and_replay_exhausted_are_per_stream() {
    let relay = TestRelay::with(|c| c.buffer_per_session = 2);
    let a: Vec<String> = (0..5).map(|q| of(A, q)).collect();
    let b: Vec<String> = (0..2).map(|q| of(B, q)).collect();
    let mut batch: Vec<&str> = a.iter().map(String::as_str).collect();
    batch.extend(b.iter().map(String::as_str));
    relay.post_ok(&batch);

    let msgs = relay.sse(&format!("{}&live=0", from("s", 0)), &[]).rest();
    let got: Vec<(Vec<String>, String)> = msgs.into_iter().map(|m| (m.comments, m.data)).collect();
    assert_eq!(
        got,
        vec![
            (vec!["replay-exhausted s 0:3".to_string()], a[3].clone()),
            (vec![], a[4].clone()),
            (vec![], b[1].clone()),
        ]
    );

    let mut ws = Ws::consumer(&relay);
    ws.subscribe("r", json!({"from": [{"session": "s", "seq": 0}]}));
    assert_eq!(
        ws.recv(),
        json!({"type": "replay-exhausted", "sub": "r", "session": "s",
               "earliest": {"epoch": 0, "seq": 3}, "source": A})
    );
    for line in [&a[3], &a[4], &b[1]] {
        assert_eq!(&ws.recv_text(), line);
    }
    let next = of(B, 9);
    relay.post_ok(&[&next]);
    assert_eq!(ws.recv_text(), next, "one marker only");
}

/// `--max-sessions` counts owning streams: a new stream evicts the least-recently-written
/// stream, here one of the two sharing `s`, and the other stays whole.
#[test]
fn max_sessions_counts_owning_streams() {
    let relay = TestRelay::with(|c| c.max_sessions = 2);
    let (a0, b5, a1) = (of(A, 0), of(B, 5), of(A, 1));
    let t0 = support::event("t", 0, 0, "run.started", "");
    relay.post_ok(&[&a0, &b5, &a1, &t0]);
    assert_eq!(
        replay(&relay, "from=all", &[]),
        (vec![], vec![a0, a1, t0]),
        "b's stream was least recently written"
    );
}

/// AEP-0001 §7 #2: a position conflict is an emitter fault within one stream. The other
/// emitter's Event at that position is held; the second Event of the same stream at it
/// is not.
#[test]
fn a_conflict_is_detected_within_one_stream_only() {
    let relay = TestRelay::start();
    let a0 = of(A, 0);
    let b0 = of(B, 0);
    let a0_again = a0.replace("\"e0\"", "\"e0-other\"");
    assert_ne!(a0, a0_again);
    relay.post_ok(&[&a0, &b0, &a0_again]);
    assert_eq!(replay(&relay, "from=all", &[]), (vec![], vec![a0, b0]));
}

/// AEP-0003 §3.5 #4: the `closing` frame gives the last position delivered per owning
/// stream, naming its `source`, so a consumer of two same-named sessions resumes both.
#[test]
fn closing_names_the_last_position_per_owning_stream() {
    let relay = TestRelay::with(|c| {
        c.heartbeat = Duration::from_secs(1);
        c.ws_idle_timeout = Duration::from_secs(2);
    });
    let mut ws = Ws::consumer(&relay);
    ws.subscribe("s", json!({"filter": {"session": "s"}}));
    let lines = [of(A, 4), of(B, 7), of(A, 5)];
    relay.post_ok(&[&lines[0], &lines[1], &lines[2]]);
    for l in &lines {
        assert_eq!(&ws.recv_text(), l);
    }
    let (code, frames) = ws.until_close();
    assert_eq!(code, Some(1001));
    let closing = frames.last().expect("a closing frame");
    assert_eq!(closing["type"], "closing", "{frames:?}");
    assert_eq!(
        closing["delivered"],
        json!([
            {"sub": "s", "session": "s", "source": A, "epoch": 0, "seq": 5},
            {"sub": "s", "session": "s", "source": B, "epoch": 0, "seq": 7},
        ])
    );
}

/// `/status` lists one row per owning stream with its `source` and `agent`.
#[cfg(feature = "status-page")]
#[test]
fn status_lists_each_owning_stream() {
    let relay = TestRelay::start();
    relay.post_ok(&[&of(A, 0), &of(B, 0)]);
    let (_, s) = support::status_json(support::agent().get(&relay.url("/status")).call());
    assert_eq!(s["sessions"]["count"], 2);
    let rows: Vec<(Value, Value, Value)> = s["sessions"]["recent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["session"].clone(),
                r["source"].clone(),
                r["agent"].clone(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (json!("s"), json!(A), json!("a")),
            (json!("s"), json!(B), json!("a")),
        ]
    );
}

// ---- the golden corpus through the real binary, with a SIGKILL restart ----

/// The golden lines HTTP accepts (commands are refused there, AEP-0004 §4.1).
fn golden_postable() -> Vec<String> {
    let path = support::shared("aep-fixtures/golden/golden.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            !matches!(
                v["type"].as_str(),
                Some(
                    "control.cancel"
                        | "control.pause"
                        | "control.resume"
                        | "control.attention.respond"
                )
            )
        })
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 62, "the golden corpus changed");
    lines
}

/// The stream key `(source, session)` and position of a sequenced line.
fn stream_of(line: &str) -> Option<((String, String), (u64, u64))> {
    let v: Value = serde_json::from_str(line).unwrap();
    let seq = v["seq"].as_u64()?;
    Some((
        (
            v["source"].as_str()?.to_string(),
            v["session"].as_str()?.to_string(),
        ),
        (v["epoch"].as_u64().unwrap_or(0), seq),
    ))
}

/// What `from=all&live=0` replays of the sequenced golden Events, per owning stream in
/// replay order, after checking every message is an input line byte for byte and every
/// `id:` names its position.
fn replayed_streams(
    relay: &support::RelayProcess,
    input: &[String],
) -> BTreeMap<(String, String), Vec<String>> {
    let mut streams: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for m in relay.sse("from=all&live=0", &[]).rest() {
        assert!(
            input.contains(&m.data),
            "replayed bytes differ from every posted line: {}",
            m.data
        );
        let Some((key, (epoch, seq))) = stream_of(&m.data) else {
            assert_eq!(m.id, None, "an unsequenced Event carries no id");
            continue;
        };
        assert_eq!(m.id, Some(format!("{}:{epoch}:{seq}", key.1)));
        streams.entry(key).or_default().push(m.data);
    }
    streams
}

#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn the_golden_corpus_replays_every_sequenced_event_live_and_after_a_sigkill() {
    let lines = golden_postable();
    // What each owning stream must replay: its lines in (epoch, seq) order.
    type Positioned = Vec<(u64, u64, String)>;
    let mut want: BTreeMap<(String, String), Positioned> = BTreeMap::new();
    for l in &lines {
        if let Some((key, (e, q))) = stream_of(l) {
            want.entry(key).or_default().push((e, q, l.clone()));
        }
    }
    let want: BTreeMap<(String, String), Vec<String>> = want
        .into_iter()
        .map(|(k, mut v)| {
            v.sort();
            (k, v.into_iter().map(|(_, _, l)| l).collect())
        })
        .collect();
    assert_eq!(want.values().map(Vec::len).sum::<usize>(), 57);
    let shared: Vec<&(String, String)> = want.keys().filter(|k| k.1 == "s_shared").collect();
    assert_eq!(shared.len(), 2, "the corpus's two s_shared emitters");

    let dir = support::temp_dir("golden-streams");
    let h = dir.join("h");
    let args = ["--history", h.to_str().unwrap()];
    let mut relay = support::RelayProcess::spawn(&args);
    relay.post_ok(&lines);
    let live = replayed_streams(&relay, &lines);
    assert_eq!(
        live, want,
        "every sequenced golden Event, per stream, in order"
    );
    let status = status_streams(&relay);
    assert!(status.contains(&(
        "s_shared".into(),
        json!("aep://host-c/agent/alpha-agent/session/s_shared"),
        json!("alpha-agent")
    )));
    assert!(status.contains(&(
        "s_shared".into(),
        json!("aep://host-d/agent/beta-agent/session/s_shared"),
        json!("beta-agent")
    )));

    relay.kill();
    let relay = support::RelayProcess::spawn(&args);
    relay
        .stderr
        .wait("the rebuild report", |l| l.contains("session files read"));
    assert_eq!(
        replayed_streams(&relay, &lines),
        want,
        "the same after the restart"
    );
    assert_eq!(status_streams(&relay), status);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/status` rows as (session, source, agent), sorted.
fn status_streams(relay: &support::RelayProcess) -> Vec<(String, Value, Value)> {
    let body = support::get_text(&relay.url("/status"));
    let s: Value = serde_json::from_str(&body).unwrap();
    let mut rows: Vec<(String, Value, Value)> = s["sessions"]["recent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["session"].as_str().unwrap().to_string(),
                r["source"].clone(),
                r["agent"].clone(),
            )
        })
        .collect();
    rows.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    rows
}

/// `--history` keeps one file per agent and session name, so two emitters of one agent
/// that share a session name share a file. The rebuild splits it into both streams again,
/// each with its exact tail and `replay-exhausted` answers, whether the newest lines of
/// the file hold both streams or only one.
#[test]
fn one_history_file_of_two_streams_rebuilds_both_exactly() {
    let dir = support::temp_dir("shared-file");
    let h = dir.join("h");
    // Buffer 3: the rebuild reads the newest 2 × 3 + 16 = 22 lines of a file first.
    let args = ["--history", h.to_str().unwrap(), "--buffer", "3"];
    let mut relay = support::RelayProcess::spawn(&args);
    // b's stream first and short, then a long run of a's: the newest lines miss b.
    let mut lines = vec![of(B, 0), of(B, 1)];
    lines.extend((0..30).map(|q| of(A, q)));
    // And interleaved, in another session name of the same two emitters.
    let t = |source: &str, q: u64| {
        of(source, q)
            .replace("\"session\":\"s\"", "\"session\":\"t\"")
            .replace("\"id\":\"e", "\"id\":\"t-e")
    };
    for q in 0..10 {
        lines.push(t(A, q));
        lines.push(t(B, q));
    }
    relay.post_ok(&lines);
    assert_eq!(support::files_under(&h).len(), 2, "a/s.jsonl and a/t.jsonl");

    let resume = |relay: &support::RelayProcess, session: &str, seq: u64| {
        let msgs = relay
            .sse(&format!("{}&live=0", from(session, seq)), &[])
            .rest();
        msgs.into_iter()
            .map(|m| (m.comments, m.data))
            .collect::<Vec<_>>()
    };
    let points = [0, 1, 5, 7, 27, 28, 29];
    let before: Vec<_> = points
        .iter()
        .flat_map(|&q| [resume(&relay, "s", q), resume(&relay, "t", q)])
        .collect();
    let all_before = relay.replay_all();
    // Both streams of `s` are there live, in the order they began: b's whole, then a's
    // tail with its marker.
    assert_eq!(
        before[0],
        vec![
            (vec![], of(B, 1)),
            (vec!["replay-exhausted s 0:27".to_string()], of(A, 27)),
            (vec![], of(A, 28)),
            (vec![], of(A, 29)),
        ]
    );

    relay.kill();
    let relay = support::RelayProcess::spawn(&args);
    relay
        .stderr
        .wait("the rebuild report", |l| l.contains("session files read"));
    let after: Vec<_> = points
        .iter()
        .flat_map(|&q| [resume(&relay, "s", q), resume(&relay, "t", q)])
        .collect();
    assert_eq!(after, before, "every resume answers as before the restart");
    assert_eq!(relay.replay_all(), all_before, "replay-all order included");
    let _ = std::fs::remove_dir_all(&dir);
}
