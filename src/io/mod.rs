//! The I/O layer: everything that touches a socket, a file, a thread or the clock, around
//! the sans-IO [`Core`](crate::core::Core).
//!
//! - [`reactor`]: the mio loop ([`Relay`](reactor::Relay)): accept, read with a budget,
//!   hand bytes to the core, write what it announces, sleep until its next deadline;
//! - [`transport`]: one socket, plain TCP or TLS, behind one read/write interface;
//! - [`tls`] (feature `tls`): rustls over a socket, and the server configuration from PEM;
//! - [`feed`]: the threads that read standard input and follow files (`--stdin`,
//!   `--ingest-file`), and the reactor's end of their channel;
//! - [`history`]: the history files (`--history`): the core's `Journal`, and the rebuild
//!   of the replay buffers at start;
//! - [`host`]: the cgroup memory limit and the physical memory, for the default memory
//!   budget;
//! - [`outbox`]: the cluster outbox file, the core's `OutboxLog`;
//! - [`bridge`] (feature `cluster`): the thread that speaks NATS JetStream for cluster
//!   mode.
//!
//! Nothing below this layer names it: the core and the building blocks are driven with
//! bytes and `now` (`.ci/sans-io.sh`, `.ci/module-cycles.py`). What embedders use is
//! re-exported at the crate root: [`Relay`](reactor::Relay), `aep_relay::history`,
//! `aep_relay::tls` and `aep_relay::bridge`.

#[cfg(feature = "cluster")]
pub mod bridge;
pub(crate) mod feed;
pub mod history;
pub(crate) mod host;
pub(crate) mod outbox;
pub(crate) mod reactor;
#[cfg(feature = "tls")]
pub mod tls;
pub(crate) mod transport;
