//! Appending: the journal. [`History`] holds the root's lock and an LRU of open session
//! files, and appends each batch before it is answered, cut back when it fails
//! ([super#writing], [super#durability-fsync]).

use super::naming::relative_key;
use super::rebuild::{last_newline_end, rebuild, RebuildStats};
use super::{create_dirs, io_at, Fsync, HistoryConfig, HistoryError, LOCK_FILE};
use crate::store::Store;
use crate::wire::envelope::{Event, Scope};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

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
    /// [module docs](super#rebuild)). `store` should be empty.
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
        events: &[Event],
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
                    (ev.attr(crate::wire::envelope::Attr::Agent), ev.session())
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
                let line = if ev.has_line_breaks() {
                    flat = bytes.to_vec();
                    crate::wire::envelope::line_breaks_to_spaces(&mut flat);
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

/// The files as the core's durable-history port: `append_batch`, its error as the
/// refusal's detail.
impl crate::core::Journal for History {
    fn append(&mut self, events: &[Event], store: &Store<Event>) -> Result<(), String> {
        self.append_batch(events, store)
            .map(|_| ())
            .map_err(|e| e.reason())
    }
}
