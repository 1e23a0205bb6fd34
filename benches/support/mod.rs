//! Shared inputs for the benches: the golden corpus (read from `../shared`, skipped with a
//! message when absent), the AEP-0001 §5.3 worked example, a generator of distinct
//! ~600-byte Events, and the criterion configuration that keeps `cargo bench` short.
#![allow(dead_code)] // each bench uses a different subset

use std::path::PathBuf;
use std::time::Duration;

use criterion::Criterion;

/// The AEP-0001 §5.3 worked example, verbatim (spec text, non-normative).
pub const WORKED_EXAMPLE: &str = aep_relay::wire::envelope::WORKED_EXAMPLE;

/// Short warm-up and measurement so the whole `cargo bench` stays within a few minutes
/// on a 2-core machine; pass `--measurement-time` on the command line for tighter
/// intervals. Times are the thread's CPU time ([`CpuTime`]).
pub fn config() -> Criterion<CpuTime> {
    Criterion::default()
        .with_measurement(CpuTime)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .configure_from_args()
}

/// The golden corpus lines (`aep-fixtures/golden/golden.jsonl` beside the project), or
/// `None` with a message on stderr when `../shared` is absent.
pub fn golden_lines() -> Option<Vec<Vec<u8>>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/aep-fixtures/golden/golden.jsonl");
    match std::fs::read(&path) {
        Ok(all) => Some(
            all.split(|b| *b == b'\n')
                .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
                .map(<[u8]>::to_vec)
                .collect(),
        ),
        Err(e) => {
            eprintln!(
                "skipping the golden-corpus benches: cannot read {} ({e})",
                path.display()
            );
            None
        }
    }
}

/// One valid `tool.completed` Event of about `size` bytes (padding in `data.output`),
/// with distinct `id` and `seq` from `n`, in `session`, and the integer extension
/// `loadts` (AEP-0001 §5.4).
pub fn event(n: u64, session: &str, size: usize) -> String {
    let head = format!(
        r#"{{"aep":"0.1","id":"01JXBENCH{n:016}","type":"tool.completed","subject":"Bash","time":"2026-07-03T10:15:04.221Z","source":"aep://host-a/agent/claude-code/session/{session}","agent":"claude-code","session":"{session}","run":"r_0042","seq":{n},"epoch":0,"severity":"info","capture":"metadata","loadts":{n},"data":{{"tool":{{"name":"Bash","call_id":"t_91"}},"status":"success","duration_ms":1240,"output":""#
    );
    let tail = r#""}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut s = head;
    s.extend(std::iter::repeat_n('x', pad));
    s.push_str(tail);
    s
}

/// `count` Events from `first` on, one per line (NDJSON, final newline included).
pub fn ndjson(first: u64, count: usize, session: &str, size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * (size + 1));
    for i in 0..count as u64 {
        out.extend_from_slice(event(first + i, session, size).as_bytes());
        out.push(b'\n');
    }
    out
}

/// An HTTP/1.1 `POST /events` request carrying `body` as NDJSON.
pub fn post_ndjson(body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST /events HTTP/1.1\r\nHost: 127.0.0.1:8787\r\nAEP-Version: 0.1\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

/// Criterion measurement of the benchmarking thread's **CPU time**
/// (`CLOCK_THREAD_CPUTIME_ID`) instead of wall time: time the thread spent preempted by
/// other processes is not counted. The development machine is shared with other builds,
/// and wall-time samples swung by 2-3x; CPU time still includes cache effects of
/// co-runners, but not their time slices.
pub struct CpuTime;

static WALL: criterion::measurement::WallTime = criterion::measurement::WallTime;

/// The calling thread's CPU time so far.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

impl criterion::measurement::Measurement for CpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn criterion::measurement::ValueFormatter {
        criterion::measurement::Measurement::formatter(&WALL)
    }
}
