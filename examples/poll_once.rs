//! Drives the relay from the host's own loop with `Relay::poll_once`, interleaving the
//! host's work (here: printing how many Events were ingested) between polls.
//!
//! ```sh
//! cargo run --example poll_once     # runs two seconds; POST to the printed address meanwhile
//! ```

use aep_relay::{Config, Relay};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut relay = Relay::bind(Config {
        listen: "127.0.0.1:0".parse()?,
        ..Config::default()
    })?;
    println!("relay on http://{}", relay.local_addr());
    let started = Instant::now();
    let mut last_report = Instant::now();
    // Run for a bounded time so the example ends by itself.
    while started.elapsed() < Duration::from_secs(2) {
        // Wait at most 50 ms for network readiness, then do host work.
        relay.poll_once(Some(Duration::from_millis(50)))?;
        if last_report.elapsed() >= Duration::from_secs(1) {
            println!("{} Events ingested so far", relay.ingested());
            last_report = Instant::now();
        }
    }
    Ok(())
}
