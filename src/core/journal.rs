//! The durable-history port: where accepted Events are kept before they are answered.
//!
//! The core calls its [`Journal`] synchronously, after an ingest unit is validated and
//! before any Event of it is published or acknowledged: "persist before answering" is the
//! contract, so a refusal here refuses the whole unit (503 `history-unavailable` over
//! HTTP, an `error` frame over WebSocket) and nothing of it is published. The files
//! themselves (`aep_relay::history::History`) live outside the core.

use crate::store::Store;
use crate::wire::envelope::Event;

/// Keeps accepted Events durably.
pub trait Journal: std::fmt::Debug + Send {
    /// Keeps `events`, one ingest unit in ingest order, before they are published.
    /// `store` is the replay store as it is *before* these Events are admitted (an
    /// implementation may skip what it already holds: a retried Event).
    ///
    /// # Errors
    /// What failed (the operation and the OS error), as the `detail` of the refusal the
    /// emitter gets; none of `events` counts as accepted.
    fn append(&mut self, events: &[Event], store: &Store<Event>) -> Result<(), String>;
}

/// No durable history (the default): every append succeeds and keeps nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoJournal;

impl Journal for NoJournal {
    fn append(&mut self, _: &[Event], _: &Store<Event>) -> Result<(), String> {
        Ok(())
    }
}

/// A history that cannot keep anything (a full disk, an unwritable directory): every
/// append fails with `reason`. For tests of the refusal path and for hosts that want
/// ingest off while their own storage is down.
#[derive(Debug, Clone)]
pub struct UnavailableJournal {
    /// The `detail` every append fails with.
    pub reason: String,
}

impl Journal for UnavailableJournal {
    fn append(&mut self, _: &[Event], _: &Store<Event>) -> Result<(), String> {
        Err(self.reason.clone())
    }
}

/// Keeps the cluster outbox durably: the messages a clustered relay admitted locally
/// while the engine was away, until the stream has them. The core calls it synchronously,
/// before the Events are answered; the reactor opens the file
/// (`crate::io::outbox::OutboxFile`) and hands the core what a previous run left.
pub trait OutboxLog: std::fmt::Debug + Send {
    /// Keeps one message (its publish id, subject and payload) before it is answered.
    ///
    /// # Errors
    /// What failed; the Events are then refused (503 `history-unavailable`).
    fn keep(&mut self, id: &str, subject: &str, payload: &bytes::Bytes) -> Result<(), String>;
    /// The message `id` is in the stream: it need not be kept any more.
    fn done(&mut self, id: &str);
    /// Where the messages are kept, for the log.
    fn place(&self) -> String;
}
