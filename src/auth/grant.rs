//! What a token allows besides its scopes: the grants of a multi-tenant relay
//! (docs/operating.md, "Multi-tenant relay").
//!
//! A grant narrows, never widens: an absent grant leaves its dimension open. They are
//! read from a tokens file line (`key=value` after the scopes) or from a JWT's `aep`
//! claim (`auth::jwt`), and enforced where an Event enters or leaves the relay:
//!
//! - `filter`: an attr-match filter (AEP-0003 §6) ANDed with every filter its holder
//!   subscribes with ([`Grant::narrow`]), on SSE, WebSocket and replay alike, and with
//!   the roster (AEP-0003 §4.1);
//! - `capture`: a ceiling (AEP-0001 §8.2) no request exceeds ([`Grant::ceiling`]);
//! - `agent`: the one agent identity (AEP-0001 §5.1 `agent`, AEP-0003 §4 `hello`
//!   identity) its holder may emit as ([`Grant::may_emit_as`]);
//! - `commands`, `targets`: the command types and the agents whose sessions its holder
//!   may command (AEP-0004 §4.2 item 3, refused `unauthorized`).

use crate::filter::{Filter, FilterError};
use crate::wire::envelope::Capture;
use serde_json::Value;
use std::sync::Arc;

use super::Scopes;

/// The restrictions a token carries (each `None`: not restricted).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Restrictions {
    /// ANDed with every subscription's filter (AEP-0003 §6.1).
    pub filter: Option<Arc<Filter>>,
    /// The widest capture level delivered (AEP-0001 §8.2).
    pub capture: Option<Capture>,
    /// The one `agent` its holder may emit as.
    pub agent: Option<Box<str>>,
    /// The command types (`control.*`, AEP-0004 §5) its holder may send.
    pub commands: Option<Box<[Box<str>]>>,
    /// The agents whose sessions its holder may command.
    pub targets: Option<Box<[Box<str>]>>,
}

impl Restrictions {
    /// Whether nothing is restricted.
    pub fn is_open(&self) -> bool {
        *self == Restrictions::default()
    }
}

/// What a request may do: its scopes, whether it authenticated, who holds the token, and
/// the token's restrictions. Cheap to clone (two reference counts).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Grant {
    /// The scopes granted.
    pub scopes: Scopes,
    /// Whether the request presented a valid token (control needs this).
    pub authenticated: bool,
    /// Who holds the token, for operators: the tokens file's `name=` or the JWT `sub`;
    /// never the token itself. `None` when neither names one.
    pub holder: Option<Arc<str>>,
    /// The token's restrictions; `None` when it has none.
    pub limits: Option<Arc<Restrictions>>,
    /// When the token stops being valid, in seconds since the Unix epoch (the JWT
    /// `exp`); a live stream or socket is closed then. `None`: it does not expire.
    pub expires: Option<u64>,
}

impl Grant {
    /// An unauthenticated grant of `scopes` with no restriction.
    pub fn open(scopes: Scopes) -> Grant {
        Grant {
            scopes,
            ..Grant::default()
        }
    }

    /// The restrictions, or the open set.
    fn limits(&self) -> &Restrictions {
        static OPEN: Restrictions = Restrictions {
            filter: None,
            capture: None,
            agent: None,
            commands: None,
            targets: None,
        };
        self.limits.as_deref().unwrap_or(&OPEN)
    }

    /// The grant's filter, when it has one.
    pub fn filter(&self) -> Option<&Arc<Filter>> {
        self.limits().filter.as_ref()
    }

    /// Whether the grant's filter admits Events of `session` from `agent`
    /// ([`Filter::admits_stream`]): what a roster entry or a `/status` row may show.
    pub fn admits_stream(&self, session: &str, agent: Option<&str>) -> bool {
        self.filter()
            .is_none_or(|f| f.admits_stream(session, agent))
    }

    /// `requested` ANDed with the grant's filter (AEP-0003 §6.1: a conjunction), compiled
    /// once per subscription so fan-out evaluates one filter per Event as without a
    /// grant. `requested` itself when the grant has no filter.
    pub fn narrow(&self, requested: Arc<Filter>) -> Arc<Filter> {
        match self.filter() {
            None => requested,
            Some(g) if requested.is_match_all() => g.clone(),
            Some(g) => Arc::new(requested.and(g)),
        }
    }

    /// The capture ceiling for a request of `requested` (`None`: as received, the
    /// widest): the narrower of the two (AEP-0001 §8.2).
    pub fn ceiling(&self, requested: Option<Capture>) -> Option<Capture> {
        match (requested, self.limits().capture) {
            (Some(r), Some(g)) => Some(r.min(g)),
            (r, g) => r.or(g),
        }
    }

    /// Whether its holder may emit as `agent` (an Event's `agent`, a `hello` identity's
    /// `agent`; `None` when absent, which a grant of `agent` refuses).
    pub fn may_emit_as(&self, agent: Option<&str>) -> bool {
        match &self.limits().agent {
            None => true,
            Some(a) => agent == Some(&**a),
        }
    }

    /// The agent its holder must emit as, when the grant names one.
    pub fn agent(&self) -> Option<&str> {
        self.limits().agent.as_deref()
    }

    /// Whether its holder may send a command of type `ty` (AEP-0004 §4.2 item 3).
    pub fn may_command(&self, ty: &str) -> bool {
        self.limits()
            .commands
            .as_ref()
            .is_none_or(|c| c.iter().any(|t| **t == *ty))
    }

    /// Whether its holder may command a session claimed by `agent` (the claimant's
    /// `hello` identity; `None` when it declared none, which a grant of `targets`
    /// refuses).
    pub fn may_target(&self, agent: Option<&str>) -> bool {
        match &self.limits().targets {
            None => true,
            Some(t) => agent.is_some_and(|a| t.iter().any(|x| **x == *a)),
        }
    }

    /// What the grant allows, for its holder (the relay's WebSocket `hello`,
    /// `capabilities.auth.grant`, docs/operating.md "Multi-tenant relay"):
    /// `{"scopes": ["emit", "watch", "control", "admin"], "filter": {attr-match, AEP-0003
    /// §6}, "capture": level (AEP-0001 §8.2), "agent": name, "commands": [type…],
    /// "targets": [agent…], "exp": seconds since the Unix epoch}`, each member but
    /// `scopes` present only when the grant has it. Never the token, nor the holder's
    /// name (an operator's label).
    pub fn to_json(&self) -> serde_json::Value {
        let l = self.limits();
        let names = |v: &[Box<str>]| v.iter().map(|s| Value::from(&**s)).collect::<Value>();
        let mut m = serde_json::Map::new();
        m.insert("scopes".into(), self.scopes.names().into());
        if let Some(f) = &l.filter {
            m.insert("filter".into(), f.to_json());
        }
        if let Some(c) = l.capture {
            m.insert("capture".into(), c.as_str().into());
        }
        if let Some(a) = &l.agent {
            m.insert("agent".into(), Value::from(&**a));
        }
        if let Some(c) = &l.commands {
            m.insert("commands".into(), names(c));
        }
        if let Some(t) = &l.targets {
            m.insert("targets".into(), names(t));
        }
        if let Some(exp) = self.expires {
            m.insert("exp".into(), exp.into());
        }
        Value::Object(m)
    }

    /// Whether the grant restricts commands (types or targets).
    pub fn restricts_commands(&self) -> bool {
        let l = self.limits();
        l.commands.is_some() || l.targets.is_some()
    }
}

/// Why a grant could not be read (a tokens file line, a JWT claim).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrantError(pub String);

impl From<FilterError> for GrantError {
    fn from(e: FilterError) -> GrantError {
        GrantError(format!("`filter`: {e}"))
    }
}

/// A list of names: a JSON array of non-empty strings (JWT) or a comma-separated list
/// (tokens file).
pub(crate) fn names<'a>(
    what: &str,
    items: impl Iterator<Item = Option<&'a str>>,
) -> Result<Box<[Box<str>]>, GrantError> {
    let mut out = Vec::new();
    for i in items {
        match i {
            Some(s) if !s.is_empty() => out.push(Box::from(s)),
            _ => return Err(GrantError(format!("`{what}` holds non-empty names only"))),
        }
    }
    if out.is_empty() {
        return Err(GrantError(format!(
            "`{what}` needs at least one name (omit it to allow any)"
        )));
    }
    Ok(out.into_boxed_slice())
}

/// Parses a capture level (`none`, `metadata`, `redacted`, `full`).
pub(crate) fn capture(v: &str) -> Result<Capture, GrantError> {
    Capture::parse(v).ok_or_else(|| {
        GrantError(format!(
            "`capture` must be one of none, metadata, redacted, full, got {v:?}"
        ))
    })
}

/// One line of a tokens file: the token, its scopes, its holder's name and its
/// restrictions.
#[derive(Clone, PartialEq)]
pub struct TokenSpec {
    /// The token (never logged, never in an error).
    pub token: String,
    /// Its scopes.
    pub scopes: Scopes,
    /// `name=`: who holds it, for operators.
    pub name: Option<Arc<str>>,
    /// Its restrictions.
    pub limits: Restrictions,
}

impl std::fmt::Debug for TokenSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSpec")
            .field("token", &"***")
            .field("scopes", &self.scopes)
            .field("name", &self.name)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Parses what follows the token on a tokens file line: scopes (separated by commas or
/// spaces), then `key=value` grants separated by spaces. `filter=` takes a JSON object
/// (which may hold spaces), `commands=` and `targets=` comma-separated names, `capture=`
/// a level, `agent=` and `name=` one name.
pub(crate) fn parse_line_rest(
    rest: &str,
) -> Result<(Scopes, Option<Arc<str>>, Restrictions), String> {
    let mut scopes = Scopes::NONE;
    let mut name = None;
    let mut limits = Restrictions::default();
    let mut rest = rest.trim_start();
    // Scopes: every word before the first `key=`.
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| c.is_whitespace() || c == ',')
            .unwrap_or(rest.len());
        let word = &rest[..end];
        if word.contains('=') {
            break;
        }
        let s = Scopes::parse_one(word)
            .ok_or_else(|| format!("unknown scope {word:?} (use emit, watch, control, admin)"))?;
        scopes = scopes.with(s);
        rest = rest[end..].trim_start_matches(|c: char| c.is_whitespace() || c == ',');
    }
    if scopes == Scopes::NONE {
        return Err("a token needs at least one scope".into());
    }
    let mut seen: Vec<&str> = Vec::new();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            return Err(format!("expected key=value after the scopes, got {rest:?}"));
        };
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(format!("expected key=value after the scopes, got {rest:?}"));
        }
        if seen.contains(&key) {
            return Err(format!("`{key}` appears twice"));
        }
        seen.push(key);
        let (value, next) = if key == "filter" {
            let mut it = serde_json::Deserializer::from_str(after).into_iter::<serde_json::Value>();
            match it.next() {
                Some(Ok(_)) => after.split_at(it.byte_offset()),
                Some(Err(e)) => return Err(format!("`filter` is not JSON: {e}")),
                None => return Err("`filter` needs a JSON object".into()),
            }
        } else {
            after.split_at(after.find(char::is_whitespace).unwrap_or(after.len()))
        };
        if !next.is_empty() && !next.starts_with(char::is_whitespace) {
            return Err(format!("`{key}`: expected a space after its value"));
        }
        rest = next.trim_start();
        let e = |g: GrantError| g.0;
        match key {
            "name" if !value.is_empty() => name = Some(Arc::from(value)),
            "filter" => {
                let f = Filter::parse(value.as_bytes()).map_err(|x| e(x.into()))?;
                limits.filter = Some(Arc::new(f));
            }
            "capture" => limits.capture = Some(capture(value).map_err(e)?),
            "agent" if !value.is_empty() => limits.agent = Some(value.into()),
            "commands" => {
                limits.commands = Some(names(key, value.split(',').map(Some)).map_err(e)?)
            }
            "targets" => limits.targets = Some(names(key, value.split(',').map(Some)).map_err(e)?),
            "name" | "agent" => return Err(format!("`{key}` needs a value")),
            _ => {
                return Err(format!(
                    "unknown grant `{key}` (use name, filter, capture, agent, commands, targets)"
                ))
            }
        }
    }
    Ok((scopes, name, limits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::envelope::Event;

    fn ev(agent: &str, session: &str) -> Event {
        Event::parse(bytes::Bytes::from(format!(
            r#"{{"aep":"0.1","id":"e1","type":"tool.completed","time":"2026-01-01T00:00:00Z","source":"urn:x","agent":"{agent}","session":"{session}","seq":1,"data":{{}}}}"#
        )))
        .unwrap()
    }

    #[test]
    fn a_line_reads_scopes_then_grants_with_a_json_filter_holding_spaces() {
        let (s, name, l) = parse_line_rest(
            r#"emit, watch name=team-a filter={"session": ["a", "b"]} capture=redacted agent=bot commands=control.cancel,control.pause targets=bot,bot2"#,
        )
        .unwrap();
        assert_eq!(s, Scopes::EMIT.with(Scopes::WATCH));
        assert_eq!(name.as_deref(), Some("team-a"));
        assert_eq!(l.capture, Some(Capture::Redacted));
        assert_eq!(l.agent.as_deref(), Some("bot"));
        assert_eq!(l.commands.as_ref().unwrap().len(), 2);
        assert_eq!(l.targets.as_ref().unwrap().len(), 2);
        let f = l.filter.unwrap();
        assert!(f.matches(&ev("x", "a")) && !f.matches(&ev("x", "c")));
    }

    #[test]
    fn a_line_refuses_unknown_repeated_or_malformed_grants() {
        for bad in [
            "watch colour=red",
            "watch name=a name=b",
            "watch filter={",
            r#"watch filter={"seq":1}"#,
            r#"watch filter={"session":"a"}x"#,
            "watch capture=most",
            "watch commands=",
            "watch commands=a,,b",
            "watch agent=",
            "name=a",
            "watch =x",
        ] {
            assert!(parse_line_rest(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn narrow_ands_the_filters_and_ceiling_takes_the_lower() {
        let g = Grant {
            limits: Some(Arc::new(Restrictions {
                filter: Some(Arc::new(Filter::parse(br#"{"agent":"a"}"#).unwrap())),
                capture: Some(Capture::Metadata),
                ..Restrictions::default()
            })),
            ..Grant::default()
        };
        let req = Arc::new(Filter::parse(br#"{"session":"s"}"#).unwrap());
        let f = g.narrow(req);
        assert!(f.matches(&ev("a", "s")));
        assert!(!f.matches(&ev("b", "s")) && !f.matches(&ev("a", "t")));
        assert!(g
            .narrow(Arc::new(Filter::match_all()))
            .matches(&ev("a", "t")));
        assert_eq!(g.ceiling(None), Some(Capture::Metadata));
        assert_eq!(g.ceiling(Some(Capture::Full)), Some(Capture::Metadata));
        assert_eq!(g.ceiling(Some(Capture::None)), Some(Capture::None));
        assert_eq!(Grant::default().ceiling(None), None);
    }

    #[test]
    fn to_json_tells_what_the_grant_has_and_nothing_else() {
        let (scopes, name, limits) =
            parse_line_rest(r#"watch name=t filter={"session":"s"} capture=redacted"#).unwrap();
        let g = Grant {
            scopes,
            authenticated: true,
            holder: name,
            limits: Some(Arc::new(limits)),
            expires: Some(1_800_000_000),
        };
        assert_eq!(
            g.to_json(),
            serde_json::json!({"scopes": ["watch"], "filter": {"session": ["s"]},
                               "capture": "redacted", "exp": 1_800_000_000u64})
        );
        assert_eq!(
            Grant::open(Scopes::ALL).to_json(),
            serde_json::json!({"scopes": ["emit", "watch", "control", "admin"]})
        );
    }

    #[test]
    fn agent_commands_and_targets_allow_only_what_they_name() {
        let g = Grant {
            limits: Some(Arc::new(Restrictions {
                agent: Some("a".into()),
                commands: Some(vec!["control.cancel".into()].into()),
                targets: Some(vec!["t".into()].into()),
                ..Restrictions::default()
            })),
            ..Grant::default()
        };
        assert!(g.may_emit_as(Some("a")) && !g.may_emit_as(Some("b")) && !g.may_emit_as(None));
        assert!(g.may_command("control.cancel") && !g.may_command("control.pause"));
        assert!(g.may_target(Some("t")) && !g.may_target(Some("u")) && !g.may_target(None));
        let open = Grant::default();
        assert!(open.may_emit_as(None) && open.may_command("x") && open.may_target(None));
    }
}
