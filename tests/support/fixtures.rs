//! What the tests share besides a relay: the upstream fixtures under `../shared`, the
//! Events they post, scratch directories.
//!
//! The fixture root is `AEP_SHARED_DIR` as `build.rs` found it (`../shared` unless the
//! variable was set at build time). A test that reads it carries
//! `#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]`, so a fresh clone
//! without `../shared` lists it as ignored; the helpers below therefore never skip: a
//! fixture that is absent while the test runs is a failure.

use std::path::{Path, PathBuf};

/// The fixture root: the directory holding `aep-fixtures/` and `aep-schemas/`.
pub fn shared_root() -> PathBuf {
    PathBuf::from(env!("AEP_SHARED_DIR"))
}

/// `{root}/{rel}` (e.g. `aep-fixtures/golden/golden.jsonl`). Panics when it is absent: the
/// calling test lacks its `cfg_attr(no_fixtures, ignore = …)`, or the corpus lost a file.
pub fn shared(rel: &str) -> PathBuf {
    let path = shared_root().join(rel);
    assert!(
        path.exists(),
        "fixture {} is absent (a test that reads ../shared carries \
         #[cfg_attr(no_fixtures, ignore = \"needs ../shared/aep-fixtures\")])",
        path.display()
    );
    path
}

/// The text of `{root}/{rel}`; panics when it is absent.
pub fn fixture(rel: &str) -> String {
    let p = shared(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `{root}/{rel}` parsed as JSON; panics when it is absent or not JSON.
pub fn fixture_json(rel: &str) -> serde_json::Value {
    serde_json::from_str(&fixture(rel)).unwrap_or_else(|e| panic!("fixture {rel} is not JSON: {e}"))
}

/// A valid sequenced Event of agent `a` in `session` at (`epoch`, `seq`), with optional
/// extra members (a string starting with `,` inserted before the closing brace).
pub fn event(session: &str, epoch: u64, seq: u64, ty: &str, extra: &str) -> String {
    envelope("a", session, epoch, seq, ty, extra)
}

/// A valid sequenced `tool.completed` Event of `agent` in `session` at (0, `seq`).
pub fn ev(agent: &str, session: &str, seq: u64) -> String {
    envelope(agent, session, 0, seq, "tool.completed", "")
}

/// The one envelope the test Events share (AEP-0001 §5): id `{session}-{epoch}-{seq}`,
/// source `aep://test/agent/{agent}/session/{session}`. `agent` and `session` are
/// written as given (no JSON escaping).
fn envelope(agent: &str, session: &str, epoch: u64, seq: u64, ty: &str, extra: &str) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{session}-{epoch}-{seq}","type":"{ty}","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/{agent}/session/{session}","agent":"{agent}","session":"{session}","seq":{seq},"epoch":{epoch}{extra}}}"#
    )
}

/// A fresh, empty directory for one test (`$TMPDIR/aep-relay-it-{name}-{pid}`).
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("aep-relay-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every regular file under `dir`, recursively, but a history root's lock file
/// (`DIR/.aep-relay.lock`).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if d == dir && e.file_name() == aep_relay::history::LOCK_FILE {
                // The history root's lock file, not a session log.
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}
