//! Test-only [`Attributes`] over a partial event written as JSON, so filter and index
//! tests do not depend on the envelope scanner. Defaults follow AEP-0001 §5.1.

use super::Attributes;
use crate::wire::envelope::{is_valid_extension_name, Attr, Capture, Scalar, Severity};
use serde_json::{Map, Value};

/// A partial Event held as its JSON object.
#[derive(Clone, Debug)]
pub(crate) struct JsonEvent(pub(crate) Map<String, Value>);

impl JsonEvent {
    /// Panics unless `v` is an object.
    pub(crate) fn new(v: Value) -> JsonEvent {
        match v {
            Value::Object(m) => JsonEvent(m),
            other => panic!("test event must be an object, got {other}"),
        }
    }
}

impl Attributes for JsonEvent {
    fn text(&self, attr: Attr) -> Option<&str> {
        self.0.get(attr.name()).and_then(Value::as_str)
    }
    fn epoch(&self) -> u64 {
        self.0.get("epoch").and_then(Value::as_u64).unwrap_or(0)
    }
    fn severity(&self) -> Severity {
        self.0
            .get("severity")
            .and_then(Value::as_str)
            .and_then(Severity::parse)
            .unwrap_or(Severity::Info)
    }
    fn capture(&self) -> Capture {
        self.0
            .get("capture")
            .and_then(Value::as_str)
            .and_then(Capture::parse)
            .unwrap_or(Capture::Metadata)
    }
    fn extension(&self, name: &str) -> Option<Scalar<'_>> {
        if !is_valid_extension_name(name) {
            return None;
        }
        match self.0.get(name)? {
            Value::String(s) => Some(Scalar::Str(s)),
            Value::Bool(b) => Some(Scalar::Bool(*b)),
            Value::Number(n) => n
                .as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
                .map(Scalar::Int),
            _ => None,
        }
    }
}

/// Shorthand: `ev(json!({...}))`.
pub(crate) fn ev(v: Value) -> JsonEvent {
    JsonEvent::new(v)
}
