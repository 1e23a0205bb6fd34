//! What a host holds of a relay besides the relay itself: why it could not start, and a
//! handle that stops it from any thread.

use crate::config::ConfigError;
use mio::Waker;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Why the relay could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Binding the listener or creating the poller failed.
    #[error("cannot listen on {addr}: {source}")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// The history directory (`--history`) cannot be opened.
    #[error(transparent)]
    History(#[from] crate::io::history::HistoryError),
    /// A JSONL source (`--stdin`, `--ingest-file`) could not be started.
    #[error("cannot start JSONL ingest: {0}")]
    Jsonl(io::Error),
    /// Cluster mode (`--cluster`) could not be started: the bridge thread, or a build
    /// without the `cluster` feature.
    #[error("cannot start cluster mode: {0}")]
    Cluster(String),
}

/// Stops a running relay from any thread.
#[derive(Clone, Debug)]
pub struct StopHandle {
    pub(super) flag: Arc<AtomicBool>,
    pub(super) graceful: Arc<AtomicBool>,
    pub(super) waker: Arc<Waker>,
}

impl StopHandle {
    /// Asks the relay to stop at once; `run` returns after its current iteration
    /// without notifying consumers.
    pub fn stop(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }

    /// Asks the relay to shut down gracefully, as on SIGTERM: stop accepting, end every
    /// stream with a notice, flush, then `run` returns (see [`Relay::run`](super::Relay::run)).
    pub fn shutdown(&self) {
        self.graceful.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}
