//! What the tests share besides a relay: the upstream fixtures under `../shared`, the
//! Events they post, scratch directories.

use std::path::{Path, PathBuf};

/// `../shared/{rel}` (e.g. `aep-fixtures/golden/golden.jsonl`), or `None` after saying
/// that it is absent, so the test skips.
pub fn shared(rel: &str) -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared")
        .join(rel);
    if path.exists() {
        Some(path)
    } else {
        eprintln!("SKIP: fixture {} is absent", path.display());
        None
    }
}

/// The text of `../shared/{rel}`, or `None` after saying that it is absent.
pub fn fixture(rel: &str) -> Option<String> {
    shared(rel)
        .map(|p| std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

/// `../shared/{rel}` parsed as JSON, or `None` after saying that it is absent. Panics
/// when it is not JSON.
pub fn fixture_json(rel: &str) -> Option<serde_json::Value> {
    fixture(rel).map(|t| {
        serde_json::from_str(&t).unwrap_or_else(|e| panic!("fixture {rel} is not JSON: {e}"))
    })
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
