//! Tells the tests whether the upstream fixtures are there, so that a fresh clone without
//! `../shared` reports the tests that read them as *ignored*, never as passed.
//!
//! The fixture root is `AEP_SHARED_DIR` when set, else `../shared` beside the package: the
//! directory holding `aep-fixtures/` and `aep-schemas/`. The build never reads the
//! fixtures; it only looks whether they exist, and:
//! - passes the root to the tests as the compile-time variable `AEP_SHARED_DIR`
//!   (`env!("AEP_SHARED_DIR")` in `tests/support/fixtures.rs`);
//! - sets `cfg(no_fixtures)` when either corpus is missing: each test that reads them
//!   carries `#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]`.
//!
//! A root that appears later is noticed when `AEP_SHARED_DIR` changes or this file is
//! touched (`touch build.rs`); a root that disappears is noticed by itself (its files are
//! watched). Under `CI=true`, `tests/sans_io/envelope_fixtures.rs` fails when the cfg is set, so
//! CI never ignores a fixture test.

use std::path::PathBuf;

/// One file of each corpus the tests read; both must be there.
const MARKERS: &[&str] = &[
    "aep-fixtures/golden/golden.jsonl",
    "aep-fixtures/attr-match/cases.json",
    "aep-schemas/registry/types.json",
];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_fixtures)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=AEP_SHARED_DIR");
    let root = match std::env::var_os("AEP_SHARED_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"))
            .join("../shared"),
    };
    println!("cargo::rustc-env=AEP_SHARED_DIR={}", root.display());
    let missing: Vec<&str> = MARKERS
        .iter()
        .copied()
        .filter(|m| !root.join(m).is_file())
        .collect();
    if missing.is_empty() {
        for m in MARKERS {
            println!("cargo::rerun-if-changed={}", root.join(m).display());
        }
    } else {
        println!("cargo::rustc-cfg=no_fixtures");
        println!(
            "cargo::warning=upstream fixtures absent ({} has no {}): the tests that read them \
             are ignored; add them (or set AEP_SHARED_DIR) and `touch build.rs`",
            root.display(),
            missing.join(", ")
        );
    }
}
