//! The live checker (`aep-relay check`, the `aep-check` crate, [`aep_check`]) against this relay: in
//! process against a [`TestRelay`] with a small buffer, with and without a token and with
//! `--evict`; and the binary end to end against a [`RelayProcess`] (lines, summary line,
//! JSON report, exit status).
//!
//! Nothing may fail, and nothing may be skipped but what a mode implies: without a token
//! the three control checks that need one (AEP-0004 §4.1). With a token the run is all
//! PASS.

use crate::support;

use std::process::Command;
use std::time::Duration;

use aep_check::{self as check, Options, Report, Status, CHECKS};
use aep_relay::auth::Auth;
use serde_json::Value;
use support::{RelayProcess, TestRelay};

/// Checks that need `--token` (AEP-0004 §4.1: control needs authentication).
const NEED_TOKEN: [&str; 3] = ["control-no-route", "control-route", "control-ambiguous"];

fn assert_conformant(report: &Report) {
    let lines: Vec<String> = report.checks.iter().map(|c| c.line()).collect();
    let text = lines.join("\n");
    assert_eq!(report.checks.len(), CHECKS.len(), "{text}");
    assert!(report.ok(), "the checker found failures:\n{text}");
    for c in &report.checks {
        if c.status == Status::Skip {
            assert!(
                !report.token && NEED_TOKEN.contains(&c.id),
                "unexpected SKIP:\n{}\n\nwhole run:\n{text}",
                c.line()
            );
        }
    }
    eprintln!("{text}\n{}", report.summary());
}

fn options(relay: &TestRelay) -> Options {
    let mut o = Options::new(format!("http://{}", relay.addr));
    o.evict = true;
    o.timeout = Duration::from_secs(10);
    o
}

#[test]
fn checker_passes_against_an_open_relay() {
    let relay = TestRelay::with(|c| c.buffer_per_session = 8);
    let report = check::run(&options(&relay)).unwrap();
    assert_conformant(&report);
    assert_eq!(
        report.get("evict-sse").unwrap().status,
        Status::Pass,
        "--evict ran"
    );
}

#[test]
fn checker_passes_against_a_relay_with_a_token() {
    let relay = TestRelay::with(|c| {
        c.buffer_per_session = 8;
        c.auth = Auth::new(Some("conformance-token"), &[]);
    });
    let mut o = options(&relay);
    o.token = Some("conformance-token".into());
    let report = check::run(&o).unwrap();
    assert_conformant(&report);
    assert_eq!(
        report.counts(),
        (CHECKS.len(), 0, 0),
        "with a token, all PASS"
    );
}

#[test]
fn checker_fails_with_a_wrong_token() {
    let relay = TestRelay::with(|c| c.auth = Auth::new(Some("right"), &[]));
    let mut o = options(&relay);
    o.token = Some("wrong".into());
    o.evict = false;
    let report = check::run(&o).unwrap();
    assert!(!report.ok());
    let d = report.get("discovery").unwrap();
    assert_eq!(d.status, Status::Fail, "{}", d.line());
    assert!(d.detail.contains("401"), "{}", d.line());
}

/// The binary: per-check lines, the exact summary line, the JSON report, exit 0.
#[test]
fn check_subcommand_end_to_end() {
    let relay = RelayProcess::spawn(&["--buffer", "8", "--token", "e2e-token"]);
    let dir = std::env::temp_dir().join(format!("aep-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json_path = dir.join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_aep-relay"))
        .args(["check", &format!("http://{}", relay.addr), "--evict"])
        .args(["--json", json_path.to_str().unwrap()])
        .env("AEP_TOKEN", "e2e-token")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), CHECKS.len() + 1, "{stdout}");
    for (line, (id, section, _)) in lines.iter().zip(CHECKS) {
        assert!(
            line.starts_with(&format!("PASS {id} ({section}): ")),
            "{line}"
        );
    }
    let summary = lines.last().unwrap();
    assert_eq!(
        *summary,
        format!("{} passed, 0 failed, 0 skipped", CHECKS.len())
    );

    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(report["tool"], "aep-relay check");
    assert_eq!(report["target"], format!("http://{}", relay.addr));
    assert_eq!(report["token"], true, "says a token was given");
    assert!(!report.to_string().contains("e2e-token"), "never the token");
    for k in ["started", "finished"] {
        let t = report[k].as_str().unwrap();
        assert!(
            t.len() == 24 && t.ends_with('Z') && t.as_bytes()[10] == b'T',
            "{t}"
        );
    }
    assert_eq!(report["ok"], true);
    assert_eq!(report["summary"]["failed"], 0);
    assert_eq!(report["summary"]["line"], *summary);
    let checks = report["checks"].as_array().unwrap();
    assert_eq!(checks.len(), CHECKS.len());
    for (c, (id, section, _)) in checks.iter().zip(CHECKS) {
        assert_eq!(c["id"], *id);
        assert_eq!(c["section"], *section);
        assert!(
            ["pass", "skip"].contains(&c["status"].as_str().unwrap()),
            "{c}"
        );
        assert!(c["detail"].is_string() && c["ms"].is_u64(), "{c}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Against nothing listening: every check that talks to the relay fails, the summary
/// says so, `--json -` puts the report on stdout (lines on stderr), exit 1.
#[test]
fn check_subcommand_reports_failures_and_exits_1() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let out = Command::new(env!("CARGO_BIN_EXE_aep-relay"))
        .args([
            "check",
            &format!("http://127.0.0.1:{port}"),
            "--json",
            "-",
            "--timeout",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON report");
    assert_eq!(report["ok"], false);
    assert_eq!(report["checks"][0]["status"], "fail");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr
            .lines()
            .next()
            .unwrap()
            .starts_with("FAIL discovery "),
        "{stderr}"
    );
    let last = stderr.lines().last().unwrap();
    assert!(
        last.ends_with(" skipped") && !last.contains(" 0 failed"),
        "{last}"
    );
}

#[test]
fn check_subcommand_refuses_a_url_it_cannot_use() {
    // (https:// is checked over TLS: tests/wire/tls.rs.)
    for url in ["ftp://relay.example", "relay.example:8787"] {
        let out = Command::new(env!("CARGO_BIN_EXE_aep-relay"))
            .args(["check", url])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{url}");
        assert!(out.stdout.is_empty(), "no check ran for {url}");
    }
}

/// `check` takes its token from `AEP_TOKEN`, like the relay and `tail`: against a relay
/// with a token, without the variable the checker is refused (401) and fails; with it,
/// nothing fails and the control checks, which need the token, pass.
#[test]
fn check_subcommand_takes_the_token_from_aep_token() {
    let relay = RelayProcess::spawn(&["--token", "env-token"]);
    let run = |token: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_aep-relay"));
        cmd.args(["check", &format!("http://{}", relay.addr)])
            .env_remove("AEP_TOKEN");
        if let Some(t) = token {
            cmd.env("AEP_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        (out.status.code(), stdout)
    };

    let (code, stdout) = run(None);
    assert_eq!(code, Some(1), "without AEP_TOKEN:\n{stdout}");
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("FAIL discovery ") && first.contains("401"),
        "without AEP_TOKEN the relay refuses the checker: {first}"
    );

    let (code, stdout) = run(Some("env-token"));
    assert_eq!(code, Some(0), "with AEP_TOKEN:\n{stdout}");
    for id in NEED_TOKEN {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("PASS {id} "))),
            "{id} needs the token and passes with AEP_TOKEN:\n{stdout}"
        );
    }
    let summary = stdout.lines().last().unwrap();
    assert!(summary.contains(" passed, 0 failed, "), "{summary}");
}
