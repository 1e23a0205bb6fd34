//! Coalescing (module docs of `crate::fanout`): the frames of one ingest unit reach each
//! connection as few slices as its selection allows, byte-identical to the per-Event
//! frames, in order. Backpressure (AEP-0003 §8.4): pauses, shedding by severity, drop
//! notices.

use super::*;
use crate::core::conn::{Conn, Conns};
use crate::fanout::Delivered;
use crate::filter::Filter;
use crate::wire::envelope::Event;
use crate::wire::ws::{self, aep};
use crate::{capture, wire::sse};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Instant;

fn event(i: u64, severity: &str) -> Arc<Event> {
    let s = format!(
        r#"{{"aep":"0.1","id":"e{i}","type":"tool.completed","time":"2026-01-01T00:00:00Z","source":"aep://h/agent/a/session/s","agent":"a","session":"s{}","seq":{i},"severity":"{severity}","capture":"full","data":{{"n":{i}}}}}"#,
        i % 2
    );
    Arc::new(Event::parse(Bytes::from(s)).expect("valid Event"))
}

fn conn() -> Conn {
    let peer = "127.0.0.1:1".parse().unwrap();
    Conn::new(peer, Instant::now())
}

struct Setup {
    hub: Hub,
    conns: Conns,
    /// What each connection's socket took, when a paused fan-out let it write.
    written: Vec<Vec<u8>>,
    /// Connections whose socket takes nothing.
    blocked: Vec<ConnId>,
    /// The number of the Event being published (`Subscriber::decided`).
    publication: u64,
}

impl Setup {
    fn new() -> Setup {
        Setup {
            hub: Hub::default(),
            conns: Conns::default(),
            written: Vec::new(),
            blocked: Vec::new(),
            publication: 0,
        }
    }

    fn subscribe(&mut self, filter: &str, ceiling: Option<Capture>, ws: bool) -> ConnId {
        let (key, _) = self.conns.insert(conn());
        self.add(key, filter, ceiling, ws);
        key
    }

    fn add(&mut self, key: ConnId, filter: &str, ceiling: Option<Capture>, ws: bool) {
        let binding = if ws {
            Binding::Ws(Delivered::new(16))
        } else {
            Binding::Sse
        };
        self.hub.insert(Subscription {
            conn: key,
            filter: Arc::new(Filter::parse(filter.as_bytes()).expect("filter")),
            ceiling,
            binding,
        });
    }

    /// Fans `events` out as one unit; returns the connections made dirty and doomed.
    fn unit(&mut self, events: &[Arc<Event>], max_output: usize) -> (Vec<ConnId>, Vec<ConnId>) {
        let (mut dirty, mut doomed) = (Vec::new(), Vec::new());
        self.hub.begin_unit();
        for ev in events {
            self.publication += 1;
            // As the core does: a paused fan-out lets the reactor write (here: every
            // queue is written to its socket, a Vec that takes everything), then the
            // same Event is fanned out again.
            let p = Publication {
                ev,
                placed: &[],
                number: self.publication,
                max_output,
            };
            while let Fanned::Paused(_) =
                self.hub
                    .fanout(p, self.conns.subscribers(), &mut dirty, &mut doomed)
            {
                for (key, conn) in self.conns.iter_mut() {
                    let i = key.index();
                    if self.written.len() <= i {
                        self.written.resize(i + 1, Vec::new());
                    }
                    if !self.blocked.contains(&key) {
                        let _ = conn
                            .subscriber
                            .out
                            .flush(&mut self.written[i], &mut self.hub.chunks);
                    }
                    conn.subscriber.offered = conn.subscriber.out.pushed();
                }
            }
        }
        self.hub.end_unit(self.conns.subscribers());
        (dirty, doomed)
    }

    /// The consumer `key` reads everything queued for it (its socket takes it all).
    fn drain(&mut self, key: ConnId) {
        if self.written.len() <= key.index() {
            self.written.resize(key.index() + 1, Vec::new());
        }
        let conn = &mut self.conns[key];
        let _ = conn
            .subscriber
            .out
            .flush(&mut self.written[key.index()], &mut self.hub.chunks);
        conn.subscriber.offered = conn.subscriber.out.pushed();
    }

    /// Queue entries and queued bytes of `key`.
    fn queued(&mut self, key: ConnId) -> (usize, Vec<u8>) {
        let q = &self.conns[key].subscriber.out;
        (q.entries(), q.concat())
    }
}

fn sse_of(events: &[Arc<Event>], keep: impl Fn(&Event) -> bool) -> Vec<u8> {
    let mut out = Vec::new();
    for ev in events.iter().filter(|e| keep(e)) {
        out.extend_from_slice(&sse::message(ev, ev.bytes()));
    }
    out
}

#[test]
fn a_match_all_subscriber_gets_one_slice_per_batch() {
    let mut s = Setup::new();
    let all = s.subscribe("{}", None, false);
    let ws = s.subscribe("{}", None, true);
    let events: Vec<_> = (0..100).map(|i| event(i, "info")).collect();
    let (dirty, doomed) = s.unit(&events, 1 << 20);
    assert!(doomed.is_empty());
    assert_eq!(dirty.len(), 2);
    let (entries, bytes) = s.queued(all);
    assert_eq!(entries, 1, "100 consecutive SSE frames are one run");
    assert_eq!(bytes, sse_of(&events, |_| true), "byte-identical, in order");
    let (entries, bytes) = s.queued(ws);
    assert_eq!(entries, 1, "100 consecutive WS frames are one run");
    let want: Vec<u8> = events
        .iter()
        .flat_map(|e| ws::rfc6455::text(e.bytes()).to_vec())
        .collect();
    assert_eq!(bytes, want);
    assert_eq!(s.hub.stats.deliveries, 200);
}

#[test]
fn a_run_breaks_exactly_where_the_selection_does() {
    let mut s = Setup::new();
    let all = s.subscribe("{}", None, false);
    let half = s.subscribe(r#"{"session":"s0"}"#, None, false);
    let events: Vec<_> = (0..10).map(|i| event(i, "info")).collect();
    s.unit(&events, 1 << 20);
    assert_eq!(s.queued(all).0, 1);
    let (entries, bytes) = s.queued(half);
    assert_eq!(entries, 5, "every other frame: five runs of one");
    assert_eq!(bytes, sse_of(&events, |e| e.session() == Some("s0")));
    // A subscriber alone on its selection takes consecutive frames of its arena even
    // though other Events came between: one run.
    let mut s = Setup::new();
    let half = s.subscribe(r#"{"session":"s0"}"#, None, false);
    s.unit(&events, 1 << 20);
    let (entries, bytes) = s.queued(half);
    assert_eq!(entries, 1);
    assert_eq!(bytes, sse_of(&events, |e| e.session() == Some("s0")));
}

#[test]
fn ceilings_select_their_arena_and_several_subscriptions_deliver_once_at_the_widest() {
    let mut s = Setup::new();
    let low = s.subscribe("{}", Some(Capture::Metadata), false);
    let both = s.subscribe("{}", Some(Capture::Metadata), false);
    s.add(both, r#"{"session":"s1"}"#, None, false);
    let events: Vec<_> = (0..6).map(|i| event(i, "info")).collect();
    s.unit(&events, 1 << 20);
    let cut = |e: &Event| {
        let p = capture::downlevel(e, Capture::Metadata).expect("down-levels");
        sse::message(e, &p).to_vec()
    };
    let (entries, bytes) = s.queued(low);
    assert_eq!(entries, 1);
    assert_eq!(
        bytes,
        events.iter().flat_map(|e| cut(e)).collect::<Vec<_>>()
    );
    let (entries, bytes) = s.queued(both);
    let want: Vec<u8> = events
        .iter()
        .flat_map(|e| match e.session() {
            Some("s1") => sse::message(e, e.bytes()).to_vec(),
            _ => cut(e),
        })
        .collect();
    assert_eq!(bytes, want, "s1 as received, s0 at metadata, each once");
    assert_eq!(entries, 6, "alternating arenas: a run per frame");
}

/// AEP-0003 §8.4, AEP-0007 §5 item 1: toward a consumer that reads nothing, `debug`
/// Events stop at half the bound, `info` at three quarters, `notice` and above take the
/// rest; drops are counted by severity, in order, and only a `notice` that does not fit
/// the whole bound disconnects.
#[test]
fn a_queue_sheds_debug_past_half_its_bound_and_info_past_three_quarters() {
    let mut s = Setup::new();
    let slow = s.subscribe("{}", None, false);
    s.blocked.push(slow);
    let frame = |e: &Arc<Event>| sse::message(e, e.bytes()).len();
    let debug: Vec<_> = (100..140).map(|i| event(i, "debug")).collect();
    let info: Vec<_> = (200..240).map(|i| event(i, "info")).collect();
    let one = frame(&debug[0]);
    let max = 16 * one;
    // Each run stops at its mark, the next frame of its severity past it.
    let (_, doomed) = s.unit(&debug, max);
    assert!(doomed.is_empty());
    let (_, after_debug) = s.queued(slow);
    assert!(after_debug.len() <= max / 2 && after_debug.len() + one > max / 2);
    assert_eq!(after_debug, sse_of(&debug[..8], |_| true));
    assert_eq!(
        s.conns[slow].subscriber.dropped,
        Drops { debug: 32, info: 0 }
    );
    let (_, doomed) = s.unit(&info, max);
    assert!(doomed.is_empty());
    let (_, after_info) = s.queued(slow);
    let took = (after_info.len() - after_debug.len()) / frame(&info[0]);
    assert_eq!(took, 4, "info up to three quarters: 12 frames of 16");
    assert_eq!(
        after_info[after_debug.len()..],
        sse_of(&info[..4], |_| true)
    );
    let dropped = Drops {
        debug: 32,
        info: 36,
    };
    assert_eq!(s.conns[slow].subscriber.dropped, dropped);
    assert_eq!(s.hub.stats.dropped, dropped);
    // A debug Event now finds the queue past its mark too; a notice still fits.
    let (_, doomed) = s.unit(&[event(300, "debug"), event(301, "notice")], max);
    assert!(doomed.is_empty());
    assert_eq!(s.conns[slow].subscriber.dropped.debug, 33);
    let notices: Vec<_> = (302..306).map(|i| event(i, "notice")).collect();
    let (_, doomed) = s.unit(&notices[..2], max);
    assert!(doomed.is_empty(), "notices take the last quarter");
    let (_, doomed) = s.unit(&notices[2..], max);
    assert_eq!(doomed, vec![slow], "a notice that does not fit disconnects");
    assert_eq!(s.hub.stats.backpressure_disconnects, 1);
}

/// The marks come from one function of the severity and the bound.
#[test]
fn the_marks_are_half_and_three_quarters_of_the_bound() {
    let max = 1 << 20;
    assert_eq!(shed_mark(Severity::Debug, max), 512 * 1024);
    assert_eq!(shed_mark(Severity::Info, max), 768 * 1024);
    for s in [
        Severity::Notice,
        Severity::Warning,
        Severity::Error,
        Severity::Critical,
    ] {
        assert_eq!(shed_mark(s, max), max);
    }
}

/// A consumer told of drops (every SSE stream) gets `: dropped {n} debug={d} info={i}`
/// just before the next Event delivered after them, between two messages, with the
/// count since the previous comment; nothing when nothing was dropped.
#[test]
fn drops_are_announced_just_before_the_next_event_delivered() {
    let mut s = Setup::new();
    let slow = s.subscribe("{}", None, false);
    s.conns[slow].subscriber.announce_drops = true;
    s.blocked.push(slow);
    let debug: Vec<_> = (100..110).map(|i| event(i, "debug")).collect();
    let one = sse::message(&debug[0], debug[0].bytes()).len();
    let max = 8 * one + 100;
    s.unit(&debug, max);
    let (_, first) = s.queued(slow);
    assert_eq!(first, sse_of(&debug[..4], |_| true), "no comment yet");
    // The consumer reads everything; the next Events are delivered, the first after
    // the comment.
    s.drain(slow);
    let next = [event(110, "info"), event(111, "debug")];
    s.unit(&next, max);
    s.drain(slow);
    let mut want = sse_of(&debug[..4], |_| true);
    want.extend_from_slice(b": dropped 6 debug=6 info=0\n\n");
    want.extend_from_slice(&sse_of(&next, |_| true));
    assert_eq!(s.written[slow.index()], want);
    assert!(s.conns[slow].subscriber.unannounced.is_empty());
    // Drops of both severities, then a notice: one comment with both counts.
    s.written[slow.index()].clear();
    let info: Vec<_> = (120..128).map(|i| event(i, "info")).collect();
    let debug: Vec<_> = (128..134).map(|i| event(i, "debug")).collect();
    let late: Vec<_> = (134..138).map(|i| event(i, "info")).collect();
    let mixed: Vec<_> = [&info[..], &debug[..], &late[..]].concat();
    s.unit(&mixed, max);
    assert_eq!(
        s.conns[slow].subscriber.dropped,
        Drops { debug: 12, info: 6 }
    );
    s.drain(slow);
    let notice = event(140, "notice");
    s.unit(std::slice::from_ref(&notice), max);
    s.drain(slow);
    let mut want = sse_of(&info[..6], |_| true);
    want.extend_from_slice(b": dropped 12 debug=6 info=6\n\n");
    want.extend_from_slice(&sse_of(&[notice], |_| true));
    assert_eq!(
        String::from_utf8_lossy(&s.written[slow.index()]),
        String::from_utf8_lossy(&want)
    );
}

/// A WebSocket that asked (`capabilities.experimental.dropped`) gets a `dropped` frame
/// where an SSE stream gets the comment; one that did not gets nothing but the count.
#[test]
fn a_websocket_that_asked_gets_a_dropped_frame() {
    let mut s = Setup::new();
    let asked = s.subscribe("{}", None, true);
    let quiet = s.subscribe("{}", None, true);
    s.conns[asked].subscriber.announce_drops = true;
    s.blocked.extend([asked, quiet]);
    let debug: Vec<_> = (100..110).map(|i| event(i, "debug")).collect();
    let one = ws::rfc6455::text(debug[0].bytes()).len();
    let max = 8 * one + 100;
    s.unit(&debug, max);
    s.drain(asked);
    s.drain(quiet);
    let next = event(110, "notice");
    s.unit(std::slice::from_ref(&next), max);
    s.drain(asked);
    s.drain(quiet);
    let frames = |evs: &[Arc<Event>]| -> Vec<u8> {
        evs.iter()
            .flat_map(|e| ws::rfc6455::text(e.bytes()).to_vec())
            .collect()
    };
    let mut want = frames(&debug[..4]);
    want.extend_from_slice(&aep::dropped(6, 0));
    want.extend_from_slice(&frames(std::slice::from_ref(&next)));
    assert_eq!(s.written[asked.index()], want);
    let mut want = frames(&debug[..4]);
    want.extend_from_slice(&frames(std::slice::from_ref(&next)));
    assert_eq!(s.written[quiet.index()], want);
    assert_eq!(s.conns[quiet].subscriber.dropped.debug, 6);
    assert!(
        s.conns[quiet].subscriber.unannounced.is_empty(),
        "nothing to tell"
    );
}

/// Live frames held behind a replay (the backlog) are shed by the same marks, against
/// the backlog's own length, and the comment goes into the backlog, in order.
#[test]
fn the_backlog_behind_a_replay_sheds_by_the_same_marks() {
    let mut s = Setup::new();
    let late = s.subscribe("{}", None, false);
    s.conns[late].subscriber.announce_drops = true;
    // Something held already: live frames join the backlog, not the queue.
    s.conns[late]
        .subscriber
        .backlog
        .push(Bytes::from_static(b": held\n\n"));
    let debug: Vec<_> = (100..120).map(|i| event(i, "debug")).collect();
    let one = sse::message(&debug[0], debug[0].bytes()).len();
    let max = 8 * one + 100;
    s.unit(&debug, max);
    assert_eq!(
        s.conns[late].subscriber.dropped,
        Drops { debug: 16, info: 0 }
    );
    let notice = event(120, "notice");
    s.unit(std::slice::from_ref(&notice), max);
    let mut want = b": held\n\n".to_vec();
    want.extend_from_slice(&sse_of(&debug[..4], |_| true));
    want.extend_from_slice(b": dropped 16 debug=16 info=0\n\n");
    want.extend_from_slice(&sse_of(&[notice], |_| true));
    assert_eq!(s.conns[late].subscriber.backlog.concat(), want);
    assert!(s.conns[late].subscriber.out.is_empty());
}

#[test]
fn a_queue_over_its_bound_is_offered_to_the_socket_before_dropping() {
    // The publication pauses at the Event's mark, not only at the bound: `debug` past
    // half of it is offered to the socket before anything is judged.
    for severity in ["debug", "info"] {
        let mut s = Setup::new();
        let fast = s.subscribe("{}", None, false);
        s.conns[fast].subscriber.announce_drops = true;
        let events: Vec<_> = (0..50).map(|i| event(i, severity)).collect();
        let one = sse::message(&events[0], events[0].bytes()).len();
        // The batch is far larger than the bound; the pipe takes everything offered.
        let (_, doomed) = s.unit(&events, one * 4);
        assert!(doomed.is_empty());
        assert_eq!(
            s.hub.stats.dropped.total(),
            0,
            "{severity}: a consumer that keeps up loses nothing"
        );
        let mut got = s.written[fast.index()].clone();
        got.extend_from_slice(&s.queued(fast).1);
        assert_eq!(got, sse_of(&events, |_| true), "{severity}: and no comment");
    }
}

/// A fan-out that pauses part-way (the second consumer must be offered its queue first)
/// and is tried again delivers each Event to each consumer exactly once, in order: the
/// first consumer, already decided, is skipped on the retry (`Subscriber::decided`).
#[test]
fn a_fan_out_paused_part_way_delivers_each_event_once_to_everyone() {
    let mut s = Setup::new();
    // `a` (WS frames, a little smaller) comes first and fills more slowly than `b`
    // (SSE), so the fan-out pauses at `b` after `a` got the Event.
    let a = s.subscribe("{}", None, true);
    let b = s.subscribe("{}", None, false);
    let events: Vec<_> = (0..50).map(|i| event(i, "notice")).collect();
    let one = sse::message(&events[0], events[0].bytes()).len();
    let (_, doomed) = s.unit(&events, one * 4);
    assert!(doomed.is_empty());
    assert_eq!(s.hub.stats.dropped.total(), 0);
    let mut got_b = s.written[b.index()].clone();
    got_b.extend_from_slice(&s.queued(b).1);
    assert_eq!(got_b, sse_of(&events, |_| true));
    let mut got_a = s.written[a.index()].clone();
    got_a.extend_from_slice(&s.queued(a).1);
    let want_a: Vec<u8> = events
        .iter()
        .flat_map(|e| ws::rfc6455::text(e.bytes()).to_vec())
        .collect();
    assert_eq!(got_a, want_a, "each Event once, in order");
}

/// `permessage-deflate` (RFC 7692): each Event is compressed at most once per capture
/// level, however many subscribers negotiated `permessage-deflate`; they all get the same
/// bytes (RSV1 set), which inflate to the plain subscribers' payloads; a plain WS
/// subscriber in the same fan-out gets plain frames; with no compressing target nothing
/// is compressed at all.
#[test]
fn compressed_frames_are_built_once_per_event_and_capture_level() {
    let mut s = Setup::new();
    let plain = s.subscribe("{}", None, true);
    let zipped: Vec<ConnId> = (0..3).map(|_| s.subscribe("{}", None, true)).collect();
    let low: Vec<ConnId> = (0..2)
        .map(|_| s.subscribe("{}", Some(Capture::Metadata), true))
        .collect();
    let events: Vec<_> = (0..10).map(|i| event(i, "info")).collect();
    s.unit(&events[..1], 1 << 20);
    assert_eq!(
        s.hub.deflater.as_ref().map(|d| d.messages()),
        None,
        "no compressing target"
    );
    for &k in zipped.iter().chain(&low) {
        s.conns[k].subscriber.deflate_window = 15;
    }
    for (_, c) in s.conns.iter_mut() {
        c.subscriber.out = OutQueue::default();
    }
    s.unit(&events[1..], 1 << 20);
    let d = s
        .hub
        .deflater
        .as_ref()
        .expect("created for the compressing targets");
    assert_eq!(
        d.messages(),
        9 * 2,
        "once per Event and capture level, not per subscriber"
    );
    let inflate = |bytes: &[u8]| -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut b = bytes;
        while !b.is_empty() {
            assert_eq!(b[0], 0xC1, "FIN, RSV1, text");
            let (len, head) = match b[1] {
                126 => (usize::from(u16::from_be_bytes([b[2], b[3]])), 4),
                n => (usize::from(n), 2),
            };
            let mut input = b[head..head + len].to_vec();
            input.extend_from_slice(&[0, 0, 0xff, 0xff]);
            let mut text = Vec::with_capacity(4096);
            flate2::Decompress::new(false)
                .decompress_vec(&input, &mut text, flate2::FlushDecompress::Sync)
                .unwrap();
            out.push(text);
            b = &b[head + len..];
        }
        out
    };
    let (_, first) = s.queued(zipped[0]);
    for &k in &zipped[1..] {
        assert_eq!(
            s.queued(k).1,
            first,
            "the same bytes for every compressing subscriber"
        );
    }
    let want: Vec<Vec<u8>> = events[1..].iter().map(|e| e.bytes().to_vec()).collect();
    assert_eq!(inflate(&first), want);
    let (_, lows) = s.queued(low[0]);
    assert_eq!(s.queued(low[1]).1, lows);
    let want: Vec<Vec<u8>> = events[1..]
        .iter()
        .map(|e| {
            crate::capture::downlevel(e, Capture::Metadata)
                .unwrap()
                .to_vec()
        })
        .collect();
    assert_eq!(inflate(&lows), want, "the down-leveled copy, compressed");
    let plain_want: Vec<u8> = events[1..]
        .iter()
        .flat_map(|e| ws::rfc6455::text(e.bytes()).to_vec())
        .collect();
    assert_eq!(s.queued(plain).1, plain_want, "plain frames beside them");
}

/// The memory budget counts a unit's frames once, however many queues hold slices of
/// them, until the last slice is written or the last holder is gone.
#[test]
fn shared_frames_count_once_until_the_last_slice_goes() {
    let mut s = Setup::new();
    let a = s.subscribe("{}", None, false);
    let b = s.subscribe("{}", None, false);
    let odd = s.subscribe(r#"{"session":"s1"}"#, None, false);
    let events: Vec<_> = (0..10).map(|i| event(i, "info")).collect();
    s.unit(&events, 1 << 20);
    let all = sse_of(&events, |_| true).len();
    assert_eq!(s.hub.chunks.bytes(), all, "three queues, one chunk");
    assert_eq!(s.conns[a].subscriber.out.own(), 0);
    let mut sink = Vec::new();
    let _ = s.conns[a]
        .subscriber
        .out
        .flush(&mut sink, &mut s.hub.chunks);
    let _ = s.conns[odd]
        .subscriber
        .out
        .flush(&mut sink, &mut s.hub.chunks);
    assert_eq!(s.hub.chunks.bytes(), all, "b still holds it");
    s.conns[b].subscriber.out.release_all(&mut s.hub.chunks);
    assert_eq!(s.hub.chunks.bytes(), 0);
}
