//! `auth`: what checking a request's credentials costs, in **µs per request**.
//!
//! - `auth/jwt_hs256`: `Auth::check_token` of a JWT signed HS256 with a typical `aep`
//!   claim (scopes, a filter, a capture ceiling, an agent), the keys of `--jwt-key`
//!   holding one secret: header and claims decoded, the HMAC verified, the filter
//!   compiled. The target is under 5 µs.
//! - `auth/static_token`: `Auth::check_token` of a tokens-file token among 100 (SHA-256
//!   and a constant-time pass over every entry), for contrast.
//!
//! A connection's check happens once, when its request head arrives; nothing is checked
//! per Event.

use aep_relay::auth::{Auth, JwtHandle, JwtKeys, Scopes};
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;

const SECRET: &[u8] = b"a bench secret of at least 32 bytes, HS256";

fn bench(c: &mut Criterion) {
    let keys = JwtKeys::parse(SECRET).unwrap();
    let auth = Auth::new(None, &[]).with_jwt(JwtHandle::new(keys));
    let claims = json!({
        "exp": 4_000_000_000u64, "sub": "team-a",
        "aep": {"scope": ["watch", "emit"], "filter": {"agent": ["a", "b"], "type": "tool.*"},
                "capture": "metadata", "agent": "a"}
    });
    let token = encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET).unwrap(),
    )
    .unwrap();
    assert!(auth.check_token(&token, 1_800_000_000).is_ok());
    let mut g = c.benchmark_group("auth");
    g.bench_function("jwt_hs256", |b| {
        b.iter(|| auth.check_token(black_box(&token), 1_800_000_000).unwrap())
    });
    let tokens: Vec<(String, Scopes)> = (0..100)
        .map(|i| {
            (
                format!("static-token-{i:03}-0123456789abcdef"),
                Scopes::WATCH,
            )
        })
        .collect();
    let static_auth = Auth::new(None, &tokens);
    g.bench_function("static_token", |b| {
        b.iter(|| {
            static_auth
                .check_token(black_box("static-token-057-0123456789abcdef"), 0)
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
