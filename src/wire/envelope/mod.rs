//! The Event envelope: the scanner that reads routing attributes out of an Event's raw
//! bytes, and AEP-0001 envelope validation.
//!
//! An [`Event`] is the original byte slice the emitter sent (a reference-counted
//! [`Bytes`]) plus the routing attributes the scanner found in it, stored as spans into
//! those bytes (decoded text only for the rare string that carries JSON escapes).
//! `data` is validated as JSON and skipped, never built (AEP-0001 §5: relays MUST NOT
//! require parsing `data`).
//!
//! Two entry points:
//! - [`Event::parse`]: scan + full envelope validation (AEP-0001 §5, §5.2, §5.4, §6, §8;
//!   AEP-0004 §2.2). This is what every ingest path calls.
//! - [`Event::scan`]: JSON well-formedness and per-attribute value types only, without the
//!   presence and cross-attribute rules. Used where a partial envelope is legitimate
//!   (filter conformance cases, tools).

use bytes::Bytes;
use bytestring::ByteString;
use smallvec::SmallVec;

mod scan;
mod validate;

pub use validate::{
    header_version_supported, is_category, is_valid_extension_name, is_valid_type, vendor_token,
    version_supported, CATEGORIES, SUPPORTED_VERSIONS,
};

/// The AEP-0001 §5.3 worked example Event, verbatim (non-normative spec text): a valid
/// `tool.completed` Event with every core attribute, for tests, benchmarks and docs.
#[doc(hidden)]
pub const WORKED_EXAMPLE: &str = r#"{
  "aep": "0.1",
  "id": "01JX9YB3P4T9",
  "type": "tool.completed",
  "subject": "Bash",
  "time": "2026-07-03T10:15:04.221Z",
  "source": "aep://host-a/agent/claude-code/session/s_8f2c",
  "agent": "claude-code",
  "session": "s_8f2c",
  "run": "r_0042",
  "step": "turn-3",
  "seq": 187,
  "epoch": 0,
  "cause": "01JX9YB2Z1QK",
  "severity": "info",
  "capture": "metadata",
  "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
  "data": {
    "tool": { "name": "Bash", "call_id": "t_91" },
    "status": "success",
    "duration_ms": 1240,
    "gen_ai.usage.input_tokens": 142,
    "gen_ai.usage.output_tokens": 87
  }
}"#;

/// Rewrites every CR and LF in a valid Event's bytes as a space, in place: the same JSON
/// value on one line. Outside strings they are insignificant whitespace; a valid string
/// cannot hold a raw one (RFC 8259 §7). Used where an Event must fit one line: an SSE
/// `data:` line (AEP-0003 §3.3.2) and a JSONL history line (§3.1.1).
pub fn line_breaks_to_spaces(bytes: &mut [u8]) {
    // memchr2 skips the (usual) line-free stretches a word at a time.
    let mut at = 0;
    while let Some(i) = memchr::memchr2(b'\n', b'\r', &bytes[at..]) {
        bytes[at + i] = b' ';
        at += i + 1;
    }
}

/// Severity levels in their AEP-0001 §8.1 total order: `debug < info < notice < warning <
/// error < critical`. The derived `Ord` is that order.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// `debug`
    Debug,
    /// `info` (the default when absent, AEP-0001 §5.1 #15)
    Info,
    /// `notice`
    Notice,
    /// `warning`
    Warning,
    /// `error`
    Error,
    /// `critical`
    Critical,
}

impl Severity {
    /// All levels, lowest first.
    pub const ALL: [Severity; 6] = [
        Severity::Debug,
        Severity::Info,
        Severity::Notice,
        Severity::Warning,
        Severity::Error,
        Severity::Critical,
    ];

    /// Parses the wire spelling (`"notice"`); `None` for anything outside the enum.
    pub fn parse(s: &str) -> Option<Severity> {
        Severity::parse_bytes(s.as_bytes())
    }

    /// [`Severity::parse`] on the raw bytes of the string (the scanner's hot path: no
    /// UTF-8 check of a word that can only match if it is ASCII).
    pub(crate) fn parse_bytes(s: &[u8]) -> Option<Severity> {
        Some(match s {
            b"debug" => Severity::Debug,
            b"info" => Severity::Info,
            b"notice" => Severity::Notice,
            b"warning" => Severity::Warning,
            b"error" => Severity::Error,
            b"critical" => Severity::Critical,
            _ => return None,
        })
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Debug => "debug",
            Severity::Info => "info",
            Severity::Notice => "notice",
            Severity::Warning => "warning",
            Severity::Error => "error",
            Severity::Critical => "critical",
        }
    }
}

/// Content-capture levels (AEP-0001 §8.2), ordered `none < metadata < redacted < full`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capture {
    /// `none`: envelope only.
    None,
    /// `metadata`: structural metadata, no free text (the default when absent).
    Metadata,
    /// `redacted`: free text passed the AEP-0003 §9.4 redaction pipeline.
    Redacted,
    /// `full`: verbatim content.
    Full,
}

impl Capture {
    /// All levels, lowest first.
    pub const ALL: [Capture; 4] = [
        Capture::None,
        Capture::Metadata,
        Capture::Redacted,
        Capture::Full,
    ];

    /// Parses the wire spelling; `None` for anything outside the enum.
    pub fn parse(s: &str) -> Option<Capture> {
        Capture::parse_bytes(s.as_bytes())
    }

    /// [`Capture::parse`] on the raw bytes of the string (see [`Severity::parse_bytes`]).
    pub(crate) fn parse_bytes(s: &[u8]) -> Option<Capture> {
        Some(match s {
            b"none" => Capture::None,
            b"metadata" => Capture::Metadata,
            b"redacted" => Capture::Redacted,
            b"full" => Capture::Full,
            _ => return None,
        })
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Capture::None => "none",
            Capture::Metadata => "metadata",
            Capture::Redacted => "redacted",
            Capture::Full => "full",
        }
    }
}

/// The string-valued core context attributes of AEP-0001 §5.1 (everything but `seq`,
/// `epoch`, `severity`, `capture` and `data`, which have their own accessors).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Attr {
    /// #1 `aep`
    Aep = 0,
    /// #2 `id`
    Id,
    /// #3 `type`
    Type,
    /// #4 `subject`
    Subject,
    /// #5 `time`
    Time,
    /// #6 `source`
    Source,
    /// #7 `agent`
    Agent,
    /// #8 `session`
    Session,
    /// #9 `run`
    Run,
    /// #10 `step`
    Step,
    /// #13 `cause`
    Cause,
    /// #14 `traceparent`
    Traceparent,
}

impl Attr {
    /// Number of string-valued core attributes.
    pub const COUNT: usize = 12;

    /// All string-valued core attributes, in `#[repr]` order.
    pub const ALL: [Attr; Attr::COUNT] = [
        Attr::Aep,
        Attr::Id,
        Attr::Type,
        Attr::Subject,
        Attr::Time,
        Attr::Source,
        Attr::Agent,
        Attr::Session,
        Attr::Run,
        Attr::Step,
        Attr::Cause,
        Attr::Traceparent,
    ];

    /// The wire name (`"session"`).
    pub fn name(self) -> &'static str {
        match self {
            Attr::Aep => "aep",
            Attr::Id => "id",
            Attr::Type => "type",
            Attr::Subject => "subject",
            Attr::Time => "time",
            Attr::Source => "source",
            Attr::Agent => "agent",
            Attr::Session => "session",
            Attr::Run => "run",
            Attr::Step => "step",
            Attr::Cause => "cause",
            Attr::Traceparent => "traceparent",
        }
    }

    /// The attribute with this wire name, if it is a string-valued core attribute.
    pub fn from_name(name: &str) -> Option<Attr> {
        Attr::ALL.iter().copied().find(|a| a.name() == name)
    }

    /// Its row in the AEP-0001 §5.1 table (`"#8"`), for refusal details.
    pub(crate) fn spec_row(self) -> &'static str {
        match self {
            Attr::Aep => "#1",
            Attr::Id => "#2",
            Attr::Type => "#3",
            Attr::Subject => "#4",
            Attr::Time => "#5",
            Attr::Source => "#6",
            Attr::Agent => "#7",
            Attr::Session => "#8",
            Attr::Run => "#9",
            Attr::Step => "#10",
            Attr::Cause => "#13",
            Attr::Traceparent => "#14",
        }
    }
}

/// The names of all sixteen core context attributes plus `data` (AEP-0001 §5.1). An
/// extension attribute may not use any of them (§5.4).
pub const CORE_NAMES: [&str; 17] = [
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

/// An extension attribute's value (AEP-0001 §5.4: string, integer or boolean only).
/// Integers are held as `i128` so that every JSON integer in `i64 ∪ u64` compares exactly.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Scalar<'a> {
    /// A JSON string, decoded.
    Str(&'a str),
    /// A JSON integer (no fraction, no exponent) within `i64::MIN..=u64::MAX`.
    Int(i128),
    /// `true` / `false`.
    Bool(bool),
}

/// Where a decoded string lives, in 8 bytes: a span of the Event's own bytes when it had
/// no escapes, or a span of the Event's side buffer of unescaped text.
///
/// Stored as two `u32` offsets `(a, b)`: `a <= b` is the raw span `bytes[a..b]` (between
/// the quotes), `a > b` the unescaped span `unescaped[b..a]`. The two cannot be confused:
/// a decoded string that went to the side buffer holds at least one character (each
/// escape decodes to one), so its span is never empty, and an empty span is `""` in
/// either buffer.
#[derive(Copy, Clone, PartialEq, Eq, Default)]
pub(crate) struct Text {
    a: u32,
    b: u32,
}

impl Text {
    /// `bytes[start..end]`.
    #[inline]
    pub(crate) fn raw(start: u32, end: u32) -> Text {
        Text { a: start, b: end }
    }

    /// `unescaped[start..end]`; `start < end` (see the type's doc).
    #[inline]
    pub(crate) fn unescaped(start: u32, end: u32) -> Text {
        Text { a: end, b: start }
    }

    /// Whether the span indexes the side buffer.
    #[inline]
    pub(crate) fn is_unescaped(self) -> bool {
        self.a > self.b
    }

    /// `(start, end)` in whichever buffer [`Text::is_unescaped`] names.
    #[inline]
    pub(crate) fn range(self) -> (usize, usize) {
        if self.a > self.b {
            (self.b as usize, self.a as usize)
        } else {
            (self.a as usize, self.b as usize)
        }
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (s, e) = self.range();
        let buf = if self.is_unescaped() {
            "unescaped"
        } else {
            "raw"
        };
        write!(f, "{buf}[{s}..{e}]")
    }
}

/// An extension attribute's value as stored (spans, not borrowed; integers without the
/// 16-byte alignment of `i128`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum StoredScalar {
    Str(Text),
    /// A non-negative integer (what `serde_json` holds as `u64`).
    U64(u64),
    /// A negative integer (what `serde_json` holds as `i64`).
    I64(i64),
    Bool(bool),
}

/// One extension attribute: its name and its value, in wire order.
pub(crate) type Extension = (Text, StoredScalar);

/// Bits of [`Attrs::present`]: `1 << (a as u32)` for a string-valued core attribute `a`,
/// then `seq`, `epoch`, `severity`, `capture`, `data` (the scanner's `Member::bit`).
pub(crate) const SEQ_BIT: u32 = 1 << Attr::COUNT;
pub(crate) const EPOCH_BIT: u32 = 1 << (Attr::COUNT + 1);
pub(crate) const DATA_BIT: u32 = 1 << (Attr::COUNT + 4);
/// Set when the Event's bytes hold a raw CR or LF (whitespace between tokens, the only
/// place a valid Event can hold one, RFC 8259 §7), seen by the scanner as it skips it.
pub(crate) const LINE_BREAK_BIT: u32 = 1 << (Attr::COUNT + 5);

/// The routing attributes the scanner extracted (crate-internal layout; read them through
/// [`Event`]'s accessors). Compact: presence is one bit mask, not an `Option` per field,
/// and one extension attribute fits inline (the usual Event has none or one).
#[derive(Clone, Debug, Default)]
pub(crate) struct Attrs {
    /// Indexed by `Attr as usize`; meaningful where `present` has the attribute's bit.
    pub(crate) text: [Text; Attr::COUNT],
    /// Which members the Event carries (`1 << (a as u32)`, [`SEQ_BIT`], ...).
    pub(crate) present: u32,
    pub(crate) severity: Option<Severity>,
    pub(crate) capture: Option<Capture>,
    /// Byte range of the `data` member's value within the Event's bytes (a raw span,
    /// braces included), when `present` has [`DATA_BIT`].
    pub(crate) data: Text,
    pub(crate) seq: u64,
    pub(crate) epoch: u64,
    /// (name, value), in wire order.
    pub(crate) extensions: SmallVec<[Extension; 1]>,
}

impl Attrs {
    /// The span of `a`, when present.
    #[inline]
    pub(crate) fn text(&self, a: Attr) -> Option<Text> {
        (self.present & 1 << (a as u32) != 0).then(|| self.text[a as usize])
    }

    /// `seq`, when present.
    #[inline]
    pub(crate) fn seq(&self) -> Option<u64> {
        (self.present & SEQ_BIT != 0).then_some(self.seq)
    }

    /// `epoch`, when present.
    #[inline]
    pub(crate) fn epoch(&self) -> Option<u64> {
        (self.present & EPOCH_BIT != 0).then_some(self.epoch)
    }
}

/// How an Event relates to session order (AEP-0001 §5.2).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// `agent.*`: no session, no seq; fanned out live, never buffered.
    Agent,
    /// Carries `session` and `seq`: a position `(session, epoch, seq)` in the owner's stream.
    Sequenced,
    /// A foreign-emitter session Event: carries `session` but no `seq` (commands,
    /// `attention.routed`).
    Foreign,
}

/// Why an Event was refused. `detail` names the attribute and the spec section, e.g.
/// "`seq` must be an integer >= 0 (AEP-0001 §5.1 #11)".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct InvalidEvent {
    /// Human-readable reason, naming the attribute and the section violated.
    pub detail: String,
    /// Byte offset in the input where the fault was found, when it is a syntax fault.
    pub at: Option<usize>,
}

impl InvalidEvent {
    pub(crate) fn new(detail: impl Into<String>) -> InvalidEvent {
        InvalidEvent {
            detail: detail.into(),
            at: None,
        }
    }
    pub(crate) fn at(detail: impl Into<String>, at: usize) -> InvalidEvent {
        InvalidEvent {
            detail: detail.into(),
            at: Some(at),
        }
    }
}

/// One Event: its original bytes and the routing attributes scanned out of them.
///
/// Cloning is cheap only for the bytes; share Events behind an `Rc`/`Arc` on the fan-out
/// path.
///
/// Its layout is compact (`size_of::<Event>()` is under 256 bytes; it is moved through
/// the ingest path by value): the bytes, a span per routing attribute, and a side buffer
/// only for the rare string that carried escapes. The bytes are held as UTF-8 text
/// (checked once when the Event is scanned), so the `&str` accessors are slices, not
/// re-validations.
#[derive(Clone, Debug)]
pub struct Event {
    /// The Event object, known to be UTF-8 (a `Bytes` underneath: [`Event::bytes`]).
    bytes: ByteString,
    attrs: Attrs,
    /// Decoded text of string attributes that carried escapes; usually empty (and then
    /// not allocated).
    unescaped: Box<str>,
}

impl Event {
    /// Scans `bytes` (one JSON object, UTF-8, surrounding ASCII whitespace allowed and not
    /// kept) and validates the envelope (AEP-0001 §5, §5.2, §5.4, §6, §8; AEP-0004 §2.2).
    ///
    /// # Errors
    /// [`InvalidEvent`] with a detail naming the attribute and the section.
    #[inline]
    pub fn parse(bytes: Bytes) -> Result<Event, InvalidEvent> {
        let ev = scan::scan(bytes)?;
        validate::validate(&ev)?;
        Ok(ev)
    }

    /// Scans `bytes` as one JSON object and checks each present top-level member's value
    /// type (strings are non-empty strings, `seq`/`epoch` integers >= 0, enums in range,
    /// extension names legal and values scalar, no `null`, no duplicate member) without
    /// the presence and cross-attribute rules of [`Event::parse`].
    ///
    /// # Errors
    /// [`InvalidEvent`] for anything `serde_json` would reject and for the value rules above.
    pub fn scan(bytes: Bytes) -> Result<Event, InvalidEvent> {
        scan::scan(bytes)
    }

    /// The Event exactly as received (surrounding whitespace trimmed).
    pub fn bytes(&self) -> &Bytes {
        self.bytes.as_bytes()
    }

    /// Gives the Event an allocation of its own when its bytes are a strict part of the
    /// buffer they were scanned from, `backing` bytes long (an NDJSON body, a WebSocket
    /// message, a read chunk): a `Bytes` slice keeps its whole buffer alive, so an Event
    /// held in a replay buffer (AEP-0003 §5) would otherwise cost the whole body. Returns
    /// whether it copied (one copy of the Event's bytes into an exact-size allocation,
    /// spans stay valid as they are relative to the bytes). Afterwards the memory the
    /// Event's bytes retain is `bytes().len()`, plus the allocator's rounding.
    ///
    /// `backing` must be the size of the whole allocation, not only of the part given
    /// to [`Event::parse`]; an Event already alone in its buffer (`backing ==
    /// bytes().len()`) is left as is.
    pub fn compact(&mut self, backing: usize) -> bool {
        if backing <= self.bytes.len() {
            return false;
        }
        self.bytes = ByteString::from(&*self.bytes);
        true
    }

    /// The text `t` denotes: a slice of UTF-8 already checked, so only the two char
    /// boundaries are tested (the scanner records spans between quotes, which are
    /// boundaries; `""` if a span were ever off one).
    #[inline]
    fn text(&self, t: Text) -> &str {
        let buf: &str = if t.is_unescaped() {
            &self.unescaped
        } else {
            &self.bytes
        };
        let (s, e) = t.range();
        buf.get(s..e).unwrap_or_default()
    }

    /// Whether the string-valued core attribute `a` is present (no text is read).
    #[inline]
    pub fn has(&self, a: Attr) -> bool {
        self.attrs.present & 1 << (a as u32) != 0
    }

    /// A string-valued core attribute, decoded; `None` when absent.
    #[inline]
    pub fn attr(&self, a: Attr) -> Option<&str> {
        self.attrs.text(a).map(|t| self.text(t))
    }

    /// `id` (empty only for an Event from [`Event::scan`] that lacks it).
    pub fn id(&self) -> &str {
        self.attr(Attr::Id).unwrap_or_default()
    }

    /// `type` (empty only for an Event from [`Event::scan`] that lacks it).
    pub fn event_type(&self) -> &str {
        self.attr(Attr::Type).unwrap_or_default()
    }

    /// `source` (empty only for an Event from [`Event::scan`] that lacks it).
    pub fn source(&self) -> &str {
        self.attr(Attr::Source).unwrap_or_default()
    }

    /// `session`, when present.
    pub fn session(&self) -> Option<&str> {
        self.attr(Attr::Session)
    }

    /// `seq`, when present.
    pub fn seq(&self) -> Option<u64> {
        self.attrs.seq()
    }

    /// `epoch` with the AEP-0001 §5.1 default applied (`0` when absent).
    pub fn epoch(&self) -> u64 {
        self.attrs.epoch().unwrap_or(0)
    }

    /// `epoch` as declared (`None` when absent).
    pub fn epoch_declared(&self) -> Option<u64> {
        self.attrs.epoch()
    }

    /// `severity` with the default applied (`info` when absent).
    pub fn severity(&self) -> Severity {
        self.attrs.severity.unwrap_or(Severity::Info)
    }

    /// `severity` as declared.
    pub fn severity_declared(&self) -> Option<Severity> {
        self.attrs.severity
    }

    /// `capture` with the default applied (`metadata` when absent).
    pub fn capture(&self) -> Capture {
        self.attrs.capture.unwrap_or(Capture::Metadata)
    }

    /// Whether the Event's bytes hold a raw CR or LF: then an SSE `data:` line or a JSONL
    /// history line needs them as spaces ([`line_breaks_to_spaces`]); otherwise its bytes
    /// are one line as they are. Known from the scan (no pass over the bytes).
    pub fn has_line_breaks(&self) -> bool {
        self.attrs.present & LINE_BREAK_BIT != 0
    }

    /// `capture` as declared.
    pub fn capture_declared(&self) -> Option<Capture> {
        self.attrs.capture
    }

    fn scalar(&self, v: StoredScalar) -> Scalar<'_> {
        match v {
            StoredScalar::Str(t) => Scalar::Str(self.text(t)),
            StoredScalar::U64(i) => Scalar::Int(i128::from(i)),
            StoredScalar::I64(i) => Scalar::Int(i128::from(i)),
            StoredScalar::Bool(b) => Scalar::Bool(b),
        }
    }

    /// The extension attribute `name` (AEP-0001 §5.4), when present.
    pub fn extension(&self, name: &str) -> Option<Scalar<'_>> {
        self.attrs
            .extensions
            .iter()
            .find(|(n, _)| self.text(*n) == name)
            .map(|(_, v)| self.scalar(*v))
    }

    /// All extension attributes in wire order.
    pub fn extensions(&self) -> impl Iterator<Item = (&str, Scalar<'_>)> + '_ {
        self.attrs
            .extensions
            .iter()
            .map(|(n, v)| (self.text(*n), self.scalar(*v)))
    }

    /// The raw bytes of the `data` member's value, when present.
    pub fn data(&self) -> Option<&[u8]> {
        if self.attrs.present & DATA_BIT == 0 {
            return None;
        }
        let (s, e) = self.attrs.data.range();
        self.bytes.as_bytes().get(s..e)
    }

    /// The Event's relation to session order (AEP-0001 §5.2), from `type` and `seq`.
    pub fn scope(&self) -> Scope {
        if self.event_type().starts_with("agent.") {
            Scope::Agent
        } else if self.attrs.present & SEQ_BIT != 0 {
            Scope::Sequenced
        } else {
            Scope::Foreign
        }
    }

    /// Whether `type` is a command (AEP-0004 §2): an imperative `control.{verb}` type or a
    /// vendor `x.{vendor}.control.*` type. The acknowledgements `control.accepted` and
    /// `control.rejected` are facts, not commands.
    pub fn is_command(&self) -> bool {
        is_command_type(self.event_type())
    }
}

/// Whether a type string names a command (AEP-0004 §2). See [`Event::is_command`].
pub fn is_command_type(t: &str) -> bool {
    if let Some(rest) = t.strip_prefix("control.") {
        return rest != "accepted" && rest != "rejected";
    }
    if let Some(rest) = t.strip_prefix("x.") {
        if let Some(dot) = rest.find('.') {
            return rest[dot + 1..].starts_with("control.");
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Event is moved by value through the ingest path, so its size is a cost per
    /// Event. This bounds the compact layout (structural): an `Option` per span and an
    /// inline `i128`-aligned extension list would make it 368 bytes.
    #[test]
    fn an_event_is_compact() {
        let size = std::mem::size_of::<Event>();
        assert!(size <= 216, "size_of::<Event>() = {size}");
        assert_eq!(std::mem::size_of::<Text>(), 8);
        assert!(std::mem::size_of::<Extension>() <= 24);
    }

    /// The accessors read spans as text: raw, unescaped, empty, absent.
    #[test]
    fn accessors_slice_the_checked_text() {
        let ev = Event::scan(Bytes::from_static(
            "{\"id\":\"é1\",\"session\":\"s\\u00e9\",\"acme\":\"\",\"n\":-3,\"u\":7}".as_bytes(),
        ))
        .unwrap();
        assert_eq!(ev.id(), "é1");
        assert_eq!(ev.session(), Some("sé"));
        assert_eq!(ev.attr(Attr::Run), None);
        assert!(!ev.has(Attr::Run));
        let ext: Vec<_> = ev.extensions().collect();
        assert_eq!(
            ext,
            [
                ("acme", Scalar::Str("")),
                ("n", Scalar::Int(-3)),
                ("u", Scalar::Int(7))
            ]
        );
        assert_eq!(ev.data(), None);
        assert_eq!(ev.seq(), None);
        assert_eq!(ev.epoch_declared(), None);
    }
}
