//! The JSONL binding as an ingest path (AEP-0003 §3.1): `--stdin` and `--ingest-file PATH`.
//!
//! ```text
//! stdin ──► reader thread ─┐                         ┌─► Core: journal append, then
//! file  ──► follower thread┼─► lines ─► Event::parse ┤   publish (store + fan-out),
//! file  ──► follower thread┘   (per line)            │   one chunk of lines at a time
//!                               bounded channel ─────┘   (woken through the mio Waker)
//! ```
//!
//! Standard input may be a regular file, which epoll refuses, and following a file is a
//! matter of polling its size, so each source is a thread that reads, splits lines, and
//! validates every line with the relay's own envelope scanner ([`Event::parse`]), then
//! sends the valid Events, a chunk at a time, over one bounded channel and wakes the
//! reactor through its `mio::Waker`. The reactor appends them to the history and
//! publishes them exactly as it does an HTTP batch. The channel's bound is the
//! backpressure: a reactor that falls behind (or a history that is failing) stops the
//! readers instead of growing memory.
//!
//! # Per line, not per batch
//!
//! A JSONL source is not a batch: each line stands alone (AEP-0003 §3.1.1). A blank line is
//! skipped. An invalid line is reported (`log::warn`, with the source and the 1-based line
//! number) and skipped; it never stops ingest. A line whose `aep` names a version this
//! relay does not speak (well-formed `MAJOR.MINOR`, not in
//! [`SUPPORTED_VERSIONS`](crate::envelope::SUPPORTED_VERSIONS); below 1.0 every minor
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

use crate::envelope::{self, Event};
use bytes::{Bytes, BytesMut};
use mio::Waker;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default interval between two looks at a followed file (`--follow-interval-ms`): 200 ms.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);
/// Size of a fresh read buffer. The lines read into it become the Events' bytes (slices
/// of it, no copy); it is freed once the store copied what it holds and the fan-out let
/// go of them.
const CHUNK: usize = 256 * 1024;
/// Room below which a read buffer is not read into again (a fresh one is taken).
const MIN_ROOM: usize = 16 * 1024;
/// Chunks in flight between the readers and the reactor (the backpressure bound: about
/// `CHUNK × CHANNEL` bytes of Events).
const CHANNEL: usize = 8;
/// Chunks the reactor ingests per wake-up before it serves its sockets again.
const BUDGET: usize = 4;
/// How long the reactor waits before retrying a chunk the history refused.
const RETRY: Duration = Duration::from_secs(1);

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
/// use aep_relay::jsonl::{classify, LineKind};
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
struct Reporter {
    label: Arc<str>,
    versions: Vec<String>,
}

impl Reporter {
    fn new(label: &str) -> Reporter {
        Reporter {
            label: label.into(),
            versions: Vec::new(),
        }
    }

    /// Classifies a piece; returns the Event to ingest, reporting everything else.
    fn take(&mut self, line: u64, piece: Piece, max_line: usize) -> Option<Event> {
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

// ---------------------------------------------------------------------------------------
// Sources (threads) and the reactor side
// ---------------------------------------------------------------------------------------

/// What a source thread hands the reactor.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Valid Events, in source order, from the source named.
    Events {
        source: Arc<str>,
        events: Vec<Event>,
    },
    /// Standard input ended; every Event before it was sent.
    StdinEof,
}

/// Sends and wakes; `false` when the relay is gone.
#[derive(Clone)]
struct Outlet {
    tx: SyncSender<Msg>,
    waker: Arc<Waker>,
    closed: Arc<AtomicBool>,
}

impl Outlet {
    fn send(&self, msg: Msg) -> bool {
        if self.tx.send(msg).is_err() {
            return false;
        }
        let _ = self.waker.wake();
        !self.closed.load(Ordering::Relaxed)
    }

    fn events(&self, source: &Arc<str>, events: &mut Vec<Event>) -> bool {
        if events.is_empty() {
            return !self.closed.load(Ordering::Relaxed);
        }
        // The next batch is likely as long: no regrowth (an Event is a large struct).
        let next = Vec::with_capacity(events.len());
        self.send(Msg::Events {
            source: source.clone(),
            events: std::mem::replace(events, next),
        })
    }
}

/// The reactor's end of the JSONL sources.
pub(crate) struct Ingest {
    rx: Receiver<Msg>,
    closed: Arc<AtomicBool>,
    /// A chunk the history refused, retried first.
    pending: Option<Msg>,
    retry_at: Option<Instant>,
    exit_on_stdin_eof: bool,
    /// More messages may be waiting (the last drain stopped at its budget).
    more: bool,
}

impl std::fmt::Debug for Ingest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingest")
            .field("pending", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        // Followers notice within one poll interval; the stdin reader at its next read.
        self.closed.store(true, Ordering::Relaxed);
    }
}

impl Ingest {
    /// Starts a thread per configured source; `None` when there is none.
    ///
    /// # Errors
    /// A thread could not be spawned.
    pub(crate) fn start(
        config: &JsonlConfig,
        max_line: usize,
        waker: Arc<Waker>,
    ) -> io::Result<Option<Ingest>> {
        if !config.is_active() {
            return Ok(None);
        }
        let (tx, rx) = sync_channel(CHANNEL);
        let closed = Arc::new(AtomicBool::new(false));
        let outlet = Outlet {
            tx,
            waker,
            closed: closed.clone(),
        };
        if config.stdin {
            let o = outlet.clone();
            std::thread::Builder::new()
                .name("aep-jsonl-stdin".into())
                .spawn(move || read_stdin(o, max_line))?;
            log::info!("ingesting JSONL from standard input");
        }
        for path in &config.files {
            let o = outlet.clone();
            let f = Follower::new(path.clone(), max_line);
            let interval = config.poll_interval;
            std::thread::Builder::new()
                .name("aep-jsonl-file".into())
                .spawn(move || f.run(o, interval))?;
            log::info!("ingesting and following JSONL file {}", path.display());
        }
        Ok(Some(Ingest {
            rx,
            closed,
            pending: None,
            retry_at: None,
            exit_on_stdin_eof: config.exit_on_stdin_eof,
            more: false,
        }))
    }

    /// Hands up to a budget of chunks to `ingest` (history append + publish), in order;
    /// `ingest` moves the Events out of the chunk it takes. A chunk `ingest` refuses
    /// (leaving it as it was) is kept and retried after a pause, and nothing behind it
    /// is taken meanwhile (the readers block on the full channel). Returns `true` when the
    /// relay should stop (standard input ended and `exit_on_stdin_eof`).
    pub(crate) fn drain<E: std::fmt::Display>(
        &mut self,
        now: Instant,
        mut ingest: impl FnMut(&mut Vec<Event>) -> Result<(), E>,
    ) -> bool {
        if self.retry_at.is_some_and(|t| now < t) {
            self.more = false;
            return false;
        }
        for _ in 0..BUDGET {
            let msg = match self.pending.take() {
                Some(m) => m,
                None => match self.rx.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => {
                        self.more = false;
                        return false;
                    }
                },
            };
            match msg {
                Msg::Events { source, mut events } => match ingest(&mut events) {
                    Ok(()) => {
                        if self.retry_at.take().is_some() {
                            log::info!("history writable again; JSONL ingest resumed");
                        }
                    }
                    Err(e) => {
                        if self.retry_at.is_none() {
                            log::error!(
                                "{source}: {} Events not ingested: {e}; JSONL ingest paused, retrying every {} s",
                                events.len(),
                                RETRY.as_secs()
                            );
                        }
                        self.retry_at = Some(now + RETRY);
                        self.pending = Some(Msg::Events { source, events });
                        self.more = false;
                        return false;
                    }
                },
                Msg::StdinEof => {
                    if self.exit_on_stdin_eof {
                        log::info!("standard input ended; stopping (--exit-on-stdin-eof)");
                        return true;
                    }
                    log::info!("standard input ended; the relay keeps running");
                }
            }
        }
        self.more = true;
        false
    }

    /// Whether the last [`Ingest::drain`] stopped at its budget with more waiting.
    pub(crate) fn more_ready(&self) -> bool {
        self.more
    }

    /// When a chunk the history refused is to be offered again, if one is waiting.
    pub(crate) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }
}

fn read_stdin(out: Outlet, max_line: usize) {
    let label: Arc<str> = "<stdin>".into();
    let mut reporter = Reporter::new(&label);
    let mut splitter = LineSplitter::new(max_line);
    let mut stdin = io::stdin().lock();
    let mut buf = BytesMut::new();
    let mut batch = Vec::new();
    loop {
        match read_chunk(&mut stdin, &mut buf) {
            Ok(data) if data.is_empty() => {
                splitter.finish(&mut |n, p| {
                    if let Some(ev) = reporter.take(n, p, max_line) {
                        batch.push(ev);
                    }
                });
                if out.events(&label, &mut batch) {
                    out.send(Msg::StdinEof);
                }
                return;
            }
            Ok(data) => {
                splitter.push(data, &mut |n, p| {
                    if let Some(ev) = reporter.take(n, p, max_line) {
                        batch.push(ev);
                    }
                });
                if !out.events(&label, &mut batch) {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::error!("<stdin>: read failed: {e}; no more Events from standard input");
                if out.events(&label, &mut batch) {
                    out.send(Msg::StdinEof);
                }
                return;
            }
        }
    }
}

/// Reads once from `r` into the free room of `buf` (a fresh [`CHUNK`] when little is
/// left) and returns what was read, empty at end of input. The room is zeroed first (no
/// `unsafe` reads into uninitialised memory).
fn read_chunk(r: &mut impl Read, buf: &mut BytesMut) -> io::Result<Bytes> {
    let room = if buf.capacity() >= MIN_ROOM {
        buf.capacity()
    } else {
        CHUNK
    };
    buf.resize(room, 0);
    match r.read(&mut buf[..]) {
        Ok(n) => {
            buf.truncate(n);
            Ok(buf.split().freeze())
        }
        Err(e) => {
            buf.clear();
            Err(e)
        }
    }
}

/// Follows one file (see the module docs).
struct Follower {
    path: PathBuf,
    label: Arc<str>,
    file: Option<File>,
    /// `(dev, ino)` of the open file.
    id: (u64, u64),
    offset: u64,
    splitter: LineSplitter,
    reporter: Reporter,
    max_line: usize,
    /// The last open error reported (reported again only when it changes).
    open_error: Option<io::ErrorKind>,
}

impl Follower {
    fn new(path: PathBuf, max_line: usize) -> Follower {
        let label: Arc<str> = path.display().to_string().into();
        Follower {
            reporter: Reporter::new(&label),
            label,
            path,
            file: None,
            id: (0, 0),
            offset: 0,
            splitter: LineSplitter::new(max_line),
            max_line,
            open_error: None,
        }
    }

    fn run(mut self, out: Outlet, interval: Duration) {
        let mut buf = BytesMut::new();
        let mut batch = Vec::new();
        loop {
            let progressed = self.poll(&mut buf, &mut batch);
            if !out.events(&self.label, &mut batch) {
                return;
            }
            if !progressed {
                std::thread::sleep(interval);
            }
        }
    }

    fn take(&mut self, data: Option<Bytes>, batch: &mut Vec<Event>) {
        let (reporter, max_line) = (&mut self.reporter, self.max_line);
        let mut sink = |n: u64, p: Piece| {
            if let Some(ev) = reporter.take(n, p, max_line) {
                batch.push(ev);
            }
        };
        match data {
            Some(d) => self.splitter.push(d, &mut sink),
            None => self.splitter.finish(&mut sink),
        }
    }

    /// One step: read what is new, or notice truncation / replacement. `true` when it
    /// did something (call again at once), `false` when there was nothing to do.
    fn poll(&mut self, buf: &mut BytesMut, batch: &mut Vec<Event>) -> bool {
        let Some(file) = self.file.as_mut() else {
            return self.open();
        };
        match read_chunk(file, buf) {
            Ok(data) if data.is_empty() => {}
            Ok(data) => {
                self.offset += data.len() as u64;
                self.take(Some(data), batch);
                return true;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return true,
            Err(e) => {
                log::warn!("{}: read failed: {e}; reopening", self.label);
                self.file = None;
                return false;
            }
        }
        // At the end of the open file: has the path moved on?
        match std::fs::metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) != self.id => {
                log::info!(
                    "{}: replaced (new inode); reading the new file from its start",
                    self.label
                );
                self.take(None, batch);
                self.file = None;
                true
            }
            Ok(m) if m.len() < self.offset => {
                log::info!(
                    "{}: truncated ({} bytes, was {}); reading from the start",
                    self.label,
                    m.len(),
                    self.offset
                );
                self.restart_at_zero()
            }
            _ => false,
        }
    }

    fn restart_at_zero(&mut self) -> bool {
        use std::io::Seek;
        self.offset = 0;
        self.splitter.reset();
        if let Some(f) = self.file.as_mut() {
            if let Err(e) = f.seek(io::SeekFrom::Start(0)) {
                log::warn!("{}: cannot rewind: {e}; reopening", self.label);
                self.file = None;
            }
        }
        true
    }

    fn open(&mut self) -> bool {
        match File::open(&self.path).and_then(|f| f.metadata().map(|m| (f, m))) {
            Ok((f, m)) => {
                if self.open_error.take().is_some() {
                    log::info!("{}: now readable", self.label);
                }
                self.file = Some(f);
                self.id = (m.dev(), m.ino());
                self.offset = 0;
                self.splitter.reset();
                true
            }
            Err(e) => {
                if self.open_error != Some(e.kind()) {
                    log::warn!("{}: cannot open: {e}; waiting for it", self.label);
                    self.open_error = Some(e.kind());
                }
                false
            }
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
