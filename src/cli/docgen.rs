//! The binary's reference documents, generated from the clap definitions, and their drift check:
//! the man pages under `contrib/man/` (`aep-relay.1` and one per command, rendered by
//! `clap_mangen`, shipped in the `.deb`).
//!
//! - `cargo test --bin aep-relay docgen` fails when a committed file differs from what the
//!   definitions produce;
//! - `AEP_REGEN_DOCS=1 cargo test --bin aep-relay docgen` writes them (review, commit).
//!
//! Built with the default features only: `--tls-cert`/`--tls-key` exist with `tls`.

use crate::Cli;
use clap::CommandFactory;
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
        pages.push((man.get_filename(), String::from_utf8(out).expect("roff is UTF-8")));
    }
    pages
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
