//! Fan-out: subscriptions, the index that finds candidate subscribers, delivery.
pub mod index;
