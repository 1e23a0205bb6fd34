//! Relay configuration.
//!
//! Precedence: command-line flag, then `AEP_*` environment variable, then the `DEFAULT_*`
//! constant of this module (the binary's `--help` lists them). Every limit the relay
//! enforces is a field here, and reaching it always gets an answer (an HTTP status with a
//! JSON error body, or an in-band error frame), never a silent drop.

use crate::auth::Auth;
use std::net::SocketAddr;
#[cfg(feature = "tls")]
use std::sync::Arc;
use std::time::Duration;

mod history;
pub mod memory;

pub use history::{Fsync, HistoryConfig, DEFAULT_FSYNC, DEFAULT_MAX_OPEN_FILES};
pub use memory::{BudgetSource, MemoryBudget};

/// Default listen address (`AEP_LISTEN`): loopback, port 8787.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
/// Default replay buffer depth in Events per session (`AEP_BUFFER`), AEP-0003 §5.
pub const DEFAULT_BUFFER: usize = 10_000;
/// Default number of sessions held before the least-recently-written one is evicted
/// (`AEP_MAX_SESSIONS`).
pub const DEFAULT_MAX_SESSIONS: usize = 500;
/// Default largest request body in bytes (`AEP_MAX_BODY`): 16 MiB.
pub const DEFAULT_MAX_BODY: usize = 16 * 1024 * 1024;
/// Default most Events in one NDJSON batch (`AEP_MAX_BATCH`).
pub const DEFAULT_MAX_BATCH: usize = 10_000;
/// Default most resume positions in one `from` (`AEP_MAX_FROM`).
pub const DEFAULT_MAX_FROM: usize = 1_000;
/// Default largest HTTP request head in bytes (`AEP_MAX_HEAD`): 192 KiB, so that a
/// `GET /stream` naming [`DEFAULT_MAX_FROM`] positions fits and gets the `from` limit's
/// own answer (400 `limit-exceeded`) rather than 431. One position URL-encoded is
/// `%7B%22session%22%3A%22{session}%22%2C%22epoch%22%3A{epoch}%2C%22seq%22%3A{seq}%7D%2C`:
/// 63 bytes plus its session and numbers, so 167 bytes for a 64-byte session with
/// 20-digit (`u64::MAX`) epoch and seq; 1 000 of them are 167 000 bytes, and 16 KiB are
/// left for the request line, a filter and the other headers (183 384 bytes in all).
pub const DEFAULT_MAX_HEAD: usize = 192 * 1024;
/// Default heartbeat interval (`AEP_HEARTBEAT_SECS`): 15 seconds (AEP-0003 §3.3.4 asks
/// for at least one `: ping` every 30 s).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(15);
/// Default time a request head or body may take to arrive (`AEP_REQUEST_TIMEOUT_SECS`):
/// 30 seconds; slower peers get 408 (slowloris defence).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default idle time before an HTTP keep-alive connection with no request in flight is
/// closed (`AEP_IDLE_TIMEOUT_SECS`): 120 seconds.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Default most simultaneous connections (`AEP_MAX_CONNECTIONS`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 200_000;
/// Default time a graceful shutdown may take to flush every connection
/// (`AEP_SHUTDOWN_DEADLINE_SECS`): 10 seconds; past it the process exits non-zero.
pub const DEFAULT_SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);
/// Default accepts served per second (`AEP_ACCEPT_RATE`), a token bucket; 0: off. Off
/// by default: the bucket is shared by every peer and judged before credentials, so
/// one peer connecting fast would spend it for all, and a browser's `EventSource`
/// gives up on the 503 rather than retrying. An operator turns it on where a flood of
/// connections, not the consumers coming back, is the danger.
pub const DEFAULT_ACCEPT_RATE: u32 = 0;
/// Default accepts the bucket holds (`AEP_ACCEPT_BURST`): how many are served at once
/// after a quiet spell. As many as a relay's worth of consumers coming back together:
/// a browser's `EventSource` does not retry after a 503, so the bucket only refuses a
/// flood past what a restart brings back.
pub const DEFAULT_ACCEPT_BURST: u32 = 10_000;
/// Default least SSE reconnection delay sent in `retry:` (`AEP_SSE_RETRY_MS`).
pub const DEFAULT_SSE_RETRY: Duration = Duration::from_millis(1000);
/// Default spread added to it, uniformly at random per stream
/// (`AEP_SSE_RETRY_JITTER_MS`): consumers dropped together come back over this span.
pub const DEFAULT_SSE_RETRY_JITTER: Duration = Duration::from_millis(4000);
/// Default bound of one connection's output queue in bytes (`AEP_MAX_OUTPUT`): 8 MiB.
pub const DEFAULT_MAX_OUTPUT: usize = 8 * 1024 * 1024;
/// Default largest WebSocket message a peer may send, in bytes, after reassembling its
/// fragments (`AEP_MAX_WS_MESSAGE`): 1 MiB. Larger closes the socket with 1009.
pub const DEFAULT_MAX_WS_MESSAGE: usize = 1024 * 1024;
/// Default most concurrent subscriptions on one WebSocket (`AEP_MAX_SUBSCRIPTIONS`);
/// one more is refused in-band with `limit-exceeded` (AEP-0003 §6.5).
pub const DEFAULT_MAX_SUBSCRIPTIONS: usize = 256;
/// Default time a WebSocket peer may stay silent (no frame of any kind, `pong`
/// included) before the relay closes it (`AEP_WS_IDLE_TIMEOUT_SECS`): 90 seconds, the
/// AEP-0003 §3.5 #5 recommendation.
pub const DEFAULT_WS_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Everything the relay needs to run. `Config::default()` is a working loopback relay.
#[derive(Clone, Debug)]
pub struct Config {
    /// Address to listen on (`--listen`, `AEP_LISTEN`). Port 0 picks a free port; the
    /// start-up line says which.
    pub listen: SocketAddr,
    /// Replay buffer depth in Events, per session, i.e. per owning stream
    /// `(source, session)` (AEP-0001 §5.2) (`AEP_BUFFER`). 0 disables buffering.
    pub buffer_per_session: usize,
    /// Sessions (owning streams `(source, session)`) held at most (`AEP_MAX_SESSIONS`);
    /// the least-recently-written is evicted.
    pub max_sessions: usize,
    /// Largest request body in bytes (`AEP_MAX_BODY`); larger answers 413 before the
    /// body is read.
    pub max_body_bytes: usize,
    /// Most Events in one NDJSON batch (`AEP_MAX_BATCH`); more answers 413
    /// `too-many-events` and nothing is ingested.
    pub max_batch_events: usize,
    /// Most resume positions in one `from` (`AEP_MAX_FROM`); more answers 400.
    pub max_from_positions: usize,
    /// Largest HTTP request head in bytes; larger answers 431.
    pub max_head_bytes: usize,
    /// Interval between `: ping` comments on idle SSE streams, and between the
    /// `{"type":"ping","t":…}` frames sent on every WebSocket (AEP-0003 §3.3 #4, §3.5 #5).
    pub heartbeat: Duration,
    /// Time a request head or body may take to arrive before 408.
    pub request_timeout: Duration,
    /// Idle keep-alive connections are closed after this long.
    pub idle_timeout: Duration,
    /// Most simultaneous connections; more are answered 503 with `Retry-After`.
    pub max_connections: usize,
    /// Bound of one connection's queued output in bytes (backpressure, AEP-0003 §8.4):
    /// toward a consumer that falls behind, `debug` Events are dropped past half of it,
    /// `info` Events past three quarters, and a `notice`+ Event that does not fit it
    /// disconnects the consumer.
    pub max_output_bytes: usize,
    /// Largest WebSocket message in bytes, fragments reassembled (`AEP_MAX_WS_MESSAGE`);
    /// a larger one closes the socket with 1009 as soon as its header announces it, so
    /// a peer cannot make the relay buffer more than this per connection.
    pub max_ws_message_bytes: usize,
    /// Negotiate `permessage-deflate` (RFC 7692) with WebSocket clients that offer it
    /// (`--ws-deflate on|off`, `AEP_WS_DEFLATE`; on by default): Events are then sent
    /// compressed, each compressed once per capture level and shared by every such
    /// subscriber (`ws::deflate`), and compressed messages from clients are inflated
    /// within `max_ws_message_bytes`. Off: every offer is declined and RSV1 is a
    /// protocol error (1002).
    pub ws_deflate: bool,
    /// Most concurrent subscriptions on one WebSocket (`AEP_MAX_SUBSCRIPTIONS`); one more
    /// is answered `limit-exceeded` and the others keep running (AEP-0003 §6.5).
    pub max_subscriptions_per_conn: usize,
    /// A WebSocket peer silent for this long (no frame at all, not even the `pong` to
    /// the relay's `ping`) is sent `closing` and closed (`AEP_WS_IDLE_TIMEOUT_SECS`,
    /// AEP-0003 §3.5 #5). Must exceed `heartbeat`, or a peer that only answers pings
    /// would be closed.
    pub ws_idle_timeout: Duration,
    /// How long a graceful shutdown may take to flush every connection. Streams are
    /// ended spread over its first half, in a random order, so that their consumers do
    /// not reconnect (to the next relay) all at once.
    pub shutdown_deadline: Duration,
    /// Most open connections from one peer address (`AEP_MAX_CONNECTIONS_PER_IP`); more
    /// are answered 503 `too-many-connections-per-ip` with `Retry-After`, before their
    /// request is read. 0 (the default): no limit, since behind a reverse proxy every
    /// client has the proxy's address. Loopback peers are not exempt.
    pub max_connections_per_ip: usize,
    /// Accepts served per second, a token bucket holding `accept_burst`
    /// (`AEP_ACCEPT_RATE`); more are answered 503 `accept-rate-limited` with a
    /// `Retry-After` that spreads their return, before their request is read. 0: no
    /// limit.
    pub accept_rate: u32,
    /// Accepts the bucket holds (`AEP_ACCEPT_BURST`, at least 1 with a rate).
    pub accept_burst: u32,
    /// Least SSE reconnection delay sent in each stream's `retry:` field (WHATWG HTML,
    /// server-sent events; `AEP_SSE_RETRY_MS`).
    pub sse_retry: Duration,
    /// Spread added to `sse_retry`, uniformly at random per stream
    /// (`AEP_SSE_RETRY_JITTER_MS`).
    pub sse_retry_jitter: Duration,
    /// Browser origins allowed to read responses cross-origin (`--cors-origin`,
    /// `AEP_CORS_ORIGIN`, comma-separated; `*` for any). Empty: no CORS headers, so
    /// only same-origin pages (the status page) can read the relay from a browser.
    pub cors_origins: Vec<String>,
    /// Bearer tokens and their scopes (`AEP_TOKEN`, `AEP_TOKENS_FILE`); empty means
    /// emit and watch for every peer and no control (AEP-0003 §8.1, AEP-0004 §4.1).
    pub auth: Auth,
    /// TLS server configuration (`--tls-cert`, `--tls-key`); `None` serves plain HTTP.
    #[cfg(feature = "tls")]
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Permit a non-loopback listen address without both TLS and a token, for a
    /// TLS-terminating proxy in front (`--allow-insecure-off-host`). Off by default:
    /// AEP-0003 §8.1 requires TLS and a bearer token for any off-host binding.
    pub allow_insecure_off_host: bool,
    /// JSONL ingest sources (`--stdin`, `--ingest-file`; AEP-0003 §3.1). None by default.
    pub jsonl: crate::wire::jsonl::JsonlConfig,
    /// Durable session history (`--history DIR`; AEP-0003 §3.1.1–2). Off by default.
    pub history: Option<HistoryConfig>,
    /// The memory budget (`--max-memory SIZE`, `AEP_MAX_MEMORY`): what the relay may
    /// hold in held Events, eviction records, output queues, connection buffers, TLS and
    /// deflate state. Over it, held Events are evicted and the consumers holding the most
    /// output are dropped; valid ingest is never refused for it. `None` (the default):
    /// derived from the host when the relay binds ([`memory`]: half the cgroup limit,
    /// else half the physical memory); a [`Core`](crate::Core) made directly with `None`
    /// has no budget.
    pub max_memory: Option<MemoryBudget>,
    /// Cluster mode on NATS JetStream (`--cluster URL[,URL]`); `None`: a single relay.
    /// The core runs the cluster logic whenever this is set; the bridge thread that talks
    /// to the engine needs the `cluster` feature.
    pub cluster: Option<crate::cluster::ClusterConfig>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            listen: DEFAULT_LISTEN
                .parse()
                .expect("default listen address parses"),
            buffer_per_session: DEFAULT_BUFFER,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_body_bytes: DEFAULT_MAX_BODY,
            max_batch_events: DEFAULT_MAX_BATCH,
            max_from_positions: DEFAULT_MAX_FROM,
            max_head_bytes: DEFAULT_MAX_HEAD,
            heartbeat: DEFAULT_HEARTBEAT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_output_bytes: DEFAULT_MAX_OUTPUT,
            max_ws_message_bytes: DEFAULT_MAX_WS_MESSAGE,
            ws_deflate: true,
            max_subscriptions_per_conn: DEFAULT_MAX_SUBSCRIPTIONS,
            ws_idle_timeout: DEFAULT_WS_IDLE_TIMEOUT,
            shutdown_deadline: DEFAULT_SHUTDOWN_DEADLINE,
            max_connections_per_ip: 0,
            accept_rate: DEFAULT_ACCEPT_RATE,
            accept_burst: DEFAULT_ACCEPT_BURST,
            sse_retry: DEFAULT_SSE_RETRY,
            sse_retry_jitter: DEFAULT_SSE_RETRY_JITTER,
            cors_origins: Vec::new(),
            auth: Auth::default(),
            #[cfg(feature = "tls")]
            tls: None,
            allow_insecure_off_host: false,
            jsonl: Default::default(),
            history: None,
            max_memory: None,
            cluster: None,
        }
    }
}

/// A configuration value that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: `{field}`: {reason}")]
pub struct ConfigError {
    /// The field (and its environment variable) at fault.
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

impl Config {
    /// Whether TLS is configured.
    pub fn tls_enabled(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Checks that the values can work together.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("max_sessions (AEP_MAX_SESSIONS)", self.max_sessions),
            ("max_body_bytes (AEP_MAX_BODY)", self.max_body_bytes),
            ("max_batch_events (AEP_MAX_BATCH)", self.max_batch_events),
            ("max_from_positions (AEP_MAX_FROM)", self.max_from_positions),
            (
                "max_connections (AEP_MAX_CONNECTIONS)",
                self.max_connections,
            ),
            (
                "max_subscriptions_per_conn (AEP_MAX_SUBSCRIPTIONS)",
                self.max_subscriptions_per_conn,
            ),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(ConfigError {
                    field,
                    reason: "must be at least 1".into(),
                });
            }
        }
        if self.max_head_bytes < 512 {
            return Err(ConfigError {
                field: "max_head_bytes (AEP_MAX_HEAD)",
                reason: "must be at least 512 bytes".into(),
            });
        }
        if self.accept_rate > 0 && self.accept_burst == 0 {
            return Err(ConfigError {
                field: "accept_burst (AEP_ACCEPT_BURST)",
                reason: "must be at least 1 with an accept rate".into(),
            });
        }
        if self.max_output_bytes < 64 * 1024 {
            return Err(ConfigError {
                field: "max_output_bytes (AEP_MAX_OUTPUT)",
                reason: "must be at least 65536 bytes".into(),
            });
        }
        let off_host = !self.listen.ip().is_loopback();
        if off_host && !(self.tls_enabled() && self.auth.enabled()) && !self.allow_insecure_off_host
        {
            return Err(ConfigError {
                field: "listen (AEP_LISTEN)",
                reason: format!(
                    "{} is not a loopback address: an off-host binding needs TLS (--tls-cert, --tls-key) and a bearer token (AEP_TOKEN or AEP_TOKENS_FILE) (AEP-0003 §8.1); pass --allow-insecure-off-host only when a TLS-terminating proxy with authentication stands in front",
                    self.listen
                ),
            });
        }
        if let Some(bytes) = self.max_memory.and_then(|b| b.bytes) {
            if bytes < memory::MIN_MAX_MEMORY {
                return Err(ConfigError {
                    field: "max_memory (AEP_MAX_MEMORY)",
                    reason: "must be at least 1 MiB".into(),
                });
            }
        }
        if self.heartbeat.is_zero() {
            return Err(ConfigError {
                field: "heartbeat (AEP_HEARTBEAT_SECS)",
                reason: "must be positive".into(),
            });
        }
        if self.max_ws_message_bytes < 1024 {
            return Err(ConfigError {
                field: "max_ws_message_bytes (AEP_MAX_WS_MESSAGE)",
                reason: "must be at least 1024 bytes".into(),
            });
        }
        if self.ws_idle_timeout <= self.heartbeat {
            return Err(ConfigError {
                field: "ws_idle_timeout (AEP_WS_IDLE_TIMEOUT_SECS)",
                reason: format!(
                    "must exceed the heartbeat ({} s), or a peer that answers every ping is still closed as idle",
                    self.heartbeat.as_secs_f64()
                ),
            });
        }
        Ok(())
    }
}
