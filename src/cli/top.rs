//! `aep-relay top URL`: the relay's connections, the most lagging consumer first,
//! redrawn every `--interval-secs`, the way `nats top` and `redis-cli --stat` show a
//! server live. It polls `GET /connections` (scope `admin`): per connection its binding,
//! peer, the name of its token, how far behind it is (Events), what is queued toward it, what it lost to
//! backpressure (AEP-0003 §8.4), its age, and its filters with their capture ceilings.
//!
//! On a terminal each frame replaces the last; otherwise frames follow one another.
//! `--once` prints one frame and exits.
//!
//! Exit status: 0 after `--once`, or when standard output is closed; 1 when `--once`
//! cannot reach the relay; 2 for a refused request (401, 403: retrying would not help)
//! or bad arguments. Otherwise an unreachable relay is retried every interval.

use clap::Args;
use serde_json::Value;
use std::fmt::Write as _;
use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

/// `aep-relay top`'s arguments.
#[derive(Args, Debug)]
pub struct TopArgs {
    /// The relay, `http://HOST:PORT` or `https://HOST:PORT`.
    url: String,
    /// For an https:// URL: trust exactly the certificates of this PEM file instead of
    /// the system's roots.
    #[arg(long, value_name = "FILE")]
    cacert: Option<std::path::PathBuf>,
    /// Bearer token with the `admin` scope, sent as `Authorization: Bearer …`.
    #[arg(long, env = "AEP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Seconds between frames.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    interval_secs: f64,
    /// Rows per frame (the most lagging).
    #[arg(long, value_name = "N", default_value_t = 20)]
    rows: usize,
    /// Print one frame and exit.
    #[arg(long)]
    once: bool,
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("aep-relay top: {msg}");
    ExitCode::from(2)
}

/// Runs `top`.
pub fn run(args: TopArgs) -> ExitCode {
    let interval = match Duration::try_from_secs_f64(args.interval_secs) {
        Ok(d) if !d.is_zero() => d,
        _ => return fail("--interval-secs must be a positive number of seconds"),
    };
    let (agent, _) = match super::client(&args.url, args.cacert.as_deref(), Duration::from_secs(10))
    {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let url = format!(
        "{}/connections?limit={}",
        args.url.trim_end_matches('/'),
        args.rows
    );
    let terminal = io::stdout().is_terminal();
    loop {
        let mut req = agent.get(&url);
        if let Some(t) = &args.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let frame = match req.call() {
            Ok(resp) => {
                let doc = resp
                    .into_string()
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_str::<Value>(&b).map_err(|e| e.to_string()));
                match doc {
                    Ok(doc) => render(&args.url, &doc),
                    Err(e) => format!("aep-relay top: unreadable answer: {e}\n"),
                }
            }
            Err(ureq::Error::Status(code @ (401 | 403), resp)) => {
                let body = resp.into_string().unwrap_or_default();
                return fail(format!("{url} answered {code}: {}", body.trim()));
            }
            Err(e) if args.once => {
                eprintln!("aep-relay top: {e}");
                return ExitCode::from(1);
            }
            Err(e) => format!("aep-relay top: {e} (retrying)\n"),
        };
        let mut out = io::stdout().lock();
        let clear = if terminal && !args.once {
            "\x1b[H\x1b[2J"
        } else {
            ""
        };
        if write!(out, "{clear}{frame}")
            .and_then(|()| out.flush())
            .is_err()
        {
            return ExitCode::SUCCESS; // standard output closed
        }
        if args.once {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(interval);
    }
}

/// One frame: a header line, then one line per row of `doc` (`GET /connections`).
fn render(url: &str, doc: &Value) -> String {
    let rows = doc["connections"].as_array().map_or(&[][..], Vec::as_slice);
    let mut s = format!(
        "aep-relay top  {url}  {} connections\n{:>6}  {:<8} {:<22} {:<12} {:>9} {:>10} {:>8} {:>8}  FILTERS\n",
        doc["total"].as_u64().unwrap_or(0),
        "ID",
        "BINDING",
        "PEER",
        "HOLDER",
        "BEHIND",
        "QUEUED",
        "DROPPED",
        "AGE"
    );
    for r in rows {
        let dropped = r["dropped"]["debug"].as_u64().unwrap_or(0)
            + r["dropped"]["info"].as_u64().unwrap_or(0);
        let filters: Vec<String> = r["subscriptions"]
            .as_array()
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .map(|sub| match sub["capture"].as_str() {
                Some(c) => format!("{} @{c}", sub["filter"]),
                None => sub["filter"].to_string(),
            })
            .collect();
        let line = format!(
            "{:>6}  {:<8} {:<22} {:<12} {:>9} {:>10} {:>8} {:>8}  {}",
            r["id"].as_u64().unwrap_or(0),
            r["binding"].as_str().unwrap_or("?"),
            r["peer"].as_str().unwrap_or("?"),
            printable(r["holder"].as_str().unwrap_or("-")),
            r["behind"].as_u64().unwrap_or(0),
            bytes(r["queued_bytes"].as_u64().unwrap_or(0)),
            dropped,
            age(r["age_s"].as_f64().unwrap_or(0.0)),
            filters.join(" | ")
        );
        let _ = writeln!(s, "{}", line.trim_end());
    }
    s
}

/// `s` with its control characters (C0, DEL, C1) escaped: a token's name is the
/// issuer's text and must not move the terminal's cursor or change its colours.
fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let escape = c.is_control().then(|| c.escape_unicode().to_string());
            escape
                .unwrap_or_else(|| c.to_string())
                .chars()
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `n` bytes, in B, KiB or MiB.
fn bytes(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

/// `secs` as `42s`, `3m07s` or `5h02m`.
fn age(secs: f64) -> String {
    let s = secs as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A frame names each connection's numbers and filters, in the order the relay
    /// gave (most lagging first).
    #[test]
    fn a_frame_shows_each_row_in_order() {
        let doc = json!({"total": 3, "connections": [
            {"id": 4, "binding": "sse", "peer": "127.0.0.1:5000", "holder": "team-a", "behind": 120,
             "queued_bytes": 2_097_152, "dropped": {"debug": 5, "info": 2}, "age_s": 75.0,
             "subscriptions": [{"id": null, "filter": {"type": ["tool.*"]}, "capture": "metadata"}]},
            {"id": 1, "binding": "ws", "peer": "127.0.0.1:5001", "behind": 0,
             "queued_bytes": 0, "dropped": {"debug": 0, "info": 0}, "age_s": 3.2,
             "subscriptions": []},
        ]});
        let frame = render("http://r", &doc);
        let lines: Vec<&str> = frame.lines().collect();
        assert!(lines[0].contains("3 connections"), "{frame}");
        assert!(
            lines[2].contains("sse") && lines[2].contains("120"),
            "{frame}"
        );
        assert!(
            lines[2].contains("2.0 MiB") && lines[2].contains(" 7 "),
            "{frame}"
        );
        assert!(
            lines[2].contains(r#"{"type":["tool.*"]} @metadata"#),
            "{frame}"
        );
        assert!(lines[2].contains("1m15s"), "{frame}");
        assert!(
            lines[3].contains("ws") && lines[3].contains("0 B"),
            "{frame}"
        );
    }
}
