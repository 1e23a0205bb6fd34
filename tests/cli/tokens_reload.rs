//! `--tokens-file` read again on SIGHUP by the real binary: a token removed from the
//! file is refused 401, a token added is admitted, a file that does not parse leaves the
//! tokens in use, and a file emptied refuses everyone rather than opening the relay
//! (docs/operating.md, "Multi-tenant relay"; AEP-0003 §8.1).

use crate::support;
use std::time::Instant;
use support::*;

/// The status of `GET /stream?live=0` with `token` (none: no `Authorization`).
fn status(relay: &RelayProcess, token: Option<&str>) -> u16 {
    let mut req = agent().get(&relay.url("/stream?live=0"));
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    match req.call() {
        Ok(r) => r.status(),
        Err(e) => status_json(Err(e)).0,
    }
}

/// Asks again until `token` is answered `want`: the reload happens on the relay's signal
/// thread, after `kill` returns. Fails after [`WAIT`].
fn await_status(relay: &RelayProcess, token: Option<&str>, want: u16) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = status(relay, token);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still {got}, not {want}, {WAIT:?} after SIGHUP"
        );
    }
}

#[test]
fn sighup_reads_the_tokens_file_again() {
    let dir = temp_dir("tokens-reload");
    let file = dir.join("tokens");
    std::fs::write(&file, "keep-tok-1a2b watch\nold-tok-3c4d watch\n").unwrap();
    let relay = RelayProcess::spawn(&["--tokens-file", file.to_str().unwrap()]);
    assert_eq!(status(&relay, Some("old-tok-3c4d")), 200);
    assert_eq!(status(&relay, Some("new-tok-5e6f")), 401);

    // One token removed, one added.
    std::fs::write(
        &file,
        "keep-tok-1a2b watch\nnew-tok-5e6f watch name=fresh\n",
    )
    .unwrap();
    relay.signal("HUP");
    await_status(&relay, Some("new-tok-5e6f"), 200);
    assert_eq!(status(&relay, Some("old-tok-3c4d")), 401);
    assert_eq!(status(&relay, Some("keep-tok-1a2b")), 200);
    relay
        .stderr
        .wait("the reload line", |l| l.contains("read again, 2 tokens"));

    // A file that does not parse: a warning naming the line, and the tokens in use stay.
    std::fs::write(
        &file,
        "keep-tok-1a2b watch\nleaky-tok-7a8b watch colour=red\n",
    )
    .unwrap();
    relay.signal("HUP");
    let warning = relay
        .stderr
        .wait("the refusal", |l| l.contains("the tokens in use are kept"));
    assert!(warning.contains("line 2"), "{warning}");
    assert_eq!(status(&relay, Some("new-tok-5e6f")), 200);
    assert_eq!(status(&relay, Some("leaky-tok-7a8b")), 401);

    // Every token revoked: every request refused, none let in for want of a token.
    std::fs::write(&file, "# nobody\n").unwrap();
    relay.signal("HUP");
    await_status(&relay, Some("new-tok-5e6f"), 401);
    assert_eq!(status(&relay, Some("keep-tok-1a2b")), 401);
    assert_eq!(status(&relay, None), 401);

    let log = relay.stderr.snapshot().join("\n");
    for t in ["keep-tok", "old-tok", "new-tok", "leaky-tok"] {
        assert!(!log.contains(t), "tokens are never logged ({t}): {log}");
    }
}
