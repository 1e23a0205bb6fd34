//! The binary's JSONL flags and its commands for people: `aep-relay tail`,
//! `aep-relay top`, `aep-relay validate` and `aep-relay check` (the live conformance checker, the
//! workspace's `aep-check` crate). Plain `aep-relay [FLAGS]` still runs the relay.

use aep_relay::history::{self, Fsync, HistoryConfig};
use aep_relay::wire::jsonl::{self, JsonlConfig};
use clap::builder::TypedValueParser;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The man pages and docs/configuration.md, generated and checked (`--tls-*` need `tls`).
#[cfg(all(test, feature = "tls"))]
mod docgen;
pub mod tail;
pub mod top;
pub mod validate;

/// The `--help` epilogue of the relay and of every command: the environment variables
/// read outside clap's `env` (the log filter, `init_logging` in main.rs).
pub const LOG_ENV_HELP: &str = "Logging (standard error): AEP_LOG, or RUST_LOG when AEP_LOG is unset, is an env_logger filter, e.g. `debug`, `warn,aep_relay=debug` (default `info`).";

/// Commands besides running the relay.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Follow a relay's SSE stream and print each Event as one JSONL line, exactly as it
    /// was ingested; reconnect and resume after a disconnect (no duplicate, no gap).
    #[command(after_help = LOG_ENV_HELP)]
    Tail(tail::TailArgs),
    /// Show the relay's connections live, the most lagging consumer first: how far
    /// behind, what is queued, what was dropped, on what filter (`GET /connections`,
    /// scope `admin`).
    #[command(after_help = LOG_ENV_HELP)]
    Top(top::TopArgs),
    /// Check the envelope of every line of JSONL files (standard input when none) with
    /// the relay's own validator; `file:line: detail` per invalid line, exit 1 if any.
    #[command(after_help = LOG_ENV_HELP)]
    Validate(validate::ValidateArgs),
    /// Check a running relay's conformance over the wire (AEP-0003 §10): discovery,
    /// ingest, SSE and WebSocket delivery, resume, capture ceilings, roster, control;
    /// PASS/FAIL/SKIP per check, exit status 0 only when nothing failed.
    #[command(after_help = LOG_ENV_HELP)]
    Check(aep_check::CheckArgs),
}

/// The HTTP client of a command that talks to the relay at `url` (`http://` or
/// `https://`; over TLS with rustls, trusting the system's roots or, with `cacert`,
/// exactly the certificates of that PEM file), reads timing out after `read_timeout`,
/// with the rest of `url` after its scheme.
///
/// # Errors
/// What is wrong with the URL or `cacert`, for the command to report.
pub fn client<'a>(
    url: &'a str,
    cacert: Option<&std::path::Path>,
    read_timeout: Duration,
) -> Result<(ureq::Agent, &'a str), String> {
    let (rest, https) = if let Some(r) = url.strip_prefix("http://") {
        (r, false)
    } else if let Some(r) = url.strip_prefix("https://") {
        (r, true)
    } else {
        return Err(format!("{url}: expected an http:// or https:// URL"));
    };
    let mut agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout_read(read_timeout);
    match (https, cacert) {
        (true, cacert) => {
            let c = aep_check::tls::Client::new(cacert).map_err(|e| e.to_string())?;
            agent = agent.tls_connector(std::sync::Arc::new(aep_check::tls::UreqConnector(c)));
        }
        (false, Some(_)) => return Err("--cacert is for https:// URLs".into()),
        (false, None) => {}
    }
    Ok((agent.build(), rest))
}

/// Runs a command.
pub fn run(cmd: Command) -> ExitCode {
    match cmd {
        Command::Tail(a) => tail::run(a),
        Command::Top(a) => top::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Check(a) => aep_check::main(a),
    }
}

/// JSONL ingest and durable history flags of the relay.
#[derive(Args, Debug)]
pub struct IngestArgs {
    /// Ingest Events from standard input, one per line (JSONL, AEP-0003 §3.1). The relay
    /// keeps running when it ends unless --exit-on-stdin-eof.
    #[arg(long)]
    stdin: bool,
    /// With --stdin: stop the relay once standard input has ended and all its Events are
    /// ingested.
    #[arg(long, requires = "stdin")]
    exit_on_stdin_eof: bool,
    /// Ingest a JSONL file of Events and keep following it as it grows, like `tail -F`
    /// (truncation and replacement are noticed). Repeatable.
    #[arg(long = "ingest-file", value_name = "PATH")]
    ingest_files: Vec<PathBuf>,
    /// Milliseconds between two looks at a followed file that had nothing new.
    #[arg(long, env = "AEP_FOLLOW_INTERVAL_MS", value_name = "MS",
          default_value_t = jsonl::DEFAULT_POLL_INTERVAL.as_millis() as u64)]
    follow_interval_ms: u64,
    /// Keep every session-scoped Event in DIR/{agent}/{session}.jsonl (names encoded) and
    /// rebuild the replay buffers from it at start.
    #[arg(long, env = "AEP_HISTORY", value_name = "DIR")]
    history: Option<PathBuf>,
    /// When history appends are forced to disk: never (survives relay crashes, not power
    /// loss); batch (each request or chunk of lines, before it is answered); always (each
    /// Event). batch/always cost a device flush each (milliseconds) on the relay's thread.
    #[arg(long, env = "AEP_FSYNC", value_name = "POLICY", default_value_t = history::DEFAULT_FSYNC,
          value_parser = clap::builder::PossibleValuesParser::new(["never", "batch", "always"])
              .map(|s| s.parse::<Fsync>().expect("a listed value")))]
    fsync: Fsync,
    /// Most history files held open at once (least recently used closed beyond).
    #[arg(long, env = "AEP_HISTORY_MAX_OPEN", value_name = "N",
          default_value_t = history::DEFAULT_MAX_OPEN_FILES)]
    history_max_open: usize,
}

impl IngestArgs {
    /// The JSONL sources.
    pub fn jsonl(&self) -> JsonlConfig {
        JsonlConfig {
            stdin: self.stdin,
            exit_on_stdin_eof: self.exit_on_stdin_eof,
            files: self.ingest_files.clone(),
            poll_interval: Duration::from_millis(self.follow_interval_ms.max(1)),
        }
    }

    /// The history, when `--history` was given.
    pub fn history(&self) -> Option<HistoryConfig> {
        self.history.as_ref().map(|dir| HistoryConfig {
            dir: dir.clone(),
            fsync: self.fsync,
            max_open_files: self.history_max_open,
        })
    }
}

/// Cluster mode flags: several relays joined by NATS JetStream.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// Join a cluster through these NATS servers (comma-separated `nats://host:port`).
    /// Without it the relay runs alone.
    #[arg(
        long,
        env = "AEP_CLUSTER",
        value_name = "URL[,URL]",
        value_delimiter = ','
    )]
    cluster: Vec<String>,
    /// This relay's id in the cluster, unique among the relays (default: the host name
    /// and the listen port; with port 0, the host name and the process id).
    #[arg(long, env = "AEP_RELAY_ID", value_name = "ID")]
    relay_id: Option<String>,
    /// The JetStream stream holding every Event (created when missing).
    #[arg(long, env = "AEP_CLUSTER_STREAM", value_name = "NAME",
          default_value = aep_relay::cluster::DEFAULT_STREAM)]
    cluster_stream: String,
    /// The first token of every subject the relay uses.
    #[arg(long, env = "AEP_CLUSTER_PREFIX", value_name = "PREFIX",
          default_value = aep_relay::cluster::DEFAULT_PREFIX)]
    cluster_prefix: String,
    /// A token for the NATS servers.
    #[arg(long, env = "AEP_CLUSTER_TOKEN", value_name = "TOKEN", conflicts_with_all = ["cluster_user", "cluster_creds"])]
    cluster_token: Option<String>,
    /// A user for the NATS servers (with --cluster-password).
    #[arg(
        long,
        env = "AEP_CLUSTER_USER",
        value_name = "USER",
        requires = "cluster_password"
    )]
    cluster_user: Option<String>,
    /// The password of --cluster-user.
    #[arg(
        long,
        env = "AEP_CLUSTER_PASSWORD",
        value_name = "PASSWORD",
        requires = "cluster_user"
    )]
    cluster_password: Option<String>,
    /// A NATS credentials file (`.creds`).
    #[arg(
        long,
        env = "AEP_CLUSTER_CREDS",
        value_name = "FILE",
        conflicts_with = "cluster_user"
    )]
    cluster_creds: Option<PathBuf>,
    /// PEM root certificates to verify the NATS servers' TLS certificates with.
    #[arg(long, env = "AEP_CLUSTER_TLS_CA", value_name = "FILE")]
    cluster_tls_ca: Option<PathBuf>,
    /// While the engine is unreachable: `local` keeps serving (local fan-out, a bounded
    /// outbox published on reconnect); `refuse` answers ingest 503 cluster-unavailable.
    #[arg(long, env = "AEP_CLUSTER_DEGRADE", value_name = "MODE", default_value = "local",
          value_parser = ["local", "refuse"])]
    cluster_degrade: String,
    /// Most Events kept in the outbox while degraded.
    #[arg(long, env = "AEP_CLUSTER_OUTBOX", value_name = "N",
          default_value_t = aep_relay::cluster::DEFAULT_OUTBOX)]
    cluster_outbox: usize,
    /// Seconds a claim lives in the claims bucket without a refresh (refreshed every third).
    #[arg(long, env = "AEP_CLUSTER_CLAIM_TTL_SECS", value_name = "SECS",
          default_value_t = aep_relay::cluster::DEFAULT_CLAIM_TTL.as_secs())]
    cluster_claim_ttl_secs: u64,
}

impl ClusterArgs {
    /// The cluster configuration, or `None` without --cluster. `listen_port` names the
    /// relay when --relay-id is not given.
    pub fn config(
        &self,
        listen_port: u16,
    ) -> Result<Option<aep_relay::cluster::ClusterConfig>, String> {
        use aep_relay::cluster::{ClusterAuth, ClusterConfig, Degrade};
        let urls: Vec<String> = self
            .cluster
            .iter()
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            return Ok(None);
        }
        if !cfg!(feature = "cluster") {
            return Err(
                "--cluster needs the `cluster` feature, which this build leaves out".into(),
            );
        }
        let relay_id = match &self.relay_id {
            Some(id) if id.is_empty() => return Err("--relay-id must not be empty".into()),
            Some(id) => id.clone(),
            None => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_owned())
                    .unwrap_or_else(|_| "relay".into());
                // Port 0 names no relay: two would share an id.
                match listen_port {
                    0 => format!("{host}-pid{}", std::process::id()),
                    p => format!("{host}-{p}"),
                }
            }
        };
        let auth = match (&self.cluster_token, &self.cluster_user, &self.cluster_creds) {
            (Some(t), _, _) => ClusterAuth::Token(t.clone()),
            (_, Some(u), _) => ClusterAuth::UserPassword {
                user: u.clone(),
                password: self.cluster_password.clone().unwrap_or_default(),
            },
            (_, _, Some(c)) => ClusterAuth::Credentials(c.clone()),
            _ => ClusterAuth::None,
        };
        if self.cluster_claim_ttl_secs == 0 {
            return Err("--cluster-claim-ttl-secs must be at least 1".into());
        }
        Ok(Some(ClusterConfig {
            urls,
            relay_id,
            stream: self.cluster_stream.clone(),
            prefix: self.cluster_prefix.clone(),
            auth,
            tls_ca: self.cluster_tls_ca.clone(),
            claim_ttl: Duration::from_secs(self.cluster_claim_ttl_secs),
            degrade: if self.cluster_degrade == "refuse" {
                Degrade::Refuse
            } else {
                Degrade::Local
            },
            outbox: self.cluster_outbox,
            ..ClusterConfig::default()
        }))
    }
}
