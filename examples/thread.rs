//! Runs the relay on its own thread inside a host program, posts one Event to it over
//! HTTP, reads it back from the SSE stream, then shuts the relay down gracefully.
//!
//! ```sh
//! cargo run --example thread
//! ```

use aep_relay::{Config, Relay};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config {
        listen: "127.0.0.1:0".parse()?,
        ..Config::default()
    };
    let mut relay = Relay::bind(config)?;
    let addr = relay.local_addr();
    let stop = relay.stop_handle();
    // `Relay` is `Send`: bind here, run there.
    let thread = std::thread::spawn(move || relay.run());

    // A consumer: read the stream until the Event arrives.
    let mut sse = TcpStream::connect(addr)?;
    sse.write_all(b"GET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
    let mut sse = BufReader::new(sse);
    let mut line = String::new();
    while line != ": aep-relay stream open\n" {
        line.clear();
        sse.read_line(&mut line)?;
    }

    // An emitter: one Event over HTTP POST.
    let event = r#"{"aep":"0.1","id":"ex-1","type":"run.started","time":"2026-07-03T10:00:00Z","source":"aep://host/agent/demo","agent":"demo","session":"s1","seq":0}"#;
    let mut post = TcpStream::connect(addr)?;
    write!(
        post,
        "POST /events HTTP/1.1\r\nHost: localhost\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{event}",
        event.len()
    )?;

    loop {
        line.clear();
        sse.read_line(&mut line)?;
        if let Some(data) = line.strip_prefix("data: ") {
            println!("received: {}", data.trim_end());
            break;
        }
    }
    stop.shutdown();
    thread.join().expect("relay thread")?;
    Ok(())
}
