//! `attr-match` filters (AEP-0003 §6): compile once per subscription, evaluate per Event.
//!
//! A filter is a JSON object; each member is a predicate on one envelope context
//! attribute or extension attribute, and the filter matches iff every member matches
//! (AEP-0003 §6.1). [`Filter::compile`] turns the JSON into a list of precomputed
//! predicates (sorted string sets, type prefixes, severity/capture bitmasks) so that
//! [`Filter::matches`] never allocates.
//!
//! Evaluation is generic over [`Attributes`], the read-only view of an Event's routing
//! attributes. [`Event`] implements it; tests implement it for partial events built from
//! JSON. Calls are monomorphised (no `dyn`), so the hot path is direct accessor calls.
//!
//! # Decisions where §6 leaves room
//!
//! - **Grammatical but unsatisfiable values are accepted and never match.** The §6.1
//!   grammar lets any key take a `Scalar` (string, integer or boolean), and §6.2 rule 2
//!   compares JSON values exactly with no coercion. So `{"session": 5}`,
//!   `{"epoch": "0"}`, `{"epoch": -1}`, `{"severity": "warn"}` or
//!   `{"capture": true}` are valid filters that match no Event: an inclusion array
//!   keeps only its satisfiable elements. This narrows, never widens, intake, which is
//!   what fail-closed asks for (AEP-0003 §11, "Filters fail closed").
//! - **Severity / capture equality** compares against the *defaulted* value
//!   (AEP-0003 §6.2 rule 5, AEP-0001 §5.1 #15/#16): `{"severity": "info"}` matches an
//!   Event without `severity`; `{"capture": "metadata"}` matches one without `capture`.
//!   Both equality and inclusion on these keys compile to a bitmask over the levels, as
//!   does `SeverityCmp`.
//! - **A severity band with `gte` above `lte`** (`{"gte": "error", "lte": "info"}`) is
//!   grammatical and matches nothing.
//! - **`*` outside `type`.** A string value containing `*` on any key but `type` is
//!   rejected as a glob on a non-type key (§6.2 rule 3), so a literal `*` cannot be
//!   matched there. On `type`, `*` is legal only as the `.*` suffix of a pattern with a
//!   non-empty prefix (`*` alone, `.*`, `a*`, `*.x`, `a.*.b` are rejected).
//! - **Rejected shapes** (`invalid-filter`, AEP-0003 §6.5): a non-object filter, a key
//!   that is neither a filterable core attribute nor a legal extension name (§6.2
//!   rule 1, AEP-0001 §5.4), `null`, floats (and integers outside `i64 ∪ u64`, which
//!   JSON parsers hold as floats), nested arrays, objects anywhere except `SeverityCmp`
//!   directly on `severity`, an empty inclusion array, a `SeverityCmp` with no operator,
//!   an unknown operator or a level outside AEP-0001 §8.1, and (in [`Filter::parse`])
//!   duplicate member names, which would otherwise be resolved silently.

use std::fmt;

use crate::wire::envelope::{is_valid_extension_name, Attr, Capture, Event, Scalar, Severity};
use serde_json::Value;

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;

/// Read-only view of an Event's routing attributes, as filter evaluation needs them.
///
/// Implemented for [`Event`]. The defaults of AEP-0001 §5.1 (`epoch` 0, `severity`
/// `info`, `capture` `metadata`) are the implementor's job: [`Attributes::epoch`],
/// [`Attributes::severity`] and [`Attributes::capture`] return the defaulted values
/// (AEP-0003 §6.2 rule 5).
pub trait Attributes {
    /// A string-valued core attribute, decoded; `None` when absent.
    fn text(&self, attr: Attr) -> Option<&str>;
    /// `epoch`, `0` when absent.
    fn epoch(&self) -> u64;
    /// `severity`, `info` when absent.
    fn severity(&self) -> Severity;
    /// `capture`, `metadata` when absent.
    fn capture(&self) -> Capture;
    /// The extension attribute `name` (AEP-0001 §5.4), when present.
    fn extension(&self, name: &str) -> Option<Scalar<'_>>;
}

impl Attributes for Event {
    #[inline]
    fn text(&self, attr: Attr) -> Option<&str> {
        Event::attr(self, attr)
    }
    #[inline]
    fn epoch(&self) -> u64 {
        Event::epoch(self)
    }
    #[inline]
    fn severity(&self) -> Severity {
        Event::severity(self)
    }
    #[inline]
    fn capture(&self) -> Capture {
        Event::capture(self)
    }
    #[inline]
    fn extension(&self, name: &str) -> Option<Scalar<'_>> {
        Event::extension(self, name)
    }
}

/// Why a filter was refused; becomes the `detail` of an `invalid-filter` answer
/// (AEP-0003 §6.5). The detail names the key and the rule violated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct FilterError {
    /// Human-readable reason, e.g. "filter key `seq` is not filterable: ... (AEP-0003
    /// §6.2 rule 1)".
    pub detail: String,
}

impl FilterError {
    fn new(detail: impl Into<String>) -> FilterError {
        FilterError {
            detail: detail.into(),
        }
    }
}

/// A sorted, deduplicated set of strings. Small sets are scanned, large ones bisected.
#[derive(Clone, Default, PartialEq, Eq)]
struct StrSet(Box<[Box<str>]>);

impl StrSet {
    fn from_vec(mut v: Vec<Box<str>>) -> StrSet {
        v.sort_unstable();
        v.dedup();
        StrSet(v.into_boxed_slice())
    }

    #[inline]
    fn contains(&self, s: &str) -> bool {
        if self.0.len() <= 8 {
            self.0.iter().any(|x| **x == *s)
        } else {
            self.0.binary_search_by(|x| (**x).cmp(s)).is_ok()
        }
    }
}

impl fmt::Debug for StrSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.iter()).finish()
    }
}

/// One compiled filter member.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pred {
    /// A string-valued core attribute other than `type` must be one of `values`
    /// (AEP-0003 §6.2 rule 2). Empty `values`: never matches.
    Text { attr: Attr, values: StrSet },
    /// `type` must be one of `exact` or start with one of `prefixes` (each ends with the
    /// dot, AEP-0003 §6.2 rule 3).
    Type {
        exact: StrSet,
        prefixes: Box<[Box<str>]>,
    },
    /// Defaulted `epoch` must be one of these (sorted, deduplicated).
    Epoch(Box<[u64]>),
    /// Bit `1 << level` set for each accepted defaulted severity (AEP-0003 §6.2 rule 4).
    Severity(u8),
    /// Bit `1 << level` set for each accepted defaulted capture.
    Capture(u8),
    /// An extension attribute (AEP-0001 §5.4) must be present and equal to one of these.
    Ext {
        name: Box<str>,
        strs: StrSet,
        ints: Box<[i128]>,
        /// bit 0: `false` accepted, bit 1: `true` accepted.
        bools: u8,
    },
}

impl Pred {
    /// Evaluation order: cheapest and most selective first.
    fn rank(&self) -> u8 {
        match self {
            Pred::Text {
                attr: Attr::Session,
                ..
            } => 0,
            Pred::Text {
                attr: Attr::Agent, ..
            } => 1,
            Pred::Type { .. } => 2,
            Pred::Severity(_) | Pred::Capture(_) | Pred::Epoch(_) => 3,
            Pred::Text { .. } => 4,
            Pred::Ext { .. } => 5,
        }
    }

    /// This predicate as one attr-match member: its key and operands ([`Filter::to_json`]).
    fn to_json(&self) -> (&str, Value) {
        let strs = |set: &StrSet| set.0.iter().map(|s| Value::from(&**s)).collect::<Vec<_>>();
        let levels = |mask: u8, names: &[&'static str]| -> Value {
            let on = names
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0);
            Value::Array(on.map(|(_, n)| Value::from(*n)).collect())
        };
        match self {
            Pred::Text { attr, values } => (attr.name(), Value::Array(strs(values))),
            Pred::Type { exact, prefixes } => {
                let mut v = strs(exact);
                v.extend(prefixes.iter().map(|p| Value::from(format!("{p}*"))));
                ("type", Value::Array(v))
            }
            Pred::Epoch(e) => ("epoch", e.iter().map(|&x| Value::from(x)).collect()),
            Pred::Severity(mask) => {
                let names = Severity::ALL.map(Severity::as_str);
                ("severity", levels(*mask, &names))
            }
            Pred::Capture(mask) => ("capture", levels(*mask, &Capture::ALL.map(Capture::as_str))),
            Pred::Ext {
                name,
                strs: s,
                ints,
                bools,
            } => {
                let mut v = strs(s);
                v.extend(
                    ints.iter()
                        .map(|&i| match (i64::try_from(i), u64::try_from(i)) {
                            (Ok(i), _) => Value::from(i),
                            (_, Ok(u)) => Value::from(u),
                            // Past JSON's integers: shown as its digits.
                            _ => Value::from(i.to_string()),
                        }),
                );
                v.extend(
                    [false, true]
                        .into_iter()
                        .filter(|b| bools & (1 << *b as u8) != 0)
                        .map(Value::from),
                );
                (name, Value::Array(v))
            }
        }
    }

    #[inline]
    fn matches<A: Attributes + ?Sized>(&self, ev: &A) -> bool {
        match self {
            Pred::Text { attr, values } => match ev.text(*attr) {
                Some(v) => values.contains(v),
                None => false, // AEP-0003 §6.2 rule 5
            },
            Pred::Type { exact, prefixes } => match ev.text(Attr::Type) {
                Some(t) => exact.contains(t) || prefixes.iter().any(|p| t.starts_with(&**p)),
                None => false,
            },
            Pred::Epoch(values) => {
                let e = ev.epoch();
                values.contains(&e)
            }
            Pred::Severity(mask) => mask & (1 << ev.severity() as u8) != 0,
            Pred::Capture(mask) => mask & (1 << ev.capture() as u8) != 0,
            Pred::Ext {
                name,
                strs,
                ints,
                bools,
            } => match ev.extension(name) {
                Some(Scalar::Str(s)) => strs.contains(s),
                Some(Scalar::Int(i)) => ints.contains(&i),
                Some(Scalar::Bool(b)) => bools & (1 << b as u8) != 0,
                None => false,
            },
        }
    }
}

/// A compiled `attr-match` filter (AEP-0003 §6).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Filter {
    /// Conjunction, in evaluation order.
    preds: Box<[Pred]>,
}

/// The exact values a filter requires of the attributes the subscription index keys on
/// (see [`Filter::pins`]).
///
/// `Some(values)`: the Event's attribute must be present and equal one of `values`
/// (sorted, deduplicated) for the filter to match; `Some(&[])` means the filter can
/// never match. `None`: the filter does not constrain that attribute to exact values.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Pins<'a> {
    /// Required `session` values.
    pub session: Option<&'a [Box<str>]>,
    /// Required `agent` values.
    pub agent: Option<&'a [Box<str>]>,
    /// Required exact `type` values; `None` when the `type` predicate has any pattern.
    pub types: Option<&'a [Box<str>]>,
}

/// Core attributes that §6.2 rule 1 names as not filterable, with the reason it gives.
const NOT_FILTERABLE: [(&str, &str); 5] = [
    ("time", "`time` is display/join metadata"),
    ("seq", "positions are the resume mechanism, not filters"),
    ("aep", "`aep` is the version marker"),
    ("traceparent", "trace context is pass-through join metadata"),
    ("data", "routing never parses payloads"),
];

impl Filter {
    /// The empty filter `{}`, which matches every Event (AEP-0003 §6.1).
    pub fn match_all() -> Filter {
        Filter::default()
    }

    /// Parses filter JSON (e.g. the decoded `filter` query parameter of the SSE binding,
    /// AEP-0003 §3.3) and compiles it. Duplicate member names at any depth are rejected
    /// rather than resolved last-wins.
    ///
    /// # Errors
    /// [`FilterError`] for malformed JSON and for everything [`Filter::compile`] rejects.
    pub fn parse(json: &[u8]) -> Result<Filter, FilterError> {
        let StrictValue(v) = serde_json::from_slice(json)
            .map_err(|e| FilterError::new(format!("filter is not valid JSON: {e}")))?;
        Filter::compile(&v)
    }

    /// Compiles a filter object (AEP-0003 §6.1 grammar, §6.2 rules).
    ///
    /// # Errors
    /// [`FilterError`] naming the key and the rule for any shape the module
    /// documentation lists as rejected (`invalid-filter`, AEP-0003 §6.5).
    pub fn compile(filter: &Value) -> Result<Filter, FilterError> {
        let Value::Object(members) = filter else {
            return Err(FilterError::new(format!(
                "filter must be a JSON object, found {} (AEP-0003 §6.1)",
                kind(filter)
            )));
        };
        let mut preds = Vec::with_capacity(members.len());
        for (key, value) in members {
            preds.push(compile_member(key, value)?);
        }
        preds.sort_by_key(Pred::rank);
        Ok(Filter {
            preds: preds.into_boxed_slice(),
        })
    }

    /// Whether the Event satisfies every member (AEP-0003 §6.1: conjunction; `{}`
    /// matches everything). Never allocates.
    #[inline]
    pub fn matches<A: Attributes + ?Sized>(&self, ev: &A) -> bool {
        self.preds.iter().all(|p| p.matches(ev))
    }

    /// The conjunction of `self` and `other` (AEP-0003 §6.1): one compiled filter that
    /// matches an Event iff both do, evaluated in the same cheapest-first order. Its
    /// [`Filter::pins`] are those of either member (an Event must satisfy both).
    pub fn and(&self, other: &Filter) -> Filter {
        let mut preds: Vec<Pred> = self
            .preds
            .iter()
            .chain(other.preds.iter())
            .cloned()
            .collect();
        preds.sort_by_key(Pred::rank);
        Filter {
            preds: preds.into_boxed_slice(),
        }
    }

    /// Whether every Event of `session` from `agent` is sure to match, as far as a
    /// stream shows: the filter has only `session` and `agent` members, and they admit
    /// them. For what names a stream without being an Event: a roster entry (AEP-0003
    /// §4.1), a `/status` row. A member on any other attribute cannot be decided on a
    /// stream, so it refuses (a grant's filter on `source` or `type` shows no stream
    /// rather than every one). `agent` `None` is an absent `agent`, which an `agent`
    /// member refuses (AEP-0003 §6.2 rule 5).
    pub fn admits_stream(&self, session: &str, agent: Option<&str>) -> bool {
        self.preds.iter().all(|p| match p {
            Pred::Text {
                attr: Attr::Session,
                values,
            } => values.contains(session),
            Pred::Text {
                attr: Attr::Agent,
                values,
            } => agent.is_some_and(|a| values.contains(a)),
            _ => false,
        })
    }

    /// Whether Events of `session` could match, as far as the filter's `session` member
    /// says (none: any session).
    pub fn admits_session(&self, session: &str) -> bool {
        self.preds.iter().all(|p| match p {
            Pred::Text {
                attr: Attr::Session,
                values,
            } => values.contains(session),
            _ => true,
        })
    }

    /// Whether this is the empty filter (matches every Event).
    pub fn is_match_all(&self) -> bool {
        self.preds.is_empty()
    }

    /// The filter in attr-match form (AEP-0003 §6.1), for display (`GET /connections`):
    /// an object with one member per predicate, its operands as an inclusion array
    /// (`type` prefixes as `prefix.*`, levels by name). It matches the same Events as
    /// the filter it was compiled from, though it may spell them differently. Should two
    /// predicates share a key (filters combined), the object becomes an array of
    /// one-member objects, all of which must hold.
    pub fn to_json(&self) -> Value {
        let members: Vec<(&str, Value)> = self.preds.iter().map(Pred::to_json).collect();
        let mut keys: Vec<&str> = members.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.len() == members.len() {
            let m = members.into_iter().map(|(k, v)| (k.to_string(), v));
            return Value::Object(m.collect());
        }
        let one = |(k, v): (&str, Value)| {
            let mut m = serde_json::Map::new();
            m.insert(k.to_string(), v);
            Value::Object(m)
        };
        Value::Array(members.into_iter().map(one).collect())
    }

    /// The exact `session`, `agent` and `type` values this filter requires, for the
    /// subscription index.
    pub fn pins(&self) -> Pins<'_> {
        let mut pins = Pins::default();
        for p in self.preds.iter() {
            match p {
                Pred::Text {
                    attr: Attr::Session,
                    values,
                } => pins.session = Some(&values.0),
                Pred::Text {
                    attr: Attr::Agent,
                    values,
                } => pins.agent = Some(&values.0),
                Pred::Type { exact, prefixes } if prefixes.is_empty() => {
                    pins.types = Some(&exact.0)
                }
                _ => {}
            }
        }
        pins
    }
}

/// A short description of a JSON value's kind for error details.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a non-integer number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A predicate operand that passed the §6.1 `Scalar` check.
enum Operand<'v> {
    Str(&'v str),
    Int(i128),
    Bool(bool),
}

/// What a key accepts, for the operand checks.
#[derive(Copy, Clone, PartialEq, Eq)]
enum KeyKind {
    /// `type`: TypePattern allowed.
    Type,
    /// `severity`: SeverityCmp allowed.
    Severity,
    /// Anything else.
    Other,
}

/// Checks one `Scalar` (AEP-0003 §6.1) appearing as `key`'s operand.
fn operand<'v>(key: &str, k: KeyKind, v: &'v Value) -> Result<Operand<'v>, FilterError> {
    match v {
        Value::String(s) => {
            if k != KeyKind::Type && s.contains('*') {
                return Err(FilterError::new(format!(
                    "filter key `{key}`: glob `{s}` is not allowed; type patterns apply \
                     only to `type` (AEP-0003 §6.2 rule 3)"
                )));
            }
            Ok(Operand::Str(s))
        }
        Value::Bool(b) => Ok(Operand::Bool(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(Operand::Int(i as i128))
            } else if let Some(u) = n.as_u64() {
                Ok(Operand::Int(u as i128))
            } else {
                Err(FilterError::new(format!(
                    "filter key `{key}`: {n} is not a Scalar; only strings, integers and \
                     booleans compare (AEP-0003 §6.1)"
                )))
            }
        }
        Value::Null => Err(FilterError::new(format!(
            "filter key `{key}`: null is not a Scalar (AEP-0003 §6.1; absent attributes \
             are omitted, AEP-0001 §5.1)"
        ))),
        Value::Array(_) => Err(FilterError::new(format!(
            "filter key `{key}`: an inclusion array holds Scalars, not arrays (AEP-0003 §6.1)"
        ))),
        Value::Object(_) => Err(FilterError::new(if k == KeyKind::Severity {
            format!(
                "filter key `{key}`: a severity comparison is not allowed inside an \
                 inclusion array (AEP-0003 §6.1)"
            )
        } else {
            format!(
                "filter key `{key}`: objects are not predicates; only `severity` takes a \
                 comparison object (AEP-0003 §6.1)"
            )
        })),
    }
}

/// The operands of `key`: one Scalar, or the elements of a non-empty inclusion array.
fn operands<'v>(key: &str, k: KeyKind, v: &'v Value) -> Result<Vec<Operand<'v>>, FilterError> {
    match v {
        Value::Array(items) => {
            if items.is_empty() {
                return Err(FilterError::new(format!(
                    "filter key `{key}`: an inclusion array needs at least one element \
                     (`[ Scalar+ ]`, AEP-0003 §6.1)"
                )));
            }
            items.iter().map(|i| operand(key, k, i)).collect()
        }
        _ => Ok(vec![operand(key, k, v)?]),
    }
}

/// The strings among `ops` (the only operands a string attribute can equal).
fn strings(ops: &[Operand<'_>]) -> StrSet {
    StrSet::from_vec(
        ops.iter()
            .filter_map(|o| match o {
                Operand::Str(s) => Some(Box::from(*s)),
                _ => None,
            })
            .collect(),
    )
}

/// Bitmask of the levels named by string operands that `parse` recognises.
fn level_mask(ops: &[Operand<'_>], level: impl Fn(&str) -> Option<u8>) -> u8 {
    ops.iter()
        .filter_map(|o| match o {
            Operand::Str(s) => level(s),
            _ => None,
        })
        .fold(0, |m, l| m | (1 << l))
}

fn compile_member(key: &str, value: &Value) -> Result<Pred, FilterError> {
    if let Some((_, why)) = NOT_FILTERABLE.iter().find(|(k, _)| *k == key) {
        return Err(FilterError::new(format!(
            "filter key `{key}` is not filterable: {why} (AEP-0003 §6.2 rule 1)"
        )));
    }
    match key {
        "type" => compile_type(value),
        "severity" => compile_severity(value),
        "capture" => {
            let ops = operands(key, KeyKind::Other, value)?;
            Ok(Pred::Capture(level_mask(&ops, |s| {
                Capture::parse(s).map(|c| c as u8)
            })))
        }
        "epoch" => {
            let ops = operands(key, KeyKind::Other, value)?;
            let mut v: Vec<u64> = ops
                .iter()
                .filter_map(|o| match o {
                    Operand::Int(i) => u64::try_from(*i).ok(),
                    _ => None,
                })
                .collect();
            v.sort_unstable();
            v.dedup();
            Ok(Pred::Epoch(v.into_boxed_slice()))
        }
        _ => {
            if let Some(attr) = Attr::from_name(key) {
                // id, subject, source, agent, session, run, step, cause (the rest of
                // Attr is in NOT_FILTERABLE or `type`).
                let ops = operands(key, KeyKind::Other, value)?;
                return Ok(Pred::Text {
                    attr,
                    values: strings(&ops),
                });
            }
            if !is_valid_extension_name(key) {
                return Err(FilterError::new(format!(
                    "filter key `{key}` is neither a filterable core attribute nor a legal \
                     extension attribute name `[a-z0-9]{{1,20}}` (AEP-0003 §6.2 rule 1, \
                     AEP-0001 §5.4)"
                )));
            }
            let ops = operands(key, KeyKind::Other, value)?;
            let mut ints: Vec<i128> = ops
                .iter()
                .filter_map(|o| match o {
                    Operand::Int(i) => Some(*i),
                    _ => None,
                })
                .collect();
            ints.sort_unstable();
            ints.dedup();
            let bools = ops.iter().fold(0u8, |m, o| match o {
                Operand::Bool(b) => m | (1 << *b as u8),
                _ => m,
            });
            Ok(Pred::Ext {
                name: key.into(),
                strs: strings(&ops),
                ints: ints.into_boxed_slice(),
                bools,
            })
        }
    }
}

/// `type`: exact types and `prefix.*` patterns, alone or in an inclusion array
/// (AEP-0003 §6.1 TypePattern, §6.2 rule 3).
fn compile_type(value: &Value) -> Result<Pred, FilterError> {
    let ops = operands("type", KeyKind::Type, value)?;
    let mut exact = Vec::new();
    let mut prefixes: Vec<Box<str>> = Vec::new();
    for op in &ops {
        let Operand::Str(s) = op else { continue };
        if !s.contains('*') {
            exact.push(Box::from(*s));
            continue;
        }
        if *s == "*" {
            return Err(FilterError::new(
                "filter key `type`: `*` alone is not a pattern; use `{}` or omit the key \
                 (AEP-0003 §6.2 rule 3)",
            ));
        }
        match s.strip_suffix(".*") {
            Some(p) if !p.is_empty() && !p.contains('*') => {
                // Keep the dot: `attention.*` matches types starting with `attention.`.
                prefixes.push(Box::from(&s[..s.len() - 1]));
            }
            _ => {
                return Err(FilterError::new(format!(
                    "filter key `type`: `{s}` is not a type pattern; `*` is allowed only as \
                     the `.*` suffix of a non-empty prefix (AEP-0003 §6.1, §6.2 rule 3)"
                )))
            }
        }
    }
    prefixes.sort_unstable();
    prefixes.dedup();
    Ok(Pred::Type {
        exact: StrSet::from_vec(exact),
        prefixes: prefixes.into_boxed_slice(),
    })
}

/// `severity`: a `SeverityCmp` object, or equality/inclusion against the defaulted
/// severity (AEP-0003 §6.1, §6.2 rules 4 and 5; AEP-0001 §8.1 order).
fn compile_severity(value: &Value) -> Result<Pred, FilterError> {
    let Value::Object(cmp) = value else {
        let ops = operands("severity", KeyKind::Severity, value)?;
        return Ok(Pred::Severity(level_mask(&ops, |s| {
            Severity::parse(s).map(|l| l as u8)
        })));
    };
    if cmp.is_empty() {
        return Err(FilterError::new(
            "filter key `severity`: a comparison needs `gte`, `lte` or both (AEP-0003 §6.1 \
             SeverityCmp)",
        ));
    }
    let (mut lo, mut hi) = (Severity::Debug, Severity::Critical);
    for (op, level) in cmp {
        let level = match level {
            Value::String(s) => Severity::parse(s).ok_or_else(|| {
                FilterError::new(format!(
                    "filter key `severity`: `{op}`: `{s}` is not a severity level \
                     (debug|info|notice|warning|error|critical, AEP-0001 §8.1)"
                ))
            })?,
            other => {
                return Err(FilterError::new(format!(
                    "filter key `severity`: `{op}` takes a level string, found {} \
                     (AEP-0003 §6.1 SeverityCmp)",
                    kind(other)
                )))
            }
        };
        match op.as_str() {
            "gte" => lo = level,
            "lte" => hi = level,
            _ => {
                return Err(FilterError::new(format!(
                    "filter key `severity`: `{op}` is not a comparison operator; only `gte` \
                     and `lte` are (AEP-0003 §6.1 SeverityCmp)"
                )))
            }
        }
    }
    // Inclusive bounds (AEP-0003 §6.2 rule 4); lo > hi leaves the mask empty.
    let mask = Severity::ALL
        .iter()
        .filter(|s| lo <= **s && **s <= hi)
        .fold(0u8, |m, s| m | (1 << *s as u8));
    Ok(Pred::Severity(mask))
}

/// A JSON value deserialised with duplicate object member names rejected.
struct StrictValue(Value);

/// Parses JSON with duplicate object member names rejected at any depth (two readers
/// could disagree on which one counts), as [`Filter::parse`] does; the WebSocket binding
/// reads its frames this way.
///
/// # Errors
/// `serde_json`'s error for malformed JSON or a duplicated member.
pub(crate) fn strict_json(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    serde_json::from_slice::<StrictValue>(bytes).map(|v| v.0)
}

impl<'de> serde::Deserialize<'de> for StrictValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<StrictValue, D::Error> {
        d.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // Not finite never comes out of JSON; map anything odd to null, which compile
        // rejects anyway.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<S: serde::de::SeqAccess<'de>>(self, mut seq: S) -> Result<Value, S::Error> {
        let mut v = Vec::new();
        while let Some(StrictValue(x)) = seq.next_element()? {
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Value, M::Error> {
        let mut m = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if m.contains_key(&k) {
                return Err(serde::de::Error::custom(format_args!(
                    "duplicate member `{k}`"
                )));
            }
            let StrictValue(v) = map.next_value()?;
            m.insert(k, v);
        }
        Ok(Value::Object(m))
    }
}
