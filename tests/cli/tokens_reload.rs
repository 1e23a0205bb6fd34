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

/// `AEP_TOKEN` (every scope) also written in the tokens file would be one token with two
/// grants: the relay refuses to start, saying which line without the token, and a reload
/// that brings it is refused and keeps the tokens in use.
#[test]
fn the_environment_token_in_the_tokens_file_is_refused() {
    let dir = temp_dir("tokens-clash");
    let file = dir.join("tokens");
    std::fs::write(&file, "env-tok-9f8e watch name=dashboard\n").unwrap();
    let out = std::process::Command::new(bin())
        .args(["--listen", "127.0.0.1:0", "--tokens-file"])
        .arg(&file)
        .env("AEP_TOKEN", "env-tok-9f8e")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("name=dashboard") && err.contains("AEP_TOKEN"),
        "{err}"
    );
    assert!(!err.contains("env-tok"), "never the token: {err}");

    // Started apart, brought together by a reload: refused, the tokens in use stay.
    std::fs::write(&file, "w-tok-1c2d watch\n").unwrap();
    let relay = RelayProcess::spawn_with(
        &["--tokens-file", file.to_str().unwrap()],
        &[("AEP_TOKEN", "env-tok-9f8e")],
        false,
        "127.0.0.1:0",
    );
    std::fs::write(&file, "env-tok-9f8e watch name=dashboard\n").unwrap();
    relay.signal("HUP");
    let warning = relay
        .stderr
        .wait("the refusal", |l| l.contains("the tokens in use are kept"));
    assert!(warning.contains("name=dashboard"), "{warning}");
    assert_eq!(status(&relay, Some("w-tok-1c2d")), 200);
    let admin = agent()
        .get(&relay.url("/connections"))
        .set("Authorization", "Bearer env-tok-9f8e")
        .call();
    assert_eq!(
        admin.map(|r| r.status()).ok(),
        Some(200),
        "still every scope"
    );
    let log = relay.stderr.snapshot().join("\n");
    assert!(!log.contains("env-tok") && !log.contains("w-tok"), "{log}");
}
