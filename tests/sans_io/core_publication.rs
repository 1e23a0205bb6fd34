//! The core's publication, driven with `aep_sim` (no socket, virtual time). Fan-out never
//! writes: when a consumer's queue cannot take the next Event, the publication pauses,
//! the reactor writes, and the same Event is fanned out again (AEP-0003 §8.4). What was
//! accepted in the meantime waits its turn, in order, with what goes with it.

use aep_relay::auth::Auth;
use aep_relay::{Config, ConnId};
use aep_sim::Sim;

use crate::support;
use support::sim::{masked, ws_frames, Frame};

const UPGRADE: &[u8] = b"GET /socket?access_token=t HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
    Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";

/// The text payloads of the server frames in `b` (after the 101 head).
fn texts(b: &[u8]) -> Vec<String> {
    let at = b
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |i| i + 4);
    ws_frames(&b[at..])
        .into_iter()
        .filter_map(|f| match f {
            Frame::Text(v) => Some(v.to_string()),
            _ => None,
        })
        .collect()
}

/// A WebSocket connection with its `hello` done (`hello` is the JSON object's inside).
fn socket(sim: &mut Sim, hello: &str) -> ConnId {
    let c = sim.connect(None);
    sim.feed(c, UPGRADE, false);
    sim.feed(
        c,
        &masked(&format!(r#"{{"type":"hello","versions":["0.1"],{hello}}}"#)),
        false,
    );
    c
}

fn event(agent: &str, session: &str, seq: u64, pad: usize) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{agent}-{seq}","type":"tool.started","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/{agent}","agent":"{agent}","session":"{session}","seq":{seq},"data":{{"pad":"{}"}}}}"#,
        "x".repeat(pad)
    )
}

/// AEP-0004 §4.2: a command reaches its one claimant once. The sender's Events ahead of
/// it pause the publication (a stalled SSE consumer's queue is full), so the command's
/// copy for observers waits behind them; when it is fanned out, it still skips the
/// claimant, which had it directly.
#[test]
fn a_command_behind_a_paused_publication_still_reaches_its_claimant_once() {
    let mut sim = Sim::new(Config {
        max_output_bytes: 64 * 1024,
        auth: Auth::new(Some("t"), &[]),
        ..Config::default()
    })
    .unwrap();
    // A consumer that never reads: its queue fills after a few Events.
    let stalled = sim.connect(Some(0));
    sim.feed(
        stalled,
        b"GET /stream?access_token=t HTTP/1.1\r\nHost: x\r\n\r\n",
        false,
    );
    // The claimant of session c-s, which also watches everything.
    let claimant = socket(
        &mut sim,
        r#""role":"both","identity":{"agent":"c"},"capabilities":{"control":{"accepts":["control.cancel"]}}"#,
    );
    sim.feed(
        claimant,
        &masked(r#"{"type":"subscribe","id":"all"}"#),
        false,
    );
    sim.feed(claimant, &masked(&event("c", "c-s", 1, 10)), false);
    let sender = socket(&mut sim, r#""role":"both","identity":{"agent":"s"}"#);
    sim.take_output(claimant);
    // One read: ten Events of about 8 KiB (more than the 64 KiB bound), then the command.
    let mut read = Vec::new();
    for seq in 1..=10 {
        read.extend(masked(&event("s", "s-s", seq, 8000)));
    }
    let cmd = r#"{"aep":"0.1","id":"cmd-1","type":"control.cancel","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/s","agent":"s","session":"c-s","data":{}}"#;
    read.extend(masked(cmd));
    sim.feed(sender, &read, false);
    let got = texts(&sim.take_output(claimant).unwrap());
    let commands = got.iter().filter(|t| t.contains(r#""id":"cmd-1""#)).count();
    assert_eq!(
        commands, 1,
        "the claimant got the command {commands} times: {got:#?}"
    );
    let events = got.iter().filter(|t| t.contains(r#""agent":"s""#)).count();
    assert_eq!(
        events, 11,
        "the ten Events and the command, through its subscription and directly"
    );
    assert!(
        sim.core().queued(stalled).unwrap() <= 64 * 1024 + 9000,
        "the stalled queue stays bounded"
    );
}

/// An emitter's answer is announced before the deliveries its Events caused: with many
/// subscribers, the `202` does not wait behind a write to each of them.
#[test]
fn a_posts_answer_is_written_before_the_deliveries_it_caused() {
    use aep_relay::core::{Core, NoJournal, Output};
    let now = std::time::Instant::now();
    let mut core = Core::new(Config::default(), Box::new(NoJournal), now, 0);
    let peer = "127.0.0.1:1".parse().unwrap();
    let write_all = |core: &mut Core| {
        let mut writable = Vec::new();
        while let Some(o) = core.poll_output() {
            if let Output::Writable(id) = o {
                writable.push(id);
                core.write_to(id, &mut Vec::new(), now);
            }
        }
        writable
    };
    for _ in 0..3 {
        let c = core.open(peer, now).unwrap();
        core.handle_input(c, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", now);
    }
    assert_eq!(write_all(&mut core).len(), 3, "the streams opened");
    let emitter = core.open(peer, now).unwrap();
    let body = event("a", "s", 0, 10);
    let post = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    core.handle_input(emitter, post.as_bytes(), now);
    let writable = write_all(&mut core);
    assert_eq!(
        writable.len(),
        4,
        "the answer and three deliveries: {writable:?}"
    );
    assert_eq!(writable[0], emitter, "the answer first: {writable:?}");
}
