//! The JSONL binding as an ingest path (AEP-0003 §3.1): `--stdin` and `--ingest-file PATH`.
//!
//! This module is the sans-IO part: the sources' configuration ([`JsonlConfig`]), the line
//! splitter ([`LineSplitter`]) and what each line is ([`classify`]). The threads that read
//! standard input and follow files, and the reactor's end of their channel, are the I/O
//! layer's (`crate::io::feed`).
//!
//! # Per line, not per batch
//!
//! A JSONL source is not a batch: each line stands alone (AEP-0003 §3.1.1). A blank line is
//! skipped. An invalid line is reported (`log::warn`, with the source and the 1-based line
//! number) and skipped; it never stops ingest. A line whose `aep` names a version this
//! relay does not speak (well-formed `MAJOR.MINOR`, not in
//! [`SUPPORTED_VERSIONS`](crate::wire::envelope::SUPPORTED_VERSIONS); below 1.0 every minor
//! version is its own contract) is skipped and reported once per source and version
//! (AEP-0003 §3.1.3). A line longer than the relay's `max_body_bytes` is reported and
//! skipped without being held in memory.
//!
//! # Commands
//!
//! A command (`control.*` except the acknowledgements, AEP-0004 §2) read from JSONL is
//! refused and reported, as on HTTP POST: control flows only on an authenticated duplex
//! binding (AEP-0004 §4.1, AEP-0003 §8.1), and JSONL carries filesystem and process trust,
//! no authentication and no way to answer the sender.
//!
//! # Following a file
//!
//! `--ingest-file` reads the file from its start and then follows it like `tail -F`: it
//! polls every [`JsonlConfig::poll_interval`] (no busy loop), resumes at its byte offset
//! (AEP-0003 §7: JSONL resumes by file offset), and notices truncation (size below the
//! offset: read again from the start) and replacement (another inode at the path: the
//! old file is read to its end, then the new one from its start). An unterminated last
//! line waits until its `\n` arrives. A file that does not exist yet is waited for. A
//! truncation followed by regrowth past the old offset between two polls cannot be told
//! from growth (as with `tail -f`). A relay restart reads each file from its start again:
//! Events still held are recognised by `(source, id)` and not re-buffered or re-written
//! to the history, though they are fanned out again (at-least-once, AEP-0001 §7.4).
//!
//! # Standard input
//!
//! `--stdin` reads until end of input; the relay keeps running afterwards unless
//! [`JsonlConfig::exit_on_stdin_eof`] is set, in which case it stops once every line before
//! the end has been ingested. At end of input an unterminated last line counts as a line.

use crate::wire::envelope::{self, Event};
use bytes::{Bytes, BytesMut};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Default interval between two looks at a followed file (`--follow-interval-ms`): 200 ms.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// JSONL ingest sources. The default has none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonlConfig {
    /// Read Events from standard input (`--stdin`).
    pub stdin: bool,
    /// Stop the relay once standard input has ended and every line was ingested
    /// (`--exit-on-stdin-eof`).
    pub exit_on_stdin_eof: bool,
    /// Files to read and follow (`--ingest-file`, repeatable).
    pub files: Vec<PathBuf>,
    /// Interval between two looks at a followed file that had nothing new
    /// (`--follow-interval-ms`); default [`DEFAULT_POLL_INTERVAL`].
    pub poll_interval: Duration,
}

impl Default for JsonlConfig {
    fn default() -> JsonlConfig {
        JsonlConfig {
            stdin: false,
            exit_on_stdin_eof: false,
            files: Vec::new(),
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }
}

impl JsonlConfig {
    /// Whether any source is configured.
    pub fn is_active(&self) -> bool {
        self.stdin || !self.files.is_empty()
    }
}

// ---------------------------------------------------------------------------------------
// Lines
// ---------------------------------------------------------------------------------------

/// One line out of a [`LineSplitter`].
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// A complete line without its `\n` (a trailing `\r` is kept): a slice of the
    /// pushed bytes (no copy), or, for a line that spanned pushes, its own allocation.
    Line(Bytes),
    /// A line longer than the splitter's limit; it was dropped. Its length in bytes.
    TooLong(u64),
}

/// Splits a byte stream into `\n`-terminated lines, numbering them from 1, holding at most
/// `max_line` bytes of an unfinished line. Sans-IO: feed it what was read.
#[derive(Debug)]
pub struct LineSplitter {
    /// The start of a line that spans pushes (a copy: only this line's bytes).
    partial: BytesMut,
    /// Length of the line being dropped, when it went over the limit.
    skipping: Option<u64>,
    line: u64,
    max_line: usize,
}

impl LineSplitter {
    /// A splitter for lines of at most `max_line` bytes (excluding the `\n`).
    pub fn new(max_line: usize) -> LineSplitter {
        LineSplitter {
            partial: BytesMut::new(),
            skipping: None,
            line: 0,
            max_line,
        }
    }

    /// Number of the last line handed out (0 before the first).
    pub fn line(&self) -> u64 {
        self.line
    }

    /// Forgets the unfinished line and restarts numbering (a truncated file).
    pub fn reset(&mut self) {
        self.partial.clear();
        self.skipping = None;
        self.line = 0;
    }

    /// Feeds `data`; calls `out(line_number, piece)` for every line it completes. A line
    /// wholly inside `data` is handed out as a slice of it (it keeps `data`'s buffer
    /// alive while it lives).
    pub fn push(&mut self, data: Bytes, out: &mut impl FnMut(u64, Piece)) {
        let mut at = 0;
        while at < data.len() {
            let rest = &data[at..];
            match memchr::memchr(b'\n', rest) {
                Some(i) => {
                    self.line += 1;
                    let seg = &rest[..i];
                    if let Some(n) = self.skipping.take() {
                        out(self.line, Piece::TooLong(n + seg.len() as u64));
                    } else if self.partial.is_empty() {
                        if seg.len() > self.max_line {
                            out(self.line, Piece::TooLong(seg.len() as u64));
                        } else {
                            out(self.line, Piece::Line(data.slice(at..at + i)));
                        }
                    } else if self.partial.len() + seg.len() > self.max_line {
                        let n = (self.partial.len() + seg.len()) as u64;
                        self.partial = BytesMut::new();
                        out(self.line, Piece::TooLong(n));
                    } else {
                        self.partial.extend_from_slice(seg);
                        out(self.line, Piece::Line(self.partial.split().freeze()));
                    }
                    at += i + 1;
                }
                None => {
                    if let Some(n) = &mut self.skipping {
                        *n += rest.len() as u64;
                    } else if self.partial.len() + rest.len() > self.max_line {
                        self.skipping = Some((self.partial.len() + rest.len()) as u64);
                        self.partial = BytesMut::new();
                    } else {
                        self.partial.extend_from_slice(rest);
                    }
                    return;
                }
            }
        }
    }

    /// End of input: an unfinished line counts as a line.
    pub fn finish(&mut self, out: &mut impl FnMut(u64, Piece)) {
        if let Some(n) = self.skipping.take() {
            self.line += 1;
            out(self.line, Piece::TooLong(n));
        } else if !self.partial.is_empty() {
            self.line += 1;
            let line = std::mem::take(&mut self.partial).freeze();
            out(self.line, Piece::Line(line));
        }
    }
}

/// What one JSONL line is.
// `Event` is large beside the other variants, but a `LineKind` is matched at once and
// never stored: boxing it would cost an allocation per line.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum LineKind {
    /// A valid Event that may be ingested (its bytes are the line's, trimmed).
    Event(Event),
    /// Empty or whitespace only.
    Blank,
    /// A well-formed `aep` version this relay does not speak (AEP-0003 §3.1.3): skipped.
    Unsupported(String),
    /// A command: refused on JSONL (AEP-0004 §4.1). Its `type`.
    Command(String),
    /// Not a valid Event: the detail names the attribute and section.
    Invalid(String),
}

/// `MAJOR.MINOR`, two decimal numbers without leading zeros (AEP-0001 §5.1 #1).
fn well_formed_version(v: &str) -> bool {
    let num = |s: &str| {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
    };
    v.split_once('.').is_some_and(|(a, b)| num(a) && num(b))
}

/// The `aep` value of a line that failed validation, when it is a well-formed version
/// this relay does not speak.
fn unsupported_version(line: &Bytes) -> Option<String> {
    let aep = match Event::scan(line.clone()) {
        Ok(ev) => ev.attr(envelope::Attr::Aep).map(str::to_string),
        // A future version may use value types this scanner refuses: read just `aep`.
        Err(_) => serde_json::from_slice::<serde_json::Value>(line.as_ref())
            .ok()?
            .get("aep")?
            .as_str()
            .map(str::to_string),
    }?;
    (well_formed_version(&aep) && !envelope::version_supported(&aep)).then_some(aep)
}

/// Classifies one line with the relay's envelope scanner and validator. A valid Event's
/// bytes are a slice of `line` (no copy; the store copies what it holds).
///
/// ```
/// use aep_relay::wire::jsonl::{classify, LineKind};
/// use bytes::Bytes;
/// assert!(matches!(classify(Bytes::from_static(b"  ")), LineKind::Blank));
/// let v9 = Bytes::from_static(br#"{"aep":"9.0","id":"x"}"#);
/// assert!(matches!(classify(v9), LineKind::Unsupported(v) if v == "9.0"));
/// assert!(matches!(classify(Bytes::from_static(b"{")), LineKind::Invalid(_)));
/// ```
pub fn classify(line: Bytes) -> LineKind {
    if line.iter().all(u8::is_ascii_whitespace) {
        return LineKind::Blank;
    }
    match Event::parse(line.clone()) {
        Ok(ev) if ev.is_command() => LineKind::Command(ev.event_type().to_string()),
        Ok(ev) => LineKind::Event(ev),
        Err(e) => match unsupported_version(&line) {
            Some(v) => LineKind::Unsupported(v),
            None => LineKind::Invalid(e.detail),
        },
    }
}

/// Reports what a source's lines were, once per unsupported version.
#[derive(Debug)]
pub(crate) struct Reporter {
    label: Arc<str>,
    versions: Vec<String>,
}

impl Reporter {
    pub(crate) fn new(label: &str) -> Reporter {
        Reporter {
            label: label.into(),
            versions: Vec::new(),
        }
    }

    /// Classifies a piece; returns the Event to ingest, reporting everything else.
    pub(crate) fn take(&mut self, line: u64, piece: Piece, max_line: usize) -> Option<Event> {
        let label = &self.label;
        match piece {
            Piece::TooLong(n) => {
                log::warn!(
                    "{label}:{line}: line of {n} bytes skipped: longer than {max_line} bytes (AEP_MAX_BODY)"
                );
                None
            }
            Piece::Line(bytes) => match classify(bytes) {
                LineKind::Event(ev) => Some(ev),
                LineKind::Blank => None,
                LineKind::Invalid(detail) => {
                    log::warn!("{label}:{line}: invalid Event skipped: {detail}");
                    None
                }
                LineKind::Command(t) => {
                    log::warn!(
                        "{label}:{line}: `{t}` is a command; refused: control flows only on an authenticated duplex binding (AEP-0004 §4.1), and JSONL has no authentication"
                    );
                    None
                }
                LineKind::Unsupported(v) => {
                    if !self.versions.contains(&v) {
                        log::warn!(
                            "{label}:{line}: skipping lines with unsupported envelope version `aep` = {v:?}; this relay speaks {} (AEP-0003 §3.1.3; reported once per source and version)",
                            envelope::SUPPORTED_VERSIONS.join(", ")
                        );
                        if self.versions.len() < 64 {
                            self.versions.push(v);
                        }
                    }
                    None
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(max: usize, chunks: &[&[u8]], finish: bool) -> Vec<(u64, Result<Vec<u8>, u64>)> {
        let mut s = LineSplitter::new(max);
        let mut out = Vec::new();
        let mut f = |n, p: Piece| {
            out.push((
                n,
                match p {
                    Piece::Line(l) => Ok(l.to_vec()),
                    Piece::TooLong(n) => Err(n),
                },
            ))
        };
        for c in chunks {
            s.push(Bytes::copy_from_slice(c), &mut f);
        }
        if finish {
            s.finish(&mut f);
        }
        out
    }

    #[test]
    fn lines_split_across_chunks_and_too_long_ones_are_dropped() {
        let got = split(
            5,
            &[b"ab", b"c\nde\n", b"0123456", b"789\nxy", b"z\nlast"],
            true,
        );
        assert_eq!(
            got,
            vec![
                (1, Ok(b"abc".to_vec())),
                (2, Ok(b"de".to_vec())),
                (3, Err(10)),
                (4, Ok(b"xyz".to_vec())),
                (5, Ok(b"last".to_vec())),
            ]
        );
        assert_eq!(split(3, &[b"abcdef\nab\n"], false)[0], (1, Err(6)));
        assert_eq!(split(3, &[b"ab", b"cd\n"], false), vec![(1, Err(4))]);
        assert!(split(3, &[b"open"], false).is_empty());
    }

    #[test]
    fn a_line_inside_one_push_is_a_slice_of_it() {
        let data = Bytes::from_static(b"one\ntw");
        let mut s = LineSplitter::new(16);
        let mut lines = Vec::new();
        s.push(data.clone(), &mut |_, p| lines.push(p));
        s.push(Bytes::from_static(b"o\n"), &mut |_, p| lines.push(p));
        let [Piece::Line(one), Piece::Line(two)] = &lines[..] else {
            panic!("{lines:?}");
        };
        assert_eq!(one.as_ptr(), data.as_ptr(), "no copy");
        assert_eq!((&one[..], &two[..]), (&b"one"[..], &b"two"[..]));
    }

    fn kind(line: &[u8]) -> LineKind {
        classify(Bytes::copy_from_slice(line))
    }

    #[test]
    fn classification() {
        let ok = br#"{"aep":"0.1","id":"1","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a","agent":"a","session":"s","seq":0}"#;
        assert!(matches!(kind(ok), LineKind::Event(_)));
        let v2 = String::from_utf8_lossy(ok).replace("\"0.1\"", "\"1.0\"");
        assert!(matches!(kind(v2.as_bytes()), LineKind::Unsupported(v) if v == "1.0"));
        // A future version may use shapes 0.1 refuses (`seq` as a string here).
        let odd = r#"{"aep":"2.0","seq":"x","seq":"y"}"#;
        assert!(matches!(kind(odd.as_bytes()), LineKind::Unsupported(v) if v == "2.0"));
        let bad = String::from_utf8_lossy(ok).replace("\"0.1\"", "\"zero\"");
        assert!(matches!(kind(bad.as_bytes()), LineKind::Invalid(_)));
        let cmd = br#"{"aep":"0.1","id":"c","type":"control.cancel","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a","agent":"a","session":"s","data":{"scope":"run"}}"#;
        assert!(matches!(kind(cmd), LineKind::Command(t) if t == "control.cancel"));
    }
}
