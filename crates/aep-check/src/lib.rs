//! `aep-check`: a live conformance checker for any AEP relay, over the wire
//! (AEP-0001 §10, AEP-0003 §10, AEP-0004 §7).
//!
//! It runs as `aep-relay check URL …` (the relay's binary depends on this crate) or on
//! its own as `aep-check URL …` (`cargo run -p aep-check -- URL …`), with the same
//! arguments ([`CheckArgs`]), output and exit status. As a library, [`run`] returns a
//! [`Report`]. It depends on nothing of the relay: it checks the relay only through what
//! the relay sends.
//!
//! Frames and connection behaviour are not fixture-shaped, so AEP-0003 §10 puts them in
//! a live checker. This one talks to a running relay exactly as a client would: HTTP
//! POST, SSE and the WebSocket binding, with bounded timeouts on every wait. It needs
//! nothing from the relay but its URL (and a token when the relay requires one), so it
//! checks this relay and any other.
//!
//! ```text
//! aep-relay check http://127.0.0.1:8787 [--token T] [--evict] [--json PATH|-] [--timeout SECS]
//! aep-relay check https://relay.example:8443 [--cacert FILE] …
//! ```
//!
//! # What it checks
//!
//! Each check cites the section it proves and ends PASS, FAIL or SKIP (a SKIP says why:
//! the relay does not advertise the feature, or the check needs `--token` / `--evict`).
//! The list, in order, is [`CHECKS`]: the discovery document; the version gate; invalid
//! Events; batch ingest with filtered SSE delivery; resume; capture ceilings; replay-all;
//! the WebSocket `hello` exchange, subscribe refusals and forward compatibility; resume
//! and ceilings over WebSocket; the roster; control gating and routing; and with
//! `--evict` buffer eviction on both bindings.
//!
//! # What it sends
//!
//! Only synthetic Events (agent `aep-relay-check`), only in sessions named
//! `live-{unix-ms}-{pid}-{purpose}`, unique per run, so a shared relay's real sessions
//! are never touched. `--evict` floods one such session past the advertised
//! `replay.buffer`, which on a relay with a *global* buffer also evicts other sessions:
//! run it against a relay started with a small buffer for the occasion (AEP-0003 §10).
//!
//! # Output
//!
//! One line per check, then the summary line `N passed, N failed, N skipped`. With
//! `--json PATH` the report also goes to `PATH` as one JSON object ([`Report::to_json`]);
//! with `--json -` it goes to standard output and the lines to standard error. The exit
//! status is 0 only when no check failed; 2 for a usage error (a URL the checker cannot
//! use, a `--cacert` that is not a PEM certificate file, a report it cannot write) and
//! for an `https://` relay whose TLS handshake fails for a reason no retry fixes (its
//! certificate is not trusted or not valid for the name, it does not speak TLS): one
//! line, and no check runs.
//!
//! # TLS
//!
//! An `https://` URL is checked over HTTPS and WSS with rustls ([`tls`]): the system's
//! root certificates by default, or exactly those of `--cacert FILE` (a private CA, or
//! the relay's self-signed certificate). The name in the URL must be one the
//! certificate lists.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

mod client;
mod suite;
pub mod tls;
mod ws;

pub use client::Target;

/// Every check the checker runs, in order: `(id, section, what it proves)`.
pub const CHECKS: &[(&str, &str, &str)] = &[
    ("discovery", "AEP-0003 §3.4", "GET {base}/events is the discovery document"),
    ("version-gate", "AEP-0003 §3.2 #2", "an unsupported AEP-Version gets 426 with the supported versions"),
    ("invalid-event", "AEP-0003 §3.2 #3", "an invalid Event gets 400 invalid-event with a detail; a batch with one is not half-ingested"),
    ("batch-filtered-delivery", "AEP-0003 §3.2 #1, §3.3 #2, §6", "an NDJSON batch reaches an attr-match SSE subscriber filtered, byte-identical, (epoch, seq) ascending"),
    ("resume-sse", "AEP-0003 §3.3 #3, §5, §7", "from and Last-Event-ID resume strictly after the position, gaps tolerated, no duplicate"),
    ("capture-ceiling-sse", "AEP-0003 §6.4, AEP-0001 §8.2", "a capture ceiling down-levels on SSE: gated fields never reach the subscriber, capture rewritten, never minted"),
    ("replay-all-sse", "AEP-0003 §5", "from=all replays every held session from its earliest, without replay-exhausted"),
    ("ws-hello-first", "AEP-0003 §3.5 #1", "a first frame other than hello gets error hello-required and close"),
    ("ws-version-refusal", "AEP-0003 §4 rule 1", "a hello without a common version gets error version-unsupported with the versions, and close"),
    ("ws-hello-reply", "AEP-0003 §3.5 #1, §4 rule 1", "the endpoint's first frame is hello selecting exactly one version"),
    ("ws-ignore-unknown", "AEP-0003 §2, §4 rule 4", "unknown capability keys, hello members and frame types are ignored; the connection lives"),
    ("ws-subscribe-refusals", "AEP-0003 §6.5", "malformed subscribes are refused in-band from the closed code set; the connection and its other subscriptions survive"),
    ("ws-resume", "AEP-0003 §6.5, §7", "subscribe.from replays strictly after the position, byte-identical, then live without duplicate"),
    ("ws-capture-ceiling", "AEP-0003 §6.4", "a subscribe capture ceiling down-levels over WebSocket"),
    ("replay-all-ws", "AEP-0003 §5, §6.5", "subscribe from \"all\" replays every held session without replay-exhausted"),
    ("roster", "AEP-0003 §4.1", "the roster answers with the id, one entry per live claim with its declarations verbatim; emitters are refused in-band"),
    ("control-unauthenticated", "AEP-0004 §4.1, AEP-0003 §8.1", "a command never flows over an unauthenticated duplex connection"),
    ("control-no-route", "AEP-0004 §4.2, §8", "a command to a session with history but no live claimant gets no-route; the session's replay is untouched"),
    ("control-route", "AEP-0004 §4.4, §4.5", "a command reaches the session's one live claimant byte-identically"),
    ("control-ambiguous", "AEP-0004 §4.5", "a command to a session with two live claimants is refused ambiguous and reaches neither"),
    ("evict-sse", "AEP-0003 §3.3 #3, §5, §10", "past the buffer, SSE resume announces replay-exhausted before delivery; every replayed payload is the posted line"),
    ("evict-ws", "AEP-0003 §5, §10", "past the buffer, WebSocket resume sends replay-exhausted before delivery; every replayed frame is the posted line"),
    ("evict-agree", "AEP-0003 §5", "both bindings name the same earliest held position"),
];

/// How one check ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// The relay did what the cited section requires.
    Pass,
    /// It did not; the detail says what happened instead.
    Fail,
    /// Not checked: the relay does not advertise the feature, or the check needs an
    /// option (`--token`, `--evict`); the detail says which.
    Skip,
}

impl Status {
    /// `PASS`, `FAIL`, `SKIP`.
    pub fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        }
    }

    /// `pass`, `fail`, `skip` (the JSON report's spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// The result of one check.
#[derive(Clone, Debug)]
pub struct CheckResult {
    /// The check's id (see [`CHECKS`]).
    pub id: &'static str,
    /// The spec sections it proves.
    pub section: &'static str,
    /// What it proves.
    pub title: &'static str,
    /// How it ended.
    pub status: Status,
    /// What was observed (for a FAIL: what happened instead of what was required).
    pub detail: String,
    /// How long it took.
    pub elapsed: Duration,
}

impl CheckResult {
    /// The line printed for this check: `PASS id (section): detail`.
    pub fn line(&self) -> String {
        format!(
            "{} {} ({}): {}",
            self.status.label(),
            self.id,
            self.section,
            self.detail
        )
    }
}

/// What to check and how.
#[derive(Clone, Debug)]
pub struct Options {
    /// The relay's base URL, e.g. `http://127.0.0.1:8787`.
    pub target: String,
    /// A bearer token with every scope, sent on every request and WebSocket handshake.
    pub token: Option<String>,
    /// Flood a session past the advertised buffer and check eviction on both bindings.
    pub evict: bool,
    /// The longest any single wait may take: a response, a whole SSE read, an expected
    /// WebSocket frame.
    pub timeout: Duration,
    /// For an `https://` target: trust exactly the certificates of this PEM file
    /// instead of the system's roots.
    pub cacert: Option<std::path::PathBuf>,
}

impl Options {
    /// Options for `target` with no token, no eviction and a 5 s wait bound.
    pub fn new(target: impl Into<String>) -> Options {
        Options {
            target: target.into(),
            token: None,
            evict: false,
            timeout: Duration::from_secs(5),
            cacert: None,
        }
    }
}

/// A whole run: one [`CheckResult`] per entry of [`CHECKS`], in order.
#[derive(Clone, Debug)]
pub struct Report {
    /// The URL checked.
    pub target: String,
    /// Whether a token was given.
    pub token: bool,
    /// Whether `--evict` was given.
    pub evict: bool,
    /// When the run started.
    pub started: SystemTime,
    /// When it ended.
    pub finished: SystemTime,
    /// The results.
    pub checks: Vec<CheckResult>,
}

impl Report {
    /// `(passed, failed, skipped)`.
    pub fn counts(&self) -> (usize, usize, usize) {
        let n = |s| self.checks.iter().filter(|c| c.status == s).count();
        (n(Status::Pass), n(Status::Fail), n(Status::Skip))
    }

    /// Whether no check failed.
    pub fn ok(&self) -> bool {
        self.counts().1 == 0
    }

    /// The summary line, exactly `N passed, N failed, N skipped`.
    pub fn summary(&self) -> String {
        let (p, f, s) = self.counts();
        format!("{p} passed, {f} failed, {s} skipped")
    }

    /// The result of the check `id`, when it ran.
    pub fn get(&self, id: &str) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.id == id)
    }

    /// The machine-readable report: one object with `tool`, `version`, `target`,
    /// `token` and `evict` (whether they were given; never the token itself), `started`
    /// and `finished` (RFC 3339, UTC), `checks` (each `id`, `section`, `title`, `status`
    /// `pass`/`fail`/`skip`, `detail`, `ms`), `summary` (`passed`, `failed`, `skipped`,
    /// and `line`, the summary line) and `ok`.
    pub fn to_json(&self) -> Value {
        let (p, f, s) = self.counts();
        json!({
            "tool": "aep-relay check",
            "version": env!("CARGO_PKG_VERSION"),
            "target": self.target,
            "token": self.token,
            "evict": self.evict,
            "started": rfc3339(self.started),
            "finished": rfc3339(self.finished),
            "checks": self.checks.iter().map(|c| json!({
                "id": c.id,
                "section": c.section,
                "title": c.title,
                "status": c.status.as_str(),
                "detail": c.detail,
                "ms": c.elapsed.as_millis() as u64,
            })).collect::<Vec<_>>(),
            "summary": { "passed": p, "failed": f, "skipped": s, "line": self.summary() },
            "ok": f == 0,
        })
    }
}

/// Runs every check against `opts.target`, calling `each` as each one ends (for
/// progress output), and returns the report.
///
/// # Errors
/// A message when the target URL cannot be used (neither `http://` nor `https://`, no
/// host), when `--cacert` is not a PEM certificate file, or when an `https://` relay's
/// TLS handshake fails with a [`tls::Failure`] (untrusted certificate, a name it does
/// not list, no TLS there); no check has run then. Everything else the relay does wrong
/// (including not answering at all) is a FAIL in the report instead.
///
/// # Panics
/// Never on anything the relay sends.
pub fn run_with(opts: &Options, each: impl FnMut(&CheckResult)) -> Result<Report, String> {
    let target = Target::parse(&opts.target)?;
    let tls = match (target.tls, &opts.cacert) {
        (true, cacert) => Some(tls::Client::new(cacert.as_deref())?),
        (false, Some(_)) => return Err(format!("{}: --cacert is for https:// URLs", opts.target)),
        (false, None) => None,
    };
    if let Some(c) = &tls {
        preflight(&target, c, opts.timeout)?;
    }
    let started = SystemTime::now();
    let checks = suite::run(opts, target, tls, each);
    Ok(Report {
        target: opts.target.clone(),
        token: opts.token.is_some(),
        evict: opts.evict,
        started,
        finished: SystemTime::now(),
        checks,
    })
}

/// One TLS handshake with the target before any check: a [`tls::Failure`] is the run's
/// error (every check would fail with it); a transport error is left to the checks.
fn preflight(target: &Target, tls: &tls::Client, timeout: Duration) -> Result<(), String> {
    use std::net::ToSocketAddrs;
    let Ok(addrs) = target.authority.to_socket_addrs() else {
        return Ok(());
    };
    for a in addrs {
        let Ok(tcp) = std::net::TcpStream::connect_timeout(&a, timeout) else {
            continue;
        };
        let _ = tcp.set_read_timeout(Some(timeout));
        let _ = tcp.set_write_timeout(Some(timeout));
        return match tls.handshake(target.host(), tcp) {
            Err(e) => match tls::failure(&e) {
                Some(f) => Err(f.to_string()),
                None => Ok(()),
            },
            Ok(mut s) => {
                s.conn.send_close_notify();
                let _ = s.conn.complete_io(&mut s.sock);
                Ok(())
            }
        };
    }
    Ok(())
}

/// [`run_with`] without progress output.
///
/// # Errors
/// As [`run_with`].
pub fn run(opts: &Options) -> Result<Report, String> {
    run_with(opts, |_| {})
}

/// The `check` subcommand's arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// The relay's base URL (http://HOST:PORT[/BASE]); the discovery document is at
    /// {base}/events.
    #[arg(value_name = "URL")]
    pub url: String,
    /// Bearer token sent on every request and handshake (needed by a relay with tokens,
    /// and for the control checks); `AEP_TOKEN`, as for the relay and `tail`.
    #[arg(long, env = "AEP_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Flood a session past the advertised replay buffer and check replay-exhausted on
    /// both bindings (run the relay with a small buffer for this).
    #[arg(long)]
    pub evict: bool,
    /// Also write the report as one JSON object to PATH (`-`: standard output, and the
    /// per-check lines go to standard error).
    #[arg(long, value_name = "PATH|-")]
    pub json: Option<String>,
    /// Seconds any single wait may take (a response, a whole SSE read, an expected frame).
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub timeout: f64,
    /// For an https:// URL: trust exactly the certificates of this PEM file (a private
    /// CA, or the relay's self-signed certificate) instead of the system's roots.
    #[arg(long, value_name = "FILE")]
    pub cacert: Option<std::path::PathBuf>,
}

/// Runs the `check` subcommand: prints each check and the summary line, writes the JSON
/// report when asked, and returns the exit status (0: nothing failed; 1: a check failed;
/// 2: a usage error). Error messages start `aep-relay check:`.
pub fn main(args: CheckArgs) -> ExitCode {
    main_as("aep-relay check", args)
}

/// [`main`] for a program named `prog` (the prefix of its error messages): the
/// `aep-check` binary passes `aep-check`.
pub fn main_as(prog: &str, args: CheckArgs) -> ExitCode {
    let Ok(timeout) = Duration::try_from_secs_f64(args.timeout) else {
        eprintln!("{prog}: --timeout must be a non-negative number of seconds");
        return ExitCode::from(2);
    };
    let opts = Options {
        target: args.url.clone(),
        token: args.token.clone(),
        evict: args.evict,
        timeout: timeout.max(Duration::from_millis(100)),
        cacert: args.cacert.clone(),
    };
    let json_stdout = args.json.as_deref() == Some("-");
    let mut out: Box<dyn Write> = if json_stdout {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    let begun = Instant::now();
    let report = match run_with(&opts, |c| {
        let _ = writeln!(out, "{}", c.line());
        let _ = out.flush();
    }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{prog}: {e}");
            return ExitCode::from(2);
        }
    };
    let _ = writeln!(out, "{}", report.summary());
    let _ = out.flush();
    log::debug!("check took {:?}", begun.elapsed());
    if let Some(path) = &args.json {
        let mut text = serde_json::to_string_pretty(&report.to_json()).unwrap_or_default();
        text.push('\n');
        let written = if json_stdout {
            std::io::stdout().write_all(text.as_bytes())
        } else {
            std::fs::write(path, text)
        };
        if let Err(e) = written {
            eprintln!("{prog}: cannot write the report to {path}: {e}");
            return ExitCode::from(2);
        }
    }
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `t` as RFC 3339 in UTC with milliseconds, e.g. `2026-07-03T10:15:04.221Z`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let d = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_utc() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_783_073_704_221);
        assert_eq!(rfc3339(t), "2026-07-03T10:15:04.221Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn check_ids_are_unique() {
        let mut ids: Vec<&str> = CHECKS.iter().map(|c| c.0).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), CHECKS.len());
    }
}
