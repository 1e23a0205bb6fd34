//! Bearer-token authentication and scopes (AEP-0003 §8.1; AEP-0004 §4.1, §8).
//!
//! Tokens come from `AEP_TOKEN` (one token with every scope) and/or a tokens file
//! (`AEP_TOKENS_FILE`): one token per line followed by its scopes, e.g.
//!
//! ```text
//! # token            scopes
//! s3cr3t-dashboard   watch
//! s3cr3t-agent       emit,watch
//! s3cr3t-operator    emit watch control
//! s3cr3t-oncall      watch admin
//! s3cr3t-team-a      watch name=team-a filter={"agent":"a"} capture=metadata
//! ```
//!
//! After the scopes, `key=value` grants narrow what the token allows ([`grant`]). The
//! binary reads the file again on SIGHUP and swaps its tokens in ([`TokensHandle`]).
//!
//! A request presents its token as `Authorization: Bearer <token>`, or as the query
//! parameter `access_token=<token>` for EventSource and browser WebSocket clients that
//! cannot set headers. Tokens are compared in constant time (SHA-256 digests compared
//! with `subtle`), and never logged: use [`scrub_query`] before logging a request target.
//!
//! `admin` lets a token see every connection (`GET /connections`). With no token
//! configured the relay grants `emit`, `watch` and `admin` to every peer that can reach
//! it (the start-up gate keeps such a relay on loopback unless the operator says
//! otherwise) and refuses all control (AEP-0004 §4.1: control needs authentication
//! unconditionally).

use crate::wire::http::RequestHead;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

pub mod grant;
pub mod jwt;
pub mod tokens;

pub use grant::{Grant, GrantError, Restrictions, TokenSpec};
pub use jwt::{JwtExpect, JwtKeyError, JwtKeys};
use std::sync::RwLock;
pub use tokens::{TokenClash, TokensHandle};

/// A set of scopes.
#[derive(Copy, Clone, PartialEq, Eq, Default, Hash)]
pub struct Scopes(u8);

impl Scopes {
    /// No scope.
    pub const NONE: Scopes = Scopes(0);
    /// May POST Events and send Events on a socket.
    pub const EMIT: Scopes = Scopes(1);
    /// May subscribe, stream, read the roster and the metrics.
    pub const WATCH: Scopes = Scopes(2);
    /// May send commands (AEP-0004).
    pub const CONTROL: Scopes = Scopes(4);
    /// May see every connection (`GET /connections`, the status page's most lagging
    /// consumers): peers, filters and the holders of other tokens.
    pub const ADMIN: Scopes = Scopes(8);
    /// Every scope.
    pub const ALL: Scopes = Scopes(15);

    /// Whether every scope of `other` is in `self`.
    pub fn contains(self, other: Scopes) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union.
    pub fn with(self, other: Scopes) -> Scopes {
        Scopes(self.0 | other.0)
    }

    /// The scope's name (`emit`, `watch`, `control`, `admin`) for a single scope.
    pub fn name(self) -> &'static str {
        match self {
            Scopes::EMIT => "emit",
            Scopes::WATCH => "watch",
            Scopes::CONTROL => "control",
            Scopes::ADMIN => "admin",
            _ => "scopes",
        }
    }

    fn parse_one(s: &str) -> Option<Scopes> {
        Some(match s {
            "emit" => Scopes::EMIT,
            "watch" => Scopes::WATCH,
            "control" => Scopes::CONTROL,
            "admin" => Scopes::ADMIN,
            _ => return None,
        })
    }
}

impl Scopes {
    /// The names of the scopes in `self`, in the order emit, watch, control, admin.
    pub fn names(self) -> Vec<&'static str> {
        [Scopes::EMIT, Scopes::WATCH, Scopes::CONTROL, Scopes::ADMIN]
            .into_iter()
            .filter(|s| self.contains(*s))
            .map(|s| s.name())
            .collect()
    }
}

impl fmt::Debug for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scopes({})", self.names().join(","))
    }
}

/// Why a request was not authenticated (401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No token was presented.
    Missing,
    /// The token presented is not known (or, a JWT, not signed by a configured key
    /// with its algorithm, or its claims do not parse).
    Wrong,
    /// A JWT at or past its `exp`.
    Expired,
    /// A JWT before its `nbf`.
    NotYetValid,
}

impl AuthError {
    /// The JSON error detail.
    pub fn detail(self) -> &'static str {
        match self {
            AuthError::Missing => "a bearer token is required: Authorization: Bearer <token>, or ?access_token=<token> (AEP-0003 §8.1)",
            AuthError::Wrong => "the bearer token is not valid (AEP-0003 §8.1)",
            AuthError::Expired => "the bearer token has expired (its JWT `exp` has passed)",
            AuthError::NotYetValid => "the bearer token is not valid yet (its JWT `nbf` is still ahead)",
        }
    }
}

/// A tokens file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("tokens file {path}: {reason}")]
pub struct TokensFileError {
    /// The file.
    pub path: String,
    /// What is wrong (line number included; never the token itself).
    pub reason: String,
}

/// The keys JWTs are verified with, shared between the relay and whoever reloads them
/// (the binary, on SIGHUP): [`JwtHandle::replace`] swaps them for every later request.
#[derive(Clone, Debug)]
pub struct JwtHandle(Arc<RwLock<Arc<JwtKeys>>>);

impl JwtHandle {
    /// A handle holding `keys`.
    pub fn new(keys: JwtKeys) -> JwtHandle {
        JwtHandle(Arc::new(RwLock::new(Arc::new(keys))))
    }

    /// Replaces the keys: requests from now on are verified with `keys` (a live stream
    /// keeps the grant it was admitted with, until its token's `exp`).
    pub fn replace(&self, keys: JwtKeys) {
        let keys = Arc::new(keys);
        match self.0.write() {
            Ok(mut k) => *k = keys,
            Err(poisoned) => *poisoned.into_inner() = keys,
        }
    }

    /// The keys now.
    pub fn current(&self) -> Arc<JwtKeys> {
        match self.0.read() {
            Ok(k) => k.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// The configured tokens and JWT keys.
#[derive(Clone, Default)]
pub struct Auth {
    /// `AEP_TOKEN` and the tokens file's tokens.
    tokens: TokensHandle,
    /// Whether static tokens are configured: `AEP_TOKEN`, a tokens file (even one that
    /// holds no token now: its tokens may all be revoked, which opens nothing).
    static_tokens: bool,
    /// `--jwt-key`: the keys JWTs are verified with.
    jwt: Option<JwtHandle>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Auth({} tokens, jwt {})",
            self.tokens.len(),
            self.jwt.is_some()
        )
    }
}

impl Auth {
    /// Builds the token table from `AEP_TOKEN` (all scopes) and tokens with scopes only.
    pub fn new(token: Option<&str>, scoped: &[(String, Scopes)]) -> Auth {
        let specs: Vec<TokenSpec> = scoped
            .iter()
            .map(|(t, s)| TokenSpec {
                token: t.clone(),
                scopes: *s,
                name: None,
                limits: Restrictions::default(),
            })
            .collect();
        Auth::with_tokens(token, &specs)
    }

    /// Builds the token table from `AEP_TOKEN` (all scopes, no restriction) and the
    /// tokens file's lines ([`Auth::parse_tokens_file`]). Authentication is on when
    /// either holds a token. Should a line hold `AEP_TOKEN`'s token, the line's grant is
    /// the one it gets ([`Auth::with_tokens_file`] refuses it).
    pub fn with_tokens(token: Option<&str>, specs: &[TokenSpec]) -> Auth {
        Auth {
            tokens: TokensHandle::new(token, specs),
            static_tokens: token.is_some() || !specs.is_empty(),
            jwt: None,
        }
    }

    /// Like [`Auth::with_tokens`], for a tokens file read again later
    /// ([`Auth::tokens`], [`TokensHandle::replace`]): authentication is on even while
    /// the file holds no token, so emptying it refuses every request rather than opening
    /// the relay.
    ///
    /// # Errors
    /// [`TokenClash`] when a line of the file holds `token` (one token with two grants).
    pub fn with_tokens_file(token: Option<&str>, specs: &[TokenSpec]) -> Result<Auth, TokenClash> {
        let auth = Auth {
            static_tokens: true,
            ..Auth::with_tokens(token, specs)
        };
        auth.tokens.clash(specs)?;
        Ok(auth)
    }

    /// The static tokens' handle, for reloading the tokens file.
    pub fn tokens(&self) -> &TokensHandle {
        &self.tokens
    }

    /// Also takes JWTs signed by the keys of `jwt` (`--jwt-key`).
    pub fn with_jwt(mut self, jwt: JwtHandle) -> Auth {
        self.jwt = Some(jwt);
        self
    }

    /// The JWT keys' handle, for reloading them.
    pub fn jwt(&self) -> Option<&JwtHandle> {
        self.jwt.as_ref()
    }

    /// The credentials taken, for the discovery document: `bearer` (configured tokens)
    /// and `jwt` (a `--jwt-key`).
    pub fn schemes(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.static_tokens {
            v.push("bearer");
        }
        if self.jwt.is_some() {
            v.push("jwt");
        }
        v
    }

    /// Whether any token is configured.
    pub fn enabled(&self) -> bool {
        self.static_tokens || self.jwt.is_some()
    }

    /// Parses a tokens file's text: `TOKEN SCOPE[,SCOPE…] [KEY=VALUE…]` per line (scopes
    /// separated by commas or spaces, then the grants of [`grant`]), blank lines and `#`
    /// comments ignored.
    ///
    /// # Errors
    /// A line without scopes, with an unknown scope or grant, a grant that does not
    /// parse, or a token used twice. The error names the line, never the token.
    pub fn parse_tokens_file(path: &Path, text: &str) -> Result<Vec<TokenSpec>, TokensFileError> {
        let err = |reason: String| TokensFileError {
            path: path.display().to_string(),
            reason,
        };
        let mut out: Vec<TokenSpec> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let end = line
                .find(|c: char| c.is_whitespace() || c == ',')
                .unwrap_or(line.len());
            let (token, rest) = line.split_at(end);
            let rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
            let (scopes, name, limits) =
                grant::parse_line_rest(rest).map_err(|r| err(format!("line {}: {r}", i + 1)))?;
            if out.iter().any(|t| t.token == token) {
                return Err(err(format!("line {}: the token appears twice", i + 1)));
            }
            out.push(TokenSpec {
                token: token.to_string(),
                scopes,
                name,
                limits,
            });
        }
        Ok(out)
    }

    /// The token a request presents: `Authorization: Bearer …` first, then the
    /// `access_token` query parameter.
    pub fn presented(head: &RequestHead) -> Option<String> {
        if let Some(v) = head.header("authorization") {
            let mut it = v.splitn(2, ' ');
            if it.next().is_some_and(|s| s.eq_ignore_ascii_case("bearer")) {
                return it.next().map(|t| t.trim().to_string());
            }
        }
        head.query_pairs()
            .into_iter()
            .find(|(k, _)| k == "access_token")
            .map(|(_, v)| v)
    }

    /// Decides what a request may do, at `now_unix` (seconds since the Unix epoch: a
    /// JWT's `exp` and `nbf` are read against it).
    ///
    /// # Errors
    /// [`AuthError`] when tokens are configured and the request presents none, an
    /// unknown one, or a JWT that is not valid now.
    pub fn check(&self, head: &RequestHead, now_unix: u64) -> Result<Grant, AuthError> {
        if !self.enabled() {
            return Ok(Grant::open(
                Scopes::EMIT.with(Scopes::WATCH).with(Scopes::ADMIN),
            ));
        }
        let token = Auth::presented(head).ok_or(AuthError::Missing)?;
        self.check_token(&token, now_unix)
    }

    /// What `token` grants at `now_unix`: a JWT (three dot-separated parts) when
    /// `--jwt-key` is set, else, or when it is no valid JWT, a configured token.
    ///
    /// # Errors
    /// [`AuthError::Wrong`] when it is neither; [`AuthError::Expired`] or
    /// [`AuthError::NotYetValid`] for a JWT signed by a configured key outside its time.
    pub fn check_token(&self, token: &str, now_unix: u64) -> Result<Grant, AuthError> {
        let mut jwt_said = AuthError::Wrong;
        if let Some(jwt) = &self.jwt {
            if token.bytes().filter(|b| *b == b'.').count() == 2 {
                match jwt.current().validate(token, now_unix) {
                    Ok(g) => return Ok(g),
                    Err(e) => jwt_said = e,
                }
            }
        }
        self.tokens.check(token).map_err(|_| jwt_said)
    }
}

/// A request target with the value of every `access_token` parameter replaced by `***`,
/// for logging (AEP-0003 §8.1: servers MUST NOT log it).
pub fn scrub_query(target: &str) -> String {
    let Some((path, query)) = target.split_once('?') else {
        return target.to_string();
    };
    let parts: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, _)) if k == "access_token" => format!("{k}=***"),
            _ => p.to_string(),
        })
        .collect();
    format!("{path}?{}", parts.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(auth: Option<&str>, query: &str) -> RequestHead {
        let mut h = RequestHead {
            query: query.into(),
            ..Default::default()
        };
        if let Some(a) = auth {
            h.headers.push(("authorization".into(), a.into()));
        }
        h
    }

    #[test]
    fn tokens_file_parses_scopes_and_refuses_mistakes() {
        let p = Path::new("t");
        let got = Auth::parse_tokens_file(p, "# c\n\na emit,watch\nb control name=ops\n").unwrap();
        assert_eq!(got[0].scopes, Scopes::EMIT.with(Scopes::WATCH));
        assert_eq!(got[1].scopes, Scopes::CONTROL);
        assert_eq!(got[1].name.as_deref(), Some("ops"));
        let e = Auth::parse_tokens_file(p, "secret watch colour=red\n").unwrap_err();
        assert!(!e.to_string().contains("secret"), "never echo a token: {e}");
        assert!(Auth::parse_tokens_file(p, "a\n").is_err());
        assert!(Auth::parse_tokens_file(p, "a emit,root\n").is_err());
        let e = Auth::parse_tokens_file(p, "secret emit\nsecret watch\n").unwrap_err();
        assert!(!e.to_string().contains("secret"), "never echo a token: {e}");
    }

    #[test]
    fn check_header_query_missing_wrong() {
        let a = Auth::new(Some("t0p"), &[("w".into(), Scopes::WATCH)]);
        assert_eq!(
            a.check(&head(Some("Bearer t0p"), ""), 0).unwrap().scopes,
            Scopes::ALL
        );
        assert_eq!(
            a.check(&head(None, "x=1&access_token=w"), 0)
                .unwrap()
                .scopes,
            Scopes::WATCH
        );
        assert_eq!(a.check(&head(None, ""), 0), Err(AuthError::Missing));
        assert_eq!(
            a.check(&head(Some("Bearer nope"), ""), 0),
            Err(AuthError::Wrong)
        );
        let open = Auth::default().check(&head(None, ""), 0).unwrap();
        assert!(!open.authenticated && !open.scopes.contains(Scopes::CONTROL));
    }

    #[test]
    fn scrub_hides_access_tokens() {
        assert_eq!(
            scrub_query("/stream?a=1&access_token=s3&b=2"),
            "/stream?a=1&access_token=***&b=2"
        );
        assert_eq!(scrub_query("/stream"), "/stream");
    }
}
