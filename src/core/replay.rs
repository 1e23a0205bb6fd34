//! Paced replay (AEP-0003 §5, §7): a subscription's replay is read from the store a page
//! at a time, only while its connection's output queue is below half its bound, and a
//! page ends once its frames fill the queue to the bound (AEP-0003 §8.4: the queue
//! passes `max_output_bytes` by one frame at most, and a page's `replay-exhausted`
//! marker). Memory per consumer stays bounded however much the store holds, and a
//! consumer that reads slowly only slows its own replay.
//!
//! Ordering: while a replay is in progress, live frames for that connection wait in its
//! backlog and follow the replay. A live Event of a session still to be replayed for the
//! same subscription is not queued live at all: the replay will reach it in the store, at
//! its place in `(epoch, seq)` order. The reactor is single-threaded, so the moment a
//! session's last page is read is the exact boundary between replay and live for it: no
//! gap and no duplicate. If the ring evicts Events ahead of a slow replay, the next page
//! carries a `replay-exhausted` marker, so even then nothing is lost silently.

use super::conn::{Conn, Phase, ReplayJob};
use super::hub::Hub;
use crate::fanout::{Binding, Frames};
use crate::store::{ReplayFrom, Store};
use crate::wire::envelope::{Event, Scope};
use crate::wire::sse;
use crate::wire::ws::aep;
use bytes::Bytes;

/// Events read from the store per page.
const PAGE: usize = 64;
/// Pages one connection may take per pump before others get a turn.
const PAGES_PER_PUMP: usize = 8;

/// Starts `job` on `conn` behind any replay already in progress there, then advances
/// it as far as the output queue allows ([`pump`]). No fan-out unit may be open: its
/// frames for `conn` would land behind the replay's.
pub(super) fn start(
    conn: &mut Conn,
    job: ReplayJob,
    store: &Store<Event>,
    hub: &mut Hub,
    max_output: usize,
) {
    debug_assert!(!hub.unit_open(), "a replay starts outside a fan-out unit");
    conn.subscriber.replay.push_back(job);
    pump(conn, store, hub, max_output);
}

/// Moves replay pages (then, once every replay is done, the held-back live frames)
/// into `conn`'s output queue while it is below half its bound. Returns
/// whether replay work remains that only waits for its turn (not for the consumer).
/// `store` is what it replays from; `hub` gives the deflater and the WebSocket
/// subscriptions' delivered positions; `max_output` is the queue's bound, bytes.
pub(super) fn pump(
    conn: &mut Conn,
    store: &Store<Event>,
    hub: &mut Hub,
    max_output: usize,
) -> bool {
    let low_water = max_output / 2;
    let mut held: Vec<Event> = Vec::new();
    let mut frames: Vec<Bytes> = Vec::new();
    for _ in 0..PAGES_PER_PUMP {
        if conn.subscriber.out.len() >= low_water {
            return false;
        }
        let Some(job) = conn.subscriber.replay.front_mut() else {
            // The live frames held back, in order, as far as the bound allows; the
            // rest follows as the consumer reads (fan-out keeps adding behind them).
            conn.subscriber
                .backlog
                .move_until(&mut conn.subscriber.out, max_output);
            return false;
        };
        let Some((stream, from)) = job.sessions.front().cloned() else {
            end_replay_job(conn);
            continue;
        };
        let filter = job.filter.clone();
        let (ws, ceiling) = (job.ws_id.is_some(), job.ceiling);
        // Room up to the bound (the queue is below half of it, above); the Event
        // that fills it ends the page: one frame over at most, as for live frames,
        // plus a `replay-exhausted` marker when the page carries one.
        let mut room = max_output.saturating_sub(conn.subscriber.out.len());
        held.clear();
        frames.clear();
        // A compressing WebSocket (RFC 7692) gets its replay compressed too, one
        // frame per Event as replay frames are built per connection.
        let window = conn.subscriber.deflate_window;
        let deflater = &mut hub.deflater;
        let page = store.replay_page(stream, from, PAGE, &mut |ev| {
            if filter.matches(&ev) {
                let frame = if ws {
                    Frames::default().ws_for(&ev, ceiling, window, deflater)
                } else {
                    Frames::default().sse(&ev, ceiling)
                };
                room = room.saturating_sub(frame.len());
                frames.push(frame);
                held.push(ev);
            }
            room > 0
        });
        let Some(job) = conn.subscriber.replay.front_mut() else {
            return false;
        };
        if page.is_none() {
            // The stream left the store since the replay began.
            job.lost = true;
        }
        let next = page.and_then(|p| p.next);
        // One marker per owning stream that no longer reaches back (AEP-0003 §5),
        // naming the bare session the position named and that stream's earliest; the
        // WS frame adds the stream's `source` (AEP-0001 §5.2), which SSE's comment
        // format has no room for.
        if let (Some(earliest), Some(info)) = (page.and_then(|p| p.marker), store.stream(stream)) {
            let marker = match &job.ws_id {
                Some(id) => aep::replay_exhausted(id, info.name, info.source, earliest),
                None => sse::replay_exhausted(info.name, earliest),
            };
            conn.subscriber.out.push(marker);
        }
        for frame in frames.drain(..) {
            conn.subscriber.out.push(frame);
        }
        match next {
            Some(cursor) => {
                if let Some(front) = job.sessions.front_mut() {
                    front.1 = ReplayFrom::Cursor(cursor);
                }
            }
            None => {
                job.sessions.pop_front();
                job.pending.remove(&stream);
            }
        }
        // A WS subscription remembers the last position it delivered (`closing`).
        if let Some(Binding::Ws(delivered)) =
            job.sub.and_then(|s| hub.get_mut(s)).map(|s| &mut s.binding)
        {
            for ev in &held {
                if let (Scope::Sequenced, Some(s), Some(q)) = (ev.scope(), ev.session(), ev.seq()) {
                    delivered.note(None, ev.source(), s, (ev.epoch(), q));
                }
            }
        }
    }
    !conn.subscriber.replay.is_empty()
}

/// Ends the front replay job of `conn`, which has nothing left to read. A replay-only
/// SSE stream (`live=0`) whose last job it was says it ended by design, not by a cut
/// connection (what the AEP SDK and `aep timeline` wait for), unless a stream it was
/// replaying was evicted meanwhile: then it ends as a cut stream does, and the consumer
/// resumes.
fn end_replay_job(conn: &mut Conn) {
    let done = conn.subscriber.replay.pop_front();
    let Some(job) = done.filter(|j| j.end_after && conn.subscriber.replay.is_empty()) else {
        return;
    };
    if job.lost {
        log::info!(
            "replay-only stream {} ends without replay-complete: a session it was replaying was evicted (--max-sessions)",
            conn.peer
        );
    } else {
        conn.subscriber
            .out
            .push(Bytes::from_static(sse::REPLAY_COMPLETE));
    }
    conn.close_after_flush = true;
    conn.enter(Phase::Closing);
}
