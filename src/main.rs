//! The `aep-relay` binary: flags and `AEP_*` environment variables → [`Config`] →
//! [`Relay::run`]. Precedence: flag, then environment, then the documented default.
//!
//! Subcommands (`src/cli`) do something else instead of running the relay: `tail`,
//! `validate`, and `check URL`, which checks a running relay's conformance over the wire
//! (the workspace's `aep-check` crate, [`aep_check`]).
//!
//! SIGTERM and SIGINT are caught here, not in the library: a thread waits for them and
//! calls [`StopHandle::shutdown`], a graceful shutdown (the relay's `run` then returns
//! once every connection is flushed, and the process exits 0). SIGHUP reads the
//! `--tokens-file` and `--jwt-key` files again, so tokens and JWT keys rotate without a
//! restart.

use aep_relay::auth::{Auth, JwtExpect, JwtHandle, JwtKeys, TokenSpec, TokensHandle};
use aep_relay::config::{self, Config};
#[cfg(feature = "tls")]
use aep_relay::tls;
use aep_relay::{Relay, StopHandle};
use clap::builder::TypedValueParser as _;
use clap::Parser;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

mod cli;

/// A relay for the Agent Event Protocol: HTTP POST ingest, SSE fan-out with attr-match
/// filters, per-session replay and capture ceilings.
#[derive(Parser, Debug)]
#[command(name = "aep-relay", version, about, after_help = cli::LOG_ENV_HELP)]
struct Cli {
    /// Address to listen on; port 0 picks a free port (the start-up line says which).
    #[arg(long, env = "AEP_LISTEN", default_value = config::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Replay buffer depth, Events per session: per owning stream (source, session)
    /// (AEP-0001 §5.2, AEP-0003 §5).
    #[arg(long, env = "AEP_BUFFER", default_value_t = config::DEFAULT_BUFFER)]
    buffer: usize,
    /// Sessions (owning streams) held before the least-recently-written is evicted.
    #[arg(long, env = "AEP_MAX_SESSIONS", default_value_t = config::DEFAULT_MAX_SESSIONS)]
    max_sessions: usize,
    /// Largest request body in bytes (413 above).
    #[arg(long, env = "AEP_MAX_BODY", default_value_t = config::DEFAULT_MAX_BODY)]
    max_body: usize,
    /// Most Events in one NDJSON batch (413 `too-many-events` above).
    #[arg(long, env = "AEP_MAX_BATCH", default_value_t = config::DEFAULT_MAX_BATCH)]
    max_batch: usize,
    /// Most resume positions in one `from`.
    #[arg(long, env = "AEP_MAX_FROM", default_value_t = config::DEFAULT_MAX_FROM)]
    max_from: usize,
    /// Largest HTTP request head in bytes (431 above).
    #[arg(long, env = "AEP_MAX_HEAD", default_value_t = config::DEFAULT_MAX_HEAD)]
    max_head: usize,
    /// Seconds between heartbeats on idle streams.
    #[arg(long, env = "AEP_HEARTBEAT_SECS", default_value_t = config::DEFAULT_HEARTBEAT.as_secs_f64())]
    heartbeat_secs: f64,
    /// Seconds a request head or body may take to arrive (408 after).
    #[arg(long, env = "AEP_REQUEST_TIMEOUT_SECS", default_value_t = config::DEFAULT_REQUEST_TIMEOUT.as_secs_f64())]
    request_timeout_secs: f64,
    /// Seconds an idle keep-alive connection is kept.
    #[arg(long, env = "AEP_IDLE_TIMEOUT_SECS", default_value_t = config::DEFAULT_IDLE_TIMEOUT.as_secs_f64())]
    idle_timeout_secs: f64,
    /// Most simultaneous connections (503 with Retry-After above).
    #[arg(long, env = "AEP_MAX_CONNECTIONS", default_value_t = config::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Most open connections from one peer address (503 with Retry-After above, the
    /// request unread); 0: no limit. Loopback peers are not exempt: behind a reverse
    /// proxy every client has the proxy's address, so leave it 0 there.
    #[arg(long, env = "AEP_MAX_CONNECTIONS_PER_IP", default_value_t = 0)]
    max_connections_per_ip: usize,
    /// Accepts served per second, a token bucket (503 with a Retry-After that spreads
    /// the refused peers' return, the request unread); 0: no limit.
    #[arg(long, env = "AEP_ACCEPT_RATE", default_value_t = config::DEFAULT_ACCEPT_RATE)]
    accept_rate: u32,
    /// Accepts the bucket holds: how many are served at once after a quiet spell.
    #[arg(long, env = "AEP_ACCEPT_BURST", default_value_t = config::DEFAULT_ACCEPT_BURST)]
    accept_burst: u32,
    /// Least SSE reconnection delay in ms, sent in each stream's `retry:` field.
    #[arg(long, env = "AEP_SSE_RETRY_MS", default_value_t = config::DEFAULT_SSE_RETRY.as_millis() as u64)]
    sse_retry_ms: u64,
    /// Most ms added to --sse-retry-ms, drawn uniformly per stream, so consumers dropped
    /// together reconnect spread out.
    #[arg(long, env = "AEP_SSE_RETRY_JITTER_MS", default_value_t = config::DEFAULT_SSE_RETRY_JITTER.as_millis() as u64)]
    sse_retry_jitter_ms: u64,
    /// Memory budget: bytes, or with a KiB, MiB or GiB suffix. Held Events are evicted
    /// and the consumers holding the most output dropped to stay under it; ingest is
    /// never refused for it. Default: half the cgroup memory limit, else half the
    /// physical memory.
    #[arg(long, env = "AEP_MAX_MEMORY", value_name = "SIZE", value_parser = config::memory::parse_size)]
    max_memory: Option<usize>,
    /// Bound of one connection's output queue in bytes (backpressure: toward a slow
    /// consumer, debug Events are dropped past half of it, info past three quarters).
    #[arg(long, env = "AEP_MAX_OUTPUT", default_value_t = config::DEFAULT_MAX_OUTPUT)]
    max_output: usize,
    /// Largest WebSocket message in bytes, fragments reassembled (close 1009 above).
    #[arg(long, env = "AEP_MAX_WS_MESSAGE", default_value_t = config::DEFAULT_MAX_WS_MESSAGE)]
    max_ws_message: usize,
    /// WebSocket compression (permessage-deflate, RFC 7692) for clients that offer it:
    /// each Event compressed once and shared by every compressing subscriber.
    #[arg(long, env = "AEP_WS_DEFLATE", value_name = "on|off", default_value = "on",
          action = clap::ArgAction::Set,
          value_parser = clap::builder::PossibleValuesParser::new(["on", "off"])
              .map(|s| s == "on"))]
    ws_deflate: bool,
    /// Most concurrent subscriptions on one WebSocket (`limit-exceeded` above).
    #[arg(long, env = "AEP_MAX_SUBSCRIPTIONS", default_value_t = config::DEFAULT_MAX_SUBSCRIPTIONS)]
    max_subscriptions: usize,
    /// Seconds a WebSocket peer may stay silent (not even a `pong`) before it is closed.
    #[arg(long, env = "AEP_WS_IDLE_TIMEOUT_SECS", default_value_t = config::DEFAULT_WS_IDLE_TIMEOUT.as_secs_f64())]
    ws_idle_timeout_secs: f64,
    /// Seconds a graceful shutdown (SIGTERM, SIGINT) may take to flush every connection;
    /// the streams are ended spread over its first half.
    #[arg(long, env = "AEP_SHUTDOWN_DEADLINE_SECS", default_value_t = config::DEFAULT_SHUTDOWN_DEADLINE.as_secs_f64())]
    shutdown_deadline_secs: f64,
    /// Browser origins allowed cross-origin (comma-separated, `*` for any).
    #[arg(long, env = "AEP_CORS_ORIGIN", value_delimiter = ',')]
    cors_origin: Vec<String>,
    /// Bearer token with every scope (emit, watch, control, admin). A tokens file that
    /// also holds it is refused (at start-up, and on SIGHUP).
    #[arg(long, env = "AEP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File of scoped tokens: one `TOKEN SCOPE[,SCOPE…] [KEY=VALUE…]` per line (scopes
    /// emit, watch, control, admin; grants name, filter, capture, agent, commands, targets).
    /// Read again on SIGHUP: new requests are checked against its tokens then, open
    /// streams keep the grant they were admitted with; a file that does not parse is
    /// logged and the tokens in use are kept.
    #[arg(long, env = "AEP_TOKENS_FILE")]
    tokens_file: Option<std::path::PathBuf>,
    /// Verify JWT bearer tokens with the keys of this file: an HS256 secret (at least 32
    /// bytes), an RS256 or ES256 public key (PEM) or a JWKS. Read again on SIGHUP.
    #[arg(long, env = "AEP_JWT_KEY", value_name = "FILE")]
    jwt_key: Option<std::path::PathBuf>,
    /// With --jwt-key: accept only JWTs whose `aud` names this audience (RFC 7519
    /// §4.1.3); a token without `aud` is refused.
    #[arg(long, env = "AEP_JWT_AUDIENCE", requires = "jwt_key")]
    jwt_audience: Option<String>,
    /// With --jwt-key: accept only JWTs whose `iss` is this issuer (RFC 7519 §4.1.1); a
    /// token without `iss` is refused.
    #[arg(long, env = "AEP_JWT_ISSUER", requires = "jwt_key")]
    jwt_issuer: Option<String>,
    /// PEM certificate chain: serve HTTPS, SSE and WSS (needs --tls-key).
    #[cfg(feature = "tls")]
    #[arg(long, env = "AEP_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key for --tls-cert.
    #[cfg(feature = "tls")]
    #[arg(long, env = "AEP_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Allow a non-loopback --listen without TLS and a token (a TLS-terminating proxy
    /// stands in front). AEP-0003 §8.1 requires both for any off-host binding.
    #[arg(long, env = "AEP_ALLOW_INSECURE_OFF_HOST")]
    allow_insecure_off_host: bool,
    /// JSONL ingest and durable history.
    #[command(flatten)]
    ingest: cli::IngestArgs,
    /// Cluster mode on NATS JetStream.
    #[command(flatten)]
    cluster: cli::ClusterArgs,
    /// `tail`, `validate`; none runs the relay.
    #[command(subcommand)]
    command: Option<cli::Command>,
}

fn secs(v: f64, name: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| format!("{name} must be a non-negative number of seconds"))
}

impl Cli {
    fn config(&self) -> Result<Config, String> {
        Ok(Config {
            listen: self.listen,
            buffer_per_session: self.buffer,
            max_sessions: self.max_sessions,
            max_body_bytes: self.max_body,
            max_batch_events: self.max_batch,
            max_from_positions: self.max_from,
            max_head_bytes: self.max_head,
            heartbeat: secs(self.heartbeat_secs, "--heartbeat-secs")?,
            request_timeout: secs(self.request_timeout_secs, "--request-timeout-secs")?,
            idle_timeout: secs(self.idle_timeout_secs, "--idle-timeout-secs")?,
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            accept_rate: self.accept_rate,
            accept_burst: self.accept_burst,
            sse_retry: Duration::from_millis(self.sse_retry_ms),
            sse_retry_jitter: Duration::from_millis(self.sse_retry_jitter_ms),
            max_output_bytes: self.max_output,
            max_ws_message_bytes: self.max_ws_message,
            ws_deflate: self.ws_deflate,
            max_subscriptions_per_conn: self.max_subscriptions,
            ws_idle_timeout: secs(self.ws_idle_timeout_secs, "--ws-idle-timeout-secs")?,
            shutdown_deadline: secs(self.shutdown_deadline_secs, "--shutdown-deadline-secs")?,
            cors_origins: self.cors_origin.clone(),
            auth: self.auth()?,
            #[cfg(feature = "tls")]
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(c), Some(k)) => Some(tls::server_config(c, k).map_err(|e| e.to_string())?),
                _ => None,
            },
            allow_insecure_off_host: self.allow_insecure_off_host,
            jsonl: self.ingest.jsonl(),
            history: self.ingest.history(),
            max_memory: self.max_memory.map(config::MemoryBudget::flag),
            // The stream keeps per subject at least what a relay keeps per session, so a
            // relay that rebuilds from it holds what the others hold (AEP-0003 §5), and
            // twice that (at least the default), so a consumer that falls behind on one
            // session does not find its next messages already discarded.
            cluster: self.cluster.config(self.listen.port())?.map(|mut c| {
                let per_subject = self.buffer.saturating_mul(2) as i64;
                c.max_msgs_per_subject = per_subject.max(c.max_msgs_per_subject);
                c
            }),
        })
    }

    /// What `--jwt-audience` and `--jwt-issuer` ask of every JWT.
    fn jwt_expect(&self) -> JwtExpect {
        JwtExpect {
            audience: self.jwt_audience.clone(),
            issuer: self.jwt_issuer.clone(),
        }
    }

    fn auth(&self) -> Result<Auth, String> {
        if self.token.as_deref() == Some("") {
            return Err("--token / AEP_TOKEN must not be empty".into());
        }
        let auth = match &self.tokens_file {
            None => Auth::with_tokens(self.token.as_deref(), &[]),
            Some(path) => Auth::with_tokens_file(self.token.as_deref(), &read_tokens_file(path)?)
                .map_err(|e| format!("tokens file {}: {e}", path.display()))?,
        };
        Ok(match &self.jwt_key {
            None => auth,
            Some(path) => auth.with_jwt(JwtHandle::new(read_jwt_key(path, &self.jwt_expect())?)),
        })
    }
}

/// Reads and parses the `--tokens-file` file.
fn read_tokens_file(path: &std::path::Path) -> Result<Vec<TokenSpec>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read tokens file {}: {e}", path.display()))?;
    Auth::parse_tokens_file(path, &text).map_err(|e| e.to_string())
}

/// Reads the `--jwt-key` file.
fn read_jwt_key(path: &std::path::Path, expect: &JwtExpect) -> Result<JwtKeys, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("cannot read --jwt-key {}: {e}", path.display()))?;
    JwtKeys::parse(&bytes)
        .map(|keys| keys.expecting(expect))
        .map_err(|e| format!("--jwt-key {}: {e}", path.display()))
}

/// The log filter when neither `AEP_LOG` nor `RUST_LOG` is set.
const DEFAULT_LOG_FILTER: &str = "info";

fn init_logging() {
    let filter = std::env::var("AEP_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into());
    env_logger::Builder::new()
        .parse_filters(&filter)
        .format_target(false)
        .init();
}

/// The files SIGHUP reads again, each with the handle its contents are swapped into.
#[derive(Default)]
struct Reload {
    /// `--tokens-file`.
    tokens: Option<(std::path::PathBuf, TokensHandle)>,
    /// `--jwt-key`, and what its tokens must name (`--jwt-audience`, `--jwt-issuer`).
    jwt: Option<(std::path::PathBuf, JwtHandle)>,
    jwt_expect: JwtExpect,
}

impl Reload {
    /// Reads every file again and swaps in what parses; a file that does not is logged
    /// (its line number and reason, never a token) and what is in use is kept.
    fn reload(&self) {
        if self.tokens.is_none() && self.jwt.is_none() {
            log::info!("received SIGHUP: no --tokens-file or --jwt-key to read again");
        }
        if let Some((path, tokens)) = &self.tokens {
            match read_tokens_file(path) {
                // In use before it is said: whoever reads the line may count on the
                // new tokens.
                Ok(specs) => match tokens.replace(&specs) {
                    Ok(()) => log::info!(
                        "received SIGHUP: --tokens-file {} read again, {} tokens",
                        path.display(),
                        specs.len()
                    ),
                    Err(e) => log::warn!(
                        "received SIGHUP: tokens file {}: {e}; the tokens in use are kept",
                        path.display()
                    ),
                },
                Err(e) => log::warn!("received SIGHUP: {e}; the tokens in use are kept"),
            }
        }
        if let Some((path, jwt)) = &self.jwt {
            match read_jwt_key(path, &self.jwt_expect) {
                Ok(keys) => {
                    let n = keys.len();
                    jwt.replace(keys);
                    log::info!(
                        "received SIGHUP: --jwt-key {} read again, {n} keys",
                        path.display()
                    );
                }
                Err(e) => log::warn!("received SIGHUP: {e}; the keys in use are kept"),
            }
        }
    }
}

/// Starts the thread that turns SIGTERM and SIGINT into [`StopHandle::shutdown`]: each
/// one asks for a graceful shutdown (stop accepting, end every stream with
/// `: shutting-down`, flush within the shutdown deadline). SIGHUP reads the files of
/// `reload` again ([`Reload::reload`]). Once installed, the signals no longer terminate
/// the process by their default action.
///
/// # Errors
/// When the handlers cannot be installed or the thread cannot be started.
fn handle_signals(stop: StopHandle, reload: Reload) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if sig == SIGHUP {
                    reload.reload();
                    continue;
                }
                let name = if sig == SIGTERM { "SIGTERM" } else { "SIGINT" };
                log::info!("received signal {sig} ({name}): shutting down");
                stop.shutdown();
            }
        })?;
    Ok(())
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    init_logging();
    if let Some(cmd) = cli.command.take() {
        return cli::run(cmd);
    }
    let config = match cli.config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("aep-relay: {e}");
            return ExitCode::from(2);
        }
    };
    let mut relay = match Relay::bind(config) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("aep-relay: {e}");
            return ExitCode::from(2);
        }
    };
    // Before the start-up line: whoever reads it may signal the relay at once.
    let auth = &relay.config().auth;
    let reload = Reload {
        tokens: cli.tokens_file.clone().map(|p| (p, auth.tokens().clone())),
        jwt: cli.jwt_key.clone().zip(auth.jwt().cloned()),
        jwt_expect: cli.jwt_expect(),
    };
    if let Err(e) = handle_signals(relay.stop_handle(), reload) {
        eprintln!("aep-relay: cannot install signal handlers: {e}");
        return ExitCode::FAILURE;
    }
    let c = relay.config();
    let posture = if c.auth.enabled() {
        "auth: bearer tokens required"
    } else {
        "auth: none, emit, watch and admin open to every peer, control refused (set AEP_TOKEN to enable control)"
    };
    eprintln!(
        "aep-relay listening on {} (TLS {}; {posture}; buffer {} Events/session, {} sessions; max body {} bytes, batch {} Events; memory budget {})",
        relay.local_addr(),
        if c.tls_enabled() { "on" } else { "off" },
        c.buffer_per_session,
        c.max_sessions,
        c.max_body_bytes,
        c.max_batch_events,
        c.max_memory.map_or_else(|| "unlimited".into(), |b| b.to_string()),
    );
    match relay.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aep-relay: {e}");
            ExitCode::FAILURE
        }
    }
}
