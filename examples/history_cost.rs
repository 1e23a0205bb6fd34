//! What the durable history costs per `--fsync` policy: appends of ~600-byte Events
//! through [`History::append_batch`], in batches of 1 (one Event per HTTP POST, the
//! common adapter pattern) and of 100 (an NDJSON batch or a chunk of JSONL lines),
//! spread over 16 sessions.
//!
//! ```sh
//! cargo run --release --example history_cost [DIR]   # DIR: where to write (default: a temp dir)
//! ```
//!
//! Prints Events/s and microseconds per batch for each (policy, batch size). The numbers
//! depend on the disk more than on the relay: `never` measures the relay's own cost
//! (one `writev` per Event), `batch` and `always` add the device's `fdatasync` latency.

use aep_relay::history::{Fsync, History, HistoryConfig};
use aep_relay::store::Store;
use aep_relay::wire::envelope::Event;
use bytes::Bytes;
use std::time::{Duration, Instant};

fn event(session: usize, seq: u64) -> Event {
    let j = serde_json::json!({
        "aep": "0.1", "id": format!("{session}-{seq}"), "type": "tool.completed",
        "time": "2026-07-03T10:15:04.221Z",
        "source": format!("aep://host-a/agent/claude-code/session/s{session}"),
        "agent": "claude-code", "session": format!("s{session}"), "seq": seq,
        "severity": "info", "capture": "metadata",
        "data": {"tool": {"name": "Bash", "call_id": "t_91"}, "status": "success",
                 "duration_ms": 1240, "pad": "x".repeat(330)}
    });
    Event::parse(Bytes::from(serde_json::to_vec(&j).unwrap())).unwrap()
}

fn main() {
    let root = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("aep-history-cost-{}", std::process::id()))
        });
    let size = event(0, 0).bytes().len();
    println!("Event size {size} bytes; writing under {}", root.display());
    println!(
        "{:<8} {:>6} {:>12} {:>14} {:>10}",
        "fsync", "batch", "Events/s", "us per batch", "MB/s"
    );
    for fsync in [Fsync::Never, Fsync::Batch, Fsync::Always] {
        for batch in [1usize, 100] {
            let dir = root.join(format!("{fsync}-{batch}"));
            let _ = std::fs::remove_dir_all(&dir);
            let store = Store::new(10, 10);
            let mut empty = Store::new(10, 10);
            let cfg = HistoryConfig {
                fsync,
                ..HistoryConfig::new(&dir)
            };
            let (mut h, _) = History::open(cfg, &mut empty).unwrap();
            // Enough work for a stable number, bounded in time for slow disks.
            let budget = Duration::from_secs(2);
            let started = Instant::now();
            let (mut events, mut batches, mut seq) = (0u64, 0u64, 0u64);
            let mut spent = Duration::ZERO;
            while started.elapsed() < budget && events < 2_000_000 {
                let b: Vec<_> = (0..batch)
                    .map(|i| {
                        seq += 1;
                        event(i % 16, seq)
                    })
                    .collect();
                // Only the append is timed, not building the Events.
                let t = Instant::now();
                h.append_batch(&b, &store).unwrap();
                spent += t.elapsed();
                events += batch as u64;
                batches += 1;
            }
            let secs = spent.as_secs_f64();
            println!(
                "{:<8} {:>6} {:>12.0} {:>14.1} {:>10.1}",
                fsync.to_string(),
                batch,
                events as f64 / secs,
                secs * 1e6 / batches as f64,
                events as f64 * (size + 1) as f64 / secs / 1e6
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}
