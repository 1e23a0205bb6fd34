//! What one WebSocket subscription has delivered, per owning stream: the positions its
//! `closing` frame carries (AEP-0003 §3.5 #4).

use crate::store::StreamId;
use std::collections::HashMap;

/// One stream's last delivered position: `(session, source, (epoch, seq))`.
type Noted = (Box<str>, Box<str>, (u64, u64));

/// The last position delivered per owning stream `(source, session)` on one
/// subscription, for the `closing` frame (AEP-0003 §3.5 #4): session identity is scoped
/// to the emitter (AEP-0001 §5.2), so two emitters sharing a session name get one entry
/// each. Updating an entry for a stream already seen does not allocate; a stream's first
/// delivery allocates its key once. At most `cap` streams are remembered (the relay holds
/// no more than `max_sessions` anyway); past that an arbitrary entry is forgotten, which
/// only makes that stream's resume start earlier.
#[derive(Debug, Default)]
pub struct Delivered {
    /// `index` maps a session name to its slots here.
    entries: Vec<Noted>,
    index: HashMap<Box<str>, Vec<usize>>,
    /// Slot of the last stream noted: consecutive deliveries of one stream (the common
    /// case) update it with two string compares, no hashing.
    recent: usize,
    /// The store's id of the stream at `recent`, when the caller gave one: consecutive
    /// deliveries of one stream then update it with one integer compare.
    recent_id: Option<StreamId>,
    cap: usize,
}

impl Delivered {
    /// An empty record remembering at most `cap` streams.
    pub fn new(cap: usize) -> Delivered {
        Delivered {
            cap: cap.max(1),
            ..Delivered::default()
        }
    }

    /// Records that `(epoch, seq)` of the stream `(source, session)` was queued to the
    /// subscriber.
    ///
    /// `stream` is the store's id of that stream when the caller has it (fan-out does):
    /// ids are never reused (`store::StreamId`), so a match on it is a match on
    /// `(source, session)` without comparing either.
    pub fn note(&mut self, stream: Option<StreamId>, source: &str, session: &str, pos: (u64, u64)) {
        if stream.is_some() && stream == self.recent_id {
            if let Some(e) = self.entries.get_mut(self.recent) {
                e.2 = pos;
                return;
            }
        }
        self.recent_id = stream;
        if let Some(e) = self.entries.get_mut(self.recent) {
            if &*e.0 == session && &*e.1 == source {
                e.2 = pos;
                return;
            }
        }
        if let Some(slots) = self.index.get(session) {
            if let Some(&i) = slots.iter().find(|&&i| &*self.entries[i].1 == source) {
                self.entries[i].2 = pos;
                self.recent = i;
                return;
            }
        }
        if self.entries.len() >= self.cap {
            // Forget the oldest-inserted stream: slot 0 (moved into by the last).
            let (gone, _, _) = self.entries.swap_remove(0);
            self.unindex(&gone, 0);
            let last = self.entries.len();
            if let Some(moved) = self.entries.first() {
                if let Some(slots) = self.index.get_mut(&moved.0) {
                    for i in slots.iter_mut().filter(|i| **i == last) {
                        *i = 0;
                    }
                }
            }
        }
        let i = self.entries.len();
        match self.index.get_mut(session) {
            Some(slots) => slots.push(i),
            None => {
                self.index.insert(session.into(), vec![i]);
            }
        }
        self.recent = i;
        self.entries.push((session.into(), source.into(), pos));
    }

    fn unindex(&mut self, session: &str, slot: usize) {
        if let Some(slots) = self.index.get_mut(session) {
            slots.retain(|&i| i != slot);
            if slots.is_empty() {
                self.index.remove(session);
            }
        }
    }

    /// `(session, source, (epoch, seq))` triples, sorted by session, then source.
    pub fn positions(&self) -> Vec<(&str, &str, (u64, u64))> {
        let mut v: Vec<_> = self
            .entries
            .iter()
            .map(|(s, src, p)| (&**s, &**src, *p))
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod delivered_tests {
    use super::Delivered;

    const X: &str = "aep://x";
    const Y: &str = "aep://y";

    #[test]
    fn note_keeps_the_last_position_per_session_within_the_cap() {
        let mut d = Delivered::new(2);
        d.note(None, X, "a", (0, 1));
        d.note(None, X, "a", (0, 2));
        d.note(None, X, "b", (0, 5));
        d.note(None, X, "a", (0, 3));
        assert_eq!(d.positions(), vec![("a", X, (0, 3)), ("b", X, (0, 5))]);
        d.note(None, X, "c", (1, 0));
        assert_eq!(d.positions().len(), 2, "at most cap sessions");
        d.note(None, X, "b", (0, 6));
        d.note(None, X, "c", (1, 1));
        assert_eq!(
            d.positions(),
            vec![("b", X, (0, 6)), ("c", X, (1, 1))],
            "the oldest-inserted session was forgotten"
        );
    }

    /// AEP-0001 §5.2: two emitters sharing a session name are two streams, each with its
    /// own last position; forgetting one (the cap) keeps the other's index right.
    #[test]
    fn note_keeps_one_position_per_owning_stream() {
        let mut d = Delivered::new(3);
        d.note(None, X, "s", (0, 4));
        d.note(None, Y, "s", (0, 1));
        d.note(None, X, "s", (0, 5));
        assert_eq!(d.positions(), vec![("s", X, (0, 5)), ("s", Y, (0, 1))]);
        d.note(None, X, "t", (0, 9));
        d.note(None, Y, "u", (0, 2)); // forgets (X, s); (Y, u) moves into its slot
        assert_eq!(
            d.positions(),
            vec![("s", Y, (0, 1)), ("t", X, (0, 9)), ("u", Y, (0, 2))]
        );
        d.note(None, Y, "s", (0, 3));
        d.note(None, Y, "u", (0, 7));
        d.note(None, X, "t", (0, 10));
        assert_eq!(
            d.positions(),
            vec![("s", Y, (0, 3)), ("t", X, (0, 10)), ("u", Y, (0, 7))]
        );
    }

    /// The store's stream ids (fan-out passes them) are a shortcut, never a different
    /// answer: the same notes with and without ids record the same positions, across
    /// same-name streams, interleaving and the cap.
    #[test]
    fn noting_with_stream_ids_records_what_noting_without_them_does() {
        use crate::store::Store;
        use crate::wire::envelope::Event;
        use std::sync::Arc;
        let mut store: Store<Event> = Store::new(64, 64);
        let script = [
            (X, "s", 1),
            (X, "s", 2),
            (Y, "s", 1),
            (X, "s", 3),
            (Y, "s", 2),
            (Y, "s", 3),
            (X, "t", 1),
            (Y, "u", 1),
            (X, "s", 4),
            (X, "s", 5),
            (Y, "u", 2),
            (X, "t", 2),
        ];
        let (mut with, mut without) = (Delivered::new(3), Delivered::new(3));
        for (i, (source, session, seq)) in script.into_iter().enumerate() {
            let line = format!(
                r#"{{"aep":"0.1","id":"e{i}","type":"tool.completed","time":"2026-01-01T00:00:00Z","source":"{source}","agent":"a","session":"{session}","seq":{seq}}}"#
            );
            let ev = Arc::new(Event::parse(bytes::Bytes::from(line)).expect("valid"));
            store.admit(&ev);
            let id = store.last_placed().first().copied();
            assert!(id.is_some(), "a sequenced Event is placed in its stream");
            with.note(id, source, session, (0, seq));
            without.note(None, source, session, (0, seq));
            assert_eq!(with.positions(), without.positions(), "after note {i}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivered_keeps_the_last_position_per_session_within_its_cap() {
        let mut d = Delivered::new(2);
        d.note(None, "x", "a", (0, 1));
        d.note(None, "x", "a", (0, 2));
        d.note(None, "x", "b", (1, 0));
        assert_eq!(d.positions(), vec![("a", "x", (0, 2)), ("b", "x", (1, 0))]);
        d.note(None, "x", "c", (0, 9));
        assert_eq!(d.positions().len(), 2);
        assert!(d.positions().contains(&("c", "x", (0, 9))));
    }
}
