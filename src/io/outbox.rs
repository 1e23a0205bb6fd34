//! The durable cluster outbox, the reactor's side: a file the core's [`OutboxLog`] port
//! writes, so that an Event answered 202 while the engine was away reaches the stream
//! whatever restarts the relay goes through meanwhile.
//!
//! The file is `DIR/`[`OUTBOX_FILE`] in the `--history` directory (whose lock already
//! makes the relay its only writer). It is a log of two kinds of records:
//!
//! ```text
//! + {publish id} {subject} {payload length}\n{payload}\n     a message kept
//! - {publish id}\n                                          that message is in the stream
//! ```
//!
//! [`OutboxFile::open`] reads it back: the messages kept and not marked done, in order (a
//! torn last record, from a crash mid-write, is ignored); it then rewrites the file with
//! only those, and the relay publishes them with their own publish ids once connected
//! (the stream's duplicate window collapses one that did get in before the crash). The
//! file is cut to nothing whenever the outbox is empty. Writes go to the kernel before
//! the Event is answered (like `--fsync never`: they survive any kill of the relay); with
//! `sync` each kept message is also `fdatasync`ed.

use crate::core::OutboxLog;
use bytes::Bytes;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The outbox's file name in the history directory.
pub const OUTBOX_FILE: &str = ".aep-cluster-outbox";

/// One message of the outbox as the file holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Its publish id ([`crate::cluster::publish_id`]).
    pub id: String,
    /// Its subject.
    pub subject: String,
    /// Its payload (one Event, or several one per line).
    pub payload: Bytes,
}

/// The outbox file, open for appending.
#[derive(Debug)]
pub struct OutboxFile {
    path: PathBuf,
    file: File,
    live: usize,
    sync: bool,
}

/// Parses the log: the messages kept and not done, in order; a torn or unreadable tail
/// ends it (with a warning).
fn parse(bytes: &[u8], path: &Path) -> Vec<Kept> {
    let mut kept: Vec<Kept> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let Some(nl) = memchr::memchr(b'\n', &bytes[i..]).map(|n| i + n) else {
            log::warn!("{}: a torn last record ignored", path.display());
            break;
        };
        let line = String::from_utf8_lossy(&bytes[i..nl]).into_owned();
        let mut parts = line.split(' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("-"), Some(id), None, None) => {
                kept.retain(|k| k.id != id);
                i = nl + 1;
            }
            (Some("+"), Some(id), Some(subject), Some(len)) => {
                let Ok(len) = len.parse::<usize>() else {
                    log::warn!("{}: a damaged record; the rest ignored", path.display());
                    break;
                };
                let end = nl + 1 + len;
                if end >= bytes.len() || bytes[end] != b'\n' {
                    log::warn!("{}: a torn last record ignored", path.display());
                    break;
                }
                kept.push(Kept {
                    id: id.to_owned(),
                    subject: subject.to_owned(),
                    payload: Bytes::copy_from_slice(&bytes[nl + 1..end]),
                });
                i = end + 1;
            }
            _ => {
                log::warn!("{}: a damaged record; the rest ignored", path.display());
                break;
            }
        }
    }
    kept
}

fn record(k: &Kept) -> Vec<u8> {
    let mut b = format!("+ {} {} {}\n", k.id, k.subject, k.payload.len()).into_bytes();
    b.extend_from_slice(&k.payload);
    b.push(b'\n');
    b
}

impl OutboxFile {
    /// Opens (creating when absent) `dir/`[`OUTBOX_FILE`]: the messages a previous run
    /// left in it, in order, and the file, rewritten with only those.
    ///
    /// # Errors
    /// When the file cannot be read, written or renamed.
    pub fn open(dir: &Path, sync: bool) -> io::Result<(OutboxFile, Vec<Kept>)> {
        let path = dir.join(OUTBOX_FILE);
        let kept = match std::fs::read(&path) {
            Ok(b) => parse(&b, &path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let tmp = dir.join(format!("{OUTBOX_FILE}.tmp"));
        {
            let mut f = File::create(&tmp)?;
            for k in &kept {
                f.write_all(&record(k))?;
            }
            f.sync_data()?;
        }
        std::fs::rename(&tmp, &path)?;
        let file = OpenOptions::new().append(true).open(&path)?;
        let live = kept.len();
        Ok((
            OutboxFile {
                path,
                file,
                live,
                sync,
            },
            kept,
        ))
    }
}

impl OutboxLog for OutboxFile {
    fn keep(&mut self, id: &str, subject: &str, payload: &Bytes) -> Result<(), String> {
        let k = Kept {
            id: id.to_owned(),
            subject: subject.to_owned(),
            payload: payload.clone(),
        };
        let r = self.file.write_all(&record(&k)).and_then(|()| {
            if self.sync {
                self.file.sync_data()
            } else {
                Ok(())
            }
        });
        r.map_err(|e| format!("writing {}: {e}", self.path.display()))?;
        self.live += 1;
        Ok(())
    }

    fn done(&mut self, id: &str) {
        self.live = self.live.saturating_sub(1);
        let r = if self.live == 0 {
            // Empty: cut the file (it only grows while the engine is away).
            self.file.set_len(0)
        } else {
            self.file.write_all(format!("- {id}\n").as_bytes())
        };
        if let Err(e) = r {
            log::warn!(
                "{}: {e} (the message may be published again at the next start)",
                self.path.display()
            );
        }
    }

    fn place(&self) -> String {
        self.path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_messages_survive_a_reopen_and_done_ones_and_torn_tails_do_not() {
        let dir = std::env::temp_dir().join(format!("aep-outbox-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (mut f, kept) = OutboxFile::open(&dir, false).unwrap();
        assert!(kept.is_empty());
        let p1 = Bytes::from_static(b"{\"a\":1}\n{\"a\":2}");
        let p2 = Bytes::from_static(b"{\"b\":1}");
        let p3 = Bytes::from_static(b"{\"c\":1}");
        f.keep("r.1.1", "aep.ev.a.s", &p1).unwrap();
        f.keep("r.1.2", "aep.ev.a.t", &p2).unwrap();
        f.keep("r.1.3", "aep.ev.a.u", &p3).unwrap();
        f.done("r.1.2");
        drop(f);
        // A crash mid-write: a torn record at the end.
        let mut raw = OpenOptions::new()
            .append(true)
            .open(dir.join(OUTBOX_FILE))
            .unwrap();
        raw.write_all(b"+ r.1.4 aep.ev.a.v 100\n{\"d\"").unwrap();
        drop(raw);
        let (mut f, kept) = OutboxFile::open(&dir, false).unwrap();
        let ids: Vec<&str> = kept.iter().map(|k| k.id.as_str()).collect();
        assert_eq!(ids, ["r.1.1", "r.1.3"]);
        assert_eq!(kept[0].payload, p1);
        assert_eq!(kept[0].subject, "aep.ev.a.s");
        f.done("r.1.1");
        f.done("r.1.3");
        assert_eq!(std::fs::metadata(dir.join(OUTBOX_FILE)).unwrap().len(), 0);
        drop(f);
        let (_, kept) = OutboxFile::open(&dir, false).unwrap();
        assert!(kept.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
