//! Credentials (`aep_relay::auth`): a tokens file's text and a presented token read as a
//! JWT (docs/operating.md, "Multi-tenant relay").
//!
//! Input: a first byte choosing the key file (an HS256 secret or a JWKS of the seeds),
//! then the rest as a tokens file's text and, after its first NUL, a token.
//!
//! Invariants asserted:
//! 1. `Auth::parse_tokens_file`, `JwtKeys::parse` and `Auth::check_token` never panic.
//! 2. A tokens file's refusal does not depend on a token's value (so never quotes it):
//!    the same file with a token spelt otherwise is refused alike; every accepted line
//!    has at least one scope.
//! 3. A token checked against the relay's keys is a known static token, or an HS256
//!    JWT that a reference check (the HMAC of the first two parts under the secret)
//!    signs: nothing else is granted. `exp` is respected at the time given.
#![no_main]

use aep_relay::auth::{Auth, JwtHandle, JwtKeys, Scopes};
use base64::Engine;
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use sha2::Sha256;
use std::path::Path;

const SECRET: &[u8] = b"the fuzz target's hs256 secret, 32+ bytes";

/// Whether `token` is `header.payload.signature` with the HS256 HMAC of the first two
/// parts under `SECRET` as its signature (base64url, no padding).
fn signed(token: &str) -> bool {
    let Some((msg, sig)) = token.rsplit_once('.') else {
        return false;
    };
    let Ok(sig) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(sig) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
    mac.update(msg.as_bytes());
    mac.verify_slice(&sig).is_ok()
}

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let key_file: &[u8] = if choice & 1 == 0 {
        SECRET
    } else {
        rest.split(|b| *b == 0).nth(2).unwrap_or_default()
    };
    let _ = JwtKeys::parse(key_file);
    let mut parts = rest.splitn(2, |b| *b == 0);
    let text = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let token = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let token = token.split('\0').next().unwrap_or_default();
    let specs = match Auth::parse_tokens_file(Path::new("t"), &text) {
        Ok(s) => s,
        Err(e) => {
            let msg = e.to_string();
            // The refusal does not depend on a token's value: spelling a token (one that
            // appears nowhere else in the file) differently gives the same refusal.
            for line in text.lines() {
                let t = line
                    .trim()
                    .split([' ', '\t', ','])
                    .next()
                    .unwrap_or_default();
                let plain = t
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !t.is_empty() && plain && text.matches(t).count() == 1 {
                    let other = (0..)
                        .map(|i| format!("zq{i}x"))
                        .find(|o| !text.contains(o.as_str()))
                        .unwrap();
                    let again = Auth::parse_tokens_file(Path::new("t"), &text.replace(t, &other));
                    let again = again
                        .map(|_| String::new())
                        .unwrap_or_else(|e| e.to_string());
                    assert_eq!(msg, again, "the refusal depends on the token {t:?}");
                }
            }
            Vec::new()
        }
    };
    assert!(specs.iter().all(|s| s.scopes != Scopes::NONE));
    let keys = JwtKeys::parse(SECRET).unwrap();
    let auth = Auth::with_tokens(None, &specs).with_jwt(JwtHandle::new(keys));
    let now = u64::from(choice) * 10_000_000;
    if let Ok(g) = auth.check_token(token, now) {
        let known = specs.iter().any(|s| s.token == token);
        assert!(known || signed(token), "granted an unsigned token");
        if !known {
            assert!(g.expires.is_some_and(|e| e > now), "granted past its exp");
        }
    }
});
