//! The hub: live subscriptions, and fan-out of each Event into the output queues of the
//! connections whose subscriptions match (AEP-0003 §6, §8.4).
//!
//! It decides per connection (its queue's bound, its replay, its `permessage-deflate`
//! window), so it is the core's; it reaches each connection as a [`Subscriber`], through
//! [`Subscribers`], and never its socket buffers, request state or phase. The parts that
//! know no connection are building blocks in [`crate::fanout`]: the subscription model, the
//! [`SubscriptionIndex`] that finds the subscriptions an Event matches, and the frames
//! of an ingest unit laid out back to back in shared arenas (`Frames`, `Unit`; see that
//! module's docs for coalescing and compression). Fan-out never writes to a socket.

use super::conn::{Chunks, Drops, OutQueue, Subscriber, Subscribers, Tag, UNSHARED};
use crate::fanout::index::SubscriptionIndex;
use crate::fanout::{Binding, Frames, Run, Subscription, Unit};
use crate::ids::{ConnId, SubId};
use crate::store::StreamId;
use crate::wire::envelope::{Capture, Event, Scope, Severity};
use crate::wire::sse;
use crate::wire::ws::aep;
use crate::wire::ws::deflate::Deflater;
use slab::Slab;

/// Queues the pending runs of `unit` on their connections, in order, as slices of its
/// arenas (each behind its drop notice, if any), and starts a new arena generation. A
/// run whose connection is gone, or whose slot was reused by another connection since,
/// is dropped. Each arena's frames become one shared chunk in `chunks` (counted once for
/// the memory budget), opened with its first queued slice.
fn queue_runs(unit: &mut Unit, conns: &mut Subscribers<'_>, chunks: &mut Chunks) {
    let mut tags = [UNSHARED; crate::fanout::ARENAS];
    unit.drain_runs(|run, generation, bytes, notice| {
        let Some(conn) = conns.get_mut(run.conn) else {
            return;
        };
        if conn.unit_generation != generation {
            return; // the slot was reused by another connection
        }
        conn.unit_pending = 0;
        let q = if run.backlog {
            &mut conn.backlog
        } else {
            &mut conn.out
        };
        if let Some(notice) = notice {
            q.push(notice.clone());
        }
        let Some(bytes) = bytes else {
            return;
        };
        let slice = bytes.slice(run.start..run.end);
        let tag: &mut Tag = &mut tags[run.arena];
        if *tag == UNSHARED {
            *tag = chunks.open(bytes.len());
        }
        chunks.take(*tag);
        q.push_shared(slice, *tag);
    });
}

/// The queue length, in bytes, up to which an Event of `severity` is queued toward a
/// consumer whose queue is bounded by `max_output` (AEP-0003 §8.4, AEP-0007 §5 item 1):
/// `debug` up to half of it, `info` up to three quarters, `notice` and above up to all
/// of it. A consumer that falls behind sheds its `debug` Events first and its `info`
/// Events next, so the last quarter stays for the Events that cannot be dropped, and
/// the half before it for those and `info`: a `notice` meets a full queue (and
/// disconnects the consumer) only when `notice`-and-above Events alone outrun it.
fn shed_mark(severity: Severity, max_output: usize) -> usize {
    match severity {
        Severity::Debug => max_output / 2,
        Severity::Info => max_output - max_output / 4,
        _ => max_output,
    }
}

/// The wider of two ceilings (`None`, as received, is the widest): a connection whose
/// subscriptions matched an Event at several ceilings gets it once, at the highest.
fn wider(a: Option<Capture>, b: Option<Capture>) -> Option<Capture> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        _ => None,
    }
}

/// One connection an Event goes to, during one fan-out.
#[derive(Debug, Clone, Copy)]
struct Target {
    conn: ConnId,
    ws: bool,
    /// The connection's `permessage-deflate` window (`Subscriber::deflate_window`).
    deflate: u8,
    ceiling: Option<Capture>,
    queued: bool,
}

/// Counters the hub keeps (read by `/metrics`).
#[derive(Debug, Default, Clone)]
pub(crate) struct FanoutStats {
    /// Frames queued to subscribers.
    pub(crate) deliveries: u64,
    /// Of `deliveries`, those to WebSocket connections.
    pub(crate) deliveries_ws: u64,
    /// `debug`/`info` Events not delivered to a slow consumer, by severity (AEP-0003
    /// §8.4), one per Event and consumer.
    pub(crate) dropped: Drops,
    /// Consumers disconnected because a `notice`+ Event could not be queued.
    pub(crate) backpressure_disconnects: u64,
}

/// Subscriptions and their index, and the delivery of an Event's frames into the
/// queues of the connections they match.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    subs: Slab<Subscription>,
    index: SubscriptionIndex,
    matched: Vec<usize>,
    /// Per fan-out scratch: one entry per connection reached (`Subscriber::fan_slot` indexes it).
    targets: Vec<Target>,
    serial: u64,
    /// A connection the next fan-outs skip: the claimant a command was just forwarded to
    /// directly, which must not get it a second time (set and cleared by the caller).
    pub(crate) except: Option<ConnId>,
    /// The ingest unit being laid out (frames and pending runs).
    unit: Unit,
    /// The one `permessage-deflate` compressor (RFC 7692, `server_no_context_takeover`),
    /// created when a compressing subscriber first takes an Event; replay uses it too.
    pub(crate) deflater: Option<Box<Deflater>>,
    /// The chunks of queued frames, each counted once (the memory budget).
    pub(crate) chunks: Chunks,
    /// Counters.
    pub(crate) stats: FanoutStats,
}

/// How one Event's fan-out ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Fanned {
    /// Delivered (or dropped, or doomed) to every target.
    Done,
    /// Nothing was delivered: this connection's queue cannot take the Event and its
    /// socket was not offered everything queued. The caller lets the reactor write, then
    /// fans the Event out again (AEP-0003 §8.4: a consumer is slow only when it does not
    /// read).
    Paused(ConnId),
}

/// Whether a frame of `len` bytes fits `q`, with `pending` bytes of the open unit
/// still to join it, within `mark` (an empty queue takes anything: one frame larger
/// than the bound still goes).
fn fits(q: &OutQueue, pending: usize, len: usize, mark: usize) -> bool {
    q.len() + pending + len <= mark || (q.is_empty() && pending == 0)
}

/// One Event's publication, as fan-out takes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Publication<'a> {
    pub(crate) ev: &'a Event,
    /// The replay streams the store just placed `ev` in (`Store::last_placed`): a
    /// subscription whose replay still has one of them to go is skipped, its replay
    /// delivers the Event in order.
    pub(crate) placed: &'a [StreamId],
    /// The publication's number (`Subscriber::decided`): a paused fan-out, tried again with
    /// the same number, skips the connections it already decided.
    pub(crate) number: u64,
    /// The output queue bound (`--max-output`, bytes), from which the marks derive.
    pub(crate) max_output: usize,
}

/// What one fan-out decides once, for all its targets.
struct Pass<'a> {
    p: Publication<'a>,
    /// This fan-out's serial (`Subscriber::mark`).
    serial: u64,
    /// Whether any target is a WebSocket (only those note positions).
    any_ws: bool,
    severity: Severity,
    /// The queue length up to which the Event is queued ([`shed_mark`]).
    mark: usize,
}

/// Queues `run` (an Event's frame, `need` bytes with the notice it owes) toward `conn`
/// in `unit`: the drop notice first, as its own slice, when the consumer is owed one;
/// then the frame, extending the connection's open run when it directly follows it in
/// the same arena, else as a new run.
#[inline(always)]
fn queue_run(
    unit: &mut Unit,
    conn: &mut Subscriber,
    mut run: Run,
    pending: usize,
    need: usize,
    ws: bool,
) {
    if conn.owes_notice {
        let n = std::mem::take(&mut conn.unannounced);
        conn.owes_notice = false;
        unit.notices.push(if ws {
            aep::dropped(n.debug, n.info)
        } else {
            sse::dropped(n.debug, n.info)
        });
        run.notice = unit.notices.len() as u32;
    }
    let open = conn.unit_generation == unit.generation && pending > 0;
    match unit.runs.get_mut(conn.unit_run) {
        Some(r)
            if open
                && run.notice == 0
                && r.conn == run.conn
                && r.arena == run.arena
                && r.end == run.start
                && r.backlog == run.backlog =>
        {
            r.end = run.end;
        }
        _ => {
            conn.unit_run = unit.runs.len();
            unit.runs.push(run);
        }
    }
    conn.unit_generation = unit.generation;
    conn.unit_pending = pending + need;
}

impl Hub {
    /// Number of live subscriptions.
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// Adds a live subscription; returns its key.
    pub fn insert(&mut self, sub: Subscription) -> SubId {
        let filter = sub.filter.clone();
        let key = self.subs.insert(sub);
        self.index.insert(key, filter);
        SubId(key)
    }

    /// Removes a subscription (no-op for an unknown key).
    pub fn remove(&mut self, key: SubId) {
        if self.subs.contains(key.0) {
            self.subs.remove(key.0);
            self.index.remove(key.0);
        }
    }

    /// The subscription with key `key`.
    pub fn get(&self, key: SubId) -> Option<&Subscription> {
        self.subs.get(key.0)
    }

    /// The subscription with key `key`, mutably.
    pub fn get_mut(&mut self, key: SubId) -> Option<&mut Subscription> {
        self.subs.get_mut(key.0)
    }

    /// Opens an ingest unit: the frames of every Event fanned out until
    /// [`Hub::end_unit`] are coalesced (module docs). While it is open, nothing else may
    /// be queued on a connection that has frames pending in it (`Conn::send` checks this
    /// in debug builds); callers end the unit before any other output.
    pub(crate) fn begin_unit(&mut self) {
        self.unit.open = true;
    }

    /// Announces `events` Events of `bytes` bytes in all to the open ingest unit, so
    /// that its arenas are sized for them once rather than grown as frames are placed.
    pub(crate) fn size_unit(&mut self, events: usize, bytes: usize) {
        // Framing: an SSE message's `event:`, `id:` and `data:` lines, a WS header.
        const FRAMING: usize = 128;
        self.unit.hint = self
            .unit
            .hint
            .saturating_add(bytes)
            .saturating_add(events.saturating_mul(FRAMING));
    }

    /// Heap bytes of the hub's own: the unit's arenas (their room not handed out yet) and
    /// its runs. The shared compressor is the caller's to count (deflate state).
    pub(crate) fn arena_bytes(&self) -> usize {
        self.unit.heap_bytes()
    }

    /// Whether a caller opened an ingest unit that is not ended yet.
    pub(crate) fn unit_open(&self) -> bool {
        self.unit.open
    }

    /// Ends the ingest unit, if any: queues every pending run on its connection, in
    /// order, as one slice of its arena. Cheap when nothing is pending.
    pub(crate) fn end_unit(&mut self, mut conns: Subscribers<'_>) {
        self.unit.open = false;
        self.unit.hint = 0;
        queue_runs(&mut self.unit, &mut conns, &mut self.chunks);
    }

    /// Fans `ev` out to every matching subscription, at most once per connection,
    /// placing its frames in the ingest unit (module docs). Connections that received
    /// output are appended to `dirty`; connections that must be dropped for backpressure
    /// to `doomed`.
    ///
    /// **Shedding by severity** (AEP-0003 §8.4, AEP-0007 §5 item 1). A queue takes the
    /// Event while it stays within the mark of the Event's severity ([`shed_mark`],
    /// computed once per Event): half of `max_output` for `debug`, three quarters for
    /// `info`, all of it for `notice` and above. Past its mark a `debug` or `info` Event
    /// is dropped and counted (`Subscriber::dropped`, by severity); a `notice`+ Event that
    /// does not fit the whole bound disconnects the consumer. A consumer told of drops
    /// (`Subscriber::announce_drops`) gets a notice just before the next Event delivered to
    /// it: the SSE comment [`sse::dropped`] or the WebSocket frame [`aep::dropped`],
    /// queued as its own slice ahead of that Event's run, so it never splits a frame
    /// and costs nothing while nothing is dropped. Live frames held behind a replay
    /// (`Subscriber::backlog`) are judged by the same marks against the backlog's own length.
    ///
    /// **Pauses come first.** Fan-out never writes to a socket. A target whose queue is
    /// past the Event's mark and got frames since its socket was last offered the queue
    /// (`Subscriber::offered`) pauses the fan-out before anything is delivered:
    /// [`Fanned::Paused`], with the unit's pending runs queued. Once the reactor wrote,
    /// the caller fans the same Event out again, and a target still past the mark is
    /// then a slow consumer (the Event is dropped, or the consumer disconnected). So the
    /// pause comes at the Event's mark, not only at the bound: a consumer is judged
    /// slow at a mark only once its socket was offered everything queued, and one that
    /// keeps up loses nothing however far one unit's frames for it go past the marks.
    /// One that does not read still pauses a publication at most once per run of
    /// frames queued to it since its last write, as at the bound. Toward a consumer
    /// that fell behind, `debug` Events stop at the first mark, so a `notice` finds
    /// room without a pause: the room above the marks is kept for it.
    ///
    /// Subscriptions are a disjunction (AEP-0003 §6.5): when several subscriptions of
    /// one connection match, the Event is delivered once, at the widest of their
    /// ceilings, and every one of them records the position as delivered.
    ///
    /// `placed` are the replay streams the store just placed `ev` in
    /// (`Store::last_placed`): a subscription whose replay still has one of them to go is
    /// skipped, its replay delivers the Event in order.
    pub(crate) fn fanout(
        &mut self,
        p: Publication<'_>,
        mut conns: Subscribers<'_>,
        dirty: &mut Vec<ConnId>,
        doomed: &mut Vec<ConnId>,
    ) -> Fanned {
        let Some(pass) = self.targets_of(&p, &mut conns) else {
            return Fanned::Done;
        };
        let mut frames = Frames::default();
        for ti in 0..self.targets.len() {
            if let Some(paused) = self.deliver(&pass, ti, &mut frames, &mut conns, dirty, doomed) {
                queue_runs(&mut self.unit, &mut conns, &mut self.chunks);
                self.note_positions(&pass, &conns);
                return Fanned::Paused(paused);
            }
        }
        if !self.unit.open {
            queue_runs(&mut self.unit, &mut conns, &mut self.chunks);
        }
        self.note_positions(&pass, &conns);
        Fanned::Done
    }

    /// Fills `targets` with the connections `p`'s Event goes to, once each at the widest
    /// of their matching subscriptions' ceilings; `None` when no subscription matches.
    /// Skipped: the connection in `except`, doomed ones, those whose replay delivers
    /// the Event, and those a paused attempt at this publication already decided.
    #[inline(always)]
    fn targets_of<'a>(
        &mut self,
        p: &Publication<'a>,
        conns: &mut Subscribers<'_>,
    ) -> Option<Pass<'a>> {
        self.matched.clear();
        self.index.matching(p.ev, &mut self.matched);
        if self.matched.is_empty() {
            return None;
        }
        self.serial += 1;
        let serial = self.serial;
        self.targets.clear();
        let mut any_ws = false;
        for &key in &self.matched {
            let Some(sub) = self.subs.get(key) else {
                continue;
            };
            if self.except == Some(sub.conn) {
                continue;
            }
            let Some(conn) = conns.get_mut(sub.conn) else {
                continue;
            };
            if conn.doomed || conn.replay_covers(SubId(key), p.placed) || conn.decided == p.number {
                // Disconnected for backpressure already; or its replay delivers it; or
                // a paused attempt at this same Event already decided for this
                // connection.
                continue;
            }
            if conn.mark == serial {
                let t = &mut self.targets[conn.fan_slot];
                t.ceiling = wider(t.ceiling, sub.ceiling);
                continue;
            }
            conn.mark = serial;
            conn.fan_slot = self.targets.len();
            let ws = matches!(sub.binding, Binding::Ws(_));
            any_ws |= ws;
            self.targets.push(Target {
                conn: sub.conn,
                ws,
                deflate: conn.deflate_window,
                ceiling: sub.ceiling,
                queued: false,
            });
        }
        let severity = p.ev.severity();
        Some(Pass {
            p: *p,
            serial,
            any_ws,
            severity,
            mark: shed_mark(severity, p.max_output),
        })
    }

    /// Decides target `ti` of `pass`: queues the Event's frame (after a drop notice it
    /// owes), drops it, or dooms the consumer. Returns the connection that pauses the
    /// publication instead, when its queue is past the mark and its socket was not
    /// offered everything queued.
    #[inline(always)]
    fn deliver(
        &mut self,
        pass: &Pass<'_>,
        ti: usize,
        frames: &mut Frames,
        conns: &mut Subscribers<'_>,
        dirty: &mut Vec<ConnId>,
        doomed: &mut Vec<ConnId>,
    ) -> Option<ConnId> {
        let t = self.targets[ti];
        let conn = conns.get_mut(t.conn)?;
        let ev = pass.p.ev;
        let (arena, start, end) = frames.place(
            &mut self.unit,
            ev,
            t.ws,
            t.ceiling,
            t.deflate,
            &mut self.deflater,
        );
        let len = end - start;
        let pending = if conn.unit_generation == self.unit.generation {
            conn.unit_pending
        } else {
            0
        };
        // Behind a replay, and until what it held back has all moved on, live frames
        // wait in the backlog: they never overtake it.
        let backlog = !conn.replay.is_empty() || !conn.backlog.is_empty();
        // Drops not yet told go just before this Event, if it is queued: it must fit
        // with their notice.
        let announce = conn.owes_notice;
        let need = if announce {
            let n = conn.unannounced;
            len + if t.ws {
                aep::dropped_len(n.debug, n.info)
            } else {
                sse::dropped_len(n.debug, n.info)
            }
        } else {
            len
        };
        // A consumer that cannot take the Event within its mark, and got frames since
        // its socket was last offered the queue, pauses the publication here: the
        // targets decided so far keep what they got (`Subscriber::decided`), the rest get
        // the Event when it is fanned out again, once the reactor wrote.
        let q = if backlog { &conn.backlog } else { &conn.out };
        let fit = fits(q, pending, need, pass.mark);
        if !fit && !backlog && (pending > 0 || conn.offered != conn.out.pushed()) {
            return Some(t.conn);
        }
        conn.decided = pass.p.number;
        if fit {
            let run = Run {
                conn: t.conn,
                arena,
                start,
                end,
                backlog,
                notice: 0,
            };
            queue_run(&mut self.unit, conn, run, pending, need, t.ws);
            self.targets[ti].queued = true;
            self.stats.deliveries += 1;
            self.stats.deliveries_ws += u64::from(t.ws);
            if !conn.dirty {
                conn.dirty = true;
                dirty.push(t.conn);
            }
        } else if pass.severity <= Severity::Info {
            conn.dropped.count(pass.severity);
            if conn.announce_drops {
                conn.unannounced.count(pass.severity);
                conn.owes_notice = true;
            }
            self.stats.dropped.count(pass.severity);
        } else {
            // Once per consumer (`aep_backpressure_disconnects_total`): the connection
            // is skipped by every later fan-out until it is closed.
            conn.doomed = true;
            self.stats.backpressure_disconnects += 1;
            doomed.push(t.conn);
        }
        None
    }

    /// WS subscriptions remember the last position they delivered (for `closing`): every
    /// target of `pass` that had its Event queued.
    fn note_positions(&mut self, pass: &Pass<'_>, conns: &Subscribers<'_>) {
        let (ev, placed, serial) = (pass.p.ev, pass.p.placed, pass.serial);
        let position = match (ev.scope(), ev.session(), ev.seq()) {
            (Scope::Sequenced, Some(s), Some(q)) if pass.any_ws => Some((s, (ev.epoch(), q))),
            _ => None,
        };
        if let Some((session, pos)) = position {
            for &key in &self.matched {
                let Some(sub) = self.subs.get_mut(key) else {
                    continue;
                };
                let Binding::Ws(delivered) = &mut sub.binding else {
                    continue;
                };
                let queued = conns
                    .get(sub.conn)
                    .is_some_and(|c| c.mark == serial && self.targets[c.fan_slot].queued);
                if queued {
                    delivered.note(placed.first().copied(), ev.source(), session, pos);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
