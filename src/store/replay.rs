//! Reading the store back: resume after a position (AEP-0003 §7), paged replay,
//! replay-all (AEP-0003 §5), and the per-stream lookups a replay starts from. Its own
//! file because it only reads what admission and eviction maintain.

use super::lane::Key;
use super::session::SessionInfo;
use super::{Position, Store, Stored, StreamId};

/// An opaque place in one stream's order, returned by [`Store::replay_page`] to
/// continue a paged replay.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Cursor(Key);

/// Where a (paged) replay of one stream starts.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReplayFrom {
    /// Strictly after a resume position (AEP-0003 §7), foreign Events anchored at it
    /// included.
    After(Position),
    /// From the earliest held Event (replay-all, AEP-0003 §5).
    Start,
    /// Strictly after the last Event of a previous page.
    Cursor(Cursor),
}

/// One page of a replay.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// `Some(earliest held position)` when a `replay-exhausted` marker is due before
    /// this page's Events.
    pub marker: Option<Position>,
    /// Where the next page starts; `None` when this page reached the newest Event.
    pub next: Option<Cursor>,
}

/// A `replay-exhausted` marker due for one stream (AEP-0003 §5, §3.3 #3), from
/// [`Store::replay_after`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Exhausted {
    /// The stream that no longer reaches back to the requested position.
    pub stream: StreamId,
    /// Its earliest held position (what the marker names).
    pub earliest: Position,
}

impl<E: Stored> Store<E> {
    /// Replays every stream of the bare name `session` for a consumer resuming from
    /// `after` (AEP-0001 §7 #6: a resume position names a bare session; AEP-0003 §7:
    /// "delivers strictly after that position"): for each stream of that name in creation
    /// order, calls `out` for every held Event ordered after `after` in that stream, in
    /// stream order ([`Store::replay_stream_after`]).
    ///
    /// Returns one [`Exhausted`] per stream that is owed a `replay-exhausted` marker, in
    /// the same order; empty when none is, including when `session` is not held (never
    /// seen, or wholly evicted: the caller decides what an unknown session means for its
    /// binding).
    pub fn replay_after(
        &self,
        session: &str,
        after: Position,
        out: &mut impl FnMut(E),
    ) -> Vec<Exhausted> {
        let mut markers = Vec::new();
        for stream in self.streams(session) {
            if let Some(earliest) = self.replay_stream_after(stream.id, after, out) {
                markers.push(Exhausted {
                    stream: stream.id,
                    earliest,
                });
            }
        }
        markers
    }

    /// Replays one stream for a consumer resuming from `after`: calls `out` for every
    /// held Event of it ordered after `after`, in stream order.
    ///
    /// Foreign Events anchored **at** `after` are included: they arrived after `after`
    /// was the stream's high-water, and a consumer that last saw `after` may or may not
    /// have seen them; delivery is at-least-once (AEP-0001 §7 #4), so they are redelivered
    /// rather than risk a loss.
    ///
    /// Returns `Some(earliest)` when a `replay-exhausted` marker is due (AEP-0003 §5,
    /// §3.3 #3): something this replay would have delivered was evicted, i.e. an evicted
    /// sequenced Event at a position `> after` or an evicted foreign Event anchored at or
    /// after `after`. Then every held Event is delivered (all are above what was
    /// evicted), and `earliest` is the lowest held `(epoch, seq)`, or, when the stream
    /// holds only foreign Events, the position they are anchored to. `None` otherwise,
    /// including when the stream is no longer held.
    pub fn replay_stream_after(
        &self,
        stream: StreamId,
        after: Position,
        out: &mut impl FnMut(E),
    ) -> Option<Position> {
        let s = self.get(stream)?;
        let bound = Key::at(after);
        for ev in s
            .merged(Some(bound))
            .filter_map(|(l, e)| s.reread::<E>(l, e))
        {
            out(ev);
        }
        s.marker_after(bound, after)
    }

    /// Replays one page of one stream: at most `max` held Events strictly after `from`,
    /// in stream order, each handed to `out`; the page ends early after an Event for
    /// which `out` returns `false` (the consumer's byte budget is spent). Paging lets a
    /// consumer's replay advance only as fast as it reads (bounded memory per consumer
    /// however large the store is).
    ///
    /// - [`ReplayFrom::After`] behaves like [`Store::replay_stream_after`] for its first
    ///   page.
    /// - [`ReplayFrom::Start`] starts at the earliest held Event, with no marker.
    /// - [`ReplayFrom::Cursor`] continues a previous page. Its marker is `Some` when Events
    ///   after the cursor were evicted between pages (the consumer fell behind the ring),
    ///   so even a paged replay never hides a gap.
    ///
    /// Returns `None` when the stream is not held, otherwise the [`Page`]: the marker (as
    /// for [`Store::replay_stream_after`]) and the cursor to continue from (`None` when
    /// the page reached the stream's newest Event).
    pub fn replay_page(
        &self,
        stream: StreamId,
        from: ReplayFrom,
        max: usize,
        out: &mut impl FnMut(E) -> bool,
    ) -> Option<Page> {
        let s = self.get(stream)?;
        let (bound, marker) = match from {
            ReplayFrom::Start => (None, None),
            ReplayFrom::After(after) => {
                let bound = Key::at(after);
                (Some(bound), s.marker_after(bound, after))
            }
            ReplayFrom::Cursor(Cursor(bound)) => (
                Some(bound),
                s.marker_after(bound, bound.anchor().unwrap_or((0, 0))),
            ),
        };
        let mut entries = s.merged(bound);
        let mut last = None;
        let mut taken = 0;
        while taken < max {
            let Some((l, e)) = entries.next() else {
                break;
            };
            last = Some(e.key);
            taken += 1;
            if s.reread::<E>(l, e).is_some_and(|ev| !out(ev)) {
                break;
            }
        }
        let next = match entries.next() {
            Some(_) => last.map(Cursor),
            None => None,
        };
        Some(Page { marker, next })
    }

    /// Every held stream, in the [`Store::replay_all`] order (least-recently-written
    /// first).
    pub fn stream_ids(&self) -> Vec<StreamId> {
        self.iter_lru()
            .map(|(slot, s)| StreamId {
                slot,
                serial: s.serial,
            })
            .collect()
    }

    /// The streams held under the bare name `session`, in creation order: its owning
    /// streams, or its foreign-only stream. Empty when the name is not held.
    pub fn streams(&self, session: &str) -> impl Iterator<Item = SessionInfo<'_>> + '_ {
        self.index
            .get(session)
            .into_iter()
            .flatten()
            .map(|&sid| self.slots[sid].info(sid))
    }

    /// The owning stream `(source, session)`, when held.
    pub fn find(&self, source: &str, session: &str) -> Option<StreamId> {
        self.streams(session)
            .find(|s| s.source == Some(source))
            .map(|s| s.id)
    }

    /// One held stream's metrics view; `None` once it is no longer held.
    pub fn stream(&self, id: StreamId) -> Option<SessionInfo<'_>> {
        self.get(id).map(|s| s.info(id.slot))
    }

    /// Replays everything held under the bare name `session`, each stream from its
    /// earliest held Event, streams in creation order, with no marker (the request names
    /// no position). Returns the number of Events delivered (0 when the name is not held).
    pub fn replay_session_from_start(&self, session: &str, out: &mut impl FnMut(E)) -> usize {
        let mut n = 0;
        for &sid in self.index.get(session).into_iter().flatten() {
            let s = &self.slots[sid];
            for ev in s.merged(None).filter_map(|(l, e)| s.reread::<E>(l, e)) {
                out(ev);
            }
            n += s.len();
        }
        n
    }

    /// Replay-all (AEP-0003 §5, `from: "all"`): every held stream from its earliest held
    /// Event, no `replay-exhausted` (honesty rule 2). Streams come
    /// **least-recently-written first**, so the most recently active stream is replayed
    /// last, next to the live tail that follows; within a stream, stream order. Wholly
    /// evicted streams are absent (honesty rule 1). A foreign Event held in several
    /// streams of one name comes once per stream. Returns the number of Events delivered.
    pub fn replay_all(&self, out: &mut impl FnMut(E)) -> usize {
        let mut n = 0;
        for (_, s) in self.iter_lru() {
            for ev in s.merged(None).filter_map(|(l, e)| s.reread::<E>(l, e)) {
                out(ev);
            }
            n += s.len();
        }
        n
    }
}
