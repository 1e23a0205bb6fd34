//! `aep-load --reconnect-storm --resume` end to end against an in-process relay, SSE and
//! WebSocket, with few subscribers: every one resumes exactly (the tool exits 0 and
//! reports `"exact"` equal to `--subscribers`). The storm's numbers are not checked here;
//! BENCHMARKS.md has the measured ones.

use aep_relay::{Config, Relay};
use std::process::Command;
use std::thread;

const SUBSCRIBERS: usize = 48;

/// Runs the storm for `target` against a fresh relay; returns aep-load's JSON line.
fn storm(target: &str) -> String {
    let mut relay = Relay::bind(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Config::default()
    })
    .expect("relay binds");
    let addr = relay.local_addr();
    let stop = relay.stop_handle();
    let running = thread::spawn(move || relay.run());
    let out = Command::new(env!("CARGO_BIN_EXE_aep-load"))
        .args(["--target", target, "--addr", &addr.to_string()])
        .args([
            "--subscribers",
            &SUBSCRIBERS.to_string(),
            "--storm-threads",
            "8",
        ])
        .args([
            "--reconnect-storm",
            "--resume",
            "--rate",
            "50",
            "--timeout",
            "60",
        ])
        .arg("--json")
        .output()
        .expect("aep-load runs");
    stop.shutdown();
    running.join().expect("relay thread").expect("relay runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "aep-load --target {target}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn every_subscriber_resumes_exactly_over_sse_and_ws() {
    // Both at once, each against its own relay: the test costs one storm's time.
    let runs: Vec<_> = ["sse", "ws"]
        .into_iter()
        .map(|t| (t, thread::spawn(move || storm(t))))
        .collect();
    for (target, run) in runs {
        let line = run.join().expect("storm thread");
        for want in [
            format!("\"target\":\"relay-{target}\""),
            format!("\"exact\":{SUBSCRIBERS},\"gaps\":0,\"duplicates\":0"),
            "\"post_errors\":0".to_string(),
        ] {
            assert!(line.contains(&want), "{target}: no {want} in {line}");
        }
    }
}
