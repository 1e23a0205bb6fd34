//! The AEP frames of the WebSocket binding (AEP-0003 §2): connection-scoped JSON
//! objects whose `type` has no dot. This module reads the client's `hello` and builds
//! every frame the relay sends, each already wrapped as a WebSocket text frame.
//!
//! Frames are small and rare next to Events, so they go through `serde_json`; Events
//! never do (they are scanned, see [`crate::wire::envelope`]).

use super::rfc6455;
use crate::refusal::Code;
use crate::wire::envelope::SUPPORTED_VERSIONS;
use bytes::Bytes;
use serde_json::{json, Map, Value};

/// A peer's role, declared in its `hello` (AEP-0003 §4 rule 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sends Events (and may send commands); may not subscribe or read the roster.
    Emitter,
    /// Subscribes and reads the roster; may send commands, not Events.
    Consumer,
    /// Both.
    Both,
}

impl Role {
    /// Whether this role may send Events (and so claim sessions).
    pub fn emits(self) -> bool {
        matches!(self, Role::Emitter | Role::Both)
    }

    /// Whether this role may subscribe and read the roster (AEP-0003 §4.1 rule 2).
    pub fn consumes(self) -> bool {
        matches!(self, Role::Consumer | Role::Both)
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Emitter => "emitter",
            Role::Consumer => "consumer",
            Role::Both => "both",
        }
    }
}

/// What a peer declared in its `hello`, kept for the life of the connection: the roster
/// repeats it verbatim (AEP-0003 §4.1 rule 4) and command routing reads `accepts`
/// (AEP-0004 §4.2).
#[derive(Debug, Clone, PartialEq)]
pub struct Declaration {
    /// The declared role.
    pub role: Role,
    /// The version selected for the connection (one of [`SUPPORTED_VERSIONS`]).
    pub version: &'static str,
    /// `identity.agent` (required for `emitter` and `both`).
    pub agent: Option<String>,
    /// `identity.instance`, when declared.
    pub instance: Option<String>,
    /// `capabilities.control`, verbatim, when declared.
    pub control: Option<Value>,
    /// `capabilities.emits`, verbatim, when declared.
    pub emits: Option<Value>,
    /// The string members of `capabilities.control.accepts`; `None` when the peer
    /// declared no such list (it then accepts no command, AEP-0004 §7).
    pub accepts: Option<Vec<String>>,
    /// Whether the peer declared `capabilities.experimental.dropped` (any value but
    /// `false` or `null`): it asks to be told of Events dropped toward it by
    /// backpressure with [`dropped`] frames (AEP-0003 §4 rule 6, §8.4).
    pub dropped: bool,
}

impl Declaration {
    /// Whether the peer declared that it accepts commands of `event_type`.
    pub fn accepts(&self, event_type: &str) -> bool {
        self.accepts
            .as_ref()
            .is_some_and(|a| a.iter().any(|t| t == event_type))
    }
}

/// Why a `hello` was refused; the relay answers an `error` frame with this code, then
/// closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloError {
    /// [`Code::VersionUnsupported`] (no version in common) or [`Code::InvalidHello`]
    /// (a hello missing what it needs; the detail names the member).
    pub code: Code,
    /// What was wrong.
    pub detail: String,
}

/// Reads a client `hello` (AEP-0003 §4): selects the first of its `versions` (newest
/// first) that the relay supports, checks `role` and, for emitters, `identity.agent`,
/// and keeps the declarations the roster and routing need. Unknown members and
/// capability keys are ignored (rule 4).
///
/// # Errors
/// [`HelloError`]: `version-unsupported` when `versions` names no supported version (or
/// is absent); `invalid-hello` for a missing or unknown `role`, or an `emitter`/`both`
/// hello without a non-empty `identity.agent` (the detail names the member).
pub fn parse_hello(v: &Map<String, Value>) -> Result<Declaration, HelloError> {
    let version = v
        .get("versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|want| SUPPORTED_VERSIONS.iter().find(|s| **s == want).copied())
        .ok_or_else(|| HelloError {
            code: Code::VersionUnsupported,
            detail: format!(
                "no version in common: this relay speaks {} (AEP-0003 §4 rule 1)",
                SUPPORTED_VERSIONS.join(", ")
            ),
        })?;
    let role = match v.get("role").and_then(Value::as_str) {
        Some("emitter") => Role::Emitter,
        Some("consumer") => Role::Consumer,
        Some("both") => Role::Both,
        other => {
            return Err(HelloError {
                code: Code::InvalidHello,
                detail: format!(
                    "hello `role` must be emitter, consumer or both (AEP-0003 §4 rule 2), got {}",
                    other.map_or("nothing".to_string(), |r| format!("{r:?}"))
                ),
            })
        }
    };
    let identity = v.get("identity").and_then(Value::as_object);
    let text = |name: &str| {
        identity
            .and_then(|i| i.get(name))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let agent = text("agent");
    if role.emits() && agent.is_none() {
        let got = match identity.and_then(|i| i.get("agent")) {
            None if identity.is_none() => "no `identity`".to_string(),
            None => "`identity` without `agent`".to_string(),
            Some(a) => format!("`identity.agent` {a}"),
        };
        return Err(HelloError {
            code: Code::InvalidHello,
            detail: format!(
                "a hello with role {} needs a non-empty string `identity.agent` (AEP-0003 §4 rule 3), got {got}",
                role.as_str()
            ),
        });
    }
    let caps = v.get("capabilities").and_then(Value::as_object);
    let control = caps.and_then(|c| c.get("control")).cloned();
    let accepts = control
        .as_ref()
        .and_then(|c| c.get("accepts"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        });
    let dropped = caps
        .and_then(|c| c.get("experimental"))
        .and_then(|e| e.get("dropped"))
        .is_some_and(|d| !d.is_null() && *d != Value::Bool(false));
    Ok(Declaration {
        role,
        version,
        agent,
        instance: text("instance"),
        control,
        emits: caps.and_then(|c| c.get("emits")).cloned(),
        accepts,
        dropped,
    })
}

/// Wraps a JSON frame (a `Value` or any `Serialize` type) as a WebSocket text frame.
pub fn encode(v: &impl serde::Serialize) -> Bytes {
    rfc6455::text(&serde_json::to_vec(v).unwrap_or_default())
}

/// The relay's `hello` (AEP-0003 §4): exactly one version, role `both`, its identity,
/// and `capabilities` as given, serialized straight from the parts (no `Map`).
pub fn hello(version: &str, capabilities: &impl serde::Serialize) -> Bytes {
    #[derive(serde::Serialize)]
    struct Hello<'a, C> {
        r#type: &'static str,
        versions: [&'a str; 1],
        role: &'static str,
        identity: Identity,
        capabilities: &'a C,
    }
    #[derive(serde::Serialize)]
    struct Identity {
        agent: &'static str,
        instance: &'static str,
    }
    let hello = Hello {
        r#type: "hello",
        versions: [version],
        role: "both",
        identity: Identity {
            agent: "aep-relay",
            instance: concat!("aep-relay/", env!("CARGO_PKG_VERSION")),
        },
        capabilities,
    };
    encode(&hello)
}

/// What an `error` frame refers to.
#[derive(Debug, Clone, Copy)]
pub enum Ref<'a> {
    /// Nothing (a connection-level error such as [`Code::HelloRequired`]).
    None,
    /// The `id` of the request or Event refused (`subscribe`, `roster`, an Event).
    Id(&'a str),
    /// The `id` of the command refused, as `cause` (AEP-0004 §4.2).
    Cause(&'a str),
}

/// `{"type":"error","code":…,"detail":…}` with `id` or `cause` (AEP-0003 §6.5,
/// AEP-0004 §4.2), plus `more` members (named unlike those: they are written after
/// them as given).
pub fn error(code: Code, r: Ref<'_>, detail: &str, more: &[(&str, Value)]) -> Bytes {
    /// The frame's members in order, serialized straight from the borrowed parts: no
    /// `Map` is built for a frame the fuzzers and hostile peers draw by the thousand.
    struct Frame<'a> {
        code: Code,
        r: Ref<'a>,
        detail: &'a str,
        more: &'a [(&'a str, Value)],
    }
    impl serde::Serialize for Frame<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(None)?;
            m.serialize_entry("type", "error")?;
            match self.r {
                Ref::None => {}
                Ref::Id(id) => m.serialize_entry("id", id)?,
                Ref::Cause(id) => m.serialize_entry("cause", id)?,
            }
            m.serialize_entry("code", self.code.as_str())?;
            m.serialize_entry("detail", self.detail)?;
            for (k, v) in self.more {
                m.serialize_entry(k, v)?;
            }
            m.end()
        }
    }
    let frame = Frame {
        code,
        r,
        detail,
        more,
    };
    rfc6455::text(&serde_json::to_vec(&frame).unwrap_or_default())
}

/// `{"type":"subscribed","id":…}` or `{"type":"unsubscribed","id":…}`.
pub fn ack(kind: &str, id: &str) -> Bytes {
    encode(&json!({ "type": kind, "id": id }))
}

/// `{"type":"replay-exhausted","sub":…,"session":…,"earliest":{"epoch":…,"seq":…},"source":…}`
/// (AEP-0003 §5): one per owning stream `(source, session)` that no longer reaches back
/// (AEP-0001 §5.2). `session` is the bare name the resume position named; `source`, an
/// extra member peers ignore unless they know it, says which emitter's stream it is
/// (absent for a stream of foreign Events only).
pub fn replay_exhausted(
    sub: &str,
    session: &str,
    source: Option<&str>,
    earliest: (u64, u64),
) -> Bytes {
    let mut f = json!({
        "type": "replay-exhausted",
        "sub": sub,
        "session": session,
        "earliest": { "epoch": earliest.0, "seq": earliest.1 },
    });
    if let Some(source) = source {
        f["source"] = source.into();
    }
    encode(&f)
}

/// `{"type":"ping","t":…}` with `t` in milliseconds since the Unix epoch (AEP-0003 §3.5
/// #5).
pub fn ping(t_ms: u64) -> Bytes {
    encode(&json!({ "type": "ping", "t": t_ms }))
}

/// `{"type":"pong","t":…}` echoing a peer's `ping` (its `t`, verbatim, when it sent one).
pub fn pong(t: Option<&Value>) -> Bytes {
    match t {
        Some(t) => encode(&json!({ "type": "pong", "t": t })),
        None => encode(&json!({ "type": "pong" })),
    }
}

/// `{"type":"dropped","count":n,"debug":d,"info":i}`: `n` Events, `d` of severity
/// `debug` and `i` of `info`, were not delivered to this connection since the previous
/// such frame because it read too slowly (AEP-0003 §8.4); sent just before the next
/// Event delivered after them. Not a frame of AEP-0003 §2's 0.1 list: the relay sends it
/// only to a peer whose `hello` declared `capabilities.experimental.dropped`
/// ([`Declaration::dropped`]), and declares the same key in its own (AEP-0003 §4 rule 6,
/// the graduation namespace). [`dropped_len`] bytes long, frame header included.
pub fn dropped(debug: u64, info: u64) -> Bytes {
    let count = debug.saturating_add(info);
    rfc6455::text(
        format!(r#"{{"type":"dropped","count":{count},"debug":{debug},"info":{info}}}"#).as_bytes(),
    )
}

/// The length of [`dropped`]`(debug, info)` in bytes, without building it: always a
/// text frame with a 2-byte header (the payload stays under 126 bytes).
pub fn dropped_len(debug: u64, info: u64) -> usize {
    let digits = |v: u64| v.checked_ilog10().map_or(1, |l| l as usize + 1);
    let count = debug.saturating_add(info);
    2 + r#"{"type":"dropped","count":,"debug":,"info":}"#.len()
        + digits(count)
        + digits(debug)
        + digits(info)
}

/// `{"type":"closing","reason":…,"delivered":[{"sub","session","source","epoch","seq"}…]}`
/// (one entry per subscription and owning stream `(source, session)`, AEP-0001 §5.2), plus
/// `dropped` (a count) and a `detail` when backpressure dropped Events toward it
/// (AEP-0003 §3.5 #4).
pub fn closing(reason: &str, delivered: Vec<Value>, dropped: u64) -> Bytes {
    let mut f = json!({ "type": "closing", "reason": reason, "delivered": delivered });
    if dropped > 0 {
        // AEP-0003 §8.4: drops toward a slow consumer are counted, and it is told.
        f["dropped"] = dropped.into();
        f["detail"] = format!(
            "{dropped} debug/info Events were not delivered to this connection (backpressure, AEP-0003 §8.4)"
        )
        .into();
    }
    encode(&f)
}

/// One roster entry (AEP-0003 §4.1 rule 4): the claimed `session`, the claimant's
/// `agent` and `instance`, and its `control` and `emits` declarations verbatim; members
/// it never declared are absent.
pub fn roster_entry(session: &str, d: &Declaration) -> Value {
    let mut m = Map::new();
    m.insert("session".into(), session.into());
    if let Some(a) = &d.agent {
        m.insert("agent".into(), a.as_str().into());
    }
    if let Some(i) = &d.instance {
        m.insert("instance".into(), i.as_str().into());
    }
    if let Some(c) = &d.control {
        m.insert("control".into(), c.clone());
    }
    if let Some(e) = &d.emits {
        m.insert("emits".into(), e.clone());
    }
    Value::Object(m)
}

/// `{"type":"roster","id":…,"entries":[…]}`.
pub fn roster(id: &str, entries: Vec<Value>) -> Bytes {
    encode(&json!({ "type": "roster", "id": id, "entries": entries }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(s: &str) -> Map<String, Value> {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn hello_selects_one_supported_version() {
        let d = parse_hello(&obj(
            r#"{"type":"hello","versions":["9.0","0.1"],"role":"consumer","x":1}"#,
        ))
        .unwrap();
        assert_eq!((d.version, d.role), ("0.1", Role::Consumer));
        let e = parse_hello(&obj(r#"{"versions":["9.0"],"role":"consumer"}"#)).unwrap_err();
        assert_eq!(e.code, Code::VersionUnsupported);
        let e = parse_hello(&obj(r#"{"role":"consumer"}"#)).unwrap_err();
        assert_eq!(e.code, Code::VersionUnsupported);
    }

    #[test]
    fn hello_roles_and_identity() {
        let e = parse_hello(&obj(r#"{"versions":["0.1"],"role":"emitter"}"#)).unwrap_err();
        assert_eq!(e.code, Code::InvalidHello);
        assert!(e.detail.contains("`identity.agent`"), "{}", e.detail);
        let e = parse_hello(&obj(r#"{"versions":["0.1"],"role":"boss"}"#)).unwrap_err();
        assert_eq!(e.code, Code::InvalidHello);
        assert!(e.detail.contains("`role`"), "{}", e.detail);
        let d = parse_hello(&obj(
            r#"{"versions":["0.1"],"role":"both","identity":{"agent":"a","instance":"h/1"},
                "capabilities":{"control":{"accepts":["control.cancel",3],"ack_window_ms":5},"emits":["tool"],"weird":{}}}"#,
        ))
        .unwrap();
        assert!(d.accepts("control.cancel") && !d.accepts("control.pause"));
        assert!(!d.dropped, "no `experimental.dropped`: no `dropped` frames");
        assert_eq!(
            roster_entry("s", &d),
            serde_json::json!({"session":"s","agent":"a","instance":"h/1",
                "control":{"accepts":["control.cancel",3],"ack_window_ms":5},"emits":["tool"]})
        );
    }

    /// `capabilities.experimental.dropped` asks for `dropped` frames; `false` and
    /// `null` do not.
    #[test]
    fn hello_asks_for_dropped_frames_in_the_experimental_namespace() {
        let asks = |caps: &str| {
            let h = format!(r#"{{"versions":["0.1"],"role":"consumer","capabilities":{caps}}}"#);
            parse_hello(&obj(&h)).unwrap().dropped
        };
        assert!(asks(r#"{"experimental":{"dropped":{}}}"#));
        assert!(asks(r#"{"experimental":{"dropped":true}}"#));
        assert!(!asks(r#"{"experimental":{"dropped":false}}"#));
        assert!(!asks(r#"{"experimental":{"dropped":null}}"#));
        assert!(!asks(r#"{"experimental":{}}"#));
        assert!(!asks(r#"{"dropped":{}}"#));
    }

    /// The frame's JSON has a fixed member order, and its length is known ahead.
    #[test]
    fn the_dropped_frame() {
        let f = dropped(10, 2);
        assert_eq!(
            &f[2..],
            br#"{"type":"dropped","count":12,"debug":10,"info":2}"#
        );
        assert_eq!(
            f[..2],
            [0x81, (f.len() - 2) as u8],
            "FIN, text, short length"
        );
        for (d, i) in [(0, 0), (9, 0), (9, 1), (10, 99), (u64::MAX, u64::MAX)] {
            assert_eq!(dropped(d, i).len(), dropped_len(d, i), "{d} {i}");
        }
        assert_eq!(
            dropped(u64::MAX, u64::MAX)[1],
            104,
            "the widest: a short length"
        );
    }
}
