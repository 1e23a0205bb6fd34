//! The envelope scanner: one pass over an Event's bytes that validates them as strict JSON
//! (RFC 8259, with exactly `serde_json`'s acceptance) and extracts the routing attributes
//! as spans, without building a DOM and without parsing `data` into anything.
//!
//! # Shape
//! - In: one JSON object, UTF-8, optionally surrounded by JSON whitespace (space, tab, LF,
//!   CR). Form feed, NBSP, a BOM, or anything after the object is refused, as
//!   `serde_json::from_slice` refuses them.
//! - Out: the trimmed object as a zero-copy `Bytes::slice` held as a `ByteString` (known
//!   UTF-8), the [`Attrs`] whose spans index that slice (raw `Text`) or the returned side
//!   buffer (unescaped `Text`, only for strings that carried escapes), and that side
//!   buffer (empty for almost every Event).
//!
//! # What is checked here (and only here)
//! - JSON: UTF-8 (once, whole, after the scan), string escapes (`\u` surrogates must pair, as `serde_json` requires when
//!   it builds a `String`), no raw control characters in strings, number grammar and
//!   `serde_json`'s "number out of range" rule for floats, literals, nesting depth
//!   (`serde_json` refuses a container nested 128 deep, so at most 127 levels counting the
//!   Event object itself), nothing after the object.
//! - Per top-level member value types (AEP-0001 §5.1, §5.4): see [`super::Event::scan`].
//!   Presence and cross-attribute rules live in `validate.rs`.
//! - Duplicate top-level member names, compared after unescaping (`"typ\u0065"` is
//!   `type`): refused, because two readers could disagree on which one counts (AEP-0001
//!   §5, RFC 8259 §4).
//!
//! # Integers
//! An integer is what `serde_json` would hold as `u64` or `i64`: no fraction, no exponent,
//! within `i64::MIN..=u64::MAX`, and not `-0` (`serde_json` 1.x reads `-0` as the float
//! `-0.0`, so `"seq": -0` is refused like `"seq": 0.0`).
//!
//! # Panics
//! Never, on any input: bytes are read through `get`, positions never pass the input's
//! end, exponent arithmetic saturates, and inputs over 4 GiB (which `u32` spans could not
//! address) are refused up front. The scanner is a fuzz target.
//!
//! # Cost
//! One pass over the bytes, then one UTF-8 check of the accepted object (`is_ascii`, a
//! word at a time, for an all-ASCII Event). No allocation for an Event whose strings
//! carry no escapes and that has at most one extension attribute (more go to a heap
//! list; up to eight are checked for duplicates without allocating); strings are
//! skipped eight bytes at a time (SWAR), long ones with `memchr`.
//! Duplicate extension names are found in O(n) even for adversarially many members.
//!
//! # Spec
//! AEP-0001 §5 (an Event is one JSON object, relays MUST NOT require parsing `data`),
//! §5.1 (attribute types, no `null`), §5.4 (extension attributes), §8 (enums).

use super::{
    Attr, Attrs, Capture, Event, InvalidEvent, Severity, StoredScalar, Text, LINE_BREAK_BIT,
};
use bytes::Bytes;
use bytestring::ByteString;
use smallvec::SmallVec;
use std::collections::HashSet;

/// The deepest container nesting `serde_json` accepts, counting the Event object as level
/// 1: its recursion budget of 128 is exhausted by the 128th nested container.
pub(crate) const MAX_DEPTH: u32 = 127;

/// A refusal inside the scanner: boxed, so that every `Result` the scanner's functions
/// return fits in registers (an unboxed [`InvalidEvent`] made each `?` a copy through
/// the stack, and the hot path paid for the error path).
type Fault = Box<InvalidEvent>;

/// A value-rule refusal (no byte offset).
#[cold]
fn fault(detail: impl Into<String>) -> Fault {
    Box::new(InvalidEvent::new(detail))
}

/// JSON whitespace (RFC 8259 §2). Deliberately not `u8::is_ascii_whitespace`, which also
/// admits form feed; `serde_json` does not.
#[inline]
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Scans one JSON object; see `Event::scan`.
///
/// Error offsets (`InvalidEvent::at`) are byte offsets into `bytes` as given, before
/// trimming.
pub(crate) fn scan(bytes: Bytes) -> Result<Event, InvalidEvent> {
    let input = &bytes[..];
    if u32::try_from(input.len()).is_err() {
        return Err(InvalidEvent::new(format!(
            "Event of {} bytes is larger than 4 GiB (AEP-0001 §5)",
            input.len()
        )));
    }
    let Some(start) = input.iter().position(|&b| !is_ws(b)) else {
        return Err(InvalidEvent::at(
            format!(
                "invalid JSON at byte {}: empty input, expected one JSON object (AEP-0001 §5)",
                input.len()
            ),
            input.len(),
        ));
    };
    let end = input
        .iter()
        .rposition(|&b| !is_ws(b))
        .map_or(start, |e| e + 1);
    let object = bytes.slice(start..end);
    let mut s = Scanner::new(&object[..], start);
    let scanned = s.top_object().and_then(|()| {
        s.skip_ws();
        if s.pos == s.b.len() {
            Ok(())
        } else {
            Err(s.syntax("trailing characters after the Event object"))
        }
    });
    // UTF-8 is checked once, over the whole object, not by the scanner: bytes >= 0x80
    // can only stand inside strings, where the scanner passes them as plain string
    // bytes. A refused input is checked whole here, because invalid UTF-8 anywhere is
    // reported before any other fault, as `serde_json` does; an accepted one below.
    if let Err(e) = scanned {
        return Err(utf8_fault(input, start).unwrap_or(*e));
    }
    let Scanner {
        attrs, unescaped, ..
    } = s;
    // The accepted object is held as text, so that the Event's `&str` accessors are
    // slices rather than re-validations. `ByteString` checks it (an `is_ascii` pass, a
    // word at a time, for the usual all-ASCII Event; `str::from_utf8` otherwise). The
    // trimmed object is UTF-8 exactly when the input is (only ASCII was cut off). The
    // Event is built here, in the caller's slot, not moved through a tuple (it is 208
    // bytes: each move is a `memcpy` call).
    match ByteString::try_from(object) {
        Ok(bytes) => Ok(Event {
            bytes,
            attrs,
            unescaped: unescaped.into_boxed_str(),
        }),
        Err(_) => Err(utf8_fault(input, start)
            .unwrap_or_else(|| InvalidEvent::new("invalid UTF-8 (RFC 8259 §8.1; AEP-0001 §5)"))),
    }
}

/// The refusal of an input that is not UTF-8, naming the member whose value holds the
/// first invalid byte (`start`: where the object begins); `None` when `input` is UTF-8.
#[cold]
fn utf8_fault(input: &[u8], start: usize) -> Option<InvalidEvent> {
    let at = std::str::from_utf8(input).err()?.valid_up_to();
    let detail = format!("invalid JSON at byte {at}: invalid UTF-8 (RFC 8259 §8.1; AEP-0001 §5)");
    // Name the member whose value holds the fault: scan the valid prefix, which ends
    // inside that value.
    let detail = match at
        .checked_sub(start)
        .and_then(|n| input.get(start..start + n))
    {
        Some(prefix) => match Scanner::new(prefix, start).member_at_end() {
            Some(name) => format!("`{name}`: {detail}"),
            None => detail,
        },
        None => detail,
    };
    Some(InvalidEvent::at(detail, at))
}

/// What a top-level member name denotes. Core names map to a bit of `Attrs::present`
/// (`Member::bit`) for duplicate detection; extension names to a `name_key`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Member {
    /// A string-valued core attribute.
    Text(Attr),
    Seq,
    Epoch,
    Severity,
    Capture,
    Data,
    /// Anything else: an extension attribute (AEP-0001 §5.4).
    Extension,
}

impl Member {
    /// A byte `match` rather than `Attr::from_name` / `CORE_NAMES`: it runs once per
    /// top-level member on the hot path and compiles to a length switch plus one compare.
    /// Inlined, so that the caller's `bit` folds into each arm.
    #[inline(always)]
    fn classify(name: &[u8]) -> Member {
        match name {
            b"aep" => Member::Text(Attr::Aep),
            b"id" => Member::Text(Attr::Id),
            b"type" => Member::Text(Attr::Type),
            b"subject" => Member::Text(Attr::Subject),
            b"time" => Member::Text(Attr::Time),
            b"source" => Member::Text(Attr::Source),
            b"agent" => Member::Text(Attr::Agent),
            b"session" => Member::Text(Attr::Session),
            b"run" => Member::Text(Attr::Run),
            b"step" => Member::Text(Attr::Step),
            b"cause" => Member::Text(Attr::Cause),
            b"traceparent" => Member::Text(Attr::Traceparent),
            b"seq" => Member::Seq,
            b"epoch" => Member::Epoch,
            b"severity" => Member::Severity,
            b"capture" => Member::Capture,
            b"data" => Member::Data,
            _ => Member::Extension,
        }
    }

    /// Bit in `Attrs::present` (`super::SEQ_BIT`, ...), which is also the scanner's set of
    /// core members seen so far; `None` for extensions (checked against the list instead).
    #[inline(always)]
    fn bit(self) -> Option<u32> {
        Some(match self {
            Member::Text(a) => a as u32,
            Member::Seq => Attr::COUNT as u32,
            Member::Epoch => Attr::COUNT as u32 + 1,
            Member::Severity => Attr::COUNT as u32 + 2,
            Member::Capture => Attr::COUNT as u32 + 3,
            Member::Data => Attr::COUNT as u32 + 4,
            Member::Extension => return None,
        })
    }

    /// The wire name and the AEP-0001 §5.1 row, for error details.
    fn describe(self) -> (&'static str, &'static str) {
        match self {
            Member::Text(a) => (a.name(), a.spec_row()),
            Member::Seq => ("seq", "#11"),
            Member::Epoch => ("epoch", "#12"),
            Member::Severity => ("severity", "#15"),
            Member::Capture => ("capture", "#16"),
            Member::Data => ("data", "#17"),
            Member::Extension => ("", ""),
        }
    }
}

/// A JSON number as `serde_json` would hold it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Num {
    U64(u64),
    I64(i64),
    /// Any other valid, in-range number (fraction, exponent, beyond `i64`/`u64`, `-0`).
    Float,
}

struct Scanner<'a> {
    /// The trimmed Event object; every span indexes this.
    b: &'a [u8],
    pos: usize,
    /// Where `b` starts in the caller's input (for error offsets).
    off: usize,
    attrs: Attrs,
    unescaped: String,
    /// Extension names seen so far, as [`name_key`]s: scanned linearly while few, moved
    /// into `ext_set` beyond [`EXT_LINEAR_MAX`] so an Event with very many extension
    /// attributes costs O(n), not O(n²).
    ext_keys: SmallVec<[u128; 8]>,
    ext_set: Option<HashSet<u128>>,
    /// Where the name of the top-level member whose value is being scanned starts (its
    /// opening quote), so a syntax fault inside a value names the attribute; `NO_MEMBER`
    /// outside any value. An offset, not the decoded name: this is written once per
    /// member on the hot path and read only on the error path.
    member_at: u32,
}

/// `Scanner::member_at` outside a member's value.
const NO_MEMBER: u32 = u32::MAX;

/// How many extension names are checked for duplicates by linear scan.
const EXT_LINEAR_MAX: usize = 32;

/// An injective key for a legal extension name (`[a-z0-9]{1,20}`, AEP-0001 §5.4): the name
/// read as base-37 digits 1..=36 (37^20 < 2^128, so no two names share a key).
fn name_key(name: &[u8]) -> u128 {
    name.iter().fold(0u128, |k, &c| {
        let d = match c {
            b'a'..=b'z' => c - b'a' + 1,
            _ => c.wrapping_sub(b'0').wrapping_add(27),
        };
        k.wrapping_mul(37).wrapping_add(u128::from(d))
    })
}

/// `a * 10 + d` would exceed `max` (`serde_json`'s `overflow!`).
#[inline]
fn overflows_u64(a: u64, d: u64) -> bool {
    a >= u64::MAX / 10 && (a > u64::MAX / 10 || d > u64::MAX % 10)
}

#[inline]
fn overflows_i32(a: i32, d: i32) -> bool {
    a >= i32::MAX / 10 && (a > i32::MAX / 10 || d > i32::MAX % 10)
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Words of 8 bytes a string is scanned with SWAR before the vectorized long-string path.
const SWAR_WORDS: u32 = 4;

/// Whether byte `c` ends a run of plain string bytes: `"`, `\` or a control character
/// (below 0x20). Non-ASCII bytes are plain: UTF-8 is checked once for the whole Event.
#[inline]
fn is_special(c: u8) -> bool {
    c == b'"' || c == b'\\' || not_plain(c)
}

/// A control character (below 0x20).
#[inline]
fn not_plain(c: u8) -> bool {
    c < 0x20
}

/// The special bytes ([`is_special`]) of the little-endian word `w` as flags (bit 7 of
/// each lane; SWAR). The lowest flag is exact: a borrow only runs upwards, from a lane
/// that matched, so it can raise flags above the first special byte but never below
/// it; `& !v` keeps bytes >= 0x80 out. Hence `trailing_zeros / 8` is the first special
/// byte's lane, and the mask is non-zero exactly when some byte is special.
#[inline]
fn special_mask(w: u64) -> u64 {
    let zero = |v: u64| v.wrapping_sub(LO) & !v;
    let q = w ^ (LO * u64::from(b'"'));
    let bs = w ^ (LO * u64::from(b'\\'));
    (zero(q) | zero(bs) | w.wrapping_sub(LO * 0x20) & !w) & HI
}

/// Whether any byte of the little-endian word `w` is special ([`special_mask`]).
#[cfg(test)]
fn has_special(w: u64) -> bool {
    special_mask(w) != 0
}

/// `10^e` exactly as the literal `1e{e}` (what `serde_json`'s `POW10` table holds), for
/// `e <= 308`. Only used on the rare exponents where the product could overflow.
fn pow10(e: u32) -> f64 {
    let mut buf = [b'1', b'e', b'0', b'0', b'0'];
    buf[2] = b'0' + (e / 100 % 10) as u8;
    buf[3] = b'0' + (e / 10 % 10) as u8;
    buf[4] = b'0' + (e % 10) as u8;
    std::str::from_utf8(&buf)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(f64::INFINITY)
}

impl<'a> Scanner<'a> {
    fn new(b: &'a [u8], off: usize) -> Scanner<'a> {
        Scanner {
            b,
            pos: 0,
            off,
            attrs: Attrs::default(),
            unescaped: String::new(),
            ext_keys: SmallVec::new(),
            ext_set: None,
            member_at: NO_MEMBER,
        }
    }

    // ---- errors -------------------------------------------------------------------

    #[cold]
    fn syntax(&self, what: &str) -> Fault {
        let at = self.off.saturating_add(self.pos);
        Box::new(InvalidEvent::at(
            format!("invalid JSON at byte {at}: {what} (RFC 8259; AEP-0001 §5)"),
            at,
        ))
    }

    #[cold]
    fn syntax_at(&mut self, pos: usize, what: &str) -> Fault {
        self.pos = pos;
        self.syntax(what)
    }

    // ---- primitives ---------------------------------------------------------------

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    /// Skips JSON whitespace, noting a CR or LF in it (`LINE_BREAK_BIT`).
    ///
    /// Compact JSON has none: one compare settles it, since every byte that may follow
    /// whitespace in valid JSON is above U+0020 (a byte at or below it that is not
    /// whitespace is refused by whoever reads it next).
    #[inline(always)]
    fn skip_ws(&mut self) {
        match self.b.get(self.pos) {
            Some(&c) if c > b' ' => {}
            None => {}
            Some(_) => self.skip_ws_run(),
        }
    }

    /// [`Self::skip_ws`] past at least one byte at or below U+0020.
    #[inline(never)]
    fn skip_ws_run(&mut self) {
        while let Some(&c) = self.b.get(self.pos) {
            if !is_ws(c) {
                break;
            }
            if c == b'\n' || c == b'\r' {
                self.attrs.present |= LINE_BREAK_BIT;
            }
            self.pos += 1;
        }
    }

    fn expect(&mut self, c: u8, what: &str) -> Result<(), Fault> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.syntax(what))
        }
    }

    /// First index `>= i` holding `"`, `\` or a control character (or `b.len()`).
    ///
    /// Routing attributes are short: up to [`SWAR_WORDS`] words go through the SWAR test,
    /// 8 bytes at a time, which also gives the special byte's position; only the last
    /// few bytes of the input go byte by byte. A longer run (free text in `data`) goes to
    /// [`Self::find_special_long`].
    #[inline]
    fn find_special(&self, mut i: usize) -> usize {
        let b = self.b;
        let mut words = 0;
        while let Some(chunk) = b.get(i..i.saturating_add(8)) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            let m = special_mask(u64::from_le_bytes(word));
            if m != 0 {
                return i + (m.trailing_zeros() / 8) as usize;
            }
            i += 8;
            words += 1;
            if words == SWAR_WORDS {
                return self.find_special_long(i);
            }
        }
        while let Some(&c) = b.get(i) {
            if is_special(c) {
                return i;
            }
            i += 1;
        }
        i
    }

    /// [`Self::find_special`] for a long string: `memchr2` finds the quote or backslash
    /// (vectorized), then the run before it is checked for control characters 32 bytes at
    /// a time with a branch-free fold that the compiler vectorizes.
    #[inline(never)]
    fn find_special_long(&self, i: usize) -> usize {
        let rest = self.b.get(i..).unwrap_or_default();
        let stop = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
        let mut at = i;
        for chunk in rest.get(..stop).unwrap_or_default().chunks(32) {
            if chunk.iter().fold(false, |any, &c| any | not_plain(c)) {
                return at + chunk.iter().position(|&c| not_plain(c)).unwrap_or(0);
            }
            at += chunk.len();
        }
        i + stop
    }

    /// The bytes a `Text` denotes.
    fn text_bytes(&self, t: Text) -> &[u8] {
        let buf = if t.is_unescaped() {
            self.unescaped.as_bytes()
        } else {
            self.b
        };
        let (s, e) = t.range();
        buf.get(s..e).unwrap_or_default()
    }

    fn text_str(&self, t: Text) -> &str {
        std::str::from_utf8(self.text_bytes(t)).unwrap_or_default()
    }

    // ---- strings ------------------------------------------------------------------

    /// Scans the string at `pos` (which holds `"`), leaving `pos` after the closing quote.
    /// With `decode`, a string carrying escapes is decoded into `self.unescaped` and
    /// returned as an unescaped `Text`; otherwise (or without escapes) the result is the
    /// raw span between the quotes.
    #[inline]
    fn string(&mut self, decode: bool) -> Result<Text, Fault> {
        self.pos += 1;
        let start = self.pos;
        let stop = self.find_special(start);
        match self.b.get(stop) {
            Some(b'"') => {
                self.pos = stop + 1;
                Ok(Text::raw(start as u32, stop as u32))
            }
            Some(b'\\') => self.string_slow(start, stop, decode),
            Some(_) => Err(self.syntax_at(
                stop,
                "control character (U+0000 to U+001F) in a string must be escaped",
            )),
            None => Err(self.syntax_at(stop, "end of input inside a string")),
        }
    }

    /// The slow path of [`Self::string`], from `stop`, the first `\`: escapes (rare for
    /// routing attributes, common in `data` free text). With `decode`, a string that
    /// carried an escape is decoded into the side buffer; otherwise the result is the
    /// raw span.
    #[inline(never)]
    fn string_slow(&mut self, start: usize, stop: usize, decode: bool) -> Result<Text, Fault> {
        let b = self.b;
        let mark = self.unescaped.len();
        let mut escaped = false;
        let mut run = start;
        let mut i = stop;
        loop {
            match b.get(i) {
                Some(b'"') => {
                    self.pos = i + 1;
                    if decode && escaped {
                        self.push_raw(run, i)?;
                        // Not empty: the escape decoded to a character (`Text`'s rule).
                        return Ok(Text::unescaped(mark as u32, self.unescaped.len() as u32));
                    }
                    return Ok(Text::raw(start as u32, i as u32));
                }
                Some(b'\\') => {
                    if decode {
                        self.push_raw(run, i)?;
                    }
                    escaped = true;
                    self.pos = i;
                    self.escape(decode)?;
                    i = self.pos;
                    run = i;
                }
                Some(_) => {
                    let next = self.find_special(i);
                    if next == i {
                        return Err(self.syntax_at(
                            i,
                            "control character (U+0000 to U+001F) in a string must be escaped",
                        ));
                    }
                    i = next;
                }
                None => return Err(self.syntax_at(i, "end of input inside a string")),
            }
        }
    }

    /// Appends `b[from..to]` (unescaped text between escapes) to the side buffer.
    fn push_raw(&mut self, from: usize, to: usize) -> Result<(), Fault> {
        let run = self.b.get(from..to).unwrap_or_default();
        match std::str::from_utf8(run) {
            Ok(s) => {
                self.unescaped.push_str(s);
                Ok(())
            }
            // Runs are cut at ASCII bytes, so this is invalid UTF-8 in the input, which
            // `scan` reports (with `utf8_fault`) instead of this fault.
            Err(_) => Err(self.syntax_at(from, "invalid UTF-8 in a string")),
        }
    }

    /// Scans one escape at `pos` (which holds `\`), appending its character when `decode`.
    fn escape(&mut self, decode: bool) -> Result<(), Fault> {
        let at = self.pos;
        let Some(c) = self.b.get(at + 1).copied() else {
            return Err(self.syntax_at(at + 1, "end of input inside an escape"));
        };
        self.pos = at + 2;
        let ch = match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let n = self.hex4()?;
                // An escape as written (six ASCII bytes from `i`), for the detail.
                let b = self.b;
                let shown = |i: usize| {
                    String::from_utf8_lossy(b.get(i..i + 6).unwrap_or_default()).into_owned()
                };
                let cp = if (0xDC00..=0xDFFF).contains(&n) {
                    let what = format!("lone trailing surrogate {} in a \\u escape", shown(at));
                    return Err(self.syntax_at(at, &what));
                } else if (0xD800..=0xDBFF).contains(&n) {
                    // A leading surrogate must be followed by `\u` and a trailing one
                    // (serde_json refuses lone surrogates in strings it decodes).
                    if self.b.get(self.pos) != Some(&b'\\')
                        || self.b.get(self.pos + 1) != Some(&b'u')
                    {
                        let what = format!(
                            "lone leading surrogate {} in a \\u escape (expected a \\u trailing surrogate)",
                            shown(at)
                        );
                        return Err(self.syntax_at(at, &what));
                    }
                    self.pos += 2;
                    let n2 = self.hex4()?;
                    if !(0xDC00..=0xDFFF).contains(&n2) {
                        let what = format!(
                            "lone leading surrogate {} in a \\u escape (the next escape, {}, is not a trailing surrogate)",
                            shown(at),
                            shown(self.pos - 6)
                        );
                        return Err(self.syntax_at(at, &what));
                    }
                    0x10000 + ((n - 0xD800) << 10) + (n2 - 0xDC00)
                } else {
                    n
                };
                match char::from_u32(cp) {
                    Some(ch) => ch,
                    None => return Err(self.syntax_at(at, "invalid \\u escape")),
                }
            }
            _ => return Err(self.syntax_at(at, "invalid escape")),
        };
        if decode {
            self.unescaped.push(ch);
        }
        Ok(())
    }

    /// Four hex digits at `pos`.
    fn hex4(&mut self) -> Result<u32, Fault> {
        let mut n = 0u32;
        for k in 0..4 {
            let d = match self.b.get(self.pos + k) {
                Some(&c @ b'0'..=b'9') => c - b'0',
                Some(&c @ b'a'..=b'f') => c - b'a' + 10,
                Some(&c @ b'A'..=b'F') => c - b'A' + 10,
                Some(_) => {
                    return Err(self.syntax_at(self.pos + k, "invalid hex digit in a \\u escape"))
                }
                None => return Err(self.syntax_at(self.pos + k, "end of input inside an escape")),
            };
            n = n << 4 | u32::from(d);
        }
        self.pos += 4;
        Ok(n)
    }

    // ---- numbers (a port of serde_json 1.x's default, non-`float_roundtrip` parser) ---

    /// Scans the number at `pos`, leaving `pos` after it.
    fn number(&mut self) -> Result<Num, Fault> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let mut sig: u64;
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return Err(self.syntax("invalid number: leading zero"));
                }
                sig = 0;
            }
            Some(c @ b'1'..=b'9') => {
                self.pos += 1;
                sig = u64::from(c - b'0');
                while let Some(c @ b'0'..=b'9') = self.peek() {
                    let d = u64::from(c - b'0');
                    if overflows_u64(sig, d) {
                        self.long_integer(sig)?;
                        return Ok(Num::Float);
                    }
                    self.pos += 1;
                    sig = sig * 10 + d;
                }
            }
            Some(_) => return Err(self.syntax("invalid number: expected a digit")),
            None => return Err(self.syntax("end of input inside a number")),
        }
        match self.peek() {
            Some(b'.') => {
                self.decimal(sig, 0)?;
                Ok(Num::Float)
            }
            Some(b'e' | b'E') => {
                self.exponent(sig, 0)?;
                Ok(Num::Float)
            }
            _ if !negative => Ok(Num::U64(sig)),
            _ => {
                // serde_json: "Convert into a float if we underflow, or on `-0`."
                let n = (sig as i64).wrapping_neg();
                Ok(if n >= 0 { Num::Float } else { Num::I64(n) })
            }
        }
    }

    /// An integer part too long for `u64`: further digits only scale the exponent.
    #[cold]
    fn long_integer(&mut self, sig: u64) -> Result<(), Fault> {
        let mut exp: i32 = 0;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
            exp = exp.saturating_add(1);
        }
        match self.peek() {
            Some(b'.') => self.decimal(sig, exp),
            Some(b'e' | b'E') => self.exponent(sig, exp),
            _ => self.float_in_range(sig, exp),
        }
    }

    /// The fraction at `pos` (which holds `.`).
    fn decimal(&mut self, mut sig: u64, exp_before: i32) -> Result<(), Fault> {
        self.pos += 1;
        let mut exp_after: i32 = 0;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            let d = u64::from(c - b'0');
            if overflows_u64(sig, d) {
                // Further digits are ignored for the value.
                while let Some(b'0'..=b'9') = self.peek() {
                    self.pos += 1;
                }
                let exp = exp_before.saturating_add(exp_after);
                return match self.peek() {
                    Some(b'e' | b'E') => self.exponent(sig, exp),
                    _ => self.float_in_range(sig, exp),
                };
            }
            self.pos += 1;
            sig = sig * 10 + d;
            exp_after = exp_after.saturating_sub(1);
        }
        if exp_after == 0 {
            return Err(match self.peek() {
                Some(_) => self.syntax("invalid number: expected a digit after `.`"),
                None => self.syntax("end of input inside a number"),
            });
        }
        let exp = exp_before.saturating_add(exp_after);
        match self.peek() {
            Some(b'e' | b'E') => self.exponent(sig, exp),
            _ => self.float_in_range(sig, exp),
        }
    }

    /// The exponent at `pos` (which holds `e` or `E`).
    fn exponent(&mut self, sig: u64, starting: i32) -> Result<(), Fault> {
        self.pos += 1;
        let positive = match self.peek() {
            Some(b'+') => {
                self.pos += 1;
                true
            }
            Some(b'-') => {
                self.pos += 1;
                false
            }
            _ => true,
        };
        let mut exp = match self.peek() {
            Some(c @ b'0'..=b'9') => i32::from(c - b'0'),
            Some(_) => return Err(self.syntax("invalid number: expected a digit in the exponent")),
            None => return Err(self.syntax("end of input inside a number")),
        };
        self.pos += 1;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            self.pos += 1;
            let d = i32::from(c - b'0');
            if overflows_i32(exp, d) {
                // serde_json: an exponent beyond i32 is 0.0 or out of range.
                if sig != 0 && positive {
                    return Err(self.syntax("number out of range"));
                }
                while let Some(b'0'..=b'9') = self.peek() {
                    self.pos += 1;
                }
                return Ok(());
            }
            exp = exp * 10 + d;
        }
        let exp = if positive {
            starting.saturating_add(exp)
        } else {
            starting.saturating_sub(exp)
        };
        self.float_in_range(sig, exp)
    }

    /// `serde_json`'s `f64_from_parts` range check: `sig * 10^exp` must stay finite when
    /// computed as `sig as f64 * POW10[exp]`. Negative exponents only divide (never fail).
    fn float_in_range(&self, sig: u64, exp: i32) -> Result<(), Fault> {
        if sig == 0 || exp < 0 {
            return Ok(());
        }
        let out_of_range = match u32::try_from(exp) {
            Ok(e) if e <= 288 => false, // u64::MAX * 1e288 < f64::MAX
            Ok(e) if e <= 308 => (sig as f64 * pow10(e)).is_infinite(),
            _ => true,
        };
        if out_of_range {
            Err(self.syntax("number out of range"))
        } else {
            Ok(())
        }
    }

    // ---- literals and whole values --------------------------------------------------

    /// The literal `word` at `pos`.
    fn literal(&mut self, word: &'static [u8]) -> Result<(), Fault> {
        for (k, &c) in word.iter().enumerate() {
            match self.b.get(self.pos + k) {
                Some(&x) if x == c => {}
                Some(_) => return Err(self.syntax_at(self.pos + k, "invalid literal")),
                None => return Err(self.syntax_at(self.pos + k, "end of input inside a literal")),
            }
        }
        self.pos += word.len();
        Ok(())
    }

    /// `"name"` `:` inside a nested object, leaving `pos` at the value.
    fn member_name(&mut self) -> Result<(), Fault> {
        if self.peek() != Some(b'"') {
            return Err(self.syntax("expected a member name string"));
        }
        self.string(false)?;
        self.skip_ws();
        self.expect(b':', "expected `:` after a member name")?;
        self.skip_ws();
        Ok(())
    }

    /// Validates one JSON value at `pos` (no leading whitespace), enclosed in `depth`
    /// containers, without building it. Iterative: a `u128` bit stack records for each
    /// open container whether it is an object, so depth costs no native stack.
    fn skip_value(&mut self, depth: u32) -> Result<(), Fault> {
        let mut stack: u128 = 0;
        let mut open: u32 = 0;
        'value: loop {
            match self.peek() {
                Some(c @ (b'{' | b'[')) => {
                    if depth + open + 1 > MAX_DEPTH {
                        return Err(self.syntax(
                            "nesting deeper than 127 levels (serde_json's recursion limit)",
                        ));
                    }
                    self.pos += 1;
                    self.skip_ws();
                    let object = c == b'{';
                    let close = if object { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.pos += 1;
                    } else {
                        stack = stack << 1 | u128::from(object);
                        open += 1;
                        if object {
                            self.member_name()?;
                        }
                        continue 'value;
                    }
                }
                Some(b'"') => {
                    self.string(false)?;
                }
                Some(b'-' | b'0'..=b'9') => {
                    self.number()?;
                }
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                Some(_) => return Err(self.syntax("expected a value")),
                None => return Err(self.syntax("end of input, expected a value")),
            }
            // A value is complete: close containers until one continues.
            loop {
                if open == 0 {
                    return Ok(());
                }
                self.skip_ws();
                let object = stack & 1 == 1;
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        self.skip_ws();
                        if object {
                            self.member_name()?;
                        }
                        continue 'value;
                    }
                    Some(b'}') if object => {}
                    Some(b']') if !object => {}
                    _ if object => return Err(self.syntax("expected `,` or `}` in an object")),
                    _ => return Err(self.syntax("expected `,` or `]` in an array")),
                }
                self.pos += 1;
                stack >>= 1;
                open -= 1;
            }
        }
    }

    // ---- the Event object ---------------------------------------------------------------

    fn top_object(&mut self) -> Result<(), Fault> {
        if self.peek() != Some(b'{') {
            return Err(self.syntax("an Event is one JSON object, expected `{`"));
        }
        self.pos += 1;
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            if self.peek() != Some(b'"') {
                return Err(self.syntax("expected a member name string"));
            }
            let mark = self.unescaped.len();
            let name_at = self.pos as u32;
            let key = self.string(true)?;
            self.skip_ws();
            self.expect(b':', "expected `:` after a member name")?;
            self.skip_ws();
            let member = Member::classify(self.text_bytes(key));
            if let Some(bit) = member.bit() {
                // A core name's decoded spelling is not kept.
                self.unescaped.truncate(mark);
                if self.attrs.present & 1 << bit != 0 {
                    return Err(fault(format!(
                        "duplicate top-level member `{}` (AEP-0001 §5; RFC 8259 §4: readers could disagree on which one counts)",
                        member.describe().0
                    )));
                }
                self.attrs.present |= 1 << bit;
                self.member_at = name_at;
                let r = self.core_value(member);
                self.in_member(r)?;
            } else {
                self.member_at = name_at;
                let r = self.extension(key);
                self.in_member(r)?;
            }
            self.member_at = NO_MEMBER;
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(self.syntax("expected `,` or `}` in the Event object")),
            }
        }
    }

    /// A syntax fault inside the value of the member being scanned (`self.member`) is
    /// reported with the member's name in front: "`agent`: invalid JSON at byte 154: …".
    /// Value-rule faults already name their attribute.
    #[inline]
    fn in_member(&self, r: Result<(), Fault>) -> Result<(), Fault> {
        match r {
            Err(mut e) if e.at.is_some() => {
                if let Some(name) = self.member_name_text() {
                    e.detail = format!("`{name}`: {}", e.detail);
                }
                Err(e)
            }
            r => r,
        }
    }

    /// The name of the member being scanned, fit for a detail (cut at 40 characters;
    /// control characters escaped).
    #[cold]
    fn member_name_text(&self) -> Option<String> {
        if self.member_at == NO_MEMBER {
            return None;
        }
        // The name is scanned again (it was valid the first time), decoded.
        let mut again = Scanner::new(self.b, self.off);
        again.pos = self.member_at as usize;
        let key = again.string(true).ok()?;
        let name = match Member::classify(again.text_bytes(key)) {
            Member::Extension => again.text_str(key),
            // A core name as the spec spells it.
            m => m.describe().0,
        };
        let mut shown: String = name.chars().take(40).flat_map(char::escape_debug).collect();
        if name.chars().count() > 40 {
            shown.push('…');
        }
        Some(shown)
    }

    /// For an input cut short inside a member's value: scans it and returns that
    /// member's name (`None` when the cut is elsewhere, e.g. inside a member name).
    #[cold]
    fn member_at_end(mut self) -> Option<String> {
        match self.top_object() {
            Err(_) => self.member_name_text(),
            Ok(()) => None,
        }
    }

    /// A value of the wrong JSON type for `what`: report a syntax fault in it first if it
    /// has one, then `null` (AEP-0001 §5.1: absent attributes are omitted, never `null`),
    /// then the type rule.
    #[cold]
    fn wrong_type(&mut self, name: &str, rule: String) -> Fault {
        let is_null = self
            .b
            .get(self.pos..)
            .is_some_and(|r| r.starts_with(b"null"));
        if let Err(e) = self.skip_value(1) {
            return e;
        }
        if is_null {
            fault(format!(
                "`{name}` is null: absent attributes MUST be omitted, not set to null (AEP-0001 §5.1)"
            ))
        } else {
            fault(rule)
        }
    }

    fn core_value(&mut self, member: Member) -> Result<(), Fault> {
        let (name, row) = member.describe();
        match member {
            Member::Text(attr) => {
                if self.peek() != Some(b'"') {
                    let rule = format!("`{name}` must be a non-empty string (AEP-0001 §5.1 {row})");
                    return Err(self.wrong_type(name, rule));
                }
                let text = self.string(true)?;
                if self.text_bytes(text).is_empty() {
                    return Err(fault(format!(
                        "`{name}` must be a non-empty string (AEP-0001 §5.1 {row})"
                    )));
                }
                self.attrs.text[attr as usize] = text;
            }
            Member::Seq | Member::Epoch => {
                // Built only on the error paths: `seq` is in almost every Event.
                let rule = || format!("`{name}` must be an integer >= 0 (AEP-0001 §5.1 {row})");
                if !matches!(self.peek(), Some(b'-' | b'0'..=b'9')) {
                    return Err(self.wrong_type(name, rule()));
                }
                let start = self.pos;
                let Num::U64(v) = self.number()? else {
                    return Err(fault(format!("{}, got {}", rule(), self.shown(start))));
                };
                if member == Member::Seq {
                    self.attrs.seq = v;
                } else {
                    self.attrs.epoch = v;
                }
            }
            Member::Severity | Member::Capture => {
                let rule = if member == Member::Severity {
                    "`severity` must be one of debug, info, notice, warning, error, critical (AEP-0001 §5.1 #15, §8.1)"
                } else {
                    "`capture` must be one of none, metadata, redacted, full (AEP-0001 §5.1 #16, §8.2)"
                };
                if self.peek() != Some(b'"') {
                    return Err(self.wrong_type(name, rule.to_owned()));
                }
                let mark = self.unescaped.len();
                let text = self.string(true)?;
                let ok = if member == Member::Severity {
                    let v = Severity::parse_bytes(self.text_bytes(text));
                    self.attrs.severity = v;
                    v.is_some()
                } else {
                    let v = Capture::parse_bytes(self.text_bytes(text));
                    self.attrs.capture = v;
                    v.is_some()
                };
                self.unescaped.truncate(mark);
                if !ok {
                    return Err(fault(rule));
                }
            }
            Member::Data => {
                if self.peek() != Some(b'{') {
                    let rule = "`data` must be a JSON object (AEP-0001 §5.1 #17)".to_owned();
                    return Err(self.wrong_type(name, rule));
                }
                let start = self.pos;
                self.skip_value(1)?;
                self.attrs.data = Text::raw(start as u32, self.pos as u32);
            }
            Member::Extension => {}
        }
        Ok(())
    }

    /// `b[from..pos]`, shortened for an error detail.
    fn shown(&self, from: usize) -> String {
        let s = String::from_utf8_lossy(self.b.get(from..self.pos).unwrap_or_default());
        if s.len() > 40 {
            format!("{}…", s.chars().take(40).collect::<String>())
        } else {
            s.into_owned()
        }
    }

    /// An extension attribute member (AEP-0001 §5.4): `key` was just scanned.
    fn extension(&mut self, key: Text) -> Result<(), Fault> {
        // `is_valid_extension_name` on the bytes, less its core-name test: the caller
        // came here because `Member::classify` found no core name (the same 17).
        let raw = self.text_bytes(key);
        let legal = (1..=20).contains(&raw.len())
            && raw
                .iter()
                .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !legal {
            let name = self.text_str(key);
            let shown: String = name.chars().take(40).collect();
            let more = if name.chars().count() > 40 { "…" } else { "" };
            return Err(fault(format!(
                "extension attribute name {shown:?}{more} must match [a-z0-9]{{1,20}} and not be a core attribute name (AEP-0001 §5.4)"
            )));
        }
        let k = name_key(self.text_bytes(key));
        let fresh = match &mut self.ext_set {
            Some(set) => set.insert(k),
            None if self.ext_keys.contains(&k) => false,
            None => {
                self.ext_keys.push(k);
                if self.ext_keys.len() > EXT_LINEAR_MAX {
                    self.ext_set = Some(self.ext_keys.drain(..).collect());
                }
                true
            }
        };
        if !fresh {
            return Err(fault(format!(
                "duplicate top-level member `{}` (AEP-0001 §5; RFC 8259 §4: readers could disagree on which one counts)",
                self.text_str(key)
            )));
        }
        let start = self.pos;
        let value = match self.peek() {
            Some(b'"') => StoredScalar::Str(self.string(true)?),
            Some(b't') => {
                self.literal(b"true")?;
                StoredScalar::Bool(true)
            }
            Some(b'f') => {
                self.literal(b"false")?;
                StoredScalar::Bool(false)
            }
            Some(b'-' | b'0'..=b'9') => match self.number()? {
                Num::U64(v) => StoredScalar::U64(v),
                Num::I64(v) => StoredScalar::I64(v),
                Num::Float => {
                    let name = self.text_str(key).to_owned();
                    return Err(fault(format!(
                        "extension attribute `{name}` must be a string, an integer within i64/u64 or a boolean, got {} (AEP-0001 §5.4)",
                        self.shown(start)
                    )));
                }
            },
            _ => {
                let name = self.text_str(key).to_owned();
                let rule = format!(
                    "extension attribute `{name}` must be a string, integer or boolean (AEP-0001 §5.4: scalar values only)"
                );
                return Err(self.wrong_type(&name, rule));
            }
        };
        self.attrs.extensions.push((key, value));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Attr, Capture, Event, Scalar, Severity};
    use super::*;

    /// A minimal member list around `extra` (no envelope rules apply to `scan`).
    fn scan_str(json: &str) -> Result<Event, InvalidEvent> {
        Event::scan(Bytes::copy_from_slice(json.as_bytes()))
    }

    fn refused(json: &str) -> InvalidEvent {
        match scan_str(json) {
            Ok(ev) => panic!("accepted {json:?}: {ev:?}"),
            Err(e) => e,
        }
    }

    fn accepted(json: &str) -> Event {
        scan_str(json).unwrap_or_else(|e| panic!("refused {json:?}: {e}"))
    }

    #[test]
    fn plain_strings_are_raw_spans_and_escaped_ones_decoded() {
        let ev = accepted(
            r#"{"id":"plain","session":"s\u0031","subject":"a\"b\\c\/d\u00e9\n\t\b\f\r","agent":"é中"}"#,
        );
        assert_eq!(ev.id(), "plain");
        assert!(!ev.attrs.text(Attr::Id).unwrap().is_unescaped());
        assert_eq!(ev.session(), Some("s1"));
        assert!(ev.attrs.text(Attr::Session).unwrap().is_unescaped());
        assert_eq!(ev.attr(Attr::Subject), Some("a\"b\\c/dé\n\t\u{8}\u{c}\r"));
        assert_eq!(ev.attr(Attr::Agent), Some("é中"));
        // Only escaped values reach the side buffer.
        assert_eq!(&*ev.unescaped, "s1a\"b\\c/dé\n\t\u{8}\u{c}\r");
    }

    #[test]
    fn escaped_member_names_are_decoded_and_not_kept() {
        let ev = accepted(r#"{"typ\u0065":"tool.x","\u0073eq":3,"acm\u0065":"v"}"#);
        assert_eq!(ev.event_type(), "tool.x");
        assert_eq!(ev.seq(), Some(3));
        assert_eq!(ev.extension("acme"), Some(Scalar::Str("v")));
        // Core names are dropped from the side buffer; the extension name stays.
        assert_eq!(&*ev.unescaped, "acme");
    }

    #[test]
    fn surrogate_pairs_decode_and_lone_surrogates_are_refused() {
        let ev = accepted(r#"{"id":"\ud83d\ude00","run":"\uD83D\uDE00x","step":"\uDBFF\uDFFF"}"#);
        assert_eq!(ev.id(), "😀");
        assert_eq!(ev.attr(Attr::Run), Some("😀x"));
        assert_eq!(ev.attr(Attr::Step), Some("\u{10FFFF}"));
        for bad in [
            r#"{"id":"\ud800"}"#,
            r#"{"id":"\ud800x"}"#,
            r#"{"id":"\udc00"}"#,
            r#"{"id":"\ud800\u0041"}"#,
            r#"{"id":"\ud800\ud800"}"#,
            r#"{"id":"\ud800\n"}"#,
            r#"{"data":{"k":"\ude00"}}"#,
            r#"{"id":"\u12"}"#,
            r#"{"id":"\u12g4"}"#,
            r#"{"id":"\x41"}"#,
            r#"{"id":"\"#,
        ] {
            let e = refused(bad);
            // A fault inside a member's value names the member.
            let name = if bad.contains("data") { "data" } else { "id" };
            assert!(
                e.detail
                    .starts_with(&format!("`{name}`: invalid JSON at byte ")),
                "{bad}: {e}"
            );
            assert!(e.at.is_some(), "{bad}");
        }
    }

    /// Every refusal names the attribute at fault, also when the fault is a JSON syntax
    /// fault inside its value (a lone surrogate, a bad escape, invalid UTF-8, a broken
    /// `data`, an extension's value). Faults outside any value stay plain syntax faults.
    #[test]
    fn a_syntax_fault_inside_a_value_names_the_member() {
        let e = refused(r#"{"aep":"0.1","agent":"\ud800","id":"x"}"#);
        assert_eq!(e.at, Some(22));
        assert_eq!(
            e.detail,
            "`agent`: invalid JSON at byte 22: lone leading surrogate \\ud800 in a \\u escape (expected a \\u trailing surrogate) (RFC 8259; AEP-0001 §5)"
        );
        for (bad, name) in [
            (r#"{"session":"\uDC00"}"#, "session"),
            (r#"{"ses\u0073ion":"\uDC00"}"#, "session"),
            (r#"{"type":"a.b","seq":01}"#, "seq"),
            (r#"{"data":{"a":[1,]}}"#, "data"),
            (r#"{"acme":tru}"#, "acme"),
            (r#"{"acme":"\q"}"#, "acme"),
            (r#"{"ac\u006de":"\q"}"#, "acme"),
            (r#"{"id":[1,]}"#, "id"),
        ] {
            let e = refused(bad);
            assert!(
                e.detail
                    .starts_with(&format!("`{name}`: invalid JSON at byte ")),
                "{bad}: {e}"
            );
        }
        let e = refused(r#"{"type":"a.b","sev\uD800":1}"#);
        assert!(
            e.detail.starts_with("invalid JSON at byte"),
            "in a name, not a value: {e}"
        );
        let e =
            Event::scan(Bytes::from_static(b"{\"id\":\"x\",\"agent\":\"a\xffb\"}")).unwrap_err();
        assert_eq!(e.at, Some(20));
        assert!(
            e.detail
                .starts_with("`agent`: invalid JSON at byte 20: invalid UTF-8"),
            "{e}"
        );
        let e = Event::scan(Bytes::from_static(b"{\"\xff\":1}")).unwrap_err();
        assert!(
            e.detail
                .starts_with("invalid JSON at byte 2: invalid UTF-8"),
            "{e}"
        );
    }

    #[test]
    fn duplicate_members_are_refused_even_when_spelled_with_escapes() {
        for (json, name) in [
            (r#"{"type":"a.b","type":"a.c"}"#, "type"),
            (r#"{"type":"a.b","typ\u0065":"a.c"}"#, "type"),
            (r#"{"\u0073eq":1,"seq":1}"#, "seq"),
            (r#"{"data":{},"data":{}}"#, "data"),
            (r#"{"acme":1,"acm\u0065":2}"#, "acme"),
            (r#"{"acme":1,"acme":1}"#, "acme"),
        ] {
            let e = refused(json);
            assert!(
                e.detail
                    .starts_with(&format!("duplicate top-level member `{name}` (AEP-0001 §5")),
                "{json}: {e}"
            );
        }
        // Only top-level names count: serde_json accepts (and a relay never reads) `data`.
        accepted(r#"{"data":{"a":1,"a":2}}"#);
    }

    #[test]
    fn seq_and_epoch_are_u64_integers() {
        for (n, want) in [
            ("0", Some(0)),
            ("9007199254740993", Some(9_007_199_254_740_993)), // 2^53 + 1, exact
            ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", None), // 2^64: a float to serde_json
            ("-0", None),                   // serde_json reads -0.0 (a float)
            ("-1", None),
            ("1e2", None),
            ("1.0", None),
            ("1E0", None),
        ] {
            for attr in ["seq", "epoch"] {
                let json = format!(r#"{{"{attr}":{n}}}"#);
                match want {
                    Some(v) => {
                        let ev = accepted(&json);
                        let got = if attr == "seq" {
                            ev.seq()
                        } else {
                            ev.epoch_declared()
                        };
                        assert_eq!(got, Some(v), "{json}");
                    }
                    None => {
                        let e = refused(&json);
                        let row = if attr == "seq" { "#11" } else { "#12" };
                        assert!(
                            e.detail.starts_with(&format!(
                                "`{attr}` must be an integer >= 0 (AEP-0001 §5.1 {row})"
                            )),
                            "{json}: {e}"
                        );
                    }
                }
            }
        }
        // Grammar faults stay syntax faults.
        for bad in ["01", "-", "1.", ".5", "+1", "1e", "1e400"] {
            let e = refused(&format!(r#"{{"seq":{bad}}}"#));
            assert!(e.detail.starts_with("`seq`: invalid JSON"), "{bad}: {e}");
        }
        // `0` is a whole value: the fault is after it, in the Event object.
        let e = refused(r#"{"seq":0x10}"#);
        assert!(
            e.detail.starts_with("invalid JSON at byte 8: expected `,`"),
            "{e}"
        );
        let e = refused(r#"{"seq":"1"}"#);
        assert!(e.detail.contains("`seq` must be an integer >= 0"), "{e}");
    }

    #[test]
    fn extension_values_are_strings_integers_or_booleans() {
        let ev = accepted(
            r#"{"a1":"","a2":true,"a3":false,"a4":-9223372036854775808,"a5":18446744073709551615,"a6":0,"a7":"x\u0041"}"#,
        );
        let got: Vec<_> = ev.extensions().collect();
        assert_eq!(
            got,
            vec![
                ("a1", Scalar::Str("")),
                ("a2", Scalar::Bool(true)),
                ("a3", Scalar::Bool(false)),
                ("a4", Scalar::Int(i128::from(i64::MIN))),
                ("a5", Scalar::Int(i128::from(u64::MAX))),
                ("a6", Scalar::Int(0)),
                ("a7", Scalar::Str("xA")),
            ]
        );
        for bad in [
            "-0",
            "1.5",
            "1e2",
            "-9223372036854775809",
            "18446744073709551616",
            "{}",
            "[]",
            "[1]",
        ] {
            let e = refused(&format!(r#"{{"acme":{bad}}}"#));
            assert!(e.detail.contains("AEP-0001 §5.4"), "{bad}: {e}");
            assert!(e.detail.contains("`acme`"), "{bad}: {e}");
        }
    }

    #[test]
    fn many_extensions_are_checked_for_duplicates_in_linear_time() {
        let names: Vec<String> = (0..5000).map(|i| format!("e{i}")).collect();
        let body: Vec<String> = names.iter().map(|n| format!("\"{n}\":1")).collect();
        let ev = accepted(&format!("{{{}}}", body.join(",")));
        assert_eq!(ev.extensions().count(), 5000);
        for dup in ["e0", "e31", "e32", "e33", "e4999"] {
            let e = refused(&format!("{{{},\"{dup}\":2}}", body.join(",")));
            assert!(
                e.detail
                    .contains(&format!("duplicate top-level member `{dup}`")),
                "{e}"
            );
        }
        // The key is injective over legal names (length is part of it).
        let keys: HashSet<u128> = [
            "a",
            "aa",
            "a0",
            "0",
            "00",
            "z",
            "9",
            "zzzzzzzzzzzzzzzzzzzz",
            "99999999999999999999",
        ]
        .iter()
        .map(|n| name_key(n.as_bytes()))
        .collect();
        assert_eq!(keys.len(), 9);
    }

    /// `extension` skips the core-name test because `Member::classify` knows exactly
    /// the core names of AEP-0001 §5.1 (`CORE_NAMES`).
    #[test]
    fn classify_knows_every_core_name() {
        for name in super::super::CORE_NAMES {
            assert_ne!(
                Member::classify(name.as_bytes()),
                Member::Extension,
                "{name}"
            );
            assert!(!super::super::is_valid_extension_name(name));
        }
        assert_eq!(Member::classify(b"acme"), Member::Extension);
    }

    #[test]
    fn extension_names_at_20_and_21_chars() {
        let twenty = "a".repeat(20);
        let ev = accepted(&format!(r#"{{"{twenty}":1}}"#));
        assert_eq!(ev.extension(&twenty), Some(Scalar::Int(1)));
        for bad in [
            "a".repeat(21),
            "Acme".to_owned(),
            "acme_ext".to_owned(),
            "acme-ext".to_owned(),
            String::new(),
            "é".to_owned(),
        ] {
            let e = refused(&format!(r#"{{"{bad}":1}}"#));
            assert!(
                e.detail.contains("must match [a-z0-9]{1,20}") && e.detail.contains("§5.4"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn null_top_level_values_are_refused() {
        for name in [
            "id", "session", "seq", "epoch", "severity", "capture", "data", "acme",
        ] {
            let e = refused(&format!(r#"{{"{name}":null}}"#));
            assert!(
                e.detail.contains(&format!("`{name}`"))
                    && (e.detail.contains("not set to null (AEP-0001 §5.1)")
                        || e.detail.contains("AEP-0001 §5.4")),
                "{name}: {e}"
            );
        }
        // `null` is fine inside `data`: the relay does not read it.
        accepted(r#"{"data":{"k":null}}"#);
    }

    #[test]
    fn core_value_types() {
        for (json, needle) in [
            (
                r#"{"id":""}"#,
                "`id` must be a non-empty string (AEP-0001 §5.1 #2)",
            ),
            (
                r#"{"type":1}"#,
                "`type` must be a non-empty string (AEP-0001 §5.1 #3)",
            ),
            (r#"{"traceparent":true}"#, "(AEP-0001 §5.1 #14)"),
            (
                r#"{"data":[]}"#,
                "`data` must be a JSON object (AEP-0001 §5.1 #17)",
            ),
            (r#"{"data":"x"}"#, "`data` must be a JSON object"),
            (r#"{"severity":"fatal"}"#, "`severity` must be one of"),
            (r#"{"severity":"INFO"}"#, "§8.1"),
            (r#"{"capture":"all"}"#, "`capture` must be one of"),
            (r#"{"capture":1}"#, "§8.2"),
        ] {
            let e = refused(json);
            assert!(e.detail.contains(needle), "{json}: {e}");
            assert_eq!(e.at, None, "{json}: a value rule, not a syntax fault");
        }
        // A wrong-typed value with a syntax fault reports the syntax fault.
        let e = refused(r#"{"id":[1,]}"#);
        assert!(e.detail.starts_with("`id`: invalid JSON at byte 9"), "{e}");
        assert_eq!(e.at, Some(9));

        let ev = accepted(r#"{"severity":"w\u0061rning","capture":"full"}"#);
        assert_eq!(ev.severity_declared(), Some(Severity::Warning));
        assert_eq!(ev.capture_declared(), Some(Capture::Full));
        assert!(ev.unescaped.is_empty(), "enum spellings are not kept");
        for s in Severity::ALL {
            let ev = accepted(&format!(r#"{{"severity":"{}"}}"#, s.as_str()));
            assert_eq!(ev.severity(), s);
        }
        for c in Capture::ALL {
            let ev = accepted(&format!(r#"{{"capture":"{}"}}"#, c.as_str()));
            assert_eq!(ev.capture(), c);
        }
    }

    #[test]
    fn data_is_a_validated_span() {
        let json = r#" {"data" : {"a":[1,-2.5e-3,"\u00e9",{"b":null}],"c":{}} , "id":"x"} "#;
        let ev = accepted(json);
        assert_eq!(
            ev.data(),
            Some(&br#"{"a":[1,-2.5e-3,"\u00e9",{"b":null}],"c":{}}"#[..])
        );
        for bad in [
            r#"{"data":{"a":1,}}"#,
            r#"{"data":{"a" 1}}"#,
            r#"{"data":{"a":[1 2]}}"#,
            r#"{"data":{1:2}}"#,
            r#"{"data":{"a":tru}}"#,
            r#"{"data":{"a":nul}}"#,
            r#"{"data":{"a":[,]}}"#,
            r#"{"data":{"a":"x
"}}"#,
            r#"{"data":{"a":[}]}}"#,
        ] {
            let e = refused(bad);
            assert!(e.detail.starts_with("`data`: invalid JSON"), "{bad:?}: {e}");
        }
        // `data` is complete; the Event object is not.
        let e = refused(r#"{"data":{"a":1}"#);
        assert!(e.detail.starts_with("invalid JSON at byte 15"), "{e}");
    }

    /// serde_json refuses the 128th nested container; the Event object is level 1.
    #[test]
    fn nesting_limit_matches_serde_json() {
        let nested = |levels: usize| {
            let inner = levels - 2; // the Event object and `data`
            format!(
                r#"{{"data":{{"k":{}0{}}}}}"#,
                "[".repeat(inner),
                "]".repeat(inner)
            )
        };
        let ev = accepted(&nested(127));
        assert!(ev.data().is_some());
        for levels in [128, 129, 1000] {
            let e = refused(&nested(levels));
            assert!(
                e.detail.contains("nesting deeper than 127"),
                "{levels}: {e}"
            );
            assert!(serde_json::from_str::<serde_json::Value>(&nested(levels)).is_err());
        }
        assert!(serde_json::from_str::<serde_json::Value>(&nested(127)).is_ok());
    }

    #[test]
    fn framing_trailing_garbage_bom_and_utf8() {
        let input = Bytes::from_static(b" \t\r\n{\"id\":\"x\"}\n ");
        let ev = Event::scan(input.clone()).unwrap();
        assert_eq!(&ev.bytes()[..], b"{\"id\":\"x\"}");
        // Zero-copy: the kept bytes are a slice of the input's allocation.
        assert_eq!(ev.bytes().as_ptr(), input[4..].as_ptr());

        for (bad, at) in [
            ("{}x", 2),
            ("{} {}", 3),
            ("{},", 2),
            ("\u{feff}{}", 0),
            ("\u{c}{}", 0),
            ("{}\u{c}", 2),
            ("[]", 0),
            ("\"x\"", 0),
            ("", 0),
            ("   ", 3),
            ("{", 1),
            ("{\"id\":\"x\"", 9),
            ("{\"id\" \"x\"}", 6),
            ("{\"id\":\"x\" \"id\"}", 10),
            ("{id:1}", 1),
        ] {
            let e = refused(bad);
            assert_eq!(e.at, Some(at), "{bad:?}: {e}");
            assert!(
                e.detail.starts_with(&format!("invalid JSON at byte {at}:")),
                "{e}"
            );
        }
        for (bad, at) in [
            (&b"{\"id\":\"\xff\"}"[..], 7),
            (b"{\"id\":\"\xc3\"}", 7),
            (b"{\"\xed\xa0\x80\":1}", 2),
            (b"{\"id\":\"x\"}\xff", 10),
        ] {
            let e = Event::scan(Bytes::copy_from_slice(bad)).unwrap_err();
            assert_eq!(e.at, Some(at), "{e}");
            assert!(e.detail.contains("invalid UTF-8"), "{e}");
        }
        // Raw control characters in strings are refused; DEL is not a control character
        // to JSON.
        refused("{\"id\":\"a\u{1}b\"}");
        refused("{\"id\":\"a\tb\"}");
        assert_eq!(accepted("{\"id\":\"a\u{7f}b\"}").id(), "a\u{7f}b");
    }

    /// UTF-8 is validated once for the whole Event (the scanner passes non-ASCII string
    /// bytes as plain): every
    /// invalid sequence, wherever it stands in a string (before or after an escape, in
    /// a member name, deep in `data`, cut by the closing quote), is refused with the
    /// offset `std::str::from_utf8` gives and the member named; valid text around
    /// escapes is accepted and kept raw unless an escape needs decoding.
    #[test]
    fn utf8_is_validated_whole() {
        let bad: [&[u8]; 7] = [
            b"\xff",
            b"\xc3",             // truncated before the closing quote
            b"\xc0\xaf",         // overlong
            b"\xed\xa0\x80",     // a UTF-16 surrogate encoded in UTF-8
            b"\xf4\x90\x80\x80", // beyond U+10FFFF
            b"\xe4\xb8",         // truncated three-byte character
            b"\x80",             // a lone continuation byte
        ];
        for seq in bad {
            for (pre, post) in [
                ("", ""),
                ("\\n", ""),
                ("", "\\t"),
                ("é", "中"),
                ("\\u00e9é", "x"),
            ] {
                let mut s = Vec::new();
                s.extend_from_slice(pre.as_bytes());
                s.extend_from_slice(seq);
                s.extend_from_slice(post.as_bytes());
                for (tpl, member) in [
                    (&br#"{"id":"@"}"#[..], "id"),
                    (&br#"{"acme":"@"}"#[..], "acme"),
                    (&br#"{"data":{"k":["x","@"]}}"#[..], "data"),
                    (&br#"{"data":{"@":1}}"#[..], "data"),
                ] {
                    let at = tpl.iter().position(|&c| c == b'@').unwrap();
                    let mut input = tpl[..at].to_vec();
                    input.extend_from_slice(&s);
                    input.extend_from_slice(&tpl[at + 1..]);
                    let want = std::str::from_utf8(&input).unwrap_err().valid_up_to();
                    let e = Event::scan(Bytes::from(input.clone())).unwrap_err();
                    assert_eq!(
                        e.at,
                        Some(want),
                        "{:?}: {e}",
                        String::from_utf8_lossy(&input)
                    );
                    assert!(
                        e.detail.starts_with(&format!(
                            "`{member}`: invalid JSON at byte {want}: invalid UTF-8"
                        )),
                        "{e}"
                    );
                }
            }
        }
        // Valid non-ASCII around escapes: decoded only where an escape needs it.
        let ev = accepted("{\"id\":\"é中\u{1F600}\",\"session\":\"a\\né\",\"acme\":\"ü\"}");
        assert_eq!(ev.id(), "é中\u{1F600}");
        assert_eq!(ev.session(), Some("a\né"));
        assert!(!ev.attrs.text(Attr::Id).unwrap().is_unescaped());
        // A raw control character after a non-ASCII run is still refused.
        refused("{\"id\":\"é\u{1}\"}");
        refused("{\"id\":\"中a\u{1f}b\"}");
    }

    #[test]
    fn swar_special_byte_detection_is_exact() {
        for special in (0u8..0x20).chain([b'"', b'\\']) {
            for lane in 0..8 {
                let mut w = [b'a'; 8];
                w[lane] = special;
                assert!(
                    has_special(u64::from_le_bytes(w)),
                    "{special:#x} in lane {lane}"
                );
            }
        }
        for plain in (0x20u8..=0xff).filter(|&b| b != b'"' && b != b'\\') {
            assert!(!has_special(u64::from_le_bytes([plain; 8])), "{plain:#x}");
            let mut w = [b' '; 8];
            w[3] = plain;
            assert!(!has_special(u64::from_le_bytes(w)), "{plain:#x}");
        }
        // The first special lane is found exactly, whatever stands above it.
        let specials = (0u8..0x20).chain([b'"', b'\\']);
        for special in specials {
            for lane in 0..8 {
                for above in [b'a', 0x00, 0x1f, b'"', b'\\', 0x80, 0xff, 0x20, 0x21] {
                    let mut w = [b'a'; 8];
                    w[lane] = special;
                    for x in w.iter_mut().skip(lane + 1) {
                        *x = above;
                    }
                    let m = special_mask(u64::from_le_bytes(w));
                    assert_eq!(
                        m.trailing_zeros() / 8,
                        lane as u32,
                        "{special:#x} at {lane}"
                    );
                }
            }
        }
        // Long strings cross the 8-byte fast path with specials at every offset.
        for k in 0..40 {
            let s = format!("{}\\n{}", "x".repeat(k), "y".repeat(40 - k));
            let json = format!(r#"{{"id":"{s}"}}"#);
            assert_eq!(
                accepted(&json).id(),
                format!("{}\n{}", "x".repeat(k), "y".repeat(40 - k))
            );
            let json = format!("{{\"id\":\"{}\u{1}\"}}", "x".repeat(k));
            refused(&json);
        }
    }

    /// The long-string path (`memchr2` + vectorized control check, past the SWAR words)
    /// finds the same first special byte as a byte-by-byte search, at every offset and
    /// for every kind of special, with specials before and after each other.
    #[test]
    fn long_string_special_detection_matches_a_naive_search() {
        let naive = |b: &[u8], i: usize| {
            b[i..]
                .iter()
                .position(|&c| is_special(c))
                .map_or(b.len(), |k| i + k)
        };
        let find = |b: &[u8], i: usize| {
            let s = Scanner::new(b, 0);
            s.find_special(i)
        };
        for len in [0, 1, 7, 8, 31, 32, 33, 40, 63, 64, 65, 100, 200] {
            let plain = vec![b'a'; len];
            for start in [0, 1, 3] {
                let start = start.min(len);
                assert_eq!(find(&plain, start), naive(&plain, start), "plain {len}");
            }
            for at in 0..len {
                for special in [b'"', b'\\', 0x00, 0x1f, b'\n', 0x80, 0xc3, 0xff] {
                    let mut b = plain.clone();
                    b[at] = special;
                    if at + 5 < len {
                        // A later special of another kind must not win.
                        b[at + 5] = b'"';
                    }
                    assert_eq!(find(&b, 0), naive(&b, 0), "{special:#x} at {at} of {len}");
                    // A control character before the quote that memchr2 finds first.
                    if at > 0 {
                        b[at - 1] = 0x01;
                        assert_eq!(find(&b, 0), naive(&b, 0), "ctl before {at} of {len}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_truncation_and_byte_is_handled_without_panic() {
        let ev = r#"{"aep":"0.1","id":"i\u00e9","type":"tool.completed","seq":18446744073709551615,"acme":-5,"data":{"a":[1.5e3,true,null,"\ud83d\ude00"]}}"#;
        for cut in 0..=ev.len() {
            let r = Event::scan(Bytes::copy_from_slice(&ev.as_bytes()[..cut]));
            assert_eq!(r.is_ok(), cut == ev.len(), "cut at {cut}");
        }
        for i in 0..ev.len() {
            for b in [0u8, b'"', b'\\', b'{', b'}', b'9', 0x80, 0xff] {
                let mut v = ev.as_bytes().to_vec();
                v[i] = b;
                let _ = Event::scan(Bytes::from(v));
            }
        }
    }
}
