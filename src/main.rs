//! The `aep-relay` binary: flags and `AEP_*` environment variables → [`Config`] →
//! [`Relay::run`]. Precedence: flag, then environment, then the documented default.

use aep_relay::config::{self, Config};
use aep_relay::Relay;
use clap::Parser;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

mod cli;

/// A relay for the Agent Event Protocol: HTTP POST ingest, SSE fan-out with attr-match
/// filters, per-session replay and capture ceilings.
#[derive(Parser, Debug)]
#[command(name = "aep-relay", version, about)]
struct Cli {
    /// Address to listen on; port 0 picks a free port (the start-up line says which).
    #[arg(long, env = "AEP_LISTEN", default_value = config::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Replay buffer depth, Events per session (AEP-0003 §5).
    #[arg(long, env = "AEP_BUFFER", default_value_t = config::DEFAULT_BUFFER)]
    buffer: usize,
    /// Sessions held before the least-recently-written is evicted.
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
    /// Bound of one connection's output queue in bytes (backpressure).
    #[arg(long, env = "AEP_MAX_OUTPUT", default_value_t = config::DEFAULT_MAX_OUTPUT)]
    max_output: usize,
    /// JSONL ingest and durable history (issue 5).
    #[command(flatten)]
    ingest: cli::IngestArgs,
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
            max_output_bytes: self.max_output,
            jsonl: self.ingest.jsonl(),
            history: self.ingest.history(),
        })
    }
}

fn init_logging() {
    let filter = std::env::var("AEP_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    env_logger::Builder::new()
        .parse_filters(&filter)
        .format_target(false)
        .init();
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
    let c = relay.config();
    eprintln!(
        "aep-relay listening on {} (TLS off; buffer {} Events/session, {} sessions; max body {} bytes, batch {} Events)",
        relay.local_addr(),
        c.buffer_per_session,
        c.max_sessions,
        c.max_body_bytes,
        c.max_batch_events
    );
    match relay.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aep-relay: {e}");
            ExitCode::FAILURE
        }
    }
}
