//! The binary's JSONL flags and its commands for people: `aep-relay tail`,
//! `aep-relay validate` (issue 5) and `aep-relay check` (issue 6, the live conformance
//! checker, the workspace's `aep-check` crate). Plain `aep-relay [FLAGS]` still runs the relay.

use aep_relay::history::{self, Fsync, HistoryConfig};
use aep_relay::jsonl::{self, JsonlConfig};
use clap::builder::TypedValueParser;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

pub mod tail;
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

/// Runs a command.
pub fn run(cmd: Command) -> ExitCode {
    match cmd {
        Command::Tail(a) => tail::run(a),
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
