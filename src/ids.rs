//! The keys the layers share: a connection's ([`ConnId`]) and a subscription's
//! ([`SubId`]). A leaf: it names no other module, so session claims (`control`), the
//! subscription model (`fanout`) and the core can all hold them without depending on one
//! another. Both are re-exported where they are used: `aep_relay::ConnId`,
//! `aep_relay::core::ConnId`, `aep_relay::fanout::SubId`.

/// A connection of the core. The reactor keeps its socket under the same id; ids of
/// closed connections are reused (after [`Output::Close`](crate::core::Output::Close)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub(crate) usize);

impl ConnId {
    /// The slot number: dense from 0, below the number of connections ever open at once.
    pub fn index(self) -> usize {
        self.0
    }
}

impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A live subscription's key in the core's subscription table: the SSE stream's one
/// subscription, or one of a WebSocket's (AEP-0003 §6.5). Keys of removed subscriptions
/// are reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubId(pub(crate) usize);

impl SubId {
    /// The slot number (for logs and metrics labels).
    pub fn index(self) -> usize {
        self.0
    }
}
