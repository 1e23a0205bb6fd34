//! Durable history through the real binary (`--history DIR`): files hold the original
//! bytes, a SIGKILLed relay restarts with the exact replay tail, a torn last line is
//! ignored, hostile agent/session names stay inside DIR without colliding, and a history
//! that cannot be written answers 503 instead of accepting (AEP-0003 §3.1, §5, §7, §9.6).

use crate::support;
use aep_relay::history::{decode_component, Decoded};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use support::*;

/// What a consumer resuming from `seq` of session `s` gets: (comments, data).
fn resume(relay: &RelayProcess, session: &str, seq: u64) -> (Vec<String>, Vec<String>) {
    let from = enc(&format!(
        r#"[{{"session":"{session}","epoch":0,"seq":{seq}}}]"#
    ));
    let msgs = relay.sse(&format!("from={from}&live=0"), &[]).rest();
    let comments = msgs.iter().flat_map(|m| m.comments.clone()).collect();
    (comments, msgs.into_iter().map(|m| m.data).collect())
}

#[test]
fn a_sigkilled_relay_restarts_with_the_exact_tail() {
    let dir = temp_dir("restart");
    let h = dir.join("h");
    let args = [
        "--history",
        h.to_str().unwrap(),
        "--buffer",
        "5",
        "--fsync",
        "batch",
    ];
    let mut relay = RelayProcess::spawn(&args);
    let lines: Vec<String> = (0..12).map(|i| ev("a", "s", i)).collect();
    for chunk in lines.chunks(4) {
        relay.post_ok(chunk);
    }
    let heartbeat = r#"{"aep":"0.1","id":"hb","type":"agent.heartbeat","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/a","agent":"a"}"#;
    relay.post_ok(&[heartbeat.to_string()]);
    // A redelivery is not written twice.
    relay.post_ok(&lines[10..]);
    assert_eq!(
        fs::read_to_string(h.join("a/s.jsonl")).unwrap(),
        lines.join("\n") + "\n",
        "one line per Event, the original bytes; agent-scoped Events are not kept"
    );
    let before: Vec<_> = [0, 2, 6, 8, 11]
        .iter()
        .map(|&q| resume(&relay, "s", q))
        .collect();
    let all_before = relay.replay_all();

    relay.kill();
    let relay = RelayProcess::spawn(&args);
    relay.stderr.wait("the rebuild report", |l| {
        l.contains("1 of 1 session files read, 12 Events offered")
    });
    let after: Vec<_> = [0, 2, 6, 8, 11]
        .iter()
        .map(|&q| resume(&relay, "s", q))
        .collect();
    assert_eq!(after, before, "every resume answers as before the restart");
    assert_eq!(relay.replay_all(), all_before);
    assert_eq!(after[1].0, vec!["replay-exhausted s 0:7".to_string()]);
    assert_eq!(after[1].1, lines[7..].to_vec());
    assert_eq!(after[3], (vec![], lines[9..].to_vec()));
    assert_eq!(after[4], (vec![], vec![]));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_torn_last_line_is_ignored_and_cut_off() {
    let dir = temp_dir("torn");
    let h = dir.join("h");
    let args = ["--history", h.to_str().unwrap()];
    let mut relay = RelayProcess::spawn(&args);
    let lines: Vec<String> = (0..3).map(|i| ev("a", "s", i)).collect();
    relay.post_ok(&lines);
    relay.kill();
    // A crash in the middle of a write.
    let file = h.join("a/s.jsonl");
    let mut f = OpenOptions::new().append(true).open(&file).unwrap();
    f.write_all(&ev("a", "s", 3).as_bytes()[..40]).unwrap();
    drop(f);
    let relay = RelayProcess::spawn(&args);
    relay.stderr.wait("the torn-line warning", |l| {
        l.contains("s.jsonl: ignoring an unterminated last line (40 bytes")
    });
    assert_eq!(relay.replay_all(), lines);
    let next = ev("a", "s", 3);
    relay.post_ok(std::slice::from_ref(&next));
    let mut want = lines.clone();
    want.push(next);
    assert_eq!(fs::read_to_string(&file).unwrap(), want.join("\n") + "\n");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn hostile_names_stay_inside_the_directory_without_collisions() {
    let dir = temp_dir("hostile");
    let h = dir.join("h");
    let args = ["--history", h.to_str().unwrap()];
    let long = "L".repeat(300) + &"é".repeat(200);
    let long2 = "L".repeat(300) + &"é".repeat(199) + "e";
    let names: Vec<(&str, &str)> = vec![
        ("..", ".."),
        (".", "."),
        ("../../etc", "passwd"),
        ("/abs", "/etc/shadow"),
        ("a/../../b", "x/../../../y"),
        ("ok", "..\\..\\win"),
        ("ok", "Session"),
        ("ok", "session"),
        ("ok", "SESSION"),
        ("ok", "nul\u{0}byte"),
        ("ok", "new\nline"),
        ("ok", "%2F"),
        ("ok", "~"),
        ("ok", ".hidden"),
        ("ok", "ÉTÉ"),
        ("ok", "été"),
        ("ok", "e\u{301}te\u{301}"),
        ("ok", "😀"),
        ("ok", " "),
        ("ok", &long),
        ("ok", &long2),
        (&long, "s"),
    ];
    let events: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, (a, s))| {
            serde_json::json!({
                "aep": "0.1", "id": format!("h{i}"), "type": "tool.completed",
                "time": "2026-07-03T10:00:00Z", "source": "aep://test/agent/x",
                "agent": a, "session": s, "seq": 0
            })
            .to_string()
        })
        .collect();
    let mut relay = RelayProcess::spawn(&args);
    relay.post_ok(&events);
    let files = files_under(&h);
    assert_eq!(
        files.len(),
        names.len(),
        "one file per (agent, session): {files:#?}"
    );
    let root = fs::canonicalize(&h).unwrap();
    let mut folded = std::collections::HashSet::new();
    for f in &files {
        let real = fs::canonicalize(f).unwrap();
        assert!(
            real.starts_with(&root),
            "{} escapes {}",
            real.display(),
            root.display()
        );
        let rel = real.strip_prefix(&root).unwrap();
        assert_eq!(rel.components().count(), 2, "{}", rel.display());
        assert!(rel.to_str().unwrap().is_ascii(), "{}", rel.display());
        assert!(
            folded.insert(rel.to_str().unwrap().to_lowercase()),
            "case-insensitive collision: {}",
            rel.display()
        );
        let name = f.file_name().unwrap().to_str().unwrap();
        assert!(name.len() <= 255, "NAME_MAX: {name}");
        // The mapping is reversible: the name decodes to the line's own session.
        let line = fs::read_to_string(f).unwrap();
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        let session = v["session"].as_str().unwrap();
        match decode_component(name.strip_suffix(".jsonl").unwrap()).unwrap() {
            Decoded::Exact(s) => assert_eq!(s, session),
            Decoded::Long { prefix, .. } => assert!(session.as_bytes().starts_with(&prefix)),
        }
        assert_eq!(line.lines().count(), 1);
    }
    assert!(
        fs::read_dir(&dir).unwrap().count() == 1,
        "nothing written beside DIR"
    );
    // And it all comes back after a restart.
    relay.kill();
    let relay = RelayProcess::spawn(&args);
    let mut held = relay.replay_all();
    held.sort();
    let mut want = events.clone();
    want.sort();
    assert_eq!(held, want);
    let _ = fs::remove_dir_all(&dir);
}

fn answer(relay: &RelayProcess, lines: &[String]) -> (u16, String) {
    let (status, json) = relay.post_lines(lines);
    (
        status,
        json["error"].as_str().unwrap_or_default().to_string(),
    )
}

#[test]
fn an_unwritable_history_answers_503_and_keeps_nothing_of_the_batch() {
    let dir = temp_dir("full");
    let h = dir.join("h");
    fs::create_dir_all(h.join("a")).unwrap();
    // /dev/full answers every write with ENOSPC, as a full disk does.
    std::os::unix::fs::symlink("/dev/full", h.join("a/full.jsonl")).unwrap();
    // A regular file where an agent directory should be: ENOTDIR.
    fs::write(h.join("blocked"), b"").unwrap();
    let relay = RelayProcess::spawn(&["--history", h.to_str().unwrap()]);
    let mut live = relay.sse("", &[]);
    let ok0 = ev("a", "ok", 0);
    relay.post_ok(std::slice::from_ref(&ok0));
    assert_eq!(live.expect().data, ok0);

    let ok1 = ev("a", "ok", 1);
    assert_eq!(
        answer(&relay, &[ok1.clone(), ev("a", "full", 0)]),
        (503, "history-unavailable".into())
    );
    assert_eq!(
        answer(&relay, &[ev("blocked", "s", 0)]),
        (503, "history-unavailable".into())
    );
    assert_eq!(
        fs::read_to_string(h.join("a/ok.jsonl")).unwrap(),
        ok0.clone() + "\n",
        "the refused batch's first Event was cut back"
    );
    // Nothing of the refused batches was published or buffered.
    let ok2 = ev("a", "ok", 2);
    relay.post_ok(std::slice::from_ref(&ok2));
    assert_eq!(
        live.expect().data,
        ok2,
        "no refused Event was fanned out before it"
    );
    assert_eq!(relay.replay_all(), vec![ok0, ok2]);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn jsonl_ingest_pauses_while_the_history_fails_and_resumes_after() {
    let dir = temp_dir("pause");
    let h = dir.join("h");
    fs::create_dir_all(h.join("a")).unwrap();
    let full = h.join("a/full.jsonl");
    std::os::unix::fs::symlink("/dev/full", &full).unwrap();
    let mut relay = RelayProcess::spawn_with(
        &["--stdin", "--history", h.to_str().unwrap()],
        &[],
        true,
        "127.0.0.1:0",
    );
    let mut live = relay.sse("", &[]);
    let lines = [ev("a", "full", 0), ev("a", "ok", 0)];
    let mut stdin = relay.stdin.take().unwrap();
    writeln!(stdin, "{}\n{}", lines[0], lines[1]).unwrap();
    stdin.flush().unwrap();
    relay
        .stderr
        .wait("the pause", |l| l.contains("JSONL ingest paused"));
    // The disk is "freed": the retry (every second) goes through, in order.
    fs::remove_file(&full).unwrap();
    relay
        .stderr
        .wait("the resumption", |l| l.contains("JSONL ingest resumed"));
    assert_eq!(live.expect().data, lines[0]);
    assert_eq!(live.expect().data, lines[1]);
    assert!(Path::new(&full).is_file());
    drop(stdin);
    let _ = fs::remove_dir_all(&dir);
}

/// One writer per history directory: a second relay on the same `--history DIR` exits
/// non-zero naming `DIR` and the holder's PID, and once the holder is gone (even by
/// SIGKILL: the kernel drops its `flock`) a new relay starts on it.
#[test]
fn a_second_relay_on_the_same_history_refuses_to_start() {
    let dir = temp_dir("locked");
    let h = dir.join("h");
    let args = ["--history", h.to_str().unwrap()];
    let mut first = RelayProcess::spawn(&args);
    first.post_ok(&[ev("a", "s", 0)]);

    let mut child = std::process::Command::new(bin())
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::collect(child.stderr.take().unwrap(), "second");
    // Killed on drop, should it run instead of exiting.
    let mut refused = RelayProcess {
        child,
        addr: "127.0.0.1:0".parse().unwrap(),
        stderr: lines,
        stdin: None,
    };
    let stderr = refused
        .stderr
        .wait_closed("the second relay's stderr")
        .join("\n");
    let status = refused.child.wait().unwrap();
    assert!(!status.success(), "the second relay ran: {stderr}");
    assert!(
        !stderr.contains("aep-relay listening on"),
        "the second relay started listening: {stderr}"
    );
    let pid = first.child.id();
    assert!(
        stderr.contains(&format!(
            "history {}: already in use by process {pid}",
            h.display()
        )),
        "the error names DIR and the holder's PID {pid}: {stderr}"
    );
    assert_eq!(
        fs::read_to_string(h.join("a/s.jsonl")).unwrap(),
        ev("a", "s", 0) + "\n",
        "the refused relay wrote nothing"
    );

    first.kill();
    let second = RelayProcess::spawn(&args);
    assert_eq!(second.replay_all(), vec![ev("a", "s", 0)]);
    assert_eq!(
        fs::read_to_string(h.join(aep_relay::history::LOCK_FILE)).unwrap(),
        format!("{}\n", second.child.id()),
        "the lock file names its new holder"
    );
    let _ = fs::remove_dir_all(&dir);
}

/// A pretty-printed Event (one `application/json` body, JSON whitespace with LF and CR
/// between members) is one history line, so a restart still replays it (AEP-0003 §3.1.1:
/// one Event per line; §5, §9.6). Before, its raw line breaks split it over three
/// lines: the rebuild skipped them as invalid and the accepted Event was lost.
#[test]
fn a_pretty_printed_event_survives_a_restart() {
    let dir = temp_dir("pretty");
    let h = dir.join("h");
    let args = ["--history", h.to_str().unwrap()];
    let mut relay = RelayProcess::spawn(&args);
    let pretty =
        ev("a", "s", 1)
            .replacen(',', ",\n  ", 1)
            .replacen(",\"type\"", ",\r\n\"type\"", 1);
    assert!(pretty.contains('\n') && pretty.contains('\r'), "{pretty}");
    let resp = agent()
        .post(&relay.url("/events"))
        .set("AEP-Version", "0.1")
        .set("Content-Type", "application/json")
        .send_string(&pretty)
        .expect("202");
    assert_eq!(resp.status(), 202);
    relay.post_ok(&[ev("a", "s", 2)]);
    let before = relay.replay_all();
    assert_eq!(before.len(), 2, "{before:?}");
    let file = fs::read_to_string(h.join("a/s.jsonl")).unwrap();
    assert_eq!(file.lines().count(), 2, "one line per Event: {file:?}");
    assert!(!file.contains('\r'), "{file:?}");

    relay.kill();
    let relay = RelayProcess::spawn(&args);
    assert_eq!(
        relay.replay_all(),
        before,
        "the same Events after the restart"
    );
    let _ = fs::remove_dir_all(&dir);
}
