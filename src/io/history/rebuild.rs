//! Rebuilding: reading the files back at start into the replay store, the newest
//! `max_sessions` files and a window of each ([super#rebuild]).

use super::naming::SUFFIX;
use super::{io_at, HistoryError};
use crate::store::Store;
use crate::wire::envelope::{Event, Scope};
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What [`History::open`](super::History::open) found while rebuilding the replay store.
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

/// The offset just after the last `\n` of the first `len` bytes (0 when there is none).
pub(super) fn last_newline_end(file: &mut File, len: u64) -> io::Result<u64> {
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
pub(super) fn rebuild(dir: &Path, store: &mut Store<Event>) -> Result<RebuildStats, HistoryError> {
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
    foreign: &mut Vec<Event>,
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
fn window_suffices(file: &mut File, end: u64, window: &[Event], buffer: usize) -> io::Result<bool> {
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
) -> io::Result<Vec<Event>> {
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
            // A slice of the read buffer: the replay buffer copies what it keeps.
            match Event::parse(buf.slice(at..stop)) {
                Ok(ev) => {
                    stats.events += 1;
                    out.push(ev);
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
