//! `aep-relay validate [FILE...]`: checks every line of JSONL files of Events with the
//! relay's own envelope validator ([`Event::parse`]: AEP-0001 §5, §5.2, §5.4, §6, §8;
//! AEP-0004 §2.2) and the JSONL framing rules (AEP-0003 §3.1.1: one Event per line, no
//! blank lines).
//!
//! Output: one `{file}:{line}: {detail}` line per invalid line on standard output (the
//! file is `-` for standard input), then a summary on standard error. Exit status 0 when
//! every line is valid, 1 when any is invalid, 2 when a file cannot be read (the others
//! are still checked). Payload schemas are not checked (a relay never parses `data`,
//! AEP-0001 §5), nor cross-Event rules.
//!
//! A lint, not a refusal: a valid vendor type `x.{vendor}.{token}.{rest}` whose `token`
//! is not one of the categories (the AEP-0001 §6 prose writes `{category}` there; the
//! envelope schema, and so the relay, accepts any token) gets one
//! `{file}:{line}: warning: …` line on standard error, at its first line, once per
//! distinct type in the run. The line stays valid and the exit status is unchanged; the
//! summary adds `; N warnings` when there are any.

use aep_relay::config::DEFAULT_MAX_BODY;
use aep_relay::wire::envelope::{is_category, vendor_token, Event};
use aep_relay::wire::jsonl::{LineSplitter, Piece};
use bytes::Bytes;
use clap::Args;
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// `aep-relay validate` arguments.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// JSONL files to check; `-` or none reads standard input.
    files: Vec<PathBuf>,
    /// Print only the summary.
    #[arg(long, short)]
    quiet: bool,
    /// Longest line accepted, in bytes (the relay's AEP_MAX_BODY default).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BODY)]
    max_line: usize,
}

/// Counts for one source.
#[derive(Default, Clone, Copy)]
struct Counts {
    lines: u64,
    invalid: u64,
    bytes: u64,
    /// Lint warnings: vendor types first seen here whose token is not a category.
    warnings: u64,
}

/// The lint state of a run: where warnings go, and the vendor types already warned about
/// (one warning per distinct type, so the set grows only with distinct offenders).
struct Lint<W> {
    out: W,
    warned: HashSet<String>,
}

impl<W: Write> Lint<W> {
    fn new(out: W) -> Lint<W> {
        Lint {
            out,
            warned: HashSet::new(),
        }
    }

    /// Warns about `ev`'s type when it is a vendor type whose token is not a category,
    /// the first time the run sees it. Returns whether it was a new warning.
    fn check(&mut self, label: &str, n: u64, ev: &Event, quiet: bool) -> io::Result<bool> {
        let t = ev.event_type();
        let Some(token) = vendor_token(t).filter(|k| !is_category(k)) else {
            return Ok(false);
        };
        if self.warned.contains(t) {
            return Ok(false);
        }
        self.warned.insert(t.to_owned());
        if !quiet {
            writeln!(
                self.out,
                "{label}:{n}: warning: `{t}`: `{token}` is not a category (AEP-0001 §6 prose: \
                 x.{{vendor}}.{{category}}.{{rest}}; the envelope schema and the relay accept it)"
            )?;
        }
        Ok(true)
    }
}

fn check(
    label: &str,
    mut input: impl Read,
    max_line: usize,
    quiet: bool,
    out: &mut impl Write,
    lint: &mut Lint<impl Write>,
) -> io::Result<Counts> {
    let mut c = Counts::default();
    let mut splitter = LineSplitter::new(max_line);
    let mut buf = vec![0u8; 1 << 20];
    let mut write_err = None;
    let mut report = |c: &mut Counts, n: u64, p: Piece| {
        c.lines += 1;
        let detail = match p {
            Piece::TooLong(len) => {
                format!("line of {len} bytes is longer than {max_line} bytes (--max-line)")
            }
            Piece::Line(l) if l.iter().all(u8::is_ascii_whitespace) => {
                "blank line (AEP-0003 §3.1.1: one Event per line, no blank lines)".to_string()
            }
            Piece::Line(l) => match Event::parse(l) {
                Ok(ev) => {
                    match lint.check(label, n, &ev, quiet) {
                        Ok(new) => c.warnings += u64::from(new),
                        Err(e) => {
                            write_err.get_or_insert(e);
                        }
                    }
                    return;
                }
                Err(e) => e.detail,
            },
        };
        c.invalid += 1;
        if !quiet && write_err.is_none() {
            if let Err(e) = writeln!(out, "{label}:{n}: {detail}") {
                write_err = Some(e);
            }
        }
    };
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        c.bytes += n as u64;
        splitter.push(Bytes::copy_from_slice(&buf[..n]), &mut |n, p| {
            report(&mut c, n, p)
        });
    }
    splitter.finish(&mut |n, p| report(&mut c, n, p));
    match write_err {
        Some(e) => Err(e),
        None => Ok(c),
    }
}

/// `; N warning(s)` for a summary, or nothing when there are none.
fn warnings(n: u64) -> String {
    match n {
        0 => String::new(),
        1 => "; 1 warning".to_owned(),
        n => format!("; {n} warnings"),
    }
}

/// Runs `validate`.
pub fn run(args: ValidateArgs) -> ExitCode {
    let mut files = args.files.clone();
    if files.is_empty() {
        files.push(PathBuf::from("-"));
    }
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(64 * 1024, stdout.lock());
    let mut lint = Lint::new(io::stderr());
    let mut total = Counts::default();
    let mut unreadable = 0;
    let started = std::time::Instant::now();
    for path in &files {
        let label = path.display().to_string();
        let result = if label == "-" {
            let stdin = io::stdin().lock();
            check("-", stdin, args.max_line, args.quiet, &mut out, &mut lint)
        } else {
            match File::open(path) {
                Ok(f) => check(&label, f, args.max_line, args.quiet, &mut out, &mut lint),
                Err(e) => Err(e),
            }
        };
        match result {
            Ok(c) => {
                if files.len() > 1 {
                    eprintln!(
                        "{label}: {} line{}, {} valid, {} invalid{}",
                        c.lines,
                        if c.lines == 1 { "" } else { "s" },
                        c.lines - c.invalid,
                        c.invalid,
                        warnings(c.warnings)
                    );
                }
                total.lines += c.lines;
                total.invalid += c.invalid;
                total.bytes += c.bytes;
                total.warnings += c.warnings;
            }
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("aep-relay validate: {label}: {e}");
                unreadable += 1;
            }
        }
    }
    if let Err(e) = out.flush() {
        if e.kind() != io::ErrorKind::BrokenPipe {
            eprintln!("aep-relay validate: {e}");
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "validate: {} lines in {} file{}: {} valid, {} invalid{}{} ({:.1} MB in {:.2} s)",
        total.lines,
        files.len() - unreadable,
        if files.len() - unreadable == 1 {
            ""
        } else {
            "s"
        },
        total.lines - total.invalid,
        total.invalid,
        warnings(total.warnings),
        if unreadable > 0 {
            format!("; {unreadable} unreadable")
        } else {
            String::new()
        },
        total.bytes as f64 / 1e6,
        secs
    );
    if unreadable > 0 {
        ExitCode::from(2)
    } else if total.invalid > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_each_invalid_line_with_its_number() {
        let ok = r#"{"aep":"0.1","id":"1","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a","agent":"a","session":"s","seq":0}"#;
        let input = format!("{ok}\n{{\n\n{ok}\r\n{}\n{ok}", ok.replace("0.1", "0.9"));
        let mut out = Vec::new();
        let mut lint = Lint::new(Vec::new());
        let c = check("f", input.as_bytes(), 1 << 20, false, &mut out, &mut lint).unwrap();
        assert!(lint.out.is_empty());
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!((c.lines, c.invalid), (6, 3), "{text}");
        assert!(lines[0].starts_with("f:2: "), "{text}");
        assert!(lines[1].starts_with("f:3: blank line"), "{text}");
        assert!(
            lines[2].starts_with("f:5: unsupported envelope version"),
            "{text}"
        );
    }

    #[test]
    fn warns_once_per_vendor_type_whose_token_is_not_a_category() {
        let line = |id: u32, t: &str| {
            format!(
                r#"{{"aep":"0.1","id":"{id}","type":"{t}","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a","agent":"a","session":"s","seq":{id}}}"#
            )
        };
        let input = [
            line(1, "x.codex.otel.api_request"),
            line(2, "x.acme.tool.done"),
            line(3, "x.codex.otel.api_request"),
            line(4, "tool.completed"),
            line(5, "x.acp.fs.read.text.file"),
        ]
        .join("\n");
        let mut out = Vec::new();
        let mut lint = Lint::new(Vec::new());
        let c = check("f", input.as_bytes(), 1 << 20, false, &mut out, &mut lint).unwrap();
        assert_eq!((c.lines, c.invalid, c.warnings), (5, 0, 2));
        assert!(out.is_empty());
        let warned = String::from_utf8(lint.out).unwrap();
        let lines: Vec<_> = warned.lines().collect();
        assert_eq!(lines.len(), 2, "{warned}");
        assert!(
            lines[0]
                .starts_with("f:1: warning: `x.codex.otel.api_request`: `otel` is not a category"),
            "{warned}"
        );
        assert!(
            lines[1].starts_with("f:5: warning: `x.acp.fs.read.text.file`: `fs` "),
            "{warned}"
        );
        // Quiet: counted, not printed; a type already warned about is not counted again.
        let mut quiet = Lint::new(Vec::new());
        let c = check("g", input.as_bytes(), 1 << 20, true, &mut out, &mut quiet).unwrap();
        assert_eq!(c.warnings, 2);
        assert!(quiet.out.is_empty());
        let c = check("h", input.as_bytes(), 1 << 20, true, &mut out, &mut quiet).unwrap();
        assert_eq!(c.warnings, 0);
        assert_eq!(warnings(0), "");
        assert_eq!(warnings(1), "; 1 warning");
        assert_eq!(warnings(3), "; 3 warnings");
    }
}
