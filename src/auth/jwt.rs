//! JWT bearer tokens (RFC 7519) signed by the keys of `--jwt-key` (docs/operating.md,
//! "Multi-tenant relay").
//!
//! The key file is one of: a JWKS (RFC 7517 §5, a JSON object with `keys`), a PEM public
//! key (RSA: RS256; EC P-256: ES256), or else an HS256 secret (the file's bytes, trailing
//! whitespace cut, at least 32 bytes, RFC 7518 §3.2). Each key verifies exactly one
//! algorithm, fixed by its type, never by the token: a token whose header names another
//! (`none`, or HS256 against an RSA public key used as the secret) is refused. In a JWKS
//! the token's `kid` picks the key; without a `kid`, the keys of its algorithm are tried.
//!
//! The claims: `exp` (required) and `nbf` in seconds since the Unix epoch, `sub` (the
//! grant's holder), and `aep`: `{"scope": ["emit", "watch", "control", "admin"], "filter",
//! "capture", "agent", "commands", "targets"}` (the grants of [`super::grant`]; an
//! unknown member is refused rather than ignored, so a misspelt grant never widens what
//! a token allows). The time is the caller's (`now_unix`): the relay's clock, read by
//! its driver.

use super::grant::{self, GrantError, Restrictions};
use super::{AuthError, Grant, Scopes};
use crate::filter::Filter;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use std::sync::Arc;

/// A key file that cannot be used (`--jwt-key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct JwtKeyError(pub String);

/// One verification key and the one algorithm it verifies.
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
    validation: Validation,
}

/// The keys JWTs are verified with.
pub struct JwtKeys {
    keys: Vec<Key>,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let algs: Vec<_> = self
            .keys
            .iter()
            .map(|k| (k.kid.as_deref(), k.alg))
            .collect();
        write!(f, "JwtKeys({algs:?})")
    }
}

/// The validation of one key: its algorithm only; `exp` and `nbf` are checked against
/// the caller's clock ([`JwtKeys::validate`]), not the library's.
fn validation(alg: Algorithm) -> Validation {
    let mut v = Validation::new(alg);
    v.validate_exp = false;
    v.validate_nbf = false;
    v.validate_aud = false;
    v.required_spec_claims.clear();
    v
}

/// What every token's registered claims must name besides its time window: its audience
/// (`aud`, RFC 7519 §4.1.3: one of the token's audiences is this one) and its issuer
/// (`iss`, §4.1.1). `None`: not checked. A token without the claim is refused when it
/// is checked, so a token minted for another service with the same key is not taken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JwtExpect {
    /// The audience this relay is (`--jwt-audience`).
    pub audience: Option<String>,
    /// The one issuer trusted (`--jwt-issuer`).
    pub issuer: Option<String>,
}

fn key(kid: Option<String>, alg: Algorithm, key: DecodingKey) -> Key {
    Key {
        kid,
        alg,
        key,
        validation: validation(alg),
    }
}

impl JwtKeys {
    /// Reads a key file's bytes: a JWKS, a PEM public key, or an HS256 secret.
    ///
    /// # Errors
    /// [`JwtKeyError`]: a JWKS or PEM that does not parse, a key of an algorithm other
    /// than HS256, RS256 and ES256, an empty JWKS, a secret under 32 bytes. It never
    /// quotes the file.
    pub fn parse(bytes: &[u8]) -> Result<JwtKeys, JwtKeyError> {
        let text = std::str::from_utf8(bytes).unwrap_or("");
        let trimmed = text.trim_start_matches('\u{feff}').trim();
        // A file that holds a PEM block anywhere (after a comment, a byte-order mark,
        // OpenSSL's bag attributes) is a public key or nothing: never an HMAC secret,
        // which anyone holding the public key could sign with.
        let armour = memchr::memmem::find(bytes, b"-----BEGIN");
        let keys = if trimmed.starts_with('{') {
            jwks(trimmed)?
        } else if let Some(at) = armour {
            vec![pem(&bytes[at..])?]
        } else {
            let secret = bytes.trim_ascii_end();
            if secret.len() < 32 {
                return Err(JwtKeyError(format!(
                    "an HS256 secret needs at least 32 bytes, this one has {} (RFC 7518 §3.2)",
                    secret.len()
                )));
            }
            let k = DecodingKey::from_secret(secret)
                .map_err(|e| JwtKeyError(format!("the HS256 secret: {e}")))?;
            vec![key(None, Algorithm::HS256, k)]
        };
        Ok(JwtKeys { keys })
    }

    /// The same keys, verifying from now on that each token names `expect`'s audience
    /// and issuer (a token that does not, or lacks the claim, is [`AuthError::Wrong`]).
    pub fn expecting(mut self, expect: &JwtExpect) -> JwtKeys {
        for k in &mut self.keys {
            if let Some(aud) = &expect.audience {
                k.validation.set_audience(&[aud]);
                k.validation.validate_aud = true;
                k.validation.required_spec_claims.insert("aud".into());
            }
            if let Some(iss) = &expect.issuer {
                k.validation.set_issuer(&[iss]);
                k.validation.required_spec_claims.insert("iss".into());
            }
        }
        self
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there is no key (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Verifies `token` and reads its grant at `now_unix` (seconds since the Unix epoch).
    ///
    /// # Errors
    /// [`AuthError::Wrong`] for a token that is no JWT, is signed by no key here or
    /// with another algorithm, or whose claims do not parse; [`AuthError::Expired`] at
    /// or past its `exp`; [`AuthError::NotYetValid`] before its `nbf`.
    pub fn validate(&self, token: &str, now_unix: u64) -> Result<Grant, AuthError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthError::Wrong)?;
        let mut candidates = self.keys.iter().filter(|k| k.alg == header.alg);
        let claims = match &header.kid {
            Some(kid) => {
                let k = candidates
                    .find(|k| {
                        k.kid.as_deref() == Some(kid) || (k.kid.is_none() && self.keys.len() == 1)
                    })
                    .ok_or(AuthError::Wrong)?;
                decode(token, k)?
            }
            None => candidates
                .find_map(|k| decode(token, k).ok())
                .ok_or(AuthError::Wrong)?,
        };
        claims.grant(now_unix)
    }
}

fn decode(token: &str, k: &Key) -> Result<Claims, AuthError> {
    jsonwebtoken::decode::<Claims>(token, &k.key, &k.validation)
        .map(|d| d.claims)
        .map_err(|_| AuthError::Wrong)
}

/// A PEM public key: RSA (RS256) or EC P-256 (ES256).
fn pem(bytes: &[u8]) -> Result<Key, JwtKeyError> {
    if let Ok(k) = DecodingKey::from_rsa_pem(bytes) {
        return Ok(key(None, Algorithm::RS256, k));
    }
    if let Ok(k) = DecodingKey::from_ec_pem(bytes) {
        return Ok(key(None, Algorithm::ES256, k));
    }
    Err(JwtKeyError(
        "the PEM is neither an RSA nor an EC public key (use RS256 or ES256 keys)".into(),
    ))
}

/// A JWKS: every key with its `kid`, its algorithm from its type (and its `alg`, which
/// must agree).
fn jwks(text: &str) -> Result<Vec<Key>, JwtKeyError> {
    let set: JwkSet = serde_json::from_str(text)
        .map_err(|e| JwtKeyError(format!("the JWKS does not parse: {e}")))?;
    let mut out = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        let alg = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            AlgorithmParameters::OctetKey(_) => Algorithm::HS256,
            _ => {
                return Err(JwtKeyError(format!(
                "JWKS key {i}: only RSA (RS256), EC P-256 (ES256) and oct (HS256) keys are taken"
            )))
            }
        };
        if let Some(declared) = jwk.common.key_algorithm {
            let same = matches!(
                (declared, alg),
                (KeyAlgorithm::RS256, Algorithm::RS256)
                    | (KeyAlgorithm::ES256, Algorithm::ES256)
                    | (KeyAlgorithm::HS256, Algorithm::HS256)
            );
            if !same {
                return Err(JwtKeyError(format!(
                    "JWKS key {i}: its `alg` {declared:?} is not the {alg:?} its type verifies"
                )));
            }
        }
        let k =
            DecodingKey::from_jwk(jwk).map_err(|e| JwtKeyError(format!("JWKS key {i}: {e}")))?;
        out.push(key(jwk.common.key_id.clone(), alg, k));
    }
    if out.is_empty() {
        return Err(JwtKeyError("the JWKS holds no key".into()));
    }
    Ok(out)
}

/// The claims read (RFC 7519 §4.1; `aep`, this relay's).
#[derive(Deserialize)]
struct Claims {
    exp: u64,
    nbf: Option<u64>,
    sub: Option<String>,
    aep: Option<AepClaim>,
}

/// The `aep` claim: scopes and grants.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AepClaim {
    scope: Vec<String>,
    filter: Option<serde_json::Value>,
    capture: Option<String>,
    agent: Option<String>,
    commands: Option<Vec<String>>,
    targets: Option<Vec<String>>,
}

impl Claims {
    fn grant(self, now: u64) -> Result<Grant, AuthError> {
        if now >= self.exp {
            return Err(AuthError::Expired);
        }
        if self.nbf.is_some_and(|n| now < n) {
            return Err(AuthError::NotYetValid);
        }
        let aep = self.aep.ok_or(AuthError::Wrong)?;
        let (scopes, limits) = aep.read().map_err(|_| AuthError::Wrong)?;
        Ok(Grant {
            scopes,
            authenticated: true,
            holder: self.sub.map(Arc::from),
            limits: (!limits.is_open()).then(|| Arc::new(limits)),
            expires: Some(self.exp),
        })
    }
}

impl AepClaim {
    fn read(self) -> Result<(Scopes, Restrictions), GrantError> {
        let mut scopes = Scopes::NONE;
        for s in &self.scope {
            scopes = scopes.with(
                Scopes::parse_one(s).ok_or_else(|| GrantError(format!("unknown scope {s:?}")))?,
            );
        }
        let list = |what: &str, v: Option<Vec<String>>| {
            v.map(|v| grant::names(what, v.iter().map(|s| Some(s.as_str()))))
                .transpose()
        };
        Ok((
            scopes,
            Restrictions {
                filter: self
                    .filter
                    .map(|f| Filter::compile(&f).map(Arc::new))
                    .transpose()?,
                capture: self.capture.as_deref().map(grant::capture).transpose()?,
                agent: match self.agent {
                    Some(a) if a.is_empty() => return Err(GrantError("empty `agent`".into())),
                    a => a.map(Box::from),
                },
                commands: list("commands", self.commands)?,
                targets: list("targets", self.targets)?,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn hs(claims: &serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(SECRET).unwrap(),
        )
        .unwrap()
    }

    fn claims(exp: u64) -> serde_json::Value {
        json!({"exp": exp, "sub": "team-a", "aep": {"scope": ["watch"], "filter": {"agent": "a"}, "capture": "metadata"}})
    }

    #[test]
    fn an_hs256_token_gives_its_grant_until_exp() {
        let keys = JwtKeys::parse(SECRET).unwrap();
        let g = keys.validate(&hs(&claims(100)), 99).unwrap();
        assert_eq!(g.scopes, Scopes::WATCH);
        assert_eq!(g.holder.as_deref(), Some("team-a"));
        assert_eq!(g.expires, Some(100));
        assert!(g.filter().is_some());
        assert_eq!(
            keys.validate(&hs(&claims(100)), 100),
            Err(AuthError::Expired)
        );
        let mut c = claims(100);
        c["nbf"] = json!(50);
        assert_eq!(keys.validate(&hs(&c), 49), Err(AuthError::NotYetValid));
        assert!(keys.validate(&hs(&c), 50).is_ok());
    }

    #[test]
    fn wrong_keys_algorithms_and_claims_are_refused() {
        let keys = JwtKeys::parse(SECRET).unwrap();
        let other = encode(
            &Header::new(Algorithm::HS256),
            &claims(100),
            &EncodingKey::from_secret(b"another secret another secret 00").unwrap(),
        )
        .unwrap();
        assert_eq!(keys.validate(&other, 1), Err(AuthError::Wrong));
        // `alg: none` (no signature) and HS384 are not this key's algorithm.
        let t = hs(&claims(100));
        let body = t.split('.').nth(1).unwrap();
        let none = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{body}.");
        assert_eq!(keys.validate(&none, 1), Err(AuthError::Wrong));
        let hs384 = encode(
            &Header::new(Algorithm::HS384),
            &claims(100),
            &EncodingKey::from_secret(SECRET).unwrap(),
        )
        .unwrap();
        assert_eq!(keys.validate(&hs384, 1), Err(AuthError::Wrong));
        for bad in [
            json!({"aep": {"scope": ["watch"]}}),
            json!({"exp": 100}),
            json!({"exp": 100, "aep": {"scope": ["root"]}}),
            json!({"exp": 100, "aep": {"scope": ["watch"], "filtre": {}}}),
            json!({"exp": 100, "aep": {"scope": ["watch"], "filter": {"seq": 1}}}),
            json!({"exp": 100, "aep": {"scope": ["watch"], "commands": []}}),
            json!({"exp": "100", "aep": {"scope": ["watch"]}}),
        ] {
            assert_eq!(keys.validate(&hs(&bad), 1), Err(AuthError::Wrong), "{bad}");
        }
        assert_eq!(keys.validate("not.a.jwt", 1), Err(AuthError::Wrong));
        assert_eq!(keys.validate("", 1), Err(AuthError::Wrong));
    }

    /// A public key with anything before its PEM block (a comment, a byte-order mark,
    /// OpenSSL's bag attributes) is still read as that public key: never as an HS256
    /// secret, which anyone holding the public key could sign tokens with.
    #[test]
    fn a_pem_after_other_lines_is_a_public_key_never_a_secret() {
        let pem = include_bytes!("../../tests/wire/jwt-keys/rsa.pub.pem");
        for prefix in [
            &b"# the relay's key\n"[..],
            "\u{feff}".as_bytes(),
            b"Bag Attributes\n    friendlyName: k\n",
        ] {
            let file = [prefix, &pem[..]].concat();
            let keys = JwtKeys::parse(&file).unwrap();
            assert_eq!(keys.keys[0].alg, Algorithm::RS256);
            let forged = encode(
                &Header::new(Algorithm::HS256),
                &claims(100),
                &EncodingKey::from_secret(&file).unwrap(),
            )
            .unwrap();
            assert_eq!(keys.validate(&forged, 1), Err(AuthError::Wrong));
        }
        assert!(JwtKeys::parse(b"a secret of 32 bytes, but -----BEGIN inside").is_err());
    }

    #[test]
    fn key_files_that_cannot_work_are_refused() {
        assert!(JwtKeys::parse(b"short\n").is_err());
        assert!(JwtKeys::parse(b"{\"keys\": []}").is_err());
        assert!(JwtKeys::parse(b"{\"keys\": 1}").is_err());
        assert!(
            JwtKeys::parse(b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
                .is_err()
        );
        let e = JwtKeys::parse(b"short secret").unwrap_err();
        assert!(
            !e.to_string().contains("short secret"),
            "never quote the file: {e}"
        );
    }

    #[test]
    fn an_audience_and_an_issuer_are_checked_when_expected() {
        let expect = JwtExpect {
            audience: Some("relay-1".into()),
            issuer: Some("https://idp.example".into()),
        };
        let keys = JwtKeys::parse(SECRET).unwrap().expecting(&expect);
        let now = 1_000;
        let with = |extra: serde_json::Value| {
            let mut c = claims(now + 60);
            c.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            keys.validate(&hs(&c), now)
        };
        let good = json!({"aud": "relay-1", "iss": "https://idp.example"});
        assert!(with(good).is_ok());
        let among = json!({"aud": ["other", "relay-1"], "iss": "https://idp.example"});
        assert!(with(among).is_ok(), "one of its audiences is enough");
        for bad in [
            json!({"aud": "relay-2", "iss": "https://idp.example"}),
            json!({"aud": "relay-1", "iss": "https://evil.example"}),
            json!({"iss": "https://idp.example"}),
            json!({"aud": "relay-1"}),
        ] {
            assert_eq!(with(bad.clone()).err(), Some(AuthError::Wrong), "{bad}");
        }
        // Without an expectation, neither claim is looked at.
        let open = JwtKeys::parse(SECRET).unwrap();
        let c = json!({"exp": now + 60, "aud": "anyone", "aep": {"scope": ["watch"]}});
        assert!(open.validate(&hs(&c), now).is_ok());
    }
}
