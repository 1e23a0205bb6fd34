//! The binary's reference documents, generated from the clap definitions, and their drift check:
//! the man pages under `contrib/man/` (`aep-relay.1` and one per command, rendered by
//! `clap_mangen`, shipped in the `.deb`) and `docs/configuration.md` (one table of every
//! flag and environment variable).
//!
//! - `cargo test --bin aep-relay docgen` fails when a committed file differs from what the
//!   definitions produce;
//! - `AEP_REGEN_DOCS=1 cargo test --bin aep-relay docgen` writes them (review, commit).
//!
//! Built with the default features only: `--tls-cert`/`--tls-key` exist with `tls`.

use crate::cli::LOG_ENV_HELP;
use crate::{Cli, DEFAULT_LOG_FILTER};
use clap::{ArgAction, CommandFactory};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const REGEN_VAR: &str = "AEP_REGEN_DOCS";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The relay's command, built (subcommands get their display names, `aep-relay-tail`),
/// without the `help` subcommand, which has no page of its own.
fn command() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// Every man page: `(file name, roff text)`, the relay's first, then one per command.
fn man_pages() -> Vec<(String, String)> {
    let cmd = command();
    let mut pages = Vec::new();
    for c in std::iter::once(&cmd).chain(cmd.get_subcommands()) {
        let man = clap_mangen::Man::new(c.clone()).manual("aep-relay manual");
        let mut out = Vec::new();
        man.render(&mut out).expect("rendering into memory");
        pages.push((
            man.get_filename(),
            String::from_utf8(out).expect("roff is UTF-8"),
        ));
    }
    pages
}

/// A table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// One row per argument of `cmd` (but `--help`, `--version`); `prefix` is the command's
/// name for a subcommand's rows (`tail`), empty for the relay's.
fn rows(cmd: &clap::Command, prefix: &str, out: &mut String) {
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let value = arg
            .get_value_names()
            .map(|v| v.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| id.to_uppercase());
        let takes_value = !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
        let mut flag = match (arg.get_long(), takes_value) {
            (Some(long), true) => format!("`--{long} {value}`"),
            (Some(long), false) => format!("`--{long}`"),
            (None, _) => format!("`{value}`"),
        };
        let says_so = arg
            .get_help()
            .is_some_and(|h| h.to_string().contains("Repeatable"));
        if arg.get_long().is_some() && matches!(arg.get_action(), ArgAction::Append) && !says_so {
            flag.push_str(" (repeatable)");
        }
        if !prefix.is_empty() {
            flag = format!("`{prefix}` {flag}");
        }
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let default = if !takes_value {
            "off".to_owned()
        } else {
            let d: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| format!("`{}`", v.to_string_lossy()))
                .collect();
            d.join(", ")
        };
        let mut meaning = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let meaning_end = meaning.trim_end().len();
        meaning.truncate(meaning_end);
        if !meaning.is_empty() && !meaning.ends_with('.') {
            meaning.push('.');
        }
        let possible: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|p| !p.is_hide_set())
            .map(|p| format!("`{}`", p.get_name()))
            .collect();
        if takes_value && !possible.is_empty() {
            let _ = write!(meaning, " One of {}.", possible.join(", "));
        }
        if arg.is_required_set() {
            meaning.push_str(" Required.");
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            cell(&flag),
            cell(&env),
            cell(&default),
            cell(&meaning)
        );
    }
}

/// `docs/configuration.md`.
fn configuration_md() -> String {
    let cmd = command();
    let mut out = String::new();
    out.push_str(
        "# Configuration\n\
         \n\
         <!-- Generated from the clap definitions (src/main.rs, src/cli/) by src/cli/docgen.rs:\n\
         do not edit. `AEP_REGEN_DOCS=1 cargo test --bin aep-relay docgen` rewrites it, and\n\
         `cargo test` fails when it is stale. -->\n\
         \n\
         Every flag and environment variable of `aep-relay` and of its commands, in one table.\n\
         A flag wins over its environment variable, which wins over the default; there is no\n\
         configuration file. `aep-relay --help` (and `aep-relay COMMAND --help`) prints the same,\n\
         and so does the man page, `man aep-relay` once the `.deb` is installed\n\
         ([`contrib/man/aep-relay.1`](../contrib/man/aep-relay.1)). Rows whose flag starts with a\n\
         command (`tail`, `validate`, `check`) belong to that command; the others run the relay.\n\
         Sizes are bytes, durations seconds unless the flag's name says otherwise.\n\
         \n\
         | flag | environment | default | meaning |\n\
         |---|---|---|---|\n",
    );
    rows(&cmd, "", &mut out);
    let _ = writeln!(
        out,
        "| | `AEP_LOG`, `RUST_LOG` | `{DEFAULT_LOG_FILTER}` | {} |",
        cell(LOG_ENV_HELP)
    );
    for sub in cmd.get_subcommands() {
        rows(sub, sub.get_name(), &mut out);
    }
    out
}

/// Compares `generated` with the committed `path`, or writes it under `AEP_REGEN_DOCS=1`.
fn check(path: PathBuf, generated: &str) {
    if std::env::var_os(REGEN_VAR).is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, generated)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale against the clap definitions: regenerate with \
         `{REGEN_VAR}=1 cargo test --bin aep-relay docgen`, review the diff and commit it",
        path.display()
    );
}

#[test]
fn man_pages_match_the_clap_definitions() {
    let pages = man_pages();
    assert_eq!(pages[0].0, "aep-relay.1");
    let dir = root().join("contrib/man");
    for (name, text) in &pages {
        check(dir.join(name), text);
    }
    // No page left behind by a command that is gone.
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                pages.iter().any(|(n, _)| *n == name),
                "contrib/man/{name} is no command's page: remove it"
            );
        }
    }
}

#[test]
fn configuration_md_matches_the_clap_definitions() {
    let text = configuration_md();
    // Every variable the relay reads through clap has its row.
    for arg in command().get_arguments() {
        if let Some(env) = arg.get_env() {
            assert!(text.contains(&format!("`{}`", env.to_string_lossy())));
        }
    }
    check(root().join("docs/configuration.md"), &text);
}
