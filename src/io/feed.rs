//! The JSONL sources' threads (`--stdin`, `--ingest-file`) and the reactor's end of their
//! channel; what a source reads and how its lines are judged is [`crate::wire::jsonl`].
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

use crate::wire::envelope::Event;
use crate::wire::jsonl::{JsonlConfig, LineSplitter, Piece, Reporter};
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

/// Size of a fresh read buffer. The lines read into it become the Events' bytes (slices
/// of it, no copy); it is freed once the store copied what it holds and the fan-out let
/// go of them. 64 KiB: the buffer is zeroed, read into, scanned and copied into the store
/// while it is still in the core's cache. `--stdin` of 1M lines admitted about 4% more
/// Events per second on one core than with 256 KiB (the files of `benches/stdin.sh`, the
/// two builds alternating, at 100 and at 1,000 sessions), for four times as many `read`
/// calls.
const CHUNK: usize = 64 * 1024;
/// Room below which a read buffer is not read into again (a fresh one is taken).
const MIN_ROOM: usize = 16 * 1024;
/// Chunks in flight between the readers and the reactor (the backpressure bound: about
/// `CHUNK × CHANNEL` bytes of Events, 512 KiB).
const CHANNEL: usize = 8;
/// Chunks the reactor ingests per wake-up before it serves its sockets again.
const BUDGET: usize = 4;
/// How long the reactor waits before retrying a chunk the history refused.
const RETRY: Duration = Duration::from_secs(1);

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
