//! `aep-relay validate` on the upstream corpus: the 64 golden Events are valid; of the
//! single-Event cases of `invalid/cases.json`, exactly the envelope-level ones are
//! reported, each at its own line (payload-schema cases are not a relay's to check,
//! AEP-0001 §5). Exit status 0 / 1 / 2; standard input when no file is named. A vendor
//! type off the categories is a warning on standard error, never an invalid line.

use crate::support;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use support::*;

fn validate(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(bin())
        .arg("validate")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("validate starts");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn the_golden_corpus_is_valid() {
    let golden = shared("aep-fixtures/golden/golden.jsonl");
    let out = validate(&[golden.to_str().unwrap()], b"");
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout), "");
    assert!(
        text(&out.stderr).contains("validate: 64 lines in 1 file: 64 valid, 0 invalid"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn exactly_the_envelope_invalid_cases_are_reported_at_their_lines() {
    let cases = shared("aep-fixtures/invalid/cases.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cases).unwrap()).unwrap();
    let mut file = String::new();
    let mut envelope = Vec::new();
    let mut n = 0;
    for case in doc["cases"].as_array().unwrap() {
        let Some(ev) = case.get("event") else {
            continue; // a stream case: cross-Event rules, not an envelope's
        };
        n += 1;
        file.push_str(&serde_json::to_string(ev).unwrap());
        file.push('\n');
        let rule = case["rule"].as_str().unwrap();
        if !rule.contains("payload schema") && !rule.contains("field_spec") {
            envelope.push(n);
        }
    }
    assert!(envelope.len() >= 17, "{envelope:?}");
    let dir = temp_dir("validate");
    let path = dir.join("cases.jsonl");
    std::fs::write(&path, &file).unwrap();
    let p = path.to_str().unwrap();
    let out = validate(&[p], b"");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let reported: Vec<usize> = stdout
        .lines()
        .map(|l| {
            let rest = l
                .strip_prefix(&format!("{p}:"))
                .unwrap_or_else(|| panic!("{l}"));
            let (num, detail) = rest.split_once(": ").unwrap();
            assert!(!detail.is_empty());
            num.parse().unwrap()
        })
        .collect();
    assert_eq!(reported, envelope, "{stdout}");
    let summary = format!(
        "{n} lines in 1 file: {} valid, {} invalid",
        n - envelope.len(),
        envelope.len()
    );
    assert!(
        text(&out.stderr).contains(&summary),
        "{}",
        text(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn standard_input_blank_lines_and_unreadable_files() {
    let good = ev("a", "s", 0);
    let input = format!("{good}\n\n{{\"aep\":\n{good}");
    for args in [&[][..], &["-"][..]] {
        let out = validate(args, input.as_bytes());
        assert_eq!(out.status.code(), Some(1));
        let stdout = text(&out.stdout);
        let lines: Vec<_> = stdout.lines().collect();
        assert_eq!(lines.len(), 2, "{stdout}");
        assert!(lines[0].starts_with("-:2: blank line"), "{stdout}");
        assert!(lines[1].starts_with("-:3: "), "{stdout}");
    }
    let dir = temp_dir("validate-io");
    let ok = dir.join("ok.jsonl");
    std::fs::write(&ok, format!("{good}\n")).unwrap();
    let missing = dir.join("missing.jsonl");
    let out = validate(
        &[missing.to_str().unwrap(), ok.to_str().unwrap(), "-q"],
        b"",
    );
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("missing.jsonl: No such file"), "{err}");
    assert!(
        err.contains("ok.jsonl: 1 line, 1 valid, 0 invalid"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A vendor type whose third token is not a category is valid (the envelope schema's
/// `x.{vendor}.{token}.{rest}`, AEP-0001 §6) and linted: one warning on standard error per
/// distinct type, at its first line; nothing on standard output; exit status 0.
#[test]
fn vendor_types_off_the_categories_are_warned_about_not_refused() {
    let line = |seq: u64, t: &str| event("s", 0, seq, t, "");
    let input = [
        line(0, "x.codex.otel.api_request"),
        line(1, "x.claude-code.session.config_change"),
        line(2, "x.codex.otel.api_request"),
        line(3, "tool.completed"),
        line(4, "x.acp.fs.read.text.file"),
    ]
    .map(|l| l + "\n")
    .concat();
    let out = validate(&[], input.as_bytes());
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(text(&out.stdout), "");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains(": warning: ")).collect();
    assert_eq!(
        warnings,
        [
            "-:1: warning: `x.codex.otel.api_request`: `otel` is not a category (AEP-0001 §6 prose: x.{vendor}.{category}.{rest}; the envelope schema and the relay accept it)",
            "-:5: warning: `x.acp.fs.read.text.file`: `fs` is not a category (AEP-0001 §6 prose: x.{vendor}.{category}.{rest}; the envelope schema and the relay accept it)",
        ],
        "{err}"
    );
    assert!(
        err.contains("validate: 5 lines in 1 file: 5 valid, 0 invalid; 2 warnings ("),
        "{err}"
    );
    // `--quiet` prints only the summary, which still counts them.
    let out = validate(&["-q"], input.as_bytes());
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("0 invalid; 2 warnings ("), "{err}");
}
