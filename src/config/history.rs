//! The history's configuration (`--history`, `--fsync`, `--history-max-open`): what
//! [`Config::history`](super::Config::history) holds. The files themselves are
//! [`crate::history`]'s; the configuration lives beside the rest of [`Config`](super::Config)
//! so that reading a configuration needs no I/O code.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Default most history files held open at once (`AEP_HISTORY_MAX_OPEN`): 256 (well
/// under the usual 1024 soft limit on descriptors, which the relay's sockets share).
pub const DEFAULT_MAX_OPEN_FILES: usize = 256;
/// Default durability policy (`AEP_FSYNC`): [`Fsync::Never`] (see [`crate::history`]
/// for why and for the measured cost of the others).
pub const DEFAULT_FSYNC: Fsync = Fsync::Never;
/// When appended Events are forced to stable storage (`--fsync`, `AEP_FSYNC`). See the
/// [history's docs](crate::history#durability-fsync) for what each survives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Fsync {
    /// Never `fdatasync`; the kernel writes back when it likes.
    Never,
    /// `fdatasync` each touched file once per batch, before the batch is answered.
    Batch,
    /// `fdatasync` after every Event.
    Always,
}

impl FromStr for Fsync {
    type Err = String;
    fn from_str(s: &str) -> Result<Fsync, String> {
        match s {
            "never" => Ok(Fsync::Never),
            "batch" => Ok(Fsync::Batch),
            "always" => Ok(Fsync::Always),
            _ => Err(format!(
                "fsync policy must be never, batch or always, got {s:?}"
            )),
        }
    }
}

impl fmt::Display for Fsync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fsync::Never => "never",
            Fsync::Batch => "batch",
            Fsync::Always => "always",
        })
    }
}

/// Where and how the history is kept (`--history`, `--fsync`, `--history-max-open`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryConfig {
    /// The history root (`--history`, `AEP_HISTORY`); created (mode `0700`) when absent.
    pub dir: PathBuf,
    /// Durability policy (`--fsync`, `AEP_FSYNC`); default [`DEFAULT_FSYNC`].
    pub fsync: Fsync,
    /// Most session files held open at once (`--history-max-open`,
    /// `AEP_HISTORY_MAX_OPEN`); the least recently used is closed beyond it. At least 1.
    pub max_open_files: usize,
}

impl HistoryConfig {
    /// A configuration for `dir` with the default policy and file cap.
    pub fn new(dir: impl Into<PathBuf>) -> HistoryConfig {
        HistoryConfig {
            dir: dir.into(),
            fsync: DEFAULT_FSYNC,
            max_open_files: DEFAULT_MAX_OPEN_FILES,
        }
    }
}
