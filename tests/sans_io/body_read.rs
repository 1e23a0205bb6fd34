//! A `POST /events` body of known length is read straight into its buffer
//! (`Core::body_room`, as the reactor reads it, while at least `BODY_READ_MIN` bytes of
//! it are to come: these bodies are larger), and that buffer is kept for the next body
//! once no Event points into it. Driven with `aep_sim` (no socket, virtual time):
//! whatever way the body's bytes arrive, and however buffers are reused, every Event is
//! delivered byte for byte as it was sent (AEP-0003 §3.2.3, §6: the relay forwards the
//! Event it received), and every request is answered in order (RFC 9112 §9.3).

use aep_relay::Config;
use aep_sim::Sim;

fn event(session: &str, seq: u64, pad: usize) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{session}-{seq}","type":"tool.started","time":"2026-07-03T10:00:00Z","source":"aep://test/agent/a","agent":"a","session":"{session}","seq":{seq},"data":{{"pad":"{}"}}}}"#,
        "x".repeat(pad)
    )
}

fn post(body: &str) -> Vec<u8> {
    format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The `data:` lines of an SSE consumer's output, in order.
fn data_lines(out: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_owned))
        .collect()
}

/// The status codes of the HTTP answers in `out`, in order.
fn statuses(out: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(out)
        .split("HTTP/1.1 ")
        .skip(1)
        .map(|a| a[..3].to_owned())
        .collect()
}

fn consumer(sim: &mut Sim, write_limit: Option<usize>) -> aep_relay::ConnId {
    let c = sim.connect(write_limit);
    sim.feed(c, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", false);
    c
}

/// The body's first bytes come with the head (through the read buffer), the rest in
/// pieces read straight into the body's buffer, with the next request right behind it
/// in the last piece.
#[test]
fn a_body_read_in_pieces_keeps_every_event_byte_for_byte() {
    let mut sim = Sim::new(Config::default()).unwrap();
    let sub = consumer(&mut sim, None);
    let events: Vec<String> = (1..=3)
        .map(|i| event("s", i, 30_000 * i as usize))
        .collect();
    let body = events.join("\n") + "\n";
    let mut wire = post(&body);
    wire.extend_from_slice(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let head_end = wire.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let emitter = sim.connect(None);
    let cuts = [0, head_end + 10, head_end + 400, head_end + 401, wire.len()];
    for w in cuts.windows(2) {
        sim.feed(emitter, &wire[w[0]..w[1]], false);
    }
    let out = sim.take_output(emitter).unwrap();
    assert_eq!(
        statuses(&out),
        ["202", "200"],
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert!(String::from_utf8_lossy(&out).contains(r#"{"accepted":3}"#));
    assert_same(&data_lines(&sim.take_output(sub).unwrap()), &events);
}

/// A shorter body after a longer one reuses its buffer: it holds exactly its own bytes,
/// never the rest of the earlier body; a body larger than the kept buffer gets its own.
#[test]
fn a_kept_body_buffer_never_shows_an_earlier_body() {
    let mut sim = Sim::new(Config::default()).unwrap();
    let sub = consumer(&mut sim, None);
    let emitter = sim.connect(None);
    let mut sent = Vec::new();
    for (n, (count, pad)) in [(4, 20_000), (1, 10), (2, 500), (6, 30_000), (1, 0)]
        .into_iter()
        .enumerate()
    {
        let events: Vec<String> = (0..count)
            .map(|i| event(&format!("s{n}"), i, pad + i as usize))
            .collect();
        sim.feed(emitter, &post(&(events.join("\n") + "\n")), false);
        let out = sim.take_output(emitter).unwrap();
        assert_eq!(statuses(&out), ["202"], "{}", String::from_utf8_lossy(&out));
        assert!(String::from_utf8_lossy(&out).contains(&format!(r#"{{"accepted":{count}}}"#)));
        sent.extend(events);
    }
    assert_same(&data_lines(&sim.take_output(sub).unwrap()), &sent);
}

/// Asserts that `got` are the Events `sent`, in order, without printing them (they are
/// long): the first difference by index and length.
fn assert_same(got: &[String], sent: &[String]) {
    for (i, (g, s)) in got.iter().zip(sent).enumerate() {
        assert!(
            g == s,
            "Event {i} differs: {} bytes against {} sent",
            g.len(),
            s.len()
        );
    }
    assert_eq!(got.len(), sent.len(), "Events delivered");
}

/// A stalled consumer pauses the publication while accepted Events wait, their bytes
/// in their body's buffer, and later bodies are read meanwhile; once its queue is over
/// its bound it misses `info` Events (AEP-0003 §8.4). Every Event still reaches the
/// consumer that reads, intact and in order, and each one the stalled consumer got is
/// intact too.
#[test]
fn bodies_accepted_around_a_paused_publication_arrive_intact() {
    let mut sim = Sim::new(Config {
        max_output_bytes: 256 * 1024,
        ..Config::default()
    })
    .unwrap();
    let stalled = consumer(&mut sim, Some(8 * 1024));
    let reader = consumer(&mut sim, None);
    let emitter = sim.connect(None);
    let mut sent = Vec::new();
    let mut wire = Vec::new();
    for b in 0..6 {
        let events: Vec<String> = (0..8)
            .map(|i| event(&format!("p{b}"), i, 9000 + b))
            .collect();
        wire.extend(post(&(events.join("\n") + "\n")));
        sent.extend(events);
    }
    sim.feed(emitter, &wire, false);
    let answers = sim.take_output(emitter).unwrap();
    assert_eq!(statuses(&answers), ["202"; 6]);
    assert_same(&data_lines(&sim.take_output(reader).unwrap()), &sent);
    // Now it reads everything its queue holds.
    let mut out = Vec::new();
    loop {
        let more = sim.take_output(stalled).unwrap();
        if more.is_empty() {
            break;
        }
        out.extend(more);
    }
    let partial = data_lines(&out);
    assert!(
        !partial.is_empty() && partial.len() < sent.len(),
        "the stalled consumer got {} of {} Events",
        partial.len(),
        sent.len()
    );
    // What it got is a subsequence of what was sent, each Event whole.
    let mut rest = sent.iter();
    for (i, got) in partial.iter().enumerate() {
        assert!(
            rest.any(|s| s == got),
            "Event {i} of the stalled consumer was not sent as it is"
        );
    }
}
