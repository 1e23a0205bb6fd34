//! A line-based SSE reader for streams the relay writes (`text/event-stream`, AEP-0003
//! §3.3): messages with their `event`, `id` and `data` fields and the comments before
//! them. For a stream read exactly as a browser's `EventSource` does, see
//! [`super::whatwg`].

use super::WAIT;
use std::io::{BufRead, BufReader, Read};

/// One SSE message as a client sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SseMessage {
    pub event: Option<String>,
    pub id: Option<String>,
    /// The `data` lines, joined with LF.
    pub data: String,
    /// Comment lines (without the leading `:` and space) seen before this message;
    /// heartbeat `ping` and the `aep-relay …` stream-open comment excluded.
    pub comments: Vec<String>,
}

/// An open event stream.
pub struct SseStream {
    reader: BufReader<Box<dyn Read + Send + Sync>>,
}

impl SseStream {
    /// Reads messages from `body` (a response body after its head).
    pub fn new(body: Box<dyn Read + Send + Sync>) -> SseStream {
        SseStream {
            reader: BufReader::new(body),
        }
    }

    /// The next message (with the comments before it); `None` at end of stream. A read
    /// waits at most [`WAIT`] (the connection's read timeout).
    pub fn next(&mut self) -> Option<SseMessage> {
        let mut msg = SseMessage::default();
        let mut has_data = false;
        loop {
            let mut line = String::new();
            let n = self
                .reader
                .read_line(&mut line)
                .unwrap_or_else(|e| panic!("SSE read failed (waited {WAIT:?}?): {e}"));
            if n == 0 {
                return None;
            }
            let line = line.trim_end_matches('\n').trim_end_matches('\r');
            if line.is_empty() {
                if has_data {
                    return Some(msg);
                }
                continue;
            }
            if let Some(c) = line.strip_prefix(':') {
                let c = c.strip_prefix(' ').unwrap_or(c);
                if c != "ping" && !c.starts_with("aep-relay") {
                    msg.comments.push(c.to_string());
                }
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "event" => msg.event = Some(value.to_string()),
                "id" => msg.id = Some(value.to_string()),
                "data" => {
                    if has_data {
                        msg.data.push('\n');
                    }
                    msg.data.push_str(value);
                    has_data = true;
                }
                _ => {}
            }
        }
    }

    /// The next message, which must exist.
    pub fn expect(&mut self) -> SseMessage {
        self.next().expect("the stream ended early")
    }

    /// Reads every remaining message until the stream ends.
    pub fn rest(&mut self) -> Vec<SseMessage> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

/// Backpressure (AEP-0003 §8.4) beside one stalled consumer: posts `batches` batches of
/// `per` info Events of session `bp`, seq 0 upwards, each padded to about 1 KB, with
/// `post`; `healthy` must receive each batch in order, nothing lost, before the next is
/// posted, so a healthy reader never has more in flight than its queue holds (and the
/// stalled one, reading nothing, fills its queue). Returns `healthy`, caught up.
pub fn flood_beside_a_stalled_consumer(
    healthy: SseStream,
    batches: u64,
    per: u64,
    mut post: impl FnMut(&[String]),
) -> SseStream {
    let pad = "x".repeat(900);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut healthy = healthy;
        for n in 0..batches * per {
            let m = healthy.expect();
            assert!(
                m.data.contains(&format!("\"seq\":{n},")),
                "healthy consumer: in order, nothing lost"
            );
            if (n + 1) % per == 0 {
                done_tx.send(()).unwrap();
            }
        }
        healthy
    });
    for b in 0..batches {
        let lines: Vec<String> = (0..per)
            .map(|i| {
                super::event(
                    "bp",
                    0,
                    b * per + i,
                    "tool.completed",
                    &format!(",\"pad\":\"{pad}\""),
                )
            })
            .collect();
        post(&lines);
        done_rx
            .recv_timeout(WAIT)
            .expect("the healthy consumer keeps up");
    }
    reader.join().unwrap()
}

/// The `notice` that follows [`flood_beside_a_stalled_consumer`]'s `total` Events (seq
/// `total`, about 20 KB): a stalled consumer with no room for it is disconnected, since a
/// notice is never dropped (AEP-0003 §8.4). It is larger than the quarter of a 64 KiB
/// bound that `info` Events leave free (they stop at three quarters of it), so one
/// notice meets a queue the flood filled.
pub fn backpressure_notice(total: u64) -> String {
    let big = "y".repeat(20_000);
    super::event(
        "bp",
        0,
        total,
        "error.raised",
        &format!(r#","severity":"notice","pad":"{big}""#),
    )
}

/// What a consumer disconnected for backpressure read (`got`, up to the end of its
/// stream) lacks `notice`, and a `live=0` stream opened by `resume` with its last
/// `id:` as `Last-Event-ID` replays exactly what came after it: the next seq first,
/// `notice` last, no duplicate, `total + 1` Events in all (AEP-0003 §3.4, §8.4).
pub fn assert_resumes_exactly(
    got: &str,
    resume: impl FnOnce(&str) -> SseStream,
    notice: &str,
    total: u64,
) {
    let last_id = got
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .next_back()
        .expect("it had received some Events");
    assert!(!got.contains("error.raised"));
    let mut resumed = resume(last_id);
    let last_seq: u64 = last_id.rsplit(':').next().unwrap().parse().unwrap();
    let first = resumed.expect();
    assert!(
        first.data.contains(&format!("\"seq\":{},", last_seq + 1)),
        "{}",
        &first.data[..120]
    );
    let rest = resumed.rest();
    assert_eq!(rest.last().unwrap().data, notice);
    assert_eq!(rest.len() as u64 + 1, total - last_seq);
}
