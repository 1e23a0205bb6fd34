//! Control routing (AEP-0004 §4): which live connection claims which session, and where
//! a command goes.
//!
//! A WebSocket connection that sends a sequenced Event for a session **claims** that
//! session for as long as it lives (the claim ends when the connection closes). A
//! command addressed to a session goes to exactly one claimant, or is refused on the
//! target's behalf with a connection-scoped `error` frame that never enters history:
//!
//! | situation | code |
//! |---|---|
//! | no live claimant | `no-route` |
//! | more than one live claimant (session names collide, AEP-0001 §5.2) | `ambiguous` |
//! | the claimant's `hello` declared no `control.accepts` listing the type | `unsupported` |
//!
//! The relay never guesses between claimants and never broadcasts a command (§4.5). The
//! gate on the sender (`unauthorized`: an unauthenticated connection or a token without
//! the `control` scope) is checked before routing, by the caller.

use crate::ids::ConnId;
use smallvec::SmallVec;
use std::collections::HashMap;

/// Live session claims: session → claimant connection keys, in claim order.
///
/// Invariant: no session maps to an empty list, and a connection appears at most once
/// per session.
#[derive(Debug, Default)]
pub struct Claims {
    by_session: HashMap<Box<str>, SmallVec<[ConnId; 1]>>,
}

/// Why a command could not be routed (AEP-0004 §4.2, §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteRefusal {
    /// No live connection claims the session (or the command names none).
    NoRoute,
    /// This many live connections claim it; the relay will not pick one.
    Ambiguous(usize),
    /// The single claimant did not declare the command's type in `control.accepts`.
    Unsupported,
}

impl RouteRefusal {
    /// The `error` frame's `code`.
    pub fn code(self) -> crate::refusal::Code {
        match self {
            RouteRefusal::NoRoute => crate::refusal::Code::NoRoute,
            RouteRefusal::Ambiguous(_) => crate::refusal::Code::Ambiguous,
            RouteRefusal::Unsupported => crate::refusal::Code::Unsupported,
        }
    }

    /// The `error` frame's `detail` for a command of `event_type` to `session`.
    pub fn detail(self, event_type: &str, session: &str) -> String {
        match self {
            RouteRefusal::NoRoute => format!(
                "no live emitter connection claims session {session:?}, so `{event_type}` has no route (AEP-0004 §4.2)"
            ),
            RouteRefusal::Ambiguous(n) => format!(
                "{n} live connections claim session {session:?}; a command goes to at most one target, so it was not delivered (AEP-0004 §4.5)"
            ),
            RouteRefusal::Unsupported => format!(
                "the emitter claiming session {session:?} does not list `{event_type}` in its declared control.accepts (AEP-0004 §4.2)"
            ),
        }
    }
}

impl Claims {
    /// Records that connection `conn` claims `session`. Returns `false` when it already
    /// did (nothing changes, nothing is allocated).
    pub fn claim(&mut self, session: &str, conn: ConnId) -> bool {
        if let Some(list) = self.by_session.get_mut(session) {
            if list.contains(&conn) {
                return false;
            }
            list.push(conn);
            return true;
        }
        self.by_session
            .insert(session.into(), SmallVec::from_elem(conn, 1));
        true
    }

    /// Ends `conn`'s claim on `session` (no-op when it had none).
    pub fn release(&mut self, session: &str, conn: ConnId) {
        if let Some(list) = self.by_session.get_mut(session) {
            list.retain(|c| *c != conn);
            if list.is_empty() {
                self.by_session.remove(session);
            }
        }
    }

    /// The live claimants of `session`, in claim order.
    pub fn claimants(&self, session: &str) -> &[ConnId] {
        self.by_session.get(session).map_or(&[], |l| &l[..])
    }

    /// Every claimed session with its claimants, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[ConnId])> + '_ {
        self.by_session.iter().map(|(s, l)| (&**s, &l[..]))
    }

    /// Number of claimed sessions.
    pub fn len(&self) -> usize {
        self.by_session.len()
    }

    /// Whether no session is claimed.
    pub fn is_empty(&self) -> bool {
        self.by_session.is_empty()
    }

    /// Routes a command of `event_type` addressed to `session` (`None` when the command
    /// names none): the single claimant's key, when `accepts(claimant)` says it
    /// declared the type.
    ///
    /// # Errors
    /// [`RouteRefusal`] as in the module table.
    pub fn route(
        &self,
        session: Option<&str>,
        accepts: impl Fn(ConnId) -> bool,
    ) -> Result<ConnId, RouteRefusal> {
        let list = session.map_or(&[][..], |s| self.claimants(s));
        match list {
            [] => Err(RouteRefusal::NoRoute),
            [one] if accepts(*one) => Ok(*one),
            [_] => Err(RouteRefusal::Unsupported),
            many => Err(RouteRefusal::Ambiguous(many.len())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_needs_exactly_one_accepting_claimant() {
        let mut c = Claims::default();
        assert_eq!(c.route(Some("s"), |_| true), Err(RouteRefusal::NoRoute));
        assert_eq!(c.route(None, |_| true), Err(RouteRefusal::NoRoute));
        assert!(c.claim("s", ConnId(7)));
        assert!(!c.claim("s", ConnId(7)));
        assert_eq!(c.route(Some("s"), |_| true), Ok(ConnId(7)));
        assert_eq!(
            c.route(Some("s"), |_| false),
            Err(RouteRefusal::Unsupported)
        );
        c.claim("s", ConnId(9));
        assert_eq!(
            c.route(Some("s"), |_| true),
            Err(RouteRefusal::Ambiguous(2))
        );
        c.release("s", ConnId(7));
        assert_eq!(c.route(Some("s"), |k| k == ConnId(9)), Ok(ConnId(9)));
        c.release("s", ConnId(9));
        assert!(c.is_empty());
    }
}
