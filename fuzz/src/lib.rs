//! Oracles shared by the fuzz targets: readings of JSON made with `serde_json` alone, so a
//! target can compare the relay's own parsers against them.
//!
//! Nothing here calls into the relay's parsers; a target that compares the relay with
//! these functions is differential only as long as they stay independent of it. The one
//! exception is [`harness`], the scene-setting shared by the targets that drive the core
//! (configuration, prefill, determinism check), which is no oracle.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

pub mod harness;

/// The top-level members of one JSON object in wire order, duplicates kept (a `Value`
/// map would merge them, last one winning). Nested values are ordinary `Value`s.
#[derive(Debug)]
pub struct Members(pub Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Members, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Members, A::Error> {
                let mut out = Vec::new();
                while let Some(kv) = m.next_entry::<String, Value>()? {
                    out.push(kv);
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Reads `bytes` as exactly one JSON object (`serde_json::from_slice` semantics: JSON
/// whitespace around it, nothing else) and returns its top-level members in order.
pub fn members(bytes: &[u8]) -> Result<Vec<(String, Value)>, String> {
    serde_json::from_slice::<Members>(bytes)
        .map(|m| m.0)
        .map_err(|e| e.to_string())
}

/// A JSON value read with duplicate member names refused at every depth.
pub struct Strict(pub Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Strict;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
                Ok(Strict(Value::Bool(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
                Ok(Strict(Value::from(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
                Ok(Strict(Value::from(v)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Strict, E> {
                serde_json::Number::from_f64(v)
                    .map(|n| Strict(Value::Number(n)))
                    .ok_or_else(|| E::custom("non-finite number"))
            }
            fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
                Ok(Strict(Value::String(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Strict, E> {
                Ok(Strict(Value::String(v)))
            }
            fn visit_unit<E>(self) -> Result<Strict, E> {
                Ok(Strict(Value::Null))
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut s: S) -> Result<Strict, S::Error> {
                let mut out = Vec::new();
                while let Some(Strict(v)) = s.next_element()? {
                    out.push(v);
                }
                Ok(Strict(Value::Array(out)))
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Strict, M::Error> {
                let mut out = Map::new();
                while let Some(k) = m.next_key::<String>()? {
                    let Strict(v) = m.next_value()?;
                    if out.insert(k.clone(), v).is_some() {
                        return Err(de::Error::custom(format_args!("duplicate `{k}`")));
                    }
                }
                Ok(Strict(Value::Object(out)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `serde_json::from_slice` with duplicate member names refused at every depth.
pub fn strict(bytes: &[u8]) -> Result<Value, String> {
    serde_json::from_slice::<Strict>(bytes)
        .map(|s| s.0)
        .map_err(|e| e.to_string())
}

/// AEP-0001 §5.4, from the spec text: `[a-z0-9]{1,20}`, and not one of the sixteen core
/// attribute names or `data` (§5.1).
pub fn legal_extension_name(name: &str) -> bool {
    const CORE: [&str; 17] = [
        "aep",
        "id",
        "type",
        "subject",
        "time",
        "source",
        "agent",
        "session",
        "run",
        "step",
        "seq",
        "epoch",
        "cause",
        "traceparent",
        "severity",
        "capture",
        "data",
    ];
    (1..=20).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && !CORE.contains(&name)
}

/// A JSON integer as JSON parsers hold it (`i64` or `u64`; not a float).
pub fn is_integer(v: &Value) -> bool {
    v.is_i64() || v.is_u64()
}

/// Splits `data` at `\n` into at most `max` lines (the last keeps the rest).
pub fn lines(data: &[u8], max: usize) -> Vec<&[u8]> {
    data.splitn(max, |b| *b == b'\n').collect()
}
