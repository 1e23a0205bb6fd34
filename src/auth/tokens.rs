//! The static bearer tokens: `AEP_TOKEN` and the tokens file's, looked up by digest in
//! constant time, and swapped whole when the tokens file is read again (SIGHUP,
//! docs/operating.md "Multi-tenant relay").

use super::grant::TokenSpec;
use super::{AuthError, Grant, Scopes};
use sha2::{Digest, Sha256};
use std::sync::{Arc, RwLock};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// The SHA-256 of a token: what the table keeps instead of the token.
pub(crate) fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// (digest of the token, what it grants), `AEP_TOKEN`'s last: should the tokens file
/// hold the same token, its line's grant, the narrower, is the one found.
type Table = Vec<([u8; 32], Grant)>;

/// A tokens file that holds the token of `--token` / `AEP_TOKEN`: one token with two
/// grants, every scope and the line's. The relay refuses to start with it, and a reload
/// that brings it keeps the tokens in use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a line{} holds the token of --token / AEP_TOKEN, which has every scope: give each its own token", .name.as_deref().map(|n| format!(" (name={n})")).unwrap_or_default())]
pub struct TokenClash {
    /// The clashing line's `name=`, when it has one (never the token).
    pub name: Option<Arc<str>>,
}

#[derive(Default)]
struct Inner {
    /// `AEP_TOKEN`'s digest: every scope, no restriction, kept across reloads.
    env: Option<[u8; 32]>,
    table: RwLock<Arc<Table>>,
}

/// The static tokens, shared between the relay and whoever reloads the tokens file (the
/// binary, on SIGHUP): [`TokensHandle::replace`] swaps the file's tokens for every later
/// request. Cheap to clone (one reference count).
#[derive(Clone, Default)]
pub struct TokensHandle(Arc<Inner>);

impl std::fmt::Debug for TokensHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokensHandle({} tokens)", self.len())
    }
}

fn table(env: Option<[u8; 32]>, specs: &[TokenSpec]) -> Table {
    let mut t = Table::with_capacity(specs.len() + 1);
    for s in specs {
        let grant = Grant {
            scopes: s.scopes,
            authenticated: true,
            holder: s.name.clone(),
            limits: (!s.limits.is_open()).then(|| Arc::new(s.limits.clone())),
            expires: None,
        };
        t.push((digest(&s.token), grant));
    }
    if let Some(d) = env {
        let mut g = Grant::open(Scopes::ALL);
        g.authenticated = true;
        t.push((d, g));
    }
    t
}

impl TokensHandle {
    /// A table of `env` (`AEP_TOKEN`: every scope) and the tokens of `specs`.
    pub fn new(env: Option<&str>, specs: &[TokenSpec]) -> TokensHandle {
        let env = env.map(digest);
        TokensHandle(Arc::new(Inner {
            env,
            table: RwLock::new(Arc::new(table(env, specs))),
        }))
    }

    /// Whether `specs` may stand beside `AEP_TOKEN`: none of them is its token.
    ///
    /// # Errors
    /// [`TokenClash`] naming the first line that is.
    pub fn clash(&self, specs: &[TokenSpec]) -> Result<(), TokenClash> {
        let Some(env) = self.0.env else {
            return Ok(());
        };
        match specs
            .iter()
            .find(|s| bool::from(digest(&s.token).ct_eq(&env)))
        {
            None => Ok(()),
            Some(s) => Err(TokenClash {
                name: s.name.clone(),
            }),
        }
    }

    /// Replaces the tokens file's tokens by `specs` (`AEP_TOKEN` stays): requests from
    /// now on are checked against them. A live stream or socket keeps the grant it was
    /// admitted with.
    ///
    /// # Errors
    /// [`TokenClash`] when one of `specs` is `AEP_TOKEN`'s token; the tokens in use are
    /// kept.
    pub fn replace(&self, specs: &[TokenSpec]) -> Result<(), TokenClash> {
        self.clash(specs)?;
        let t = Arc::new(table(self.0.env, specs));
        match self.0.table.write() {
            Ok(mut k) => *k = t,
            Err(poisoned) => *poisoned.into_inner() = t,
        }
        Ok(())
    }

    fn current(&self) -> Arc<Table> {
        match self.0.table.read() {
            Ok(t) => t.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// How many tokens are in use, `AEP_TOKEN` included.
    pub fn len(&self) -> usize {
        self.current().len()
    }

    /// Whether no token is in use.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What `token` grants.
    ///
    /// # Errors
    /// [`AuthError::Wrong`] when it is none of the tokens in use.
    pub fn check(&self, token: &str) -> Result<Grant, AuthError> {
        let d = digest(token);
        let table = self.current();
        // Look at every entry, and pick the first match without branching on it, so
        // the time taken does not depend on which one matched.
        let mut found = 0u32;
        let mut any = subtle::Choice::from(0);
        for (i, (t, _)) in table.iter().enumerate() {
            let eq = t.ct_eq(&d);
            found.conditional_assign(&(i as u32), eq & !any);
            any |= eq;
        }
        if bool::from(any) {
            Ok(table[found as usize].1.clone())
        } else {
            Err(AuthError::Wrong)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Restrictions;

    fn spec(token: &str, scopes: Scopes) -> TokenSpec {
        TokenSpec {
            token: token.into(),
            scopes,
            name: None,
            limits: Restrictions::default(),
        }
    }

    #[test]
    fn replace_swaps_the_file_tokens_and_keeps_the_environment_token() {
        let h = TokensHandle::new(Some("env"), &[spec("old", Scopes::WATCH)]);
        let other = h.clone();
        assert_eq!(h.check("old").unwrap().scopes, Scopes::WATCH);
        other.replace(&[spec("new", Scopes::EMIT)]).unwrap();
        assert_eq!(h.check("old"), Err(AuthError::Wrong));
        assert_eq!(h.check("new").unwrap().scopes, Scopes::EMIT);
        assert_eq!(h.check("env").unwrap().scopes, Scopes::ALL);
        other.replace(&[]).unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h.check("new"), Err(AuthError::Wrong));
    }

    #[test]
    fn the_environment_token_in_the_file_is_refused_and_never_widens_the_line() {
        let mut named = spec("env", Scopes::WATCH);
        named.name = Some("ops".into());
        let h = TokensHandle::new(Some("env"), &[spec("w", Scopes::WATCH)]);
        let e = h.replace(&[named.clone()]).unwrap_err();
        assert!(e.to_string().contains("name=ops") && !e.to_string().contains("env"));
        assert_eq!(h.check("w").unwrap().scopes, Scopes::WATCH, "kept");
        assert_eq!(h.check("env").unwrap().scopes, Scopes::ALL);
        assert!(TokensHandle::default().clash(&[named.clone()]).is_ok());
        // Built regardless (an embedder's `Auth::with_tokens`): the line's grant wins.
        let both = TokensHandle::new(Some("env"), &[named]);
        assert_eq!(both.check("env").unwrap().scopes, Scopes::WATCH);
    }
}
