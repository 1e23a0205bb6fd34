//! Replay is paced by the consumer: a huge `from=all` costs bounded memory, and live
//! Events that arrive meanwhile follow the replay in order with no gap and no duplicate
//! (AEP-0003 §5, §7, §8.4). Driven through in-memory connections, whose unread output is
//! capped exactly like a consumer that reads slowly.

use aep_relay::Config;
use aep_sim::Sim;
use bytes::Bytes;

const MAX_OUTPUT: usize = 64 * 1024;

fn ev(session: &str, seq: u64) -> String {
    ev_padded(session, seq, 900)
}

fn ev_padded(session: &str, seq: u64, pad: usize) -> String {
    format!(
        r#"{{"aep":"0.1","id":"{session}-{seq}","type":"tool.completed","time":"2026-07-03T10:00:00Z","source":"aep://h/agent/a","agent":"a","session":"{session}","seq":{seq},"pad":"{}"}}"#,
        "p".repeat(pad)
    )
}

/// Collects SSE `id:` lines from output that arrives in arbitrary pieces.
#[derive(Default)]
struct Reader {
    partial: String,
    ids: Vec<String>,
    markers: usize,
}

impl Reader {
    fn feed(&mut self, bytes: Vec<u8>) {
        self.partial.push_str(&String::from_utf8(bytes).unwrap());
        let Some(end) = self.partial.rfind('\n') else {
            return;
        };
        for line in self.partial[..end].lines() {
            if let Some(id) = line.strip_prefix("id: ") {
                self.ids.push(id.to_string());
            }
            self.markers += usize::from(line.starts_with(": replay-exhausted"));
        }
        self.partial.drain(..=end);
    }
}

/// A consumer of `GET /stream?{query}` that holds at most 16 KiB unread at a time: its
/// queue fills before it reads.
fn slow_consumer(relay: &mut Sim, query: &str) -> aep_relay::ConnId {
    let c = relay.connect(Some(16 * 1024));
    let req = format!("GET /stream?{query} HTTP/1.1\r\nHost: x\r\n\r\n");
    relay.feed(c, req.as_bytes(), false);
    c
}

#[test]
fn a_large_replay_is_paced_and_live_events_follow_it_exactly_once() {
    let mut relay = Sim::new(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        buffer_per_session: 50_000,
        max_output_bytes: MAX_OUTPUT,
        ..Config::default()
    })
    .unwrap();
    let total = 20_000u64;
    for chunk in (0..total).collect::<Vec<_>>().chunks(1000) {
        let body: String = chunk.iter().map(|&i| ev("a", i) + "\n").collect();
        relay.ingest(Bytes::from(body)).unwrap();
    }
    let c = slow_consumer(&mut relay, "from=all");
    // The largest SSE message: the Event with its `event:`, `id:` and `data:` lines.
    let one_frame = ev("a", total).len() + 128;
    let mut got = Reader::default();
    let mut rounds = 0;
    let mut posted_live = false;
    while got.ids.len() < (total + 3) as usize {
        let queued = relay.queued_output(c).unwrap();
        // AEP-0003 §8.4: the bound plus one frame, not plus a page.
        assert!(
            queued <= MAX_OUTPUT + one_frame,
            "bounded: {queued} bytes queued for a 20 MB replay"
        );
        got.feed(relay.take_output(c).unwrap());
        rounds += 1;
        if !posted_live && got.ids.len() > 5_000 {
            // Mid-replay: one Event of the session being replayed, one of a new session
            // and one already-held position redelivered (admission dedupes it).
            let body = format!("{}\n{}\n", ev("a", total), ev("b", 0));
            relay.ingest(Bytes::from(body)).unwrap();
            relay.ingest(Bytes::from(ev("a", total + 1))).unwrap();
            posted_live = true;
        }
        // A bounded loop: the relay must make progress every round.
        assert!(
            rounds < 100_000,
            "replay stalled at {} Events",
            got.ids.len()
        );
    }
    let ids = got.ids;
    let want: Vec<String> = (0..=total + 1)
        .map(|i| format!("a:0:{i}"))
        .chain(std::iter::once("b:0:0".to_string()))
        .collect();
    let mut sorted_a: Vec<&String> = ids.iter().filter(|i| i.starts_with("a:")).collect();
    sorted_a.dedup();
    assert_eq!(
        sorted_a.len(),
        (total + 2) as usize,
        "every Event of a exactly once"
    );
    assert_eq!(
        ids, want,
        "replay order, then the live Event of the new session"
    );
    assert_eq!(got.markers, 0);
}

/// A page of large Events ends once the queue is full: a stalled consumer of a store of
/// 60 KiB Events holds the bound plus one Event, never a page of 64 of them (3.8 MiB).
#[test]
fn a_replay_page_of_large_events_stops_at_the_bound() {
    let pad = 60 * 1024;
    let mut relay = Sim::new(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        buffer_per_session: 200,
        max_body_bytes: 256 * 1024,
        max_output_bytes: MAX_OUTPUT,
        ..Config::default()
    })
    .unwrap();
    for seq in 0..100 {
        relay
            .ingest(Bytes::from(ev_padded("big", seq, pad)))
            .unwrap();
    }
    let frame = pad + 512;
    let c = slow_consumer(&mut relay, "from=all&live=0");
    let mut got = Reader::default();
    let mut rounds = 0;
    while got.ids.len() < 100 {
        let queued = relay.queued_output(c).unwrap_or(0);
        assert!(
            queued <= MAX_OUTPUT + frame,
            "{queued} bytes queued: over the bound plus one {frame}-byte frame"
        );
        got.feed(relay.take_output(c).unwrap_or_default());
        rounds += 1;
        assert!(
            rounds < 10_000,
            "replay stalled at {} Events",
            got.ids.len()
        );
    }
    let want: Vec<String> = (0..100).map(|i| format!("big:0:{i}")).collect();
    assert_eq!(got.ids, want, "every Event once, in order");
}

/// Reads `c` to its end (the relay shut its side), the whole text.
fn read_to_end(relay: &mut Sim, c: aep_relay::ConnId) -> String {
    let mut all = Vec::new();
    for _ in 0..100_000 {
        all.extend(relay.take_output(c).unwrap_or_default());
        if relay.is_shut(c) {
            all.extend(relay.take_output(c).unwrap_or_default());
            return String::from_utf8(all).unwrap();
        }
    }
    panic!("the stream never ended");
}

/// A replay-only stream whose session leaves the store mid-replay (`--max-sessions`)
/// did not deliver everything it was asked for: it ends without `: replay-complete`,
/// so a client resumes instead of taking a partial history for the whole of it.
#[test]
fn a_replay_only_stream_whose_session_is_evicted_does_not_say_complete() {
    let mut relay = Sim::new(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        buffer_per_session: 200,
        max_sessions: 2,
        max_output_bytes: MAX_OUTPUT,
        ..Config::default()
    })
    .unwrap();
    for seq in 0..100 {
        relay
            .ingest(Bytes::from(ev_padded("ev1", seq, 4096)))
            .unwrap();
    }
    let filter = "filter=%7B%22session%22%3A%22ev1%22%7D&live=0";
    let c = slow_consumer(&mut relay, filter);
    let first = relay.take_output(c).unwrap();
    assert!(!first.is_empty(), "the replay began");
    // Two other sessions: the least recently written (ev1) leaves the store.
    relay.ingest(Bytes::from(ev("o1", 0))).unwrap();
    relay.ingest(Bytes::from(ev("o2", 0))).unwrap();
    let rest = read_to_end(&mut relay, c);
    assert!(
        !rest.contains("replay-complete"),
        "{}",
        &rest[rest.len().saturating_sub(200)..]
    );

    // Undisturbed, the same request ends with it.
    let c = slow_consumer(&mut relay, "filter=%7B%22session%22%3A%22o1%22%7D&live=0");
    let all = read_to_end(&mut relay, c);
    assert!(all.ends_with(": replay-complete\n\n"), "{all}");
}

/// A graceful shutdown ends a replay-only stream that is still replaying the way it
/// ends a live one: what was queued, then `: shutting-down`, never `: replay-complete`.
#[test]
fn shutdown_ends_a_replay_only_stream_mid_replay_with_shutting_down() {
    let mut relay = Sim::new(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        buffer_per_session: 2_000,
        max_output_bytes: MAX_OUTPUT,
        ..Config::default()
    })
    .unwrap();
    let body: String = (0..1_000).map(|i| ev("a", i) + "\n").collect();
    relay.ingest(Bytes::from(body)).unwrap();
    let c = slow_consumer(&mut relay, "from=all&live=0");
    let first = String::from_utf8(relay.take_output(c).unwrap()).unwrap();
    relay.shutdown();
    let all = first + &read_to_end(&mut relay, c);
    assert!(
        all.ends_with(": shutting-down\n\n"),
        "{}",
        &all[all.len() - 100..]
    );
    assert!(!all.contains("replay-complete"));
    let ids = all.lines().filter(|l| l.starts_with("id: ")).count();
    assert!(
        ids < 1_000,
        "the replay stopped at the shutdown ({ids} Events)"
    );
}
