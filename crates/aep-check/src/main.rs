//! The `aep-check` binary: the live conformance checker on its own, with exactly the
//! arguments, output and exit status of `aep-relay check` (see the crate's docs).

use clap::Parser;
use std::process::ExitCode;

/// Check a running AEP relay's conformance over the wire (AEP-0003 §10): discovery,
/// ingest, SSE and WebSocket delivery, resume, capture ceilings, roster, control;
/// PASS/FAIL/SKIP per check, exit status 0 only when nothing failed.
#[derive(Parser, Debug)]
#[command(name = "aep-check", version, about)]
struct Cli {
    #[command(flatten)]
    args: aep_check::CheckArgs,
}

fn main() -> ExitCode {
    aep_check::main_as("aep-check", Cli::parse().args)
}
