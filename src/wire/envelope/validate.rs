//! AEP-0001 envelope validation: the rules beyond per-attribute JSON value types (those
//! are the scanner's, `scan.rs`).
//!
//! In order, [`validate`] checks:
//! 1. REQUIRED attributes present: `aep`, `id`, `type`, `time`, `source`, `agent`
//!    (AEP-0001 §5.1).
//! 2. `aep` is `MAJOR.MINOR` and a version this relay speaks (AEP-0001 §5.1 #1, §11).
//! 3. `type` grammar: a core type's category from the closed set, a vendor type as the
//!    envelope schema has it (AEP-0001 §6, AEP-0002 §3; see the decisions).
//! 4. `time` is an RFC 3339 date-time with a timezone (AEP-0001 §5.1 #5).
//! 5. `traceparent`, when present, is a W3C Trace Context header value (AEP-0001 §5.1 #14).
//! 6. Session scoping (AEP-0001 §5.2, AEP-0004 §2.2).
//!
//! # Decisions
//! - **Vendor types and scope.** Only a bare `agent.*` type is agent-scoped. AEP-0001 §5.2
//!   scopes by category, and a vendor type's first segment is `x`, whose scope AEP-0002 §3
//!   gives as "any"; the envelope schema (`aep-event.schema.json`, what an emitter is
//!   held to by AEP-0001 §10) makes only `^agent\.` agent-scoped and requires `session`
//!   and `seq` on `x.{vendor}.agent.*`. This relay follows the schema, which also keeps
//!   [`super::Event::scope`] (`starts_with("agent.")`) consistent with validation.
//!   `x.{vendor}.control.*` types are commands (foreign-emitter), as in the schema.
//! - **Commands.** Every `control.*` type except the acknowledgements `control.accepted` /
//!   `control.rejected` is a command ([`super::is_command_type`], AEP-0004 §2.1: a
//!   command is `control.{rest}` with an imperative verb), so an unregistered
//!   `control.{verb}` must omit `seq` too. The schema lists only the four registered
//!   commands; for those, both agree.
//! - **Vendor types.** `x.{vendor}.{token}.{rest}` takes any `[a-z0-9_]+` as `{token}`.
//!   The AEP-0001 §6 text writes `{category}` there; the envelope schema's pattern
//!   (`x\.[a-z0-9_-]+\.[a-z0-9_]+(\.[a-z0-9_]+)+`, what AEP-0001 §10 holds an emitter
//!   to) admits any token, and the reference adapters emit such types
//!   (`x.codex.otel.api_request`, `x.acp.fs.read.text.file`). Where prose and schema
//!   disagree, the relay accepts what the schema accepts: it is a hop, consumers MUST
//!   tolerate unknown types (AEP-0001 §6), and an NDJSON batch is all or none, so one
//!   refused line would refuse every valid Event posted with it. `aep-relay validate`
//!   warns about such a type without counting it invalid. The vendor token itself is
//!   the schema's `[a-z0-9_-]+`, and a vendor type needs at least four tokens in all
//!   (`x.acme.foo` is refused, as in the schema). Scope reads `{token}` only to find a
//!   command (`control`, as the schema's `x\.[a-z0-9_-]+\.control\..+`); every other
//!   vendor type, its token a category or not, is session-scoped (the first decision).
//! - **`time`.** RFC 3339 §5.6 `date-time`: `T`/`t` separator and `Z`/`z` (RFC 3339 §5.6
//!   note: these may be lower case), fractional seconds optional, seconds `00`-`60`
//!   (leap second, §5.7), day checked against the month and leap years (§5.7).
//! - **`traceparent`.** Exactly `{version}-{trace-id}-{parent-id}-{flags}` in lowercase
//!   hex (2-32-16-2, as the envelope schema's pattern), version `ff` invalid, trace-id
//!   and parent-id not all zeros (W3C Trace Context §3.2).

use super::{is_command_type, Attr, Event, InvalidEvent};

/// Envelope versions this relay speaks (major.minor), AEP-0001 §5.1 #1.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["0.1"];

/// Declares [`CATEGORIES`] and [`is_category`] from one list, so that the table and the
/// `match` that runs for every Event (a length switch and one compare, rather than a scan
/// of the table) cannot disagree.
macro_rules! categories {
    ($($c:literal,)+) => {
        /// The closed category set of AEP 0.1 (AEP-0002 §3; `x` is the vendor namespace,
        /// not a category): the first token of every core type. Hard-coded, as the build
        /// must not read the schema registry, and the one list of them: the type grammar
        /// ([`is_valid_type`], [`is_category`]), its refusal detail, the `validate` lint
        /// and the corpus tests all read it, so a new category (a Standards-Track AEP,
        /// AEP-0002 §3) is one line of it.
        pub const CATEGORIES: &[&str] = &[$($c),+];

        /// Whether `c` is one of the [`CATEGORIES`] (AEP-0002 §3).
        ///
        /// ```
        /// use aep_relay::wire::envelope::is_category;
        /// assert!(is_category("tool"));
        /// assert!(!is_category("otel"));
        /// assert!(!is_category("x"));
        /// ```
        pub fn is_category(c: &str) -> bool {
            matches!(c, $($c)|+)
        }
    };
}

categories! {
    "agent",
    "session",
    "run",
    "progress",
    "tool",
    "delegation",
    "attention",
    "resource",
    "error",
    "state",
    "assessment",
    "message",
    "control",
}

/// Whether `name` is a legal extension attribute name (AEP-0001 §5.4): `[a-z0-9]{1,20}`
/// and not a core attribute name.
pub fn is_valid_extension_name(name: &str) -> bool {
    (1..=20).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && !super::CORE_NAMES.contains(&name)
}

/// `MAJOR.MINOR` as two decimal numbers without leading zeros (AEP-0001 §5.1 #1).
fn parse_version(v: &str) -> Option<(u32, u32)> {
    let (major, minor) = v.split_once('.')?;
    let num = |s: &str| -> Option<u32> {
        let ok = !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        if ok {
            s.parse().ok()
        } else {
            None
        }
    };
    Some((num(major)?, num(minor)?))
}

/// Whether an Event's `aep` value names an envelope version this relay speaks: the form
/// `MAJOR.MINOR` and listed in [`SUPPORTED_VERSIONS`] (AEP-0001 §5.1 #1).
///
/// ```
/// use aep_relay::wire::envelope::version_supported;
/// assert!(version_supported("0.1"));
/// assert!(!version_supported("0.2"));
/// assert!(!version_supported("0.1.0"));
/// ```
pub fn version_supported(aep: &str) -> bool {
    parse_version(aep).is_some() && SUPPORTED_VERSIONS.contains(&aep)
}

/// Whether an HTTP `AEP-Version` request header value is acceptable (AEP-0003 §3.2 #2:
/// servers answer an unsupported version with 426 and `{"versions": ["0.1"]}`).
///
/// Accepts `MAJOR.MINOR` (surrounding optional whitespace ignored) where the version is in
/// [`SUPPORTED_VERSIONS`], i.e. major 0 and minor 1 today. Below 1.0 each minor version is
/// its own wire contract, so `0.2` is as unsupported as `1.0`.
///
/// ```
/// use aep_relay::wire::envelope::header_version_supported;
/// assert!(header_version_supported(" 0.1 "));
/// assert!(!header_version_supported("1.0"));
/// assert!(!header_version_supported("0.2"));
/// ```
pub fn header_version_supported(v: &str) -> bool {
    version_supported(v.trim_matches(|c| c == ' ' || c == '\t'))
}

/// The number of `[a-z0-9_]+` tokens in `s` when it is one or more of them separated by
/// single dots (no leading, trailing or doubled dot), in one pass; `None` otherwise.
fn tokens(s: &[u8]) -> Option<usize> {
    let mut count = 1usize;
    let mut token = 0usize;
    for &b in s {
        if b == b'.' {
            if token == 0 {
                return None;
            }
            count += 1;
            token = 0;
        } else if b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' {
            token += 1;
        } else {
            return None;
        }
    }
    (token > 0).then_some(count)
}

/// Whether `v` is a vendor token, the envelope schema's `[a-z0-9_-]+` (AEP-0001 §6: the
/// `{vendor}` token additionally allows `-`).
fn is_vendor(v: &[u8]) -> bool {
    !v.is_empty()
        && v.iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Whether `t` is a well-formed AEP type (AEP-0001 §6, AEP-0002 §3), exactly the envelope
/// schema's `type` pattern:
///
/// - a core type `{category}.{rest}`: `category` one of [`CATEGORIES`], `rest` one or more
///   `[a-z0-9_]+` tokens separated by dots;
/// - a vendor type `x.{vendor}.{token}.{rest}`: `vendor` is `[a-z0-9_-]+`, `token` any
///   `[a-z0-9_]+` (a category or not: where the AEP-0001 §6 prose says `{category}`, the
///   relay accepts what the schema accepts, as it is a hop and consumers MUST tolerate
///   unknown types, AEP-0001 §6), `rest` one or more tokens.
///
/// Registration is not checked (unknown types are tolerated, AEP-0001 §6).
///
/// ```
/// use aep_relay::wire::envelope::is_valid_type;
/// assert!(is_valid_type("run.step.started"));
/// assert!(is_valid_type("x.claude-code.session.config_change"));
/// assert!(is_valid_type("x.codex.otel.api_request"));
/// assert!(!is_valid_type("tool"));
/// assert!(!is_valid_type("banana.peeled"));
/// assert!(!is_valid_type("x.acme.foo"));
/// ```
pub fn is_valid_type(t: &str) -> bool {
    let b = t.as_bytes();
    match b.strip_prefix(b"x.") {
        Some(vendored) => match memchr::memchr(b'.', vendored) {
            Some(dot) => {
                is_vendor(&vendored[..dot]) && tokens(&vendored[dot + 1..]).is_some_and(|n| n >= 2)
            }
            None => false,
        },
        // `dot` indexes an ASCII byte, so it is a char boundary of `t`.
        None => match memchr::memchr(b'.', b) {
            Some(dot) => is_category(&t[..dot]) && tokens(&b[dot + 1..]).is_some(),
            None => false,
        },
    }
}

/// The `{token}` of a vendor type `x.{vendor}.{token}.{rest}` (the place the AEP-0001 §6
/// prose gives a category), or `None` when `t` is not a valid vendor type. What
/// `aep-relay validate` lints: a token outside [`CATEGORIES`] is valid on the wire (see
/// [`is_valid_type`]) but departs from the prose.
///
/// ```
/// use aep_relay::wire::envelope::vendor_token;
/// assert_eq!(vendor_token("x.codex.otel.api_request"), Some("otel"));
/// assert_eq!(vendor_token("x.claude-code.session.config_change"), Some("session"));
/// assert_eq!(vendor_token("tool.completed"), None);
/// assert_eq!(vendor_token("x.acme.foo"), None);
/// ```
pub fn vendor_token(t: &str) -> Option<&str> {
    if !is_valid_type(t) {
        return None;
    }
    let mut parts = t.strip_prefix("x.")?.splitn(3, '.');
    parts.next()?;
    parts.next()
}

/// `n` ASCII digits at `b[at..]` as a number.
fn digits(b: &[u8], at: usize, n: usize) -> Option<u32> {
    let s = b.get(at..at + n)?;
    s.iter().try_fold(0u32, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

/// Whether `s` is an RFC 3339 `date-time` (§5.6) with valid field ranges (§5.7).
pub(crate) fn is_valid_time(s: &str) -> bool {
    let b = s.as_bytes();
    let field =
        |at: usize, n: usize, lo: u32, hi: u32| digits(b, at, n).filter(|v| (lo..=hi).contains(v));
    let (Some(year), Some(month)) = (field(0, 4, 0, 9999), field(5, 2, 1, 12)) else {
        return false;
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    let shape = b.get(4) == Some(&b'-')
        && b.get(7) == Some(&b'-')
        && matches!(b.get(10), Some(b'T' | b't'))
        && b.get(13) == Some(&b':')
        && b.get(16) == Some(&b':');
    if !shape
        || field(8, 2, 1, days).is_none()
        || field(11, 2, 0, 23).is_none()
        || field(14, 2, 0, 59).is_none()
        || field(17, 2, 0, 60).is_none()
    {
        return false;
    }
    let mut i = 19;
    if b.get(i) == Some(&b'.') {
        let frac = b
            .get(i + 1..)
            .unwrap_or_default()
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if frac == 0 {
            return false;
        }
        i += 1 + frac;
    }
    match b.get(i..) {
        Some([b'Z' | b'z']) => true,
        Some([b'+' | b'-', _, _, b':', _, _]) => {
            field(i + 1, 2, 0, 23).is_some() && field(i + 4, 2, 0, 59).is_some()
        }
        _ => false,
    }
}

/// Whether `s` is a W3C Trace Context `traceparent` value (see the module decisions).
pub(crate) fn is_valid_traceparent(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b.get(r).is_some_and(|p| {
            p.iter()
                .all(|&c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        })
    };
    let nonzero =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|p| p.iter().any(|&c| c != b'0'));
    b.len() == 55
        && b[2] == b'-'
        && b[35] == b'-'
        && b[52] == b'-'
        && hex(0..2)
        && hex(3..35)
        && hex(36..52)
        && hex(53..55)
        && &b[0..2] != b"ff"
        && nonzero(3..35)
        && nonzero(36..52)
}

/// A value shown in a detail, quoted and shortened.
fn shown(v: &str) -> String {
    if v.chars().count() > 60 {
        format!("{:?}…", v.chars().take(60).collect::<String>())
    } else {
        format!("{v:?}")
    }
}

/// The presence and cross-attribute rules of AEP-0001 §5.1, §5.2, §6 and AEP-0004 §2.2 on
/// an Event whose value types the scanner already checked.
pub(crate) fn validate(ev: &Event) -> Result<(), InvalidEvent> {
    const REQUIRED: [Attr; 6] = [
        Attr::Aep,
        Attr::Id,
        Attr::Type,
        Attr::Time,
        Attr::Source,
        Attr::Agent,
    ];
    // All present is one mask test; the first missing one in table order is named.
    let mask = REQUIRED.iter().fold(0u32, |m, &a| m | 1 << (a as u32));
    if ev.attrs.present & mask != mask {
        if let Some(a) = REQUIRED.into_iter().find(|&a| !ev.has(a)) {
            return Err(InvalidEvent::new(format!(
                "missing REQUIRED attribute `{}` (AEP-0001 §5.1 {})",
                a.name(),
                a.spec_row()
            )));
        }
    }

    let aep = ev.attr(Attr::Aep).unwrap_or_default();
    // Every supported version is well-formed, so a listed one passes both rules.
    if !SUPPORTED_VERSIONS.contains(&aep) {
        if parse_version(aep).is_none() {
            return Err(InvalidEvent::new(format!(
                "`aep` must be a version MAJOR.MINOR, got {} (AEP-0001 §5.1 #1)",
                shown(aep)
            )));
        }
        return Err(InvalidEvent::new(format!(
            "unsupported envelope version `aep` = {}; this relay speaks {} (AEP-0001 §5.1 #1, §11)",
            shown(aep),
            SUPPORTED_VERSIONS.join(", ")
        )));
    }

    let t = ev.event_type();
    if !is_valid_type(t) {
        return Err(InvalidEvent::new(format!(
            "`type` {} must be {{category}}.{{rest}} or x.{{vendor}}.{{token}}.{{rest}}: lowercase [a-z0-9_] tokens (the vendor token may also hold `-`), category one of {} (AEP-0001 §6, AEP-0002 §3)",
            shown(t),
            CATEGORIES.join(", ")
        )));
    }

    let time = ev.attr(Attr::Time).unwrap_or_default();
    if !is_valid_time(time) {
        return Err(InvalidEvent::new(format!(
            "`time` {} must be an RFC 3339 date-time with timezone, e.g. 2026-07-03T10:15:04.221Z (AEP-0001 §5.1 #5)",
            shown(time)
        )));
    }

    if let Some(tp) = ev.attr(Attr::Traceparent) {
        if !is_valid_traceparent(tp) {
            return Err(InvalidEvent::new(format!(
                "`traceparent` {} must be a W3C Trace Context value 00-{{32 hex trace-id}}-{{16 hex parent-id}}-{{2 hex flags}}, lowercase, ids not all zero (AEP-0001 §5.1 #14)",
                shown(tp)
            )));
        }
    }

    session_scope(ev, t)
}

/// AEP-0001 §5.2 and AEP-0004 §2.2: which of `session`, `run`, `step`, `seq` an Event
/// carries, by its type.
fn session_scope(ev: &Event, t: &str) -> Result<(), InvalidEvent> {
    if t.starts_with("agent.") {
        for a in [Attr::Session, Attr::Run, Attr::Step] {
            if ev.has(a) {
                return Err(InvalidEvent::new(format!(
                    "`{}` must be omitted on agent-scoped Events ({t}) (AEP-0001 §5.2)",
                    a.name()
                )));
            }
        }
        if ev.seq().is_some() {
            return Err(InvalidEvent::new(format!(
                "`seq` must be omitted on agent-scoped Events ({t}) (AEP-0001 §5.2)"
            )));
        }
        return Ok(());
    }
    let command = is_command_type(t);
    if command || t == "attention.routed" {
        let (what, section) = if command {
            ("commands", "AEP-0004 §2.2, AEP-0001 §5.2")
        } else {
            ("attention.routed", "AEP-0001 §5.2, AEP-0002 §7.3")
        };
        if !ev.has(Attr::Session) {
            return Err(InvalidEvent::new(format!(
                "`session` is REQUIRED on {what} ({t}): it names the target session ({section})"
            )));
        }
        if ev.seq().is_some() {
            return Err(InvalidEvent::new(format!(
                "`seq` must be omitted on {what} ({t}): a foreign emitter does not own the session's order ({section})"
            )));
        }
        return Ok(());
    }
    if !ev.has(Attr::Session) {
        return Err(InvalidEvent::new(format!(
            "`session` is REQUIRED on session-scoped Events ({t}) (AEP-0001 §5.2)"
        )));
    }
    if ev.seq().is_none() {
        return Err(InvalidEvent::new(format!(
            "`seq` is REQUIRED on session-scoped Events ({t}) (AEP-0001 §5.2)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Event;
    use super::*;
    use bytes::Bytes;

    /// A valid session-scoped Event with `overrides` applied: `(name, Some(json))` sets a
    /// member to raw JSON, `(name, None)` removes it.
    fn event(overrides: &[(&str, Option<&str>)]) -> String {
        let mut members: Vec<(String, String)> = [
            ("aep", r#""0.1""#),
            ("id", r#""01JX""#),
            ("type", r#""tool.completed""#),
            ("time", r#""2026-07-03T10:15:04.221Z""#),
            ("source", r#""aep://h/agent/a/session/s1""#),
            ("agent", r#""a""#),
            ("session", r#""s1""#),
            ("seq", "7"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        for (k, v) in overrides {
            members.retain(|(n, _)| n != k);
            if let Some(v) = v {
                members.push(((*k).to_owned(), (*v).to_owned()));
            }
        }
        let body: Vec<String> = members
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        format!("{{{}}}", body.join(","))
    }

    fn parse(json: &str) -> Result<Event, InvalidEvent> {
        Event::parse(Bytes::copy_from_slice(json.as_bytes()))
    }

    fn ok(overrides: &[(&str, Option<&str>)]) {
        let json = event(overrides);
        if let Err(e) = parse(&json) {
            panic!("refused {json}: {e}");
        }
    }

    fn refused(overrides: &[(&str, Option<&str>)], needle: &str) {
        let json = event(overrides);
        match parse(&json) {
            Ok(_) => panic!("accepted {json}"),
            Err(e) => assert!(e.detail.contains(needle), "{json}: {e:?} lacks {needle:?}"),
        }
    }

    #[test]
    fn required_attributes() {
        ok(&[]);
        for (name, row) in [
            ("aep", "#1"),
            ("id", "#2"),
            ("type", "#3"),
            ("time", "#5"),
            ("source", "#6"),
            ("agent", "#7"),
        ] {
            refused(
                &[(name, None)],
                &format!("missing REQUIRED attribute `{name}` (AEP-0001 §5.1 {row})"),
            );
        }
        // `scan` alone takes a partial envelope.
        assert!(Event::scan(Bytes::from_static(br#"{"type":"tool.x"}"#)).is_ok());
    }

    #[test]
    fn envelope_version() {
        assert!(version_supported("0.1"));
        // `validate` takes a listed version as well-formed without parsing it.
        for v in SUPPORTED_VERSIONS {
            assert!(parse_version(v).is_some(), "{v}");
        }
        for bad in [
            "0.2", "1.0", "0.1.0", "00.1", "0.01", "0", ".1", "0.", "v0.1", " 0.1", "",
        ] {
            assert!(!version_supported(bad), "{bad:?}");
        }
        refused(&[("aep", Some(r#""0.2""#))], "unsupported envelope version");
        refused(&[("aep", Some(r#""0.2""#))], "(AEP-0001 §5.1 #1");
        refused(&[("aep", Some(r#""1.0""#))], "(AEP-0001 §5.1 #1");
        refused(
            &[("aep", Some(r#""zero""#))],
            "`aep` must be a version MAJOR.MINOR",
        );

        assert!(header_version_supported("0.1"));
        assert!(header_version_supported("\t0.1 "));
        for bad in ["0.2", "1.0", "1", "0.1.0", "", "0.1,0.2", "01.1"] {
            assert!(!header_version_supported(bad), "{bad:?}");
        }
    }

    #[test]
    fn every_category_in_bare_and_vendor_form() {
        // The table holds distinct `[a-z]+` tokens, and `x` (the vendor namespace) is not
        // among them; its length is not pinned, so a new category is one line.
        let unique: std::collections::HashSet<_> = CATEGORIES.iter().collect();
        assert_eq!(unique.len(), CATEGORIES.len());
        assert!(!is_category("x") && !is_category("") && !is_category("Tool"));
        for &c in CATEGORIES {
            assert!(c.bytes().all(|b| b.is_ascii_lowercase()), "{c}");
            assert!(is_category(c), "{c}");
            for t in [
                format!("{c}.x"),
                format!("{c}.step.started_2"),
                format!("x.acme.{c}.y"),
                format!("x.claude-code.{c}.config_change"),
                format!("x.a_b-c9.{c}.y.z"),
            ] {
                assert!(is_valid_type(&t), "{t}");
            }
            assert!(!is_valid_type(c), "{c}: a category alone is not a type");
            assert!(!is_valid_type(&format!("x.acme.{c}")), "x.acme.{c}");
        }
        for bad in [
            "",
            "tool",
            "tool.",
            "tool..x",
            "tool.x..y",
            "tool.x.y.",
            "tool.x_.y..",
            "x.acme.tool.",
            "x.acme.tool..x",
            "x.acme..x",
            "x.acme.",
            ".tool.x",
            "tool.x.",
            "Tool.x",
            "tool.X",
            "tool.a-b",
            "tool.a b",
            "tool.é",
            "banana.peeled",
            "x.acme.foo",
            "x..tool.x",
            "x.Acme.tool.x",
            "x.ac me.tool.x",
            "x.tool.x",
            "x",
            "x.",
            "dev.aep.tool.completed",
        ] {
            assert!(!is_valid_type(bad), "{bad:?}");
        }
        refused(
            &[("type", Some(r#""banana.peeled""#))],
            "(AEP-0001 §6, AEP-0002 §3)",
        );
        refused(&[("type", Some(r#""tool""#))], "`type` \"tool\" must be");
    }

    /// The vendor form is the envelope schema's `x\.[a-z0-9_-]+\.[a-z0-9_]+(\.[a-z0-9_]+)+`:
    /// any token third, a category or not (AEP-0001 §6 prose says category; the relay
    /// accepts what the schema accepts).
    #[test]
    fn vendor_types_take_any_token_third() {
        for good in [
            "x.codex.otel.api_request",
            "x.acp.fs.read.text.file",
            "x.agui.text_message.start",
            "x.kimi-code.web.event.approval.requested",
            "x.acme.banana.peeled",
            "x.acme.x.tool.y",
            "x.acme.control_x.y",
            "x.a-b.c.d",
            "x.-.tool.done",
            "x.--.a.b",
            "x._.a.b",
            "x.1.2.3",
            "x.x.x.x",
            "x.acme.otel.a.b.c.d.e",
        ] {
            assert!(is_valid_type(good), "{good}");
            ok(&[("type", Some(&format!("\"{good}\"")))]);
        }
        for bad in [
            // Too short: a vendor type has at least four tokens.
            "x",
            "x.",
            "x.acme",
            "x.acme.",
            "x.acme.foo",
            "x.acme.otel",
            "x.acme.otel.",
            "x.acme-corp.verb",
            // Upper case anywhere.
            "X.acme.otel.x",
            "x.ACME.otel.x",
            "x.acme.Otel.x",
            "x.acme.otel.X",
            "x.acme.otel.a.B",
            // Empty tokens.
            ".x.acme.otel.x",
            "x..otel.x",
            "x.acme..x",
            "x.acme.otel..x",
            "x.acme.otel.x.",
            "x.acme.otel.x..y",
            "x...",
            "x....",
            // `-` only in the vendor token; no other bytes.
            "x.acme.ot-el.x",
            "x.acme.otel.a-b",
            "x.acme.otel.a b",
            "x.acme.otel.é",
            "x.ac/me.otel.x",
            "x.acme.otel.x\n",
            // Not the vendor namespace, and not a category.
            "y.acme.otel.x",
            "xx.acme.otel.x",
        ] {
            assert!(!is_valid_type(bad), "{bad:?}");
        }
        refused(
            &[("type", Some(r#""x.acme.foo""#))],
            "x.{vendor}.{token}.{rest}",
        );
        // Scope (AEP-0001 §5.2, the schema's rules): a vendor type whose token is not a
        // category is session-scoped; `control` as the token makes it a command, the
        // word elsewhere does not.
        let t = [("type", Some(r#""x.codex.otel.api_request""#))];
        refused(
            &[t[0], ("seq", None)],
            "`seq` is REQUIRED on session-scoped",
        );
        refused(
            &[t[0], ("session", None)],
            "`session` is REQUIRED on session-scoped",
        );
        let ev = parse(&event(&t)).unwrap();
        assert_eq!(ev.scope(), super::super::Scope::Sequenced);
        assert!(!ev.is_command());
        assert!(!is_command_type("x.acme.otel.control.stop"));
        assert!(is_command_type("x.acme.control.stop"));
    }

    /// [`is_valid_type`] against the envelope schema's `type` pattern written out as token
    /// rules, on every string of up to five pieces (tokens, dots, the bytes at the edges).
    #[test]
    fn type_grammar_agrees_with_the_schema_pattern() {
        fn schema(t: &str) -> bool {
            let parts: Vec<&str> = t.split('.').collect();
            let token = |p: &&str| {
                !p.is_empty()
                    && p.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            };
            let vendor = !parts.get(1).unwrap_or(&"").is_empty()
                && parts[1].bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            (CATEGORIES.contains(&parts[0]) && parts.len() >= 2 && parts[1..].iter().all(token))
                || (parts[0] == "x" && parts.len() >= 4 && vendor && parts[2..].iter().all(token))
        }
        const PIECES: [&str; 12] = [
            "x.", "x", "a", ".", ".a", "-", "_", "run", "A", "0", "é", " ",
        ];
        let mut t = String::new();
        let mut checked = 0;
        // Every sequence of up to five pieces, counting in base 12.
        let mut idx: Vec<usize> = Vec::new();
        loop {
            t.clear();
            for &i in &idx {
                t.push_str(PIECES[i]);
            }
            assert_eq!(is_valid_type(&t), schema(&t), "{t:?}");
            assert_eq!(
                vendor_token(&t).is_some(),
                schema(&t) && t.starts_with("x."),
                "{t:?}"
            );
            checked += 1;
            // Next sequence: count in base 10, growing by one piece on overflow.
            let mut k = idx.len();
            loop {
                if k == 0 {
                    idx.insert(0, 0);
                    idx.iter_mut().for_each(|i| *i = 0);
                    break;
                }
                k -= 1;
                idx[k] += 1;
                if idx[k] < PIECES.len() {
                    break;
                }
                idx[k] = 0;
            }
            if idx.len() > 5 {
                break;
            }
        }
        assert_eq!(checked, 271_453);
    }

    #[test]
    fn vendor_token_is_the_third_token_of_a_valid_vendor_type() {
        assert_eq!(vendor_token("x.codex.otel.api_request"), Some("otel"));
        assert_eq!(vendor_token("x.acp.fs.read.text.file"), Some("fs"));
        assert_eq!(vendor_token("x.a-b.tool.x"), Some("tool"));
        for none in ["tool.completed", "x.acme.foo", "x.acme.Otel.x", "", "x"] {
            assert_eq!(vendor_token(none), None, "{none:?}");
        }
    }

    #[test]
    fn time_is_rfc3339_with_timezone() {
        for good in [
            "2026-07-03T10:15:04Z",
            "2026-07-03T10:15:04.221Z",
            "2026-07-03T10:15:04.123456789Z",
            "2026-07-03t10:15:04z",
            "2026-07-03T10:15:04+05:30",
            "2026-07-03T10:15:04.5-00:00",
            "2026-07-03T23:59:60Z",
            "2024-02-29T00:00:00Z",
            "2000-02-29T00:00:00Z",
            "2026-12-31T23:59:59+23:59",
            "0000-01-01T00:00:00Z",
        ] {
            assert!(is_valid_time(good), "{good}");
        }
        for bad in [
            "",
            "2026-07-03T10:15:04",
            "2026-07-03 10:15:04Z",
            "2026-07-03T10:15:04.Z",
            "2026-07-03T10:15Z",
            "2026-7-03T10:15:04Z",
            "2026-07-3T10:15:04Z",
            "2023-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-00-01T00:00:00Z",
            "2026-01-00T00:00:00Z",
            "2026-07-03T24:00:00Z",
            "2026-07-03T10:60:00Z",
            "2026-07-03T10:15:61Z",
            "2026-07-03T10:15:04+05:3",
            "2026-07-03T10:15:04+0530",
            "2026-07-03T10:15:04+24:00",
            "2026-07-03T10:15:04+05:60",
            "2026-07-03T10:15:04ZZ",
            "2026-07-03T10:15:04Z ",
            "+2026-07-03T10:15:04Z",
            "2026-07-03T10:15:04UTC",
            "１２３４-07-03T10:15:04Z",
        ] {
            assert!(!is_valid_time(bad), "{bad:?}");
        }
        refused(&[("time", Some(r#""yesterday""#))], "(AEP-0001 §5.1 #5)");
    }

    #[test]
    fn traceparent_is_w3c_trace_context() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(is_valid_traceparent(good));
        assert!(is_valid_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        ));
        for bad in [
            "not-a-traceparent",
            "",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "0-04bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(!is_valid_traceparent(bad), "{bad:?}");
        }
        ok(&[("traceparent", Some(&format!("\"{good}\"")))]);
        refused(&[("traceparent", Some(r#""nope""#))], "(AEP-0001 §5.1 #14)");
    }

    #[test]
    fn agent_scoped_events_carry_no_session_run_step_or_seq() {
        let agent = [
            ("type", Some(r#""agent.heartbeat""#)),
            ("session", None),
            ("seq", None),
        ];
        ok(&agent);
        // `epoch` is not forbidden on agent-scoped Events (AEP-0001 §5.2 names four).
        ok(&[agent[0], agent[1], agent[2], ("epoch", Some("2"))]);
        for (name, v) in [
            ("session", r#""s""#),
            ("run", r#""r""#),
            ("step", r#""p""#),
            ("seq", "0"),
        ] {
            refused(
                &[agent[0], agent[1], agent[2], (name, Some(v))],
                &format!("`{name}` must be omitted on agent-scoped Events (agent.heartbeat) (AEP-0001 §5.2)"),
            );
        }
    }

    #[test]
    fn commands_and_attention_routed_carry_session_without_seq() {
        for t in [
            "control.cancel",
            "control.attention.respond",
            "control.frobnicate",
            "x.acme.control.stop",
            "attention.routed",
        ] {
            let ty = format!("\"{t}\"");
            ok(&[("type", Some(&ty)), ("seq", None)]);
            refused(&[("type", Some(&ty))], "`seq` must be omitted on");
            refused(
                &[("type", Some(&ty)), ("seq", None), ("session", None)],
                "`session` is REQUIRED on",
            );
        }
        refused(
            &[("type", Some(r#""control.cancel""#))],
            "(AEP-0004 §2.2, AEP-0001 §5.2)",
        );
        refused(
            &[("type", Some(r#""attention.routed""#))],
            "(AEP-0001 §5.2, AEP-0002 §7.3)",
        );
        // The acknowledgements are the target's own sequenced Events (AEP-0004 §3).
        for t in ["control.accepted", "control.rejected"] {
            let ty = format!("\"{t}\"");
            ok(&[("type", Some(&ty))]);
            refused(
                &[("type", Some(&ty)), ("seq", None)],
                "`seq` is REQUIRED on session-scoped",
            );
        }
    }

    #[test]
    fn session_scoped_events_carry_session_and_seq() {
        refused(
            &[("session", None)],
            "`session` is REQUIRED on session-scoped Events (tool.completed) (AEP-0001 §5.2)",
        );
        refused(
            &[("seq", None)],
            "`seq` is REQUIRED on session-scoped Events (tool.completed) (AEP-0001 §5.2)",
        );
        // Decision: a vendor `x.{vendor}.agent.*` type is not agent-scoped (the envelope
        // schema's `^agent\.` rule); it is session-scoped like any non-command type.
        let vendor_agent = [("type", Some(r#""x.acme.agent.ping""#))];
        ok(&vendor_agent);
        refused(&[vendor_agent[0], ("seq", None)], "`seq` is REQUIRED");
        let ev = parse(&event(&vendor_agent)).unwrap();
        assert_eq!(ev.scope(), super::super::Scope::Sequenced);
    }

    #[test]
    fn worked_example_of_section_5_3_is_valid() {
        // AEP-0001 §5.3, verbatim.
        let json = crate::wire::envelope::WORKED_EXAMPLE;
        let ev = parse(json).unwrap();
        assert_eq!(ev.seq(), Some(187));
        assert_eq!(ev.attr(Attr::Step), Some("turn-3"));
        assert!(ev.data().unwrap().starts_with(b"{\n    \"tool\""));
    }
}
