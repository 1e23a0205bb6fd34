//! `--jwt-key` read again on SIGHUP by the real binary: keys rotate without a restart,
//! and a key file that no longer parses leaves the keys in use (docs/operating.md,
//! "Multi-tenant relay").

use crate::support;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;
use std::time::{SystemTime, UNIX_EPOCH};
use support::*;

const OLD: &[u8] = b"the old hs256 secret, 32 bytes or more";
const NEW: &[u8] = b"the new hs256 secret, 32 bytes or more";

fn token(secret: &[u8]) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 300;
    let claims = json!({"exp": exp, "sub": "rotating", "aep": {"scope": ["watch"]}});
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap()
}

fn status(relay: &RelayProcess, token: &str) -> u16 {
    let r = agent()
        .get(&relay.url("/stream?live=0"))
        .set("Authorization", &format!("Bearer {token}"))
        .call();
    match r {
        Ok(r) => r.status(),
        Err(e) => status_json(Err(e)).0,
    }
}

#[test]
fn sighup_rotates_the_jwt_key() {
    let dir = temp_dir("jwt-reload");
    let key = dir.join("jwt.key");
    std::fs::write(&key, OLD).unwrap();
    let relay = RelayProcess::spawn(&["--jwt-key", key.to_str().unwrap()]);
    assert_eq!(status(&relay, &token(OLD)), 200);
    assert_eq!(status(&relay, &token(NEW)), 401);

    std::fs::write(&key, NEW).unwrap();
    relay.signal("HUP");
    relay
        .stderr
        .wait("the reload", |l| l.contains("read again, 1 keys"));
    assert_eq!(status(&relay, &token(NEW)), 200);
    assert_eq!(status(&relay, &token(OLD)), 401);

    // A file that does not parse: logged, and the keys in use stay.
    std::fs::write(&key, b"short").unwrap();
    relay.signal("HUP");
    relay
        .stderr
        .wait("the refusal", |l| l.contains("the keys in use are kept"));
    assert_eq!(status(&relay, &token(NEW)), 200);
    let log = relay.stderr.snapshot().join("\n");
    assert!(!log.contains("eyJ"), "tokens are never logged: {log}");
}

/// A token of `secret` with `extra` claims (`aud`, `iss`).
fn token_with(secret: &[u8], extra: serde_json::Value) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 300;
    let mut claims = json!({"exp": exp, "sub": "tenant", "aep": {"scope": ["watch"]}});
    claims
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap()
}

#[test]
fn jwt_audience_and_issuer_hold_across_a_reload() {
    let dir = temp_dir("jwt-aud");
    let key = dir.join("jwt.key");
    std::fs::write(&key, OLD).unwrap();
    let relay = RelayProcess::spawn(&[
        "--jwt-key",
        key.to_str().unwrap(),
        "--jwt-audience",
        "relay-eu",
        "--jwt-issuer",
        "https://idp.example",
    ]);
    let ours = json!({"aud": "relay-eu", "iss": "https://idp.example"});
    let theirs = json!({"aud": "billing", "iss": "https://idp.example"});
    let forged = json!({"aud": "relay-eu", "iss": "https://elsewhere.example"});
    assert_eq!(status(&relay, &token_with(OLD, ours.clone())), 200);
    assert_eq!(status(&relay, &token_with(OLD, theirs.clone())), 401);
    assert_eq!(status(&relay, &token_with(OLD, forged.clone())), 401);
    assert_eq!(status(&relay, &token(OLD)), 401, "no aud, no iss");

    // The rotated keys keep asking for the same audience and issuer.
    std::fs::write(&key, NEW).unwrap();
    relay.signal("HUP");
    relay
        .stderr
        .wait("the reload", |l| l.contains("read again, 1 keys"));
    assert_eq!(status(&relay, &token_with(NEW, ours)), 200);
    assert_eq!(status(&relay, &token_with(NEW, theirs)), 401);
    assert_eq!(status(&relay, &token_with(NEW, forged)), 401);
}
