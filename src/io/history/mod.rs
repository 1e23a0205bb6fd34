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

mod append;
mod naming;
mod rebuild;

pub use crate::config::{Fsync, HistoryConfig, DEFAULT_FSYNC, DEFAULT_MAX_OPEN_FILES};
pub use append::History;
pub use naming::{
    decode_component, encode_component, relative_path, Decoded, MAX_COMPONENT, SUFFIX,
};
pub use rebuild::RebuildStats;

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

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

pub(crate) fn io_at(path: &Path) -> impl FnOnce(io::Error) -> HistoryError + '_ {
    move |source| HistoryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn create_dirs(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

#[cfg(test)]
mod tests;
