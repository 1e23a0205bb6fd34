//! JSONL ingest through the real binary (AEP-0003 §3.1): `--stdin` and `--ingest-file`,
//! per-line validation, reports with source and line number, unsupported versions
//! reported once, commands refused, a followed file's growth, truncation and replacement.

use crate::support;
use std::fs::{self, OpenOptions};
use std::io::Write;
use support::*;

fn count(lines: &[String], needle: &str) -> usize {
    lines.iter().filter(|l| l.contains(needle)).count()
}

fn command_line() -> String {
    r#"{"aep":"0.1","id":"c1","type":"control.cancel","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/ops","agent":"ops","session":"s","data":{"scope":"run"}}"#.to_string()
}

#[test]
fn stdin_is_ingested_line_by_line_and_bad_lines_are_reported() {
    let mut relay = RelayProcess::spawn_with(&["--stdin"], &[], true, "127.0.0.1:0");
    let mut stream = relay.sse("", &[]);
    let e: Vec<String> = (0..3).map(|i| ev("a", "s", i)).collect();
    let v1 = |i: u64| ev("a", "s", 100 + i).replace(r#""aep":"0.1""#, r#""aep":"1.0""#);
    let input = [
        e[0].clone(),
        "garbage".into(),
        v1(0),
        v1(1),
        command_line(),
        e[1].clone(),
        String::new(),
        v1(2),
        e[2].clone(),
    ]
    .join("\n");
    let mut stdin = relay.stdin.take().unwrap();
    // The last line has no `\n`: at the end of input it still counts.
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    for want in &e {
        assert_eq!(&stream.expect().data, want, "byte-identical, in order");
    }
    relay.stderr.wait("the end of standard input", |l| {
        l.contains("standard input ended; the relay keeps running")
    });
    let log = relay.stderr.snapshot();
    assert_eq!(
        count(&log, "<stdin>:2: invalid Event skipped"),
        1,
        "{log:#?}"
    );
    assert_eq!(count(&log, "unsupported envelope version"), 1, "{log:#?}");
    assert_eq!(
        count(
            &log,
            r#"<stdin>:3: skipping lines with unsupported envelope version `aep` = "1.0""#
        ),
        1
    );
    assert_eq!(
        count(&log, "<stdin>:5: `control.cancel` is a command; refused"),
        1
    );
    // Still serving after the end of input.
    let doc: serde_json::Value = agent()
        .get(&relay.url("/events"))
        .call()
        .unwrap()
        .into_string()
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap();
    assert_eq!(doc["role"], "relay");
    let held = relay.replay_all();
    assert_eq!(held, e, "the command and the bad lines were not buffered");
}

#[test]
fn exit_on_stdin_eof_stops_after_the_last_line() {
    let dir = temp_dir("stdin-exit");
    let hist = dir.join("h");
    let mut relay = RelayProcess::spawn_with(
        &[
            "--stdin",
            "--exit-on-stdin-eof",
            "--history",
            hist.to_str().unwrap(),
        ],
        &[],
        true,
        "127.0.0.1:0",
    );
    let lines: Vec<String> = (0..50).map(|i| ev("a", "s", i)).collect();
    let mut stdin = relay.stdin.take().unwrap();
    stdin
        .write_all((lines.join("\n") + "\n").as_bytes())
        .unwrap();
    drop(stdin);
    relay.stderr.wait_closed("the relay");
    let status = relay.child.wait().unwrap();
    assert!(status.success(), "{status}");
    let kept = fs::read_to_string(hist.join("a/s.jsonl")).unwrap();
    assert_eq!(
        kept,
        lines.join("\n") + "\n",
        "every line was ingested before the exit"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_followed_file_is_read_through_growth_truncation_and_replacement() {
    let dir = temp_dir("follow");
    let path = dir.join("in.jsonl");
    let p = path.to_str().unwrap();
    let relay = RelayProcess::spawn(&["--ingest-file", p, "--follow-interval-ms", "10"]);
    relay.stderr.wait("the wait for the absent file", |l| {
        l.contains("in.jsonl: cannot open") && l.contains("waiting for it")
    });
    let mut stream = relay.sse("", &[]);
    let e: Vec<String> = (0..6).map(|i| ev("a", "s", i)).collect();
    let v2 = |i: u64| ev("a", "s", 100 + i).replace(r#""aep":"0.1""#, r#""aep":"2.0""#);

    // Appears, with half a line at its end: only the complete line is ingested.
    let (head, tail) = e[1].split_at(20);
    fs::write(&path, format!("{}\n{head}", e[0])).unwrap();
    assert_eq!(stream.expect().data, e[0]);

    // Grows: the rest of line 2, a bad line, two unsupported-version lines, line 6.
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    write!(f, "{tail}\nnot json\n{}\n{}\n{}\n", v2(0), v2(1), e[2]).unwrap();
    drop(f);
    assert_eq!(stream.expect().data, e[1], "the split line arrives whole");
    assert_eq!(stream.expect().data, e[2]);
    relay.stderr.wait("the bad line's report", |l| {
        l.contains("in.jsonl:3: invalid Event skipped")
    });

    // Truncated in place (same inode, smaller): read again from the start.
    fs::write(&path, format!("{}\n", e[3])).unwrap();
    assert_eq!(stream.expect().data, e[3]);
    relay.stderr.wait("the truncation notice", |l| {
        l.contains("in.jsonl: truncated")
    });

    // Replaced (a new inode at the path): the new file from its start.
    let tmp = dir.join("next.jsonl");
    fs::write(&tmp, format!("{}\n{}\n{}\n", v2(2), e[4], e[5])).unwrap();
    fs::rename(&tmp, &path).unwrap();
    assert_eq!(stream.expect().data, e[4]);
    assert_eq!(stream.expect().data, e[5]);
    relay.stderr.wait("the replacement notice", |l| {
        l.contains("in.jsonl: replaced")
    });

    // One more bad line, so every earlier report is in the log before we count.
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    writeln!(f, "{{").unwrap();
    drop(f);
    relay.stderr.wait("the last bad line's report", |l| {
        l.contains("in.jsonl:4: invalid Event skipped")
    });
    let log = relay.stderr.snapshot();
    assert_eq!(
        count(&log, "unsupported envelope version"),
        1,
        "reported once per source: {log:#?}"
    );
    assert_eq!(count(&log, "invalid Event skipped"), 2, "{log:#?}");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn two_files_and_stdin_feed_one_relay() {
    let dir = temp_dir("multi");
    let (a, b) = (dir.join("a.jsonl"), dir.join("b.jsonl"));
    fs::write(&a, format!("{}\n{}\n", ev("x", "sa", 0), ev("x", "sa", 1))).unwrap();
    fs::write(&b, format!("{}\n", ev("y", "sb", 0))).unwrap();
    let mut relay = RelayProcess::spawn_with(
        &[
            "--ingest-file",
            a.to_str().unwrap(),
            "--ingest-file",
            b.to_str().unwrap(),
            "--stdin",
            "--follow-interval-ms",
            "10",
        ],
        &[],
        true,
        "127.0.0.1:0",
    );
    let mut stdin = relay.stdin.take().unwrap();
    writeln!(stdin, "{}", ev("z", "sc", 0)).unwrap();
    drop(stdin);
    // Replay of everything held, then live: no gap between the two (AEP-0003 §5).
    let mut stream = relay.sse("from=all", &[]);
    let mut first: Vec<String> = (0..4).map(|_| stream.expect().data).collect();
    first.sort();
    let mut want = vec![
        ev("x", "sa", 0),
        ev("x", "sa", 1),
        ev("y", "sb", 0),
        ev("z", "sc", 0),
    ];
    want.sort();
    assert_eq!(first, want);
    let mut f = OpenOptions::new().append(true).open(&b).unwrap();
    writeln!(f, "{}", ev("y", "sb", 1)).unwrap();
    drop(f);
    assert_eq!(stream.expect().data, ev("y", "sb", 1));
    let _ = fs::remove_dir_all(&dir);
}
