//! JWT bearer tokens over real sockets (docs/operating.md, "Multi-tenant relay"): a valid
//! token's `aep` claim is its grant; an expired one, one not yet valid, one signed by
//! another key, or with another algorithm (`none`; HS256 with the RS256 public key as
//! the secret) gets 401; a JWKS picks its key by `kid`; a live SSE stream ends after its
//! last whole Event when its token expires, and a WebSocket gets `closing` with the
//! reason. The test keys are in `tests/wire/jwt-keys/`.

use crate::support;
use aep_relay::auth::{Auth, JwtHandle, JwtKeys};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};
use support::*;

const SECRET: &[u8] = b"an hs256 secret of at least 32 bytes!";

fn key_file(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/wire/jwt-keys/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn relay_with(keys: &[u8]) -> TestRelay {
    let keys = JwtKeys::parse(keys).unwrap();
    TestRelay::with(|c| c.auth = Auth::new(Some("admin-tok"), &[]).with_jwt(JwtHandle::new(keys)))
}

fn claims(exp: u64, aep: Value) -> Value {
    json!({"exp": exp, "sub": "team-a", "aep": aep})
}

fn sign(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: &Value) -> String {
    let mut h = Header::new(alg);
    h.kid = kid.map(str::to_owned);
    encode(&h, claims, key).unwrap()
}

fn hs(claims: &Value) -> String {
    sign(
        Algorithm::HS256,
        None,
        &EncodingKey::from_secret(SECRET).unwrap(),
        claims,
    )
}

/// The status of `GET /stream?live=0` with `token`.
fn stream_status(relay: &TestRelay, token: &str) -> (u16, Value) {
    let r = agent()
        .get(&relay.url("/stream?live=0"))
        .set("Authorization", &format!("Bearer {token}"))
        .call();
    match r {
        Ok(r) => (r.status(), Value::Null),
        Err(e) => status_json(Err(e)),
    }
}

#[test]
fn time_keys_and_algorithms_decide_401() {
    let relay = relay_with(SECRET);
    let watch = json!({"scope": ["watch"]});
    assert_eq!(
        stream_status(&relay, &hs(&claims(now() + 60, watch.clone()))).0,
        200
    );
    let (status, body) = stream_status(&relay, &hs(&claims(now() - 1, watch.clone())));
    assert_eq!(status, 401, "expired");
    assert!(
        body["detail"].as_str().unwrap().contains("expired"),
        "{body}"
    );
    let mut early = claims(now() + 60, watch.clone());
    early["nbf"] = json!(now() + 30);
    let (status, body) = stream_status(&relay, &hs(&early));
    assert_eq!(status, 401, "not yet valid");
    assert!(
        body["detail"].as_str().unwrap().contains("not valid yet"),
        "{body}"
    );
    let other = EncodingKey::from_secret(b"another secret of at least 32 bytes..").unwrap();
    let wrong = sign(
        Algorithm::HS256,
        None,
        &other,
        &claims(now() + 60, watch.clone()),
    );
    assert_eq!(stream_status(&relay, &wrong).0, 401, "wrong key");
    // `alg: none`, unsigned.
    let body = hs(&claims(now() + 60, watch.clone()));
    let payload = body.split('.').nth(1).unwrap();
    assert_eq!(
        stream_status(&relay, &format!("eyJhbGciOiJub25lIn0.{payload}.")).0,
        401
    );
    // A token lacking the scope the route needs: 403, as for a static token.
    assert_eq!(
        stream_status(&relay, &hs(&claims(now() + 60, json!({"scope": ["emit"]})))).0,
        403
    );
}

#[test]
fn an_rs256_key_takes_no_hs256_token_signed_with_it_as_the_secret() {
    let relay = relay_with(&key_file("rsa.pub.pem"));
    let watch = claims(now() + 60, json!({"scope": ["watch"]}));
    let rsa = EncodingKey::from_rsa_pem(&key_file("rsa.pem")).unwrap();
    assert_eq!(
        stream_status(&relay, &sign(Algorithm::RS256, None, &rsa, &watch)).0,
        200
    );
    let confused = EncodingKey::from_secret(&key_file("rsa.pub.pem")).unwrap();
    let t = sign(Algorithm::HS256, None, &confused, &watch);
    assert_eq!(stream_status(&relay, &t).0, 401, "algorithm confusion");
    let ec_relay = relay_with(&key_file("ec.pub.pem"));
    let ec = EncodingKey::from_ec_pem(&key_file("ec.pem")).unwrap();
    assert_eq!(
        stream_status(&ec_relay, &sign(Algorithm::ES256, None, &ec, &watch)).0,
        200
    );
    assert_eq!(
        stream_status(&ec_relay, &sign(Algorithm::RS256, None, &rsa, &watch)).0,
        401
    );
}

#[test]
fn a_jwks_picks_each_key_by_kid() {
    let relay = relay_with(&key_file("jwks.json"));
    let watch = claims(now() + 60, json!({"scope": ["watch"]}));
    let hs1 = EncodingKey::from_secret(b"jwks secret number one, 32 bytes+").unwrap();
    let rsa = EncodingKey::from_rsa_pem(&key_file("rsa.pem")).unwrap();
    let ec = EncodingKey::from_ec_pem(&key_file("ec.pem")).unwrap();
    for (alg, kid, key) in [
        (Algorithm::HS256, "hs-1", &hs1),
        (Algorithm::RS256, "rsa-1", &rsa),
        (Algorithm::ES256, "ec-1", &ec),
    ] {
        assert_eq!(
            stream_status(&relay, &sign(alg, Some(kid), key, &watch)).0,
            200,
            "{kid}"
        );
    }
    // A kid naming another key, an unknown kid, and no kid for a key of another type.
    assert_eq!(
        stream_status(&relay, &sign(Algorithm::RS256, Some("ec-1"), &rsa, &watch)).0,
        401
    );
    assert_eq!(
        stream_status(&relay, &sign(Algorithm::RS256, Some("rsa-9"), &rsa, &watch)).0,
        401
    );
    assert_eq!(
        stream_status(&relay, &sign(Algorithm::ES256, None, &ec, &watch)).0,
        200
    );
    let t = sign(
        Algorithm::HS256,
        Some("rsa-1"),
        &EncodingKey::from_secret(&key_file("rsa.pub.pem")).unwrap(),
        &watch,
    );
    assert_eq!(stream_status(&relay, &t).0, 401);
}

#[test]
fn a_jwt_grant_filters_and_its_expiry_ends_sse_and_websocket() {
    let relay = relay_with(SECRET);
    let exp = now() + 2;
    let token = hs(&claims(
        exp,
        json!({"scope": ["watch"], "filter": {"agent": "a"}, "capture": "metadata"}),
    ));
    let mut sse = relay.sse("", &[("Authorization", &format!("Bearer {token}"))]);
    let (mut ws, hello) = Ws::hello(
        &relay,
        &format!("access_token={token}"),
        "consumer",
        json!({}),
    );
    // The socket's `hello` tells the grant, its `exp` included.
    assert_eq!(
        hello["capabilities"]["auth"]["grant"],
        json!({"scopes": ["watch"], "filter": {"agent": ["a"]}, "capture": "metadata", "exp": exp})
    );
    ws.subscribe("s", json!({}));
    let posted = agent()
        .post(&relay.url("/events"))
        .set("Authorization", "Bearer admin-tok")
        .set("AEP-Version", "0.1")
        .set("Content-Type", "application/x-ndjson")
        .send_string(&[ev("b", "s", 1), ev("a", "s", 2)].join("\n"));
    assert_eq!(status_json(posted).0, 202);
    assert_eq!(
        sse.expect().id.as_deref(),
        Some("s:0:2"),
        "agent b's Event is filtered out"
    );
    assert_eq!(ws.recv()["id"], "s-0-2");
    // The token expires: the stream ends (the rest of it holds no Event), the socket
    // gets `closing` with the reason, then the close frame.
    assert!(sse.rest().is_empty());
    let (code, frames) = ws.until_close();
    assert_eq!(code, Some(1008));
    let closing = frames
        .iter()
        .find(|f| f["type"] == "closing")
        .expect("closing");
    assert_eq!(closing["reason"], "token expired", "{closing}");
    assert!(now() >= exp);
}
