//! The binary's `--help` names every environment variable it reads: the names are taken
//! from the source itself (every clap `env = "…"` and every `std::env::var("…")` under
//! `src/` and under `crates/aep-check/src/`, the checker the binary runs as `check`), so
//! a variable added without being documented fails here. The relay's own `--help` names
//! all of them; each subcommand's (`tail`, `validate`, `check`) names those its own
//! arguments read and the log filter (`AEP_LOG`, `RUST_LOG`), which every command
//! honours.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// clap's `env = "NAME"`.
const CLAP: &[&str] = &["env = \""];
/// `env::var("NAME")`, `env::var_os("NAME")`.
const STD: &[&str] = &["env::var(\"", "env::var_os(\""];

/// The environment variables the code in `files` reads through `markers`.
fn reads(files: &[PathBuf], markers: &[&str]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        for marker in markers {
            for (i, _) in text.match_indices(marker) {
                let rest = &text[i + marker.len()..];
                // A name, not a format string or a doc example.
                let name = &rest[..rest.find('"').unwrap()];
                if !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
                {
                    names.insert(name.to_string());
                }
            }
        }
    }
    names
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_aep-relay"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help: {:?}", out.status);
    String::from_utf8(out.stdout).unwrap()
}

fn assert_names(what: &str, text: &str, names: &BTreeSet<String>) {
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !text.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "`aep-relay {what}--help` does not name {missing:?}:\n{text}"
    );
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The sources of `aep-relay check`: the workspace's checker crate.
fn checker_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/aep-check/src")
}

#[test]
fn relay_help_names_every_environment_variable_the_code_reads() {
    let mut files = sources(&src());
    files.extend(sources(&checker_src()));
    let mut all = reads(&files, CLAP);
    all.extend(reads(&files, STD));
    // The scan itself works: the log filter (read with std::env::var in main.rs), a clap
    // `env` of the relay, of the JSONL flags and of `tail`.
    for n in [
        "AEP_LOG",
        "RUST_LOG",
        "AEP_LISTEN",
        "AEP_HISTORY",
        "AEP_TOKEN",
    ] {
        assert!(all.contains(n), "the scan missed {n}: {all:?}");
    }
    assert_names("", &help(&[]), &all);
}

#[test]
fn subcommand_help_names_the_variables_it_reads_and_the_log_filter() {
    let src = src();
    // What main.rs reads for every command before dispatching (the log filter).
    let log = reads(&[src.join("main.rs")], STD);
    assert_eq!(log, ["AEP_LOG", "RUST_LOG"].map(String::from).into());
    for (cmd, files) in [
        ("tail", vec![src.join("cli/tail.rs")]),
        ("validate", vec![src.join("cli/validate.rs")]),
        ("check", sources(&checker_src())),
    ] {
        let mut names = reads(&files, CLAP);
        names.extend(reads(&files, STD));
        names.extend(log.iter().cloned());
        assert_names(&format!("{cmd} "), &help(&[cmd]), &names);
    }
}
