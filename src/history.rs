//! Durable session history (`--history DIR`): every admitted session-scoped Event is
//! appended to `{DIR}/{agent}/{session}.jsonl`, and on start the replay buffers are rebuilt
//! from those files (AEP-0003 §3.1.1, §3.1.2: an append-only session log is both a durable
//! history and a transport; `tail -f` on one is a conformant consume path).
//!
//! # Layout and the name mapping
//!
//! `agent` and `session` are producer-controlled strings with no charset or length
//! guarantee (AEP-0001 §12, AEP-0003 §9.6), so each becomes one path component through
//! [`encode_component`]:
//!
//! - bytes `a-z`, `0-9`, `_`, `-`, and `.` (except as the first byte) are kept;
//! - every other byte of the UTF-8 value (upper case, `/`, `\`, `%`, `~`, NUL, control
//!   characters, every byte of a non-ASCII character, a leading `.`) is written `%XX`
//!   with upper-case hex.
//!
//! So a component is never empty, `.`, `..` or hidden, never holds a separator, is pure
//! ASCII (no Unicode normalisation on any filesystem can merge two), and two different
//! values never map to names that differ only in case (letters outside `%XX` are always
//! lower case, hex inside it always upper case): no escape from `DIR` and no collision,
//! on case-sensitive and case-insensitive filesystems alike. [`decode_component`] reverses
//! it exactly.
//!
//! A value whose encoding is longer than [`MAX_COMPONENT`] bytes (the file name must fit
//! `NAME_MAX` = 255 bytes with `.jsonl`) is written `{prefix}~{sha256}`: the first bytes of
//! the encoding, `~` (never produced otherwise), and the SHA-256 of the raw value in lower
//! hex. That form is reversible through the file's content: every line carries the full
//! `agent` and `session`.
//!
//! # Writing
//!
//! One `writev` of the Event's original bytes (CR and LF, JSON whitespace of a
//! pretty-printed Event, as spaces) and `\n` per Event (AEP-0003 §3.1.1: a
//! concurrent `tail -f` never sees a torn line). Files are opened with `O_APPEND`,
//! mode `0600` (directories `0700`: the history holds whatever content the emitters
//! captured), and kept open in a small LRU bounded by
//! [`HistoryConfig::max_open_files`]. The relay must be the only writer of `DIR`: it holds
//! an exclusive `flock` on `DIR/`[`LOCK_FILE`] (with its PID inside) while it runs, and a
//! second relay on the same `DIR` refuses to start ([`HistoryError::Locked`], naming the
//! directory and the holder's PID).
//!
//! A batch (one HTTP body, or one chunk of JSONL lines) is appended before any of it is
//! published or answered: when an append fails, the files this batch touched are cut back
//! to their lengths before the batch (best effort: a failed cut is logged), and the whole
//! batch is refused (HTTP 503 `history-unavailable`), so an emitter is never told
//! "accepted" for an Event the history could not keep.
//!
//! What is written: session-scoped Events (sequenced and foreign, AEP-0001 §5.2) that the
//! replay store does not already hold by `(source, id)` where they would go (a redelivery
//! is not written twice; two copies within one batch and session neither). Agent-scoped Events have no session and
//! are never written. A position conflict (a different Event at a held `(epoch, seq)`,
//! AEP-0001 §7.2) is written, as the audit record of the emitter fault; on rebuild the
//! first one wins again, as it did live.
//!
//! # Durability ([`Fsync`])
//!
//! `never` (the default): `write` only. Survives every crash of the relay (SIGKILL
//! included: the kernel has the bytes) and restarts; a crash of the machine or a power
//! loss can lose what the kernel had not written back yet (seconds). `batch`:
//! `fdatasync` of each file a batch touched, once, before the batch is answered, so a
//! `202` means "on stable storage". `always`: `fdatasync` after every Event. A new file's
//! directory entry is synced too (except under `never`).
//!
//! Why `never` by default: the relay is one thread, and an `fdatasync` stalls every
//! connection, subscribers included, for the device's flush latency. Measured with
//! `cargo run --release --example history_cost` on the project's 2-core VM (virtual
//! disk, ~645-byte Events, 16 sessions): `never` 3.4 µs per Event (~290 000 Events/s);
//! `batch` 3.4 ms per single-Event request (~300 requests/s) and 63 ms for a 100-Event
//! batch over 16 files (~1 600 Events/s); `always` 2.7 ms per Event (~370 Events/s).
//! Choose `batch` where a power loss must not lose an acknowledged Event.
//!
//! # Rebuild
//!
//! [`History::open`] rebuilds the replay store: it takes the newest `max_sessions` files
//! by modification time, oldest first (so the store's least-recently-written order
//! matches), and from each the newest `2 × buffer_per_session + 16` lines (the whole file
//! when it is smaller), admitting them in file order as if they had just arrived. Loading
//! more lines than the ring holds makes the store evict the oldest ones, which sets its
//! eviction high-water, so a consumer resuming from before the kept tail is told
//! `replay-exhausted` exactly as before the restart.
//!
//! A file is keyed by agent and session name, but the store keys buffers by owning
//! stream `(source, session)` (AEP-0001 §5.2), so one file can hold several streams (two
//! emitters of one agent whose session names collide); admitting its lines splits them
//! again, each in its own order. The window must rebuild every one of them: when some
//! stream in it has fewer than `buffer_per_session` distinct positions there (its ring
//! would not fill, for example because the window is mostly another stream's or mostly
//! duplicates), or the file's first line belongs to a stream the window does not hold, the
//! whole file is read instead, in file order, so streams are created and last written in
//! the order they were live. The one stream this cannot see is one that appears neither
//! in the window nor on the first line (it started after another stream of the file and
//! fell silent well before the file's end). An
//! unterminated last line (a crash or a full disk mid-write) is ignored with a warning and
//! cut off, so the next append starts on a fresh line; other invalid lines are skipped
//! with a warning naming the file and line (or byte offset).
//!
//! Foreign-emitter Events (commands, `attention.routed`: session-scoped, no `seq`) are
//! written to their emitter's file, not the session owner's, so their arrival order
//! relative to the session's own Events is not on disk. They are admitted after every
//! sequenced Event, which anchors them at the high-water of every owning stream of their
//! session name (the streams they join, see [`crate::store`]): a consumer resuming
//! after the restart gets them (perhaps again: delivery is at-least-once and consumers
//! dedupe on `(source, id)`, AEP-0001 §7.4), never loses them; within a session they now
//! come after the sequenced Events, where live they came at their arrival point. The
//! sequenced tail and its `replay-exhausted` answers are exactly as before the restart.

pub use crate::config::{Fsync, HistoryConfig, DEFAULT_FSYNC, DEFAULT_MAX_OPEN_FILES};
use crate::envelope::{Event, Scope};
use crate::store::Store;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Longest encoded component, in bytes, before the `{prefix}~{sha256}` form is used:
/// 240, so `{component}.jsonl` fits `NAME_MAX` (255 bytes).
pub const MAX_COMPONENT: usize = 240;
/// The file name suffix of a session log.
pub const SUFFIX: &str = ".jsonl";
/// The lock file in the history root: held with an exclusive `flock` for as long as the
/// relay runs (the kernel drops it when the process ends, `kill -9` included) and holding
/// the holder's PID in decimal and `\n`. A leading `.`, so never read as a session.
pub const LOCK_FILE: &str = ".aep-relay.lock";

/// Why the history could not be opened or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// A file or directory operation failed (`path` names it).
    #[error("history {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error (`ENOSPC` for a full disk, `EACCES`, `EROFS`, …).
        source: io::Error,
    },
    /// The configuration cannot work.
    #[error("history: {0}")]
    Config(String),
    /// Another process holds the history root's [`LOCK_FILE`]: two writers would
    /// interleave their lines, so one relay per `DIR`.
    #[error("history {}: already in use by {} (lock {}); one relay per history directory", dir.display(), match pid { Some(p) => format!("process {p}"), None => "another process".to_string() }, dir.join(LOCK_FILE).display())]
    Locked {
        /// The history root.
        dir: PathBuf,
        /// The holder's PID as it wrote it into the lock file (`None` when unreadable).
        pid: Option<u32>,
    },
}

impl HistoryError {
    /// The reason without the path, for an emitter (the server log has the path).
    pub fn reason(&self) -> String {
        match self {
            HistoryError::Io { source, .. } => source.to_string(),
            HistoryError::Config(s) => s.clone(),
            HistoryError::Locked { .. } => "history directory in use by another process".into(),
        }
    }
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> HistoryError + '_ {
    move |source| HistoryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

// ---------------------------------------------------------------------------------------
// The name mapping
// ---------------------------------------------------------------------------------------

fn plain(b: u8, first: bool) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-' || (b == b'.' && !first)
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Encodes a producer-controlled value (an `agent` or a `session`) as one safe path
/// component; see the [module docs](self#layout-and-the-name-mapping) for the rules.
///
/// The result is 1 to [`MAX_COMPONENT`] bytes of `[a-z0-9._%A-F~-]`, never starts with
/// `.`, and is distinct for distinct values even under case folding. The empty string
/// (which a valid envelope never carries) encodes as `~`.
///
/// ```
/// use aep_relay::history::{decode_component, encode_component, Decoded};
/// assert_eq!(encode_component("s_8f2c"), "s_8f2c");
/// assert_eq!(encode_component("../etc/Passwd"), "%2E.%2Fetc%2F%50asswd");
/// assert_eq!(encode_component("é"), "%C3%A9");
/// assert_eq!(decode_component("%2E.%2Fetc%2F%50asswd"), Some(Decoded::Exact("../etc/Passwd".into())));
/// assert!(encode_component(&"x".repeat(300)).contains('~'));
/// ```
pub fn encode_component(raw: &str) -> String {
    if raw.is_empty() {
        return "~".into();
    }
    let mut out = String::with_capacity(raw.len());
    for (i, &b) in raw.as_bytes().iter().enumerate() {
        if plain(b, i == 0) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 15) as usize] as char);
        }
    }
    if out.len() <= MAX_COMPONENT {
        return out;
    }
    // `{prefix}~{64 hex}`: cut the prefix at an escape boundary.
    let mut cut = MAX_COMPONENT - 1 - 64;
    let bytes = out.as_bytes();
    for back in 1..=2 {
        if cut >= back && bytes[cut - back] == b'%' {
            cut -= back;
            break;
        }
    }
    let digest = Sha256::digest(raw.as_bytes());
    let mut long = String::with_capacity(MAX_COMPONENT);
    long.push_str(&out[..cut]);
    long.push('~');
    for b in digest {
        long.push_str(&format!("{b:02x}"));
    }
    long
}

/// What a path component produced by [`encode_component`] says about the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// The value, exactly.
    Exact(String),
    /// A long value: the first bytes of its UTF-8 (possibly ending inside a character)
    /// and the SHA-256 of the whole value, lower hex. The full value is in the file.
    Long {
        /// Leading bytes of the value.
        prefix: Vec<u8>,
        /// SHA-256 of the value, 64 lower-case hex digits.
        sha256: String,
    },
}

/// Reverses [`encode_component`]. `None` when `name` is not an encoding this module
/// produces (a file someone else put in the history directory).
pub fn decode_component(name: &str) -> Option<Decoded> {
    if name == "~" {
        return Some(Decoded::Exact(String::new()));
    }
    let (body, digest) = match name.split_once('~') {
        Some((b, d)) => (b, Some(d)),
        None => (name, None),
    };
    let mut raw = Vec::with_capacity(body.len());
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = |c: u8| HEX.iter().position(|&h| h == c);
            let hi = hex(*bytes.get(i + 1)?)?;
            let lo = hex(*bytes.get(i + 2)?)?;
            let v = (hi * 16 + lo) as u8;
            if plain(v, raw.is_empty()) {
                return None; // not canonical: we never escape a plain byte
            }
            raw.push(v);
            i += 3;
        } else if plain(b, raw.is_empty()) {
            raw.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    match digest {
        None => String::from_utf8(raw).ok().map(Decoded::Exact),
        Some(d)
            if d.len() == 64
                && d.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) =>
        {
            Some(Decoded::Long {
                prefix: raw,
                sha256: d.to_string(),
            })
        }
        Some(_) => None,
    }
}

/// The file of `(agent, session)`, relative to the history root:
/// `{encode(agent)}/{encode(session)}.jsonl`.
pub fn relative_path(agent: &str, session: &str) -> PathBuf {
    PathBuf::from(relative_key(agent, session))
}

fn relative_key(agent: &str, session: &str) -> String {
    let mut p = encode_component(agent);
    p.push('/');
    p.push_str(&encode_component(session));
    p.push_str(SUFFIX);
    p
}

// ---------------------------------------------------------------------------------------
// The writer
// ---------------------------------------------------------------------------------------

struct OpenFile {
    file: File,
    /// Bytes in the file (we are its only writer; `O_APPEND`).
    len: u64,
    /// LRU stamp.
    used: u64,
}

/// The open history: the writer (with its open-file LRU) and the configuration.
pub struct History {
    config: HistoryConfig,
    /// The root's [`LOCK_FILE`], locked exclusively while this is alive.
    _lock: File,
    /// Open files by path relative to the root (`{agent}/{session}.jsonl`, encoded).
    open: HashMap<String, OpenFile>,
    clock: u64,
    /// Events appended since start.
    appended: u64,
    /// When a failure was last logged, and failures not logged since (rate limit).
    last_logged: Option<std::time::Instant>,
    unlogged: u64,
}

/// At most one history failure is logged per this interval (the rest are counted).
const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("History")
            .field("dir", &self.config.dir)
            .field("fsync", &self.config.fsync)
            .field("open_files", &self.open.len())
            .field("appended", &self.appended)
            .finish()
    }
}

/// What [`History::open`] found while rebuilding the replay store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RebuildStats {
    /// Session files found.
    pub files: usize,
    /// Files read (the newest `max_sessions`).
    pub files_read: usize,
    /// Lines offered to the store.
    pub events: usize,
    /// Invalid lines skipped.
    pub invalid: usize,
    /// Unterminated last lines cut off.
    pub torn: usize,
}

fn create_dirs(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

/// Cuts an unterminated last line off `file` (of `len` bytes); returns the new length.
fn repair_torn_tail(file: &mut File, len: u64, path: &Path) -> io::Result<u64> {
    if len == 0 {
        return Ok(0);
    }
    let end = last_newline_end(file, len)?;
    if end < len {
        log::warn!(
            "history {}: ignoring an unterminated last line ({} bytes; a crash or a full disk mid-write) and cutting it off",
            path.display(),
            len - end
        );
        file.set_len(end)?;
    }
    Ok(end)
}

/// The offset just after the last `\n` of the first `len` bytes (0 when there is none).
fn last_newline_end(file: &mut File, len: u64) -> io::Result<u64> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut pos = len;
    while pos > 0 {
        let n = (buf.len() as u64).min(pos) as usize;
        pos -= n as u64;
        file.seek(SeekFrom::Start(pos))?;
        file.read_exact(&mut buf[..n])?;
        if let Some(i) = memchr::memrchr(b'\n', &buf[..n]) {
            return Ok(pos + i as u64 + 1);
        }
    }
    Ok(0)
}

/// The offset where the newest `lines` complete lines of the first `end` bytes start
/// (`end` is just after a `\n`, or 0).
fn tail_start(file: &mut File, end: u64, lines: usize) -> io::Result<u64> {
    if end == 0 {
        return Ok(0);
    }
    let mut buf = vec![0u8; 64 * 1024];
    // The last byte is the terminator of the last line; count newlines before it.
    let mut pos = end - 1;
    let mut seen = 0usize;
    while pos > 0 {
        let n = (buf.len() as u64).min(pos) as usize;
        pos -= n as u64;
        file.seek(SeekFrom::Start(pos))?;
        file.read_exact(&mut buf[..n])?;
        for i in memchr::memrchr_iter(b'\n', &buf[..n]) {
            seen += 1;
            if seen == lines {
                return Ok(pos + i as u64 + 1);
            }
        }
    }
    Ok(0)
}

/// Takes the exclusive lock on `dir`'s [`LOCK_FILE`] without waiting and writes this
/// process's PID into it. The lock lives as long as the returned file.
fn lock_root(dir: &Path) -> Result<File, HistoryError> {
    let path = dir.join(LOCK_FILE);
    // No truncation before the lock is ours: the holder's PID must stay readable.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io_at(&path))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(HistoryError::Locked {
                dir: dir.to_path_buf(),
                pid: text.trim().parse().ok(),
            });
        }
        Err(fs::TryLockError::Error(e)) => return Err(io_at(&path)(e)),
    }
    file.set_len(0).map_err(io_at(&path))?;
    file.write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0)
        .map_err(io_at(&path))?;
    Ok(file)
}

impl History {
    /// Opens (creating when absent) the history root and rebuilds `store` from it (see the
    /// [module docs](self#rebuild)). `store` should be empty.
    ///
    /// # Errors
    /// [`HistoryError::Config`] for a zero file cap; [`HistoryError::Locked`] when another
    /// process (another relay) holds the root's [`LOCK_FILE`]; [`HistoryError::Io`] when
    /// the root cannot be created, locked or listed. Unreadable or damaged session files are skipped with
    /// a warning, never fatal.
    pub fn open(
        config: HistoryConfig,
        store: &mut Store<Event>,
    ) -> Result<(History, RebuildStats), HistoryError> {
        if config.max_open_files == 0 {
            return Err(HistoryError::Config(
                "max_open_files (AEP_HISTORY_MAX_OPEN) must be at least 1".into(),
            ));
        }
        create_dirs(&config.dir).map_err(io_at(&config.dir))?;
        let lock = lock_root(&config.dir)?;
        let stats = rebuild(&config.dir, store)?;
        Ok((
            History {
                config,
                _lock: lock,
                open: HashMap::new(),
                clock: 0,
                appended: 0,
                last_logged: None,
                unlogged: 0,
            },
            stats,
        ))
    }

    /// The configuration in force.
    pub fn config(&self) -> &HistoryConfig {
        &self.config
    }

    /// Events appended since start.
    pub fn appended(&self) -> u64 {
        self.appended
    }

    /// Files currently held open (at most `max_open_files`).
    pub fn open_files(&self) -> usize {
        self.open.len()
    }

    /// Appends one batch: each session-scoped Event of `events` that `store` does not
    /// already hold (and that is not a repeat within the batch), as one `writev` of its
    /// bytes and `\n`, in order; then syncs per the [`Fsync`] policy. Call it before the
    /// Events are admitted to `store`. Returns the number of Events written.
    ///
    /// # Errors
    /// [`HistoryError::Io`] naming the file when a directory, open, write or sync fails
    /// (a full disk is `ENOSPC`). The files this batch touched are then cut back to their
    /// lengths before it (a failed cut is logged) and cached handles to them are dropped,
    /// so a later batch reopens them: the caller refuses the whole batch.
    pub fn append_batch(
        &mut self,
        events: &[Arc<Event>],
        store: &Store<Event>,
    ) -> Result<usize, HistoryError> {
        // Relative path -> length before this batch.
        let mut touched: HashMap<String, u64> = HashMap::new();
        // Keyed like the store's admission dedupe: `(source, id)` within one session
        // (AEP-0001 §5.2, §7 #4).
        let mut seen: HashSet<(&str, &str, &str)> = HashSet::new();
        let mut written = 0;
        let result = (|| {
            for ev in events {
                if ev.scope() == Scope::Agent {
                    continue;
                }
                let (Some(agent), Some(session)) =
                    (ev.attr(crate::envelope::Attr::Agent), ev.session())
                else {
                    continue;
                };
                if store.holds(ev) || !seen.insert((ev.source(), session, ev.id())) {
                    continue;
                }
                let rel = relative_key(agent, session);
                let len = self.ensure_open(&rel, &touched)?;
                // Recorded before the write, so a short write is cut back too.
                touched.entry(rel.clone()).or_insert(len);
                // A line break in a valid Event is JSON whitespace between tokens (a
                // string cannot hold a raw one, RFC 8259 §7): a pretty-printed
                // `application/json` body or WebSocket message. It would split the Event
                // over several history lines, which the rebuild skips as invalid, so the
                // Event is written with each CR and LF as a space, one line (AEP-0003
                // §3.1.1), the form SSE sends (`envelope::line_breaks_to_spaces`). Only such Events
                // are copied.
                let bytes = ev.bytes();
                let mut flat;
                let line = if memchr::memchr2(b'\n', b'\r', bytes).is_some() {
                    flat = bytes.to_vec();
                    crate::envelope::line_breaks_to_spaces(&mut flat);
                    &flat[..]
                } else {
                    bytes
                };
                self.append_one(&rel, line)?;
                written += 1;
            }
            if self.config.fsync == Fsync::Batch {
                for rel in touched.keys() {
                    self.sync(rel)?;
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                self.appended += written as u64;
                Ok(written)
            }
            Err(e) => {
                let now = std::time::Instant::now();
                if self
                    .last_logged
                    .is_none_or(|t| now.duration_since(t) >= LOG_EVERY)
                {
                    log::error!(
                        "{e}: a batch of {} Events was refused (503 history-unavailable){}",
                        events.len(),
                        match std::mem::take(&mut self.unlogged) {
                            0 => String::new(),
                            n => format!("; {n} more failures since the last report"),
                        }
                    );
                    self.last_logged = Some(now);
                } else {
                    self.unlogged += 1;
                }
                self.roll_back(&touched);
                Err(e)
            }
        }
    }

    fn sync(&mut self, rel: &str) -> Result<(), HistoryError> {
        if let Some(f) = self.open.get(rel) {
            f.file
                .sync_data()
                .map_err(io_at(&self.config.dir.join(rel)))?;
        }
        Ok(())
    }

    /// Opens `rel` when it is not open (closing the least recently used file beyond the
    /// cap); returns its current length.
    fn ensure_open(
        &mut self,
        rel: &str,
        touched: &HashMap<String, u64>,
    ) -> Result<u64, HistoryError> {
        if let Some(f) = self.open.get(rel) {
            return Ok(f.len);
        }
        self.make_room(touched)?;
        let path = self.config.dir.join(rel);
        let f = self.open_file(rel, &path)?;
        let len = f.len;
        self.open.insert(rel.to_string(), f);
        Ok(len)
    }

    /// Appends `bytes` + `\n` to the open file `rel` in one `writev`.
    fn append_one(&mut self, rel: &str, bytes: &[u8]) -> Result<(), HistoryError> {
        self.clock += 1;
        let clock = self.clock;
        let fsync = self.config.fsync;
        let dir = &self.config.dir;
        let Some(f) = self.open.get_mut(rel) else {
            return Err(HistoryError::Config("open file vanished".into()));
        };
        f.used = clock;
        let want = bytes.len() + 1;
        let res = f
            .file
            .write_vectored(&[IoSlice::new(bytes), IoSlice::new(b"\n")]);
        match res {
            Ok(n) if n == want => {}
            Ok(n) => {
                // A short write (the disk filled up mid-line): a torn line we cut back.
                f.len += n as u64;
                return Err(HistoryError::Io {
                    path: dir.join(rel),
                    source: io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("short write: {n} of {want} bytes (disk full?)"),
                    ),
                });
            }
            Err(e) => return Err(io_at(&dir.join(rel))(e)),
        }
        f.len += want as u64;
        if fsync == Fsync::Always {
            f.file.sync_data().map_err(io_at(&dir.join(rel)))?;
        }
        Ok(())
    }

    /// Closes least-recently-used files until one more fits under the cap. A file this
    /// batch touched is synced first under `batch` (its sync is owed before the answer).
    fn make_room(&mut self, touched: &HashMap<String, u64>) -> Result<(), HistoryError> {
        while self.open.len() >= self.config.max_open_files {
            let Some(victim) = self
                .open
                .iter()
                .min_by_key(|(_, f)| f.used)
                .map(|(p, _)| p.clone())
            else {
                return Ok(());
            };
            if self.config.fsync == Fsync::Batch && touched.contains_key(&victim) {
                self.sync(&victim)?;
            }
            self.open.remove(&victim);
        }
        Ok(())
    }

    fn open_file(&mut self, rel: &str, path: &Path) -> Result<OpenFile, HistoryError> {
        let mut opts = OpenOptions::new();
        opts.read(true).append(true).mode(0o600);
        // The common case, an existing file, costs one open, one fstat and a 1-byte read.
        let mut file = match opts.open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let parent = path.parent().unwrap_or(&self.config.dir);
                let new_dir = !parent.is_dir();
                create_dirs(parent).map_err(io_at(parent))?;
                let f = opts.create(true).open(path).map_err(io_at(path))?;
                if self.config.fsync != Fsync::Never {
                    // Make the new directory entries durable too.
                    let sync_dir = |d: &Path| File::open(d).and_then(|f| f.sync_all());
                    sync_dir(parent).map_err(io_at(parent))?;
                    if new_dir {
                        sync_dir(&self.config.dir).map_err(io_at(&self.config.dir))?;
                    }
                }
                f
            }
            Err(e) => return Err(io_at(path)(e)),
        };
        let len = file.metadata().map_err(io_at(path))?.len();
        let mut last = [0u8; 1];
        let ends_clean =
            len == 0 || (file.read_exact_at(&mut last, len - 1).is_ok() && last[0] == b'\n');
        let len = if ends_clean {
            len
        } else {
            repair_torn_tail(&mut file, len, path).map_err(io_at(path))?
        };
        log::debug!("history: opened {}", rel);
        Ok(OpenFile {
            file,
            len,
            used: self.clock,
        })
    }

    fn roll_back(&mut self, touched: &HashMap<String, u64>) {
        for (rel, before) in touched {
            let path = self.config.dir.join(rel);
            let cut = match self.open.get(rel) {
                Some(f) => f.file.set_len(*before),
                None => OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_len(*before)),
            };
            if let Err(e) = cut {
                log::error!(
                    "history {}: could not cut a refused batch back to {before} bytes: {e}; the file may hold Events that were answered 503 (they are deduplicated on (source, id) when the emitter retries and on rebuild)",
                    path.display()
                );
            }
        }
        // Drop the handles of every file this batch touched: a later batch reopens them
        // (and recovers once the disk has room again).
        for rel in touched.keys() {
            self.open.remove(rel);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Rebuild
// ---------------------------------------------------------------------------------------

fn list_files(dir: &Path) -> Result<Vec<(SystemTime, PathBuf)>, HistoryError> {
    let mut out = Vec::new();
    for agent in fs::read_dir(dir).map_err(io_at(dir))? {
        let agent = agent.map_err(io_at(dir))?;
        if agent.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let apath = agent.path();
        if !agent.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            continue;
        }
        let entries = match fs::read_dir(&apath) {
            Ok(e) => e,
            Err(e) => {
                log::warn!("history {}: cannot list: {e}; skipped", apath.display());
                continue;
            }
        };
        for f in entries.flatten() {
            let name = f.file_name();
            let name = name.to_string_lossy();
            if !name.ends_with(SUFFIX) || name.starts_with('.') {
                continue;
            }
            match f.metadata() {
                Ok(m) if m.is_file() => {
                    out.push((m.modified().unwrap_or(SystemTime::UNIX_EPOCH), f.path()))
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

/// Rebuilds `store` from the files under `dir` (see the module docs).
fn rebuild(dir: &Path, store: &mut Store<Event>) -> Result<RebuildStats, HistoryError> {
    let mut stats = RebuildStats::default();
    let mut files = list_files(dir)?;
    stats.files = files.len();
    if store.buffer_per_session() == 0 {
        return Ok(stats);
    }
    // Newest first, keep max_sessions, then oldest first.
    files.sort_by(|a, b| b.cmp(a));
    files.truncate(store.max_sessions());
    files.reverse();
    let window = store
        .buffer_per_session()
        .saturating_mul(2)
        .saturating_add(16);
    let mut foreign = Vec::new();
    for (_, path) in files {
        match load_file(&path, store, window, &mut stats, &mut foreign) {
            Ok(()) => stats.files_read += 1,
            Err(e) => log::warn!("history {}: cannot read: {e}; skipped", path.display()),
        }
    }
    // Foreign-emitter Events live in their emitter's file, so their arrival order against
    // the session's own Events is unknown here: placed after them (anchored at the
    // session's high-water), a resume after the restart delivers them, perhaps again
    // (AEP-0001 §7.4), and never loses one.
    for ev in foreign {
        let held = ev.session().is_some_and(|s| store.session(s).is_some());
        if held || store.session_count() < store.max_sessions() {
            store.admit(&ev);
        }
    }
    Ok(stats)
}

fn load_file(
    path: &Path,
    store: &mut Store<Event>,
    window: usize,
    stats: &mut RebuildStats,
    foreign: &mut Vec<Arc<Event>>,
) -> io::Result<()> {
    let mut file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(_) => OpenOptions::new().read(true).open(path)?,
    };
    let len = file.metadata()?.len();
    let end = last_newline_end(&mut file, len)?;
    if end < len {
        stats.torn += 1;
        log::warn!(
            "history {}: ignoring an unterminated last line ({} bytes; a crash or a full disk mid-write)",
            path.display(),
            len - end
        );
        if let Err(e) = file.set_len(end) {
            log::warn!("history {}: cannot cut it off: {e}", path.display());
        }
    }
    let start = tail_start(&mut file, end, window)?;
    let mut lines = parse_range(&mut file, path, start, end, stats)?;
    if start > 0 && !window_suffices(&mut file, end, &lines, store.buffer_per_session())? {
        // Read the whole file instead, in file order, so every stream's order, its
        // eviction high-water and the order streams were created and written come out
        // as they were live.
        let mut whole = parse_range(&mut file, path, 0, start, stats)?;
        whole.append(&mut lines);
        lines = whole;
    }
    for ev in lines {
        if ev.scope() == Scope::Foreign {
            foreign.push(ev);
        } else {
            store.admit(&ev);
        }
    }
    Ok(())
}

/// Whether the newest lines of a file (`window`, of a file whose lines end at `end`)
/// rebuild every owning stream `(source, session)` the file holds exactly. One file holds
/// every emitter of one agent and session name, so it can hold several streams
/// (AEP-0001 §5.2). The window suffices when each stream in it has at least `buffer`
/// distinct positions there (its ring fills, so its eviction high-water is set and a
/// resume from before the window is told `replay-exhausted`, as live), and the file's
/// first line belongs to one of them (a stream the window misses entirely would
/// otherwise be lost). A stream that appears neither in the window nor on the first line
/// (it started after another emitter's stream in that file and fell silent long before
/// the end) is the one case it cannot see.
fn window_suffices(
    file: &mut File,
    end: u64,
    window: &[Arc<Event>],
    buffer: usize,
) -> io::Result<bool> {
    let mut streams: HashMap<(&str, &str), HashSet<(u64, u64)>> = HashMap::new();
    for ev in window {
        if let (Scope::Sequenced, Some(session), Some(seq)) = (ev.scope(), ev.session(), ev.seq()) {
            streams
                .entry((ev.source(), session))
                .or_default()
                .insert((ev.epoch(), seq));
        }
    }
    if streams.values().any(|positions| positions.len() < buffer) {
        return Ok(false);
    }
    Ok(match first_line(file, end)? {
        Some(ev) => match (ev.scope(), ev.session()) {
            (Scope::Sequenced, Some(session)) => streams.contains_key(&(ev.source(), session)),
            _ => true,
        },
        None => true,
    })
}

/// The file's first line (of the first `end` bytes) as an Event; `None` when it is not a
/// valid one.
fn first_line(file: &mut File, end: u64) -> io::Result<Option<Event>> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 4096];
    let mut pos = 0u64;
    while pos < end {
        let n = (chunk.len() as u64).min(end - pos) as usize;
        file.seek(SeekFrom::Start(pos))?;
        file.read_exact(&mut chunk[..n])?;
        if let Some(i) = memchr::memchr(b'\n', &chunk[..n]) {
            buf.extend_from_slice(&chunk[..i]);
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        pos += n as u64;
    }
    Ok(Event::parse(bytes::Bytes::from(buf)).ok())
}

/// Parses the lines in `[start, end)`, in order, skipping (and reporting) invalid ones.
fn parse_range(
    file: &mut File,
    path: &Path,
    start: u64,
    end: u64,
    stats: &mut RebuildStats,
) -> io::Result<Vec<Arc<Event>>> {
    let mut out = Vec::new();
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((end - start) as usize);
    file.take(end - start).read_to_end(&mut buf)?;
    let buf = bytes::Bytes::from(buf);
    let mut at = 0usize;
    let mut line = 0usize;
    while at < buf.len() {
        let stop = memchr::memchr(b'\n', &buf[at..]).map_or(buf.len(), |i| at + i);
        line += 1;
        let slice = &buf[at..stop];
        if !slice.iter().all(u8::is_ascii_whitespace) {
            // Copy: a held Event must not pin the whole read buffer (nor, `compact`,
            // the whitespace around it).
            match Event::parse(bytes::Bytes::copy_from_slice(slice)) {
                Ok(mut ev) => {
                    ev.compact(slice.len());
                    stats.events += 1;
                    out.push(Arc::new(ev));
                }
                Err(e) => {
                    stats.invalid += 1;
                    if start == 0 {
                        log::warn!("{}:{line}: invalid line skipped: {e}", path.display());
                    } else {
                        log::warn!(
                            "{} at byte {}: invalid line skipped: {e}",
                            path.display(),
                            start + at as u64
                        );
                    }
                }
            }
        }
        at = stop + 1;
    }
    Ok(out)
}

/// The files as the core's durable-history port: `append_batch`, its error as the
/// refusal's detail.
impl crate::core::Journal for History {
    fn append(&mut self, events: &[Arc<Event>], store: &Store<Event>) -> Result<(), String> {
        self.append_batch(events, store)
            .map(|_| ())
            .map_err(|e| e.reason())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn ev(agent: &str, session: &str, seq: u64) -> Arc<Event> {
        let j = serde_json::json!({
            "aep": "0.1", "id": format!("{session}-{seq}"), "type": "tool.completed",
            "time": "2026-07-03T10:00:00Z", "source": "aep://t/agent/a",
            "agent": agent, "session": session, "seq": seq
        });
        Arc::new(Event::parse(Bytes::from(serde_json::to_vec(&j).unwrap())).unwrap())
    }

    fn tmp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("aep-history-unit-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    /// A small deterministic generator of awkward strings.
    fn awkward(seed: u64) -> String {
        let pool = [
            "a", "Z", ".", "..", "/", "\\", "%", "~", "\0", "\n", " ", "é", "É", "😀", "-", "_",
            "0", "%2F", "~x", "A", "a.", ".jsonl",
        ];
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let n = (x >> 60) as usize + 1;
        let mut s = String::new();
        for _ in 0..n {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s.push_str(pool[(x >> 33) as usize % pool.len()]);
        }
        s
    }

    #[test]
    fn encoding_is_safe_reversible_and_case_distinct() {
        let mut seen = HashMap::new();
        let mut values: Vec<String> = (0..5000).map(awkward).collect();
        values.extend(["..", ".", "", "Session", "session", "a/b", "a%2Fb"].map(String::from));
        for v in values {
            let e = encode_component(&v);
            assert!(!e.is_empty() && e.len() <= MAX_COMPONENT, "{v:?} -> {e:?}");
            assert!(!e.starts_with('.'), "{v:?} -> {e:?}");
            assert!(e
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'\\'));
            assert_eq!(decode_component(&e), Some(Decoded::Exact(v.clone())));
            let folded = e.to_ascii_lowercase();
            if let Some(other) = seen.insert(folded, v.clone()) {
                assert_eq!(other, v, "case-folded collision");
            }
        }
    }

    #[test]
    fn long_values_use_a_digest_and_stay_distinct() {
        let a = "s".repeat(1000);
        let b = format!("{}t", "s".repeat(999));
        let (ea, eb) = (encode_component(&a), encode_component(&b));
        assert_ne!(ea, eb);
        for e in [&ea, &eb] {
            assert!(e.len() <= MAX_COMPONENT);
            assert!(matches!(decode_component(e), Some(Decoded::Long { .. })));
        }
        // An escape is never cut in half.
        let c = "É".repeat(200);
        let ec = encode_component(&c);
        let Some(Decoded::Long { prefix, .. }) = decode_component(&ec) else {
            panic!("{ec}")
        };
        assert!(c.as_bytes().starts_with(&prefix));
        assert!(relative_path(&c, &a).to_string_lossy().len() < 600);
    }

    #[test]
    fn foreign_names_do_not_decode() {
        for n in ["A", "%2f", "%61", ".x", "a/b", "x~123", "%G0", "%4"] {
            assert_eq!(decode_component(n), None, "{n}");
        }
    }

    #[test]
    fn append_rebuild_round_trip_with_lru_and_dedupe() {
        let dir = tmp("roundtrip");
        let mut store = Store::new(3, 10);
        let mut cfg = HistoryConfig::new(&dir);
        cfg.max_open_files = 2;
        cfg.fsync = Fsync::Never;
        let (mut h, stats) = History::open(cfg.clone(), &mut store).unwrap();
        assert_eq!(stats, RebuildStats::default());
        let batch: Vec<_> = (0..5)
            .flat_map(|i| [ev("a", "s1", i), ev("a", "s2", i), ev("B", "s3", i)])
            .collect();
        let dup = batch[0].clone();
        let mut with_dup = batch.clone();
        with_dup.push(dup.clone());
        assert_eq!(h.append_batch(&with_dup, &store).unwrap(), 15);
        assert!(h.open_files() <= 2);
        for e in &batch {
            store.admit(e);
        }
        // Held: not written again.
        assert_eq!(h.append_batch(&[ev("a", "s1", 4)], &store).unwrap(), 0);
        let text = fs::read_to_string(dir.join("a/s1.jsonl")).unwrap();
        assert_eq!(text.lines().count(), 5);
        assert!(dir.join("%42/s3.jsonl").exists());

        // Torn tail: cut off on rebuild.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join("a/s2.jsonl"))
            .unwrap();
        f.write_all(b"{\"aep\":\"0.1\",\"id").unwrap();
        drop(f);
        drop(h); // the first relay is gone: it held DIR's lock
        let mut fresh = Store::new(3, 10);
        let (_, stats) = History::open(cfg, &mut fresh).unwrap();
        assert_eq!((stats.files, stats.torn, stats.invalid), (3, 1, 0));
        let mut got = Vec::new();
        let marker = fresh.replay_after("s2", (0, 0), &mut |e| got.push(e.seq().unwrap()));
        assert_eq!(got, vec![2, 3, 4]);
        assert_eq!(
            marker.iter().map(|m| m.earliest).collect::<Vec<_>>(),
            [(0, 2)]
        );
        assert!(fs::read(dir.join("a/s2.jsonl")).unwrap().ends_with(b"}\n"));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_window_smaller_than_the_file_still_reports_exhaustion() {
        let dir = tmp("window");
        let mut store = Store::new(2, 10);
        let cfg = HistoryConfig {
            fsync: Fsync::Never,
            ..HistoryConfig::new(&dir)
        };
        let (mut h, _) = History::open(cfg.clone(), &mut store).unwrap();
        let batch: Vec<_> = (0..100).map(|i| ev("a", "s", i)).collect();
        h.append_batch(&batch, &store).unwrap();
        drop(h); // the first relay is gone: it held DIR's lock
        let mut fresh = Store::new(2, 10);
        let (_, stats) = History::open(cfg, &mut fresh).unwrap();
        assert_eq!(stats.events, 2 * 2 + 16, "only the window is read");
        let mut got = Vec::new();
        let marker = fresh.replay_after("s", (0, 10), &mut |e| got.push(e.seq().unwrap()));
        let marker: Vec<_> = marker.iter().map(|m| m.earliest).collect();
        assert_eq!((got, marker), (vec![98, 99], vec![(0, 98)]));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn foreign_events_from_another_file_are_never_lost_on_rebuild() {
        let dir = tmp("foreign");
        let cfg = HistoryConfig {
            fsync: Fsync::Never,
            ..HistoryConfig::new(&dir)
        };
        let mut live = Store::new(10, 10);
        let (mut h, _) = History::open(cfg.clone(), &mut live).unwrap();
        let routed = serde_json::json!({
            "aep": "0.1", "id": "r1", "type": "attention.routed", "time": "2026-07-03T10:00:00Z",
            "source": "aep://t/agent/router", "agent": "router", "session": "s", "subject": "x"
        });
        let routed = Arc::new(Event::parse(Bytes::from(routed.to_string())).unwrap());
        let mut arrivals: Vec<Arc<Event>> = (0..2).map(|i| ev("a", "s", i)).collect();
        arrivals.push(routed.clone());
        arrivals.extend((2..5).map(|i| ev("a", "s", i)));
        for e in &arrivals {
            h.append_batch(std::slice::from_ref(e), &live).unwrap();
            live.admit(e);
        }
        let ids = |st: &Store<Event>, after| {
            let mut v = Vec::new();
            st.replay_after("s", (0, after), &mut |e| v.push(e.id().to_string()));
            v
        };
        assert_eq!(ids(&live, 1), ["r1", "s-2", "s-3", "s-4"]);
        // The router's file was last written before the session's own file.
        for (f, secs) in [("router/s.jsonl", 1_000_000), ("a/s.jsonl", 1_000_010)] {
            File::options()
                .write(true)
                .open(dir.join(f))
                .unwrap()
                .set_modified(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs))
                .unwrap();
        }
        drop(h); // the first relay is gone: it held DIR's lock
        let mut rebuilt = Store::new(10, 10);
        History::open(cfg, &mut rebuilt).unwrap();
        for after in 0..5 {
            let got = ids(&rebuilt, after);
            for want in ids(&live, after) {
                assert!(
                    got.contains(&want),
                    "resume from {after}: {want} lost: {got:?}"
                );
            }
        }
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_the_newest_sessions_are_rebuilt() {
        let dir = tmp("newest");
        let mut store = Store::new(5, 100);
        let cfg = HistoryConfig {
            fsync: Fsync::Never,
            ..HistoryConfig::new(&dir)
        };
        let (mut h, _) = History::open(cfg.clone(), &mut store).unwrap();
        for i in 0..4 {
            h.append_batch(&[ev("a", &format!("s{i}"), 0)], &store)
                .unwrap();
            let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i);
            File::options()
                .write(true)
                .open(dir.join(format!("a/s{i}.jsonl")))
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        drop(h); // the first relay is gone: it held DIR's lock
        let mut fresh = Store::new(5, 2);
        let (_, stats) = History::open(cfg, &mut fresh).unwrap();
        assert_eq!((stats.files, stats.files_read), (4, 2));
        let names: Vec<_> = fresh.sessions().map(|s| s.name.to_string()).collect();
        assert_eq!(names, ["s2", "s3"]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unwritable_file_refuses_the_batch_and_rolls_back() {
        let dir = tmp("full");
        let mut store = Store::new(5, 10);
        let cfg = HistoryConfig::new(&dir);
        let (mut h, _) = History::open(cfg, &mut store).unwrap();
        h.append_batch(&[ev("a", "ok", 0)], &store).unwrap();
        // /dev/full answers every write with ENOSPC: a full disk.
        fs::create_dir_all(dir.join("a")).unwrap();
        std::os::unix::fs::symlink("/dev/full", dir.join("a/full.jsonl")).unwrap();
        let err = h
            .append_batch(&[ev("a", "ok", 1), ev("a", "full", 0)], &store)
            .unwrap_err();
        assert!(err.to_string().contains("full.jsonl"), "{err}");
        let text = fs::read_to_string(dir.join("a/ok.jsonl")).unwrap();
        assert_eq!(
            text.lines().count(),
            1,
            "the batch's first append was cut back"
        );
        // It recovers: the next batch reopens the file.
        assert_eq!(h.append_batch(&[ev("a", "ok", 1)], &store).unwrap(), 1);
        let _ = fs::remove_dir_all(&dir);
    }
}
