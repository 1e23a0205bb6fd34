//! Capture ceilings and mechanical down-leveling (AEP-0001 §8.2, AEP-0002 §5.1,
//! AEP-0003 §6.4).
//!
//! A subscription may declare a capture ceiling; fan-out delivers every Event whose
//! `capture` is above it as a down-leveled copy and never up-levels (AEP-0003 §6.4).
//! This module is that copy:
//!
//! - [`target_level`]: the level a hop lands on, `min(ceiling, source)` except that a
//!   `full` Event under a `redacted` ceiling lands on `metadata`, because `redacted` is a
//!   provenance claim a mechanical hop can never mint (AEP-0001 §8.2(e), AEP-0002 §5.1
//!   rule 3). A mechanical hop therefore only ever lands on `none` or `metadata`.
//! - [`downlevel_value`]: the core, over the whole Event as a JSON object.
//! - [`downlevel`]: the wrapper the fan-out path calls with an [`Event`]; `None` means
//!   "forward the original bytes", `Some` is the rewritten copy serialized once (the
//!   caller caches it per `(Event, level)`).
//! - [`schema`]: the gating table, generated from the AEP-0002 payload schemas'
//!   `x-aep-capture` annotations into `table.rs` by `tests/sans_io/capture_table.rs`.
//!
//! What a down-leveled copy looks like (AEP-0002 §5.1):
//!
//! ```text
//! target none      envelope only: `data` removed, `capture: "none"`
//! unknown type     (no registered schema: vendor `x.*`, reserved `message.*`) `data` removed,
//!                  since nothing says which of its members are content
//! registered type  every member whose annotation is above the target removed, recursively
//!                  through nested objects and arrays of objects; members the schema does not
//!                  list default to `metadata` (§5.1 rule 4); the [metadata*] exception fields
//!                  degrade structurally (see [`Gate`])
//! always           `capture` rewritten in place to the target, every other envelope member
//!                  and the member order kept
//! ```

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::wire::envelope::{Attr, Capture, Event, Scalar};

#[rustfmt::skip]
mod table;

/// How a payload member's value is structured, as far as gating needs to know.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Anything without annotated members of its own (strings, numbers, enums, arrays of
    /// scalars, free-form objects): kept or dropped whole.
    Leaf,
    /// An object whose members are annotated (schema `properties`).
    Object(&'static [Field]),
    /// An array of objects whose members are annotated (schema `items.properties`); each
    /// element is gated like an [`Shape::Object`].
    Array(&'static [Field]),
}

/// The AEP-0002 `[metadata*]` exceptions: members annotated `metadata` that may carry
/// content at `redacted` and above, so a hop landing below `redacted` has to degrade them
/// structurally instead of keeping them verbatim (AEP-0002 §5.2 `field_spec`, §5.3
/// `attention.requested` / `attention.answered`; AEP-0006 Security considerations: "a hop
/// rewriting `capture` below `redacted` has no source context to classify `values`
/// entries or synthesize labels, so it degrades the `[metadata*]` fields structurally").
///
/// In the schemas they are `x-aep-capture: metadata` members whose `$comment` says
/// "metadata-gated by exception" (or, for `values`, "type-dependent" gating); the table
/// generator classifies them from that comment.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// An ordinary member: kept verbatim at or above its level.
    Plain,
    /// `attention.requested.prompt`: below `redacted` replaced by the AEP-0003 §9.2
    /// synthesis `"{agent} requests {kind}: {subject}"` from the envelope's `agent` and
    /// `subject` and the sibling `kind` (`"{agent} requests {kind}"` without a `subject`;
    /// `other` for a `kind` outside its enum, so only closed tokens and envelope values go
    /// in).
    Synthesize,
    /// `options[].label`, `fields[].label`, `fields[].choices[].label`: below `redacted`
    /// replaced by a structural placeholder, the sibling `id` (the 1-based position in the
    /// enclosing array when there is no string `id`; dropped when neither exists).
    Placeholder,
    /// `answer.values`: below `redacted` only entries that are numbers or booleans are kept.
    /// Whether a string (or an array of strings) is a closed-select id or free text depends
    /// on the `field_spec` of another Event, which a hop does not have, so every string is
    /// treated as free text (AEP-0006; dropping more is legal, AEP-0001 §8.2(b)).
    StructuralEntries,
}

/// One annotated payload member of a registered type (AEP-0002 §5.1).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The member name, verbatim (it may contain dots: `gen_ai.usage.input_tokens`).
    pub name: &'static str,
    /// The `x-aep-capture` annotation: the minimum capture level at which the member may be
    /// present (`metadata` when unannotated, §5.1 rule 4). For an array whose `items` carry
    /// their own annotation it is the higher of the two.
    pub level: Capture,
    /// Whether this is one of the `[metadata*]` exceptions (only ever on a [`Shape::Leaf`]).
    pub gate: Gate,
    /// Nested annotated members, if any.
    pub shape: Shape,
}

impl Field {
    /// The same member as one of the `[metadata*]` exceptions.
    const fn gated(self, gate: Gate) -> Field {
        Field { gate, ..self }
    }
}

/// A member without annotated children (table constructor).
const fn leaf(name: &'static str, level: Capture) -> Field {
    Field {
        name,
        level,
        gate: Gate::Plain,
        shape: Shape::Leaf,
    }
}

/// An object member with annotated children (table constructor).
const fn object(name: &'static str, level: Capture, fields: &'static [Field]) -> Field {
    Field {
        name,
        level,
        gate: Gate::Plain,
        shape: Shape::Object(fields),
    }
}

/// An array-of-objects member with annotated element members (table constructor).
const fn array(name: &'static str, level: Capture, fields: &'static [Field]) -> Field {
    Field {
        name,
        level,
        gate: Gate::Plain,
        shape: Shape::Array(fields),
    }
}

/// The gating table of `event_type`'s payload: its top-level members in schema order.
///
/// `Some` for every type AEP-0002 §4 registers with a payload schema (`&[]` for a schema
/// with no members, e.g. `control.pause`: its payload members all default to `metadata`);
/// `None` for every other type (vendor `x.*`, reserved `message.*`, unregistered), whose
/// `data` a down-leveling hop drops whole.
///
/// # Spec
/// AEP-0002 §5.1 (annotations), §5.3 / §5.4 (per-type schemas), §6 (registry).
///
/// # Examples
/// ```
/// use aep_relay::capture::{schema, Gate, Shape};
/// use aep_relay::wire::envelope::Capture;
///
/// let tool_failed = schema("tool.failed").unwrap();
/// let error = tool_failed.iter().find(|f| f.name == "error").unwrap();
/// let Shape::Object(members) = error.shape else { panic!() };
/// let message = members.iter().find(|f| f.name == "message").unwrap();
/// assert_eq!((message.level, message.gate), (Capture::Redacted, Gate::Plain));
/// assert!(schema("x.acme.session.custom_blob").is_none());
/// ```
pub fn schema(event_type: &str) -> Option<&'static [Field]> {
    table::lookup(event_type)
}

/// The capture level a mechanical hop rewrites an Event to, or `None` when the Event
/// passes unchanged.
///
/// `None` when `ceiling >= source` (never up-level; a `redacted` source passes a
/// `redacted` ceiling because its claim was minted at the source). Otherwise `ceiling`,
/// except that a `redacted` ceiling on a `full` source yields `metadata`: dropping fields
/// does not establish the §9.4 redaction the `redacted` level claims. The result is
/// therefore always [`Capture::None`] or [`Capture::Metadata`].
///
/// # Spec
/// AEP-0001 §8.2(b), §8.2(e); AEP-0002 §5.1 rule 3; AEP-0003 §6.4.
///
/// # Examples
/// ```
/// use aep_relay::capture::target_level;
/// use aep_relay::wire::envelope::Capture;
///
/// assert_eq!(target_level(Capture::Full, Capture::Redacted), Some(Capture::Metadata));
/// assert_eq!(target_level(Capture::Redacted, Capture::Redacted), None);
/// assert_eq!(target_level(Capture::Redacted, Capture::None), Some(Capture::None));
/// assert_eq!(target_level(Capture::Metadata, Capture::Full), None);
/// ```
pub fn target_level(source: Capture, ceiling: Capture) -> Option<Capture> {
    if ceiling >= source {
        return None;
    }
    Some(match ceiling {
        // ceiling < source, so the source is `full` (§8.2(e)).
        Capture::Redacted => Capture::Metadata,
        other => other,
    })
}

/// The `capture` an Event object declares: `metadata` when absent (AEP-0001 §5.1 #16),
/// `full` when present but not one of the four levels, so that a value nobody can trust
/// is gated as strictly as possible (fail closed; the envelope validator refuses such an
/// Event anyway).
fn declared_capture(event: &Map<String, Value>) -> Capture {
    match event.get("capture") {
        None => Capture::Metadata,
        Some(Value::String(s)) => Capture::parse(s).unwrap_or(Capture::Full),
        Some(_) => Capture::Full,
    }
}

/// Down-levels one Event, given as its whole JSON object, to a subscription `ceiling`, in
/// place. Returns `false`, leaving `event` untouched, when the Event passes unchanged
/// ([`target_level`] is `None`); `true` when it was rewritten.
///
/// Input shape: the Event object as parsed by `serde_json` (with `preserve_order`, so the
/// member order survives). `capture` is read with its default (`metadata` when absent);
/// `type` selects the gating table ([`schema`]); `agent` and `subject` feed the prompt
/// synthesis of [`Gate::Synthesize`].
///
/// Output shape: the same object with `capture` set to the target (replaced in place, or
/// appended when it was absent), `data` removed at target `none`, for a type without a
/// schema and when `data` is not an object; otherwise `data` pruned member by member:
///
/// - a member whose level is above the target is removed;
/// - a member the schema does not list is kept (it defaults to `metadata`, AEP-0002 §5.1
///   rule 4);
/// - nested objects and arrays of objects are pruned the same way, element by element;
///   a value whose shape contradicts the schema (an annotated object that is not an
///   object, an element that is not an object) cannot be gated member by member and is
///   removed (dropping more than required is legal, AEP-0001 §8.2(b));
/// - the `[metadata*]` exceptions degrade as [`Gate`] describes.
///
/// Every other envelope member keeps its value and its position.
///
/// # Panics
/// Never.
///
/// # Spec
/// AEP-0001 §8.2; AEP-0002 §5.1, §5.2, §5.3; AEP-0003 §6.4, §9.2; AEP-0006 (values and
/// labels at a hop).
///
/// # Examples
/// ```
/// use aep_relay::capture::downlevel_value;
/// use aep_relay::wire::envelope::Capture;
/// use serde_json::json;
///
/// let mut ev = json!({"aep": "0.1", "id": "e1", "type": "tool.failed", "agent": "a",
///     "capture": "redacted", "data": {"tool": {"name": "Bash"},
///     "error": {"type": "ExecError", "message": "failed in /home/u"}}});
/// assert!(downlevel_value(ev.as_object_mut().unwrap(), Capture::Metadata));
/// assert_eq!(ev["capture"], "metadata");
/// assert_eq!(ev["data"], json!({"tool": {"name": "Bash"}, "error": {"type": "ExecError"}}));
/// ```
pub fn downlevel_value(event: &mut Map<String, Value>, ceiling: Capture) -> bool {
    let Some(target) = target_level(declared_capture(event), ceiling) else {
        return false;
    };

    // Take `data` out (leaving `null` in its slot, so its position is kept) to read the
    // envelope while rewriting the payload.
    if let Some(mut data) = event.get_mut("data").map(Value::take) {
        let env = Envelope {
            agent: event.get("agent").and_then(Value::as_str),
            subject: event.get("subject").and_then(Value::as_str),
        };
        let table = event.get("type").and_then(Value::as_str).and_then(schema);
        let keep = match (target, table, &mut data) {
            (Capture::None, _, _) => false,
            (_, Some(fields), Value::Object(members)) => {
                prune_object(members, fields, target, &env, None);
                true
            }
            // No schema (the members' levels are unknown) or a non-object payload.
            _ => false,
        };
        if keep {
            if let Some(slot) = event.get_mut("data") {
                *slot = data;
            }
        } else {
            // `shift_remove`, not `remove`: with `preserve_order` the latter swaps the last
            // member into the hole.
            event.shift_remove("data");
        }
    }

    let level = Value::String(target.as_str().to_owned());
    match event.get_mut("capture") {
        Some(slot) => *slot = level,
        None => {
            event.insert("capture".to_owned(), level);
        }
    }
    true
}

/// The envelope attributes the `[metadata*]` degradation reads.
struct Envelope<'a> {
    agent: Option<&'a str>,
    subject: Option<&'a str>,
}

/// `attention.requested.kind` values (AEP-0002 §5.3, AEP-0006); anything else is
/// synthesized as `other`, so the synthesized prompt only ever carries a closed token.
const ATTENTION_KINDS: [&str; 6] = ["permission", "input", "auth", "review", "form", "other"];

/// AEP-0003 §9.2: `"{agent} requests {kind}: {subject}"`, from structural metadata only.
fn synthesize_prompt(env: &Envelope<'_>, kind: Option<&str>) -> String {
    let agent = env.agent.unwrap_or("agent");
    let kind = kind
        .filter(|k| ATTENTION_KINDS.contains(k))
        .unwrap_or("other");
    match env.subject {
        Some(subject) => format!("{agent} requests {kind}: {subject}"),
        None => format!("{agent} requests {kind}"),
    }
}

/// Prunes one payload object to `target` against its annotated `fields`. `position` is the
/// object's 0-based index when it is an array element (for [`Gate::Placeholder`]).
fn prune_object(
    members: &mut Map<String, Value>,
    fields: &'static [Field],
    target: Capture,
    env: &Envelope<'_>,
    position: Option<usize>,
) {
    // Sibling values the exception rules read, computed before any member is rewritten and
    // only where this object has such a member and the target is below `redacted`.
    let degrades = |gate| target < Capture::Redacted && fields.iter().any(|f| f.gate == gate);
    let placeholder = match members.get("id") {
        _ if !degrades(Gate::Placeholder) => None,
        Some(Value::String(id)) => Some(id.clone()),
        _ => position.map(|i| (i + 1).to_string()),
    };
    let prompt = if degrades(Gate::Synthesize) {
        synthesize_prompt(env, members.get("kind").and_then(Value::as_str))
    } else {
        String::new()
    };

    members.retain(|name, value| {
        let Some(field) = fields.iter().find(|f| f.name == name) else {
            // Not in the schema: `metadata` (AEP-0002 §5.1 rule 4).
            return target >= Capture::Metadata;
        };
        if field.level > target {
            return false;
        }
        match field.shape {
            Shape::Object(children) => match value {
                Value::Object(m) => {
                    prune_object(m, children, target, env, None);
                    true
                }
                _ => false,
            },
            Shape::Array(children) => match value {
                Value::Array(items) => {
                    let mut index = 0;
                    items.retain_mut(|item| {
                        let at = index;
                        index += 1;
                        match item {
                            Value::Object(m) => {
                                prune_object(m, children, target, env, Some(at));
                                true
                            }
                            _ => false,
                        }
                    });
                    true
                }
                _ => false,
            },
            Shape::Leaf if target >= Capture::Redacted => true,
            Shape::Leaf => match field.gate {
                Gate::Plain => true,
                Gate::Synthesize => {
                    *value = Value::String(prompt.clone());
                    true
                }
                Gate::Placeholder => match &placeholder {
                    Some(p) => {
                        *value = Value::String(p.clone());
                        true
                    }
                    None => false,
                },
                Gate::StructuralEntries => match value {
                    Value::Object(entries) => {
                        entries.retain(|_, v| v.is_number() || v.is_boolean());
                        true
                    }
                    _ => false,
                },
            },
        }
    });
}

/// Down-levels `ev` to a subscription `ceiling` (AEP-0003 §6.4).
///
/// Returns `None` when the Event passes unchanged ([`target_level`] is `None`: the ceiling
/// is at or above the Event's `capture`); the caller forwards [`Event::bytes`] as they are.
/// This check reads only the scanned `capture` and costs no parsing.
///
/// Otherwise returns the down-leveled copy ([`downlevel_value`]) as one compact JSON
/// object, member order kept: the Event is parsed with `serde_json` and re-serialized
/// once. Envelope members keep their values; their bytes may differ where the original
/// used escapes or whitespace that serialization normalizes. Callers cache the result per
/// `(Event, level)`; at most two distinct copies exist per Event (`metadata`, `none`).
///
/// An [`Event`] from the scanner is always valid JSON that `serde_json` accepts; should
/// parsing ever fail anyway, the copy is rebuilt from the scanned attributes without
/// `data` (fail closed: the original bytes are never forwarded above the ceiling).
///
/// # Panics
/// Never.
///
/// # Spec
/// AEP-0001 §8.2; AEP-0002 §5.1; AEP-0003 §6.4.
pub fn downlevel(ev: &Event, ceiling: Capture) -> Option<Bytes> {
    target_level(ev.capture(), ceiling)?;
    let mut event = match serde_json::from_slice::<Map<String, Value>>(ev.bytes()) {
        Ok(event) => event,
        Err(_) => envelope_only(ev),
    };
    downlevel_value(&mut event, ceiling);
    Some(Bytes::from(serialize(&event)))
}

fn serialize(event: &Map<String, Value>) -> Vec<u8> {
    // Serializing a `Map<String, Value>` into a `Vec` has no failure path (keys are strings,
    // the writer cannot fail); `unwrap_or_default` only satisfies the signature.
    serde_json::to_vec(event).unwrap_or_default()
}

/// The Event's scanned attributes as an object, without `data` (the fail-closed fallback of
/// [`downlevel`]).
fn envelope_only(ev: &Event) -> Map<String, Value> {
    let mut m = Map::new();
    for a in Attr::ALL {
        if let Some(v) = ev.attr(a) {
            m.insert(a.name().to_owned(), Value::from(v));
        }
    }
    if let Some(seq) = ev.seq() {
        m.insert("seq".to_owned(), Value::from(seq));
    }
    if let Some(epoch) = ev.epoch_declared() {
        m.insert("epoch".to_owned(), Value::from(epoch));
    }
    if let Some(severity) = ev.severity_declared() {
        m.insert("severity".to_owned(), Value::from(severity.as_str()));
    }
    if let Some(capture) = ev.capture_declared() {
        m.insert("capture".to_owned(), Value::from(capture.as_str()));
    }
    for (name, value) in ev.extensions() {
        let value = match value {
            Scalar::Str(s) => Value::from(s),
            Scalar::Int(i) => i64::try_from(i)
                .map(Value::from)
                .or_else(|_| u64::try_from(i).map(Value::from))
                .unwrap_or(Value::Null),
            Scalar::Bool(b) => Value::from(b),
        };
        if !value.is_null() {
            m.insert(name.to_owned(), value);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prune(event_type: &str, mut data: Value, target: Capture) -> Value {
        let env = Envelope {
            agent: Some("a"),
            subject: Some("S"),
        };
        let fields = schema(event_type).unwrap();
        prune_object(data.as_object_mut().unwrap(), fields, target, &env, None);
        data
    }

    #[test]
    fn target_is_only_ever_none_or_metadata() {
        for source in Capture::ALL {
            for ceiling in Capture::ALL {
                match target_level(source, ceiling) {
                    None => assert!(ceiling >= source),
                    Some(t) => {
                        assert!(t <= ceiling && t < source);
                        assert!(matches!(t, Capture::None | Capture::Metadata));
                    }
                }
            }
        }
    }

    /// The walker is written against any target; at `redacted` (a redacting re-emitter's
    /// level, never a mechanical hop's) the exceptions stay verbatim and only `full`
    /// members go (AEP-0002 §5.1 rule 1).
    #[test]
    fn redacted_target_keeps_exceptions_verbatim() {
        let data = json!({"kind": "form", "prompt": "Pick a database", "context": {"x": 1},
            "options": [{"id": "1", "label": "PostgreSQL"}]});
        let out = prune("attention.requested", data, Capture::Redacted);
        assert_eq!(
            out,
            json!({"kind": "form", "prompt": "Pick a database",
                "options": [{"id": "1", "label": "PostgreSQL"}]})
        );
        let data = json!({"answer": {"text": "t", "values": {"name": "x", "n": 1}}});
        let out = prune("attention.answered", data.clone(), Capture::Redacted);
        assert_eq!(out, data);
    }

    #[test]
    fn unknown_kind_is_synthesized_as_other() {
        let env = Envelope {
            agent: None,
            subject: None,
        };
        assert_eq!(
            synthesize_prompt(&env, Some("free text")),
            "agent requests other"
        );
    }
}
