//! `aep-relay tail` against real relays: byte-identical JSONL on stdout, reconnection
//! across a relay restart with no duplicate and no gap (from `all` and from positions),
//! `--live=0`, `replay-exhausted` on stderr, a refused request ending with status 2.

use crate::support;
use std::process::{Child, Command, Stdio};
use support::*;

struct Tail {
    child: Child,
    out: Lines,
    err: Lines,
}

impl Tail {
    fn spawn(args: &[&str]) -> Tail {
        let mut child = Command::new(bin())
            .arg("tail")
            .args(args)
            .env_remove("AEP_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tail starts");
        let out = Lines::collect(child.stdout.take().unwrap(), "");
        let err = Lines::collect(child.stderr.take().unwrap(), "tail");
        Tail { child, out, err }
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn assert_no_duplicates(lines: &[String]) {
    let mut seen = std::collections::HashSet::new();
    for l in lines {
        assert!(seen.insert(l), "printed twice: {l}");
    }
}

#[test]
fn from_all_resumes_across_a_relay_restart_without_duplicates_or_gaps() {
    let dir = temp_dir("tail-all");
    let h = dir.join("h");
    let hist = ["--history", h.to_str().unwrap()];
    let mut relay = RelayProcess::spawn(&hist);
    let addr = relay.addr.to_string();
    let mut want: Vec<String> = (0..5).map(|i| ev("a", "s", i)).collect();
    want.extend((0..2).map(|i| ev("a", "t", i)));
    relay.post_ok(&want);
    let tail = Tail::spawn(&[&format!("http://{addr}"), "--from", "all"]);
    let got = tail.out.wait_count(want.len(), "the replay");
    let mut sorted = got.clone();
    sorted.sort();
    let mut w = want.clone();
    w.sort();
    assert_eq!(sorted, w, "replay of everything held, byte-identical");

    relay.kill();
    tail.err.wait("the disconnection", |l| {
        l.contains("aep-relay tail: disconnected")
    });
    let relay = RelayProcess::spawn_with(&hist, &[], false, &addr);
    // While tail is still away: more of `s`, and a session that began meanwhile.
    let more: Vec<String> = (5..8)
        .map(|i| ev("a", "s", i))
        .chain([ev("b", "u", 0)])
        .collect();
    relay.post_ok(&more);
    tail.err.wait("the reconnection", |l| {
        l.contains("aep-relay tail: reconnected; resuming from all")
    });
    let sentinel = ev("a", "s", 8);
    relay.post_ok(std::slice::from_ref(&sentinel));
    let n = want.len() + more.len() + 1;
    let lines = tail.out.wait_count(n, "the resumed stream");
    assert_eq!(
        lines[n - 1],
        sentinel,
        "nothing printed twice before the sentinel"
    );
    assert_no_duplicates(&lines);
    let mut all = want.clone();
    all.extend(more);
    all.push(sentinel);
    let (mut a, mut b) = (lines.clone(), all);
    a.sort();
    b.sort();
    assert_eq!(a, b, "no gap");
    // Per session, in order.
    let s: Vec<_> = lines
        .iter()
        .filter(|l| l.contains(r#""session":"s""#))
        .cloned()
        .collect();
    assert_eq!(s, (0..9).map(|i| ev("a", "s", i)).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn live_tail_resumes_from_its_last_positions_after_a_restart() {
    let dir = temp_dir("tail-live");
    let h = dir.join("h");
    let hist = ["--history", h.to_str().unwrap()];
    let mut relay = RelayProcess::spawn(&hist);
    let addr = relay.addr.to_string();
    let tail = Tail::spawn(&[&format!("http://{addr}/")]);
    tail.err.wait("the subscription", |l| {
        l.contains("aep-relay tail: following")
    });
    let first: Vec<String> = (0..3).map(|i| ev("a", "s", i)).collect();
    relay.post_ok(&first);
    assert_eq!(tail.out.wait_count(3, "live Events"), first);

    relay.kill();
    tail.err.wait("the disconnection", |l| {
        l.contains("aep-relay tail: disconnected")
    });
    let relay = RelayProcess::spawn_with(&hist, &[], false, &addr);
    let missed: Vec<String> = (3..6).map(|i| ev("a", "s", i)).collect();
    relay.post_ok(&missed);
    tail.err.wait("the reconnection", |l| {
        l.contains(r#"resuming from [{"session":"s","epoch":0,"seq":2}]"#)
    });
    let sentinel = ev("a", "s", 6);
    relay.post_ok(std::slice::from_ref(&sentinel));
    let lines = tail.out.wait_count(7, "the resumed stream");
    let want: Vec<String> = (0..7).map(|i| ev("a", "s", i)).collect();
    assert_eq!(lines, want, "no duplicate, no gap, in order");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn live_0_prints_the_replay_reports_exhaustion_and_exits() {
    let relay = RelayProcess::spawn(&["--buffer", "3"]);
    let lines: Vec<String> = (0..10).map(|i| ev("a", "s", i)).collect();
    relay.post_ok(&lines);
    let mut tail = Tail::spawn(&[
        &relay.url(""),
        "--from",
        r#"[{"session":"s","seq":1}]"#,
        "--live=0",
        "--filter",
        r#"{"type":["tool.*"]}"#,
        "--capture",
        "full",
    ]);
    let out = tail.out.wait_closed("tail's output");
    assert_eq!(out, lines[7..].to_vec());
    let err = tail.err.wait_closed("tail's errors");
    assert!(
        err.iter().any(|l| l.contains(
            "replay-exhausted: session s: the relay no longer holds the Events before 0:7"
        )),
        "{err:#?}"
    );
    assert!(tail.child.wait().unwrap().success());
}

#[test]
fn a_refused_request_exits_2_with_the_relays_answer() {
    let relay = RelayProcess::spawn(&[]);
    let mut tail = Tail::spawn(&[&relay.url(""), "--filter", r#"{"seq":5}"#]);
    let err = tail.err.wait_closed("tail's errors");
    assert!(
        err.iter()
            .any(|l| l.contains("HTTP 400") && l.contains("invalid-filter")),
        "{err:#?}"
    );
    assert_eq!(tail.child.wait().unwrap().code(), Some(2));
    // --live=0 against nothing: no endless retry.
    let addr = relay.addr.to_string();
    drop(relay);
    let mut gone = Tail::spawn(&[&format!("http://{addr}"), "--live=0"]);
    assert_eq!(gone.child.wait().unwrap().code(), Some(1));
    let mut bad = Tail::spawn(&["ftp://example.invalid"]);
    assert_eq!(bad.child.wait().unwrap().code(), Some(2));
    bad.err.wait("the reason", |l| {
        l.contains("expected an http:// or https:// URL")
    });
}

/// A sequenced Event in a hostile `session` (serde_json escapes it in the JSON text).
fn hostile_ev(tag: usize, session: &str, seq: u64) -> String {
    serde_json::json!({
        "aep": "0.1", "id": format!("h{tag}-{seq}"), "type": "tool.completed",
        "time": "2026-07-03T10:00:00Z", "source": "aep://test/agent/a/session/h",
        "agent": "a", "session": session, "seq": seq
    })
    .to_string()
}

/// `tail` reads each position from the SSE `id:` the relay escaped (`%XX`) and resumes
/// with exactly that session, whatever its bytes: an injected `data:` in a session is
/// not printed as an Event, and the Events posted while `tail` was away arrive once
/// (AEP-0003 §3.3.2, §7; `subscription::parse_last_event_id`).
#[test]
fn tail_resumes_hostile_sessions_exactly() {
    let sessions: Vec<String> = [
        "s1\ndata: {\"fake\":true}\n\nid: x",
        "a:b:0:1",
        "50%",
        "%0A",
        "back\\slash",
        "cr\rx",
        "nul\0x",
        "séance 会话 𝄞",
        " lead",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["\r\n%:é".repeat(171)])
    .collect();
    let dir = temp_dir("tail-hostile");
    let h = dir.join("h");
    let hist = ["--history", h.to_str().unwrap()];
    let mut relay = RelayProcess::spawn(&hist);
    let addr = relay.addr.to_string();
    let tail = Tail::spawn(&[&format!("http://{addr}")]);
    tail.err.wait("the subscription", |l| {
        l.contains("aep-relay tail: following")
    });
    let batch = |seqs: std::ops::Range<u64>| -> Vec<String> {
        sessions
            .iter()
            .enumerate()
            .flat_map(|(i, s)| seqs.clone().map(move |q| hostile_ev(i, s, q)))
            .collect()
    };
    let first = batch(0..3);
    relay.post_ok(&first);
    assert_eq!(tail.out.wait_count(first.len(), "live Events"), first);

    relay.kill();
    tail.err.wait("the disconnection", |l| {
        l.contains("aep-relay tail: disconnected")
    });
    // While tail is away, a relay it cannot reach keeps more Events in the same history.
    let missed = batch(3..5);
    let side = RelayProcess::spawn(&hist);
    side.post_ok(&missed);
    drop(side);
    let relay = RelayProcess::spawn_with(&hist, &[], false, &addr);
    let line = tail.err.wait("the reconnection", |l| {
        l.contains("aep-relay tail: reconnected; resuming from ")
    });
    let from: serde_json::Value =
        serde_json::from_str(line.split("resuming from ").nth(1).unwrap()).unwrap();
    let mut named: Vec<(String, u64)> = from
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["session"].as_str().unwrap().to_string(),
                p["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    named.sort();
    let mut want_from: Vec<(String, u64)> = sessions.iter().map(|s| (s.clone(), 2)).collect();
    want_from.sort();
    assert_eq!(named, want_from, "the resume names every session exactly");

    let sentinel = hostile_ev(99, "sentinel", 0);
    relay.post_ok(std::slice::from_ref(&sentinel));
    let n = first.len() + missed.len() + 1;
    let lines = tail.out.wait_count(n, "the resumed stream");
    assert_eq!(lines[n - 1], sentinel, "nothing else before the sentinel");
    assert_no_duplicates(&lines);
    let (mut got, mut want) = (lines[first.len()..n - 1].to_vec(), missed);
    got.sort();
    want.sort();
    assert_eq!(got, want, "the missed Events, once each");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `agent/session/seq` of an Event line, for short failure messages.
fn short(line: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let s = |k: &str| v[k].as_str().unwrap_or("?").to_string();
    format!("{}/{}/{}", s("agent"), s("session"), v["seq"])
}

/// Two emitters share the session name `s_shared` (AEP-0001 §5.2: two sessions that
/// share a name) at far-apart positions: `a` printed up to seq 50, `b` up to seq 3. A
/// resume position names only the bare session and the relay applies it to both streams
/// (AEP-0003 §7), so `tail` must name the lower of the two and skip, per stream, what it
/// already printed: every Event printed once, none missing, both for a live `tail`
/// (`from=[…]`) and for `--from all`; live backfill after the resume is not mistaken for
/// a replayed Event.
#[test]
fn same_named_sessions_of_two_emitters_resume_each_from_its_own_position() {
    let dir = temp_dir("tail-shared");
    let h = dir.join("h");
    let hist = ["--history", h.to_str().unwrap()];
    let mut relay = RelayProcess::spawn(&hist);
    let addr = relay.addr.to_string();
    let url = format!("http://{addr}");
    let live = Tail::spawn(&[&url]);
    let all = Tail::spawn(&[&url, "--from", "all"]);
    for t in [&live, &all] {
        t.err.wait("the subscription", |l| {
            l.contains("aep-relay tail: following")
        });
    }
    let s = "s_shared";
    let mut first: Vec<String> = (0..=50).map(|q| ev("a", s, q)).collect();
    first.extend((0..=3).map(|q| ev("b", s, q)));
    relay.post_ok(&first);
    for t in [&live, &all] {
        assert_eq!(t.out.wait_count(first.len(), "live Events"), first);
    }

    relay.kill();
    for t in [&live, &all] {
        t.err.wait("the disconnection", |l| {
            l.contains("aep-relay tail: disconnected")
        });
    }
    // While both tails are away, a relay they cannot reach keeps more of both streams in
    // the same history, so the resumed replay (not live delivery) must carry them.
    let missed: Vec<String> = (51..54)
        .map(|q| ev("a", s, q))
        .chain((4..7).map(|q| ev("b", s, q)))
        .collect();
    let side = RelayProcess::spawn(&hist);
    side.post_ok(&missed);
    drop(side);
    let relay = RelayProcess::spawn_with(&hist, &[], false, &addr);
    let line = live.err.wait("the reconnection", |l| {
        l.contains("aep-relay tail: reconnected; resuming from ")
    });
    all.err.wait("the reconnection", |l| {
        l.contains("aep-relay tail: reconnected; resuming from all")
    });

    let sentinel = ev("a", "sentinel", 0);
    relay.post_ok(std::slice::from_ref(&sentinel));
    let mut want = first.clone();
    want.extend(missed);
    want.push(sentinel.clone());
    for (what, t) in [("live", &live), ("--from all", &all)] {
        t.out
            .wait(&format!("the sentinel ({what})"), |l| l == sentinel);
        let lines = t.out.snapshot();
        assert_no_duplicates(&lines);
        assert_eq!(lines.last(), Some(&sentinel), "{what}: nothing after it");
        let missing: Vec<String> = want
            .iter()
            .filter(|w| !lines.contains(w))
            .map(|l| short(l))
            .collect();
        let extra: Vec<String> = lines
            .iter()
            .filter(|l| !want.contains(l))
            .map(|l| short(l))
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{what}: every Event of both streams, once; missing {missing:?}, extra {extra:?}"
        );
        for (agent, n) in [("a", 54), ("b", 7)] {
            let tag = format!(r#""source":"aep://test/agent/{agent}/session/{s}""#);
            let got: Vec<_> = lines
                .iter()
                .filter(|l| l.contains(&tag))
                .map(|l| short(l))
                .collect();
            let want: Vec<_> = (0..n).map(|q| short(&ev(agent, s, q))).collect();
            assert_eq!(got, want, "{what}: stream {agent} in order");
        }
    }
    assert!(
        line.ends_with(r#"resuming from [{"session":"s_shared","epoch":0,"seq":3}]"#),
        "the bare name once, at the lower stream's position: {line}"
    );
    // Live backfill (AEP-0001 §7 #2: a not-yet-seen position below the high-water)
    // after the resume is printed: only what was printed before it is skipped.
    let late = [ev("a", s, 55), ev("a", s, 54), ev("b", s, 8), ev("b", s, 7)];
    let sentinel2 = ev("a", "sentinel", 1);
    let mut batch = late.to_vec();
    batch.push(sentinel2.clone());
    relay.post_ok(&batch);
    for (what, t) in [("live", &live), ("--from all", &all)] {
        t.out
            .wait(&format!("the second sentinel ({what})"), |l| l == sentinel2);
        let lines = t.out.snapshot();
        let tail: Vec<String> = lines[want.len()..].iter().map(|l| short(l)).collect();
        let expect: Vec<String> = batch.iter().map(|l| short(l)).collect();
        assert_eq!(
            tail, expect,
            "{what}: the backfill printed, in arrival order"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
