//! A stand-in for `envelope::Event` in the store's tests (`src/store/tests.rs`,
//! `tests/sans_io/store_model.rs`): the fields the store asks for, and bytes that spell them so
//! the store can read a held one back ([`Stored::reread`]).

use std::sync::Arc;

use aep_relay::store::{Position, Stored};
use aep_relay::wire::envelope::Scope;
use bytes::Bytes;

/// A stand-in for `envelope::Event` (whose scanner is written elsewhere). Its bytes
/// (`raw`, made by [`sealed`]) spell its fields, padded with spaces to `len`, so the
/// store can read a held one back.
#[derive(Debug)]
pub struct T {
    pub session: Option<String>,
    pub pos: Option<Position>,
    pub source: String,
    pub id: String,
    pub scope: Scope,
    /// A `debug` Event (the live view, [`Stored::delta`]).
    pub debug: bool,
    pub len: usize,
    pub raw: Vec<u8>,
}

/// `t` with its bytes spelled out: `session`, `epoch.seq`, `source`, `id`, the scope
/// letter and `D` for a `debug` Event (else nothing), separated by U+001F, padded to
/// `t.len` bytes (or longer, when they need it).
pub fn sealed(mut t: T) -> Arc<T> {
    let pos = t.pos.map(|(e, s)| format!("{e}.{s}")).unwrap_or_default();
    let scope = match t.scope {
        Scope::Agent => "A",
        Scope::Sequenced => "S",
        Scope::Foreign => "F",
    };
    let mut raw = [
        t.session.as_deref().unwrap_or("\u{0}"),
        &pos,
        &t.source,
        &t.id,
        scope,
        if t.debug { "D" } else { "" },
    ]
    .join("\u{1f}")
    .into_bytes();
    if raw.len() < t.len {
        raw.resize(t.len, b' ');
    }
    t.len = raw.len();
    t.raw = raw;
    Arc::new(t)
}

/// The stand-in `sealed` spelled as `raw`.
fn unsealed(raw: &[u8]) -> Option<T> {
    let text = std::str::from_utf8(raw).ok()?;
    let mut f = text.trim_end_matches(' ').split('\u{1f}');
    let session = Some(f.next()?).filter(|s| *s != "\u{0}").map(String::from);
    let pos = match f.next()? {
        "" => None,
        p => {
            let (e, s) = p.split_once('.')?;
            Some((e.parse().ok()?, s.parse().ok()?))
        }
    };
    let (source, id) = (f.next()?.to_string(), f.next()?.to_string());
    let scope = match f.next()? {
        "A" => Scope::Agent,
        "S" => Scope::Sequenced,
        _ => Scope::Foreign,
    };
    let debug = f.next()? == "D";
    Some(T {
        session,
        pos,
        source,
        id,
        scope,
        debug,
        len: raw.len(),
        raw: raw.to_vec(),
    })
}

impl Stored for T {
    fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }
    fn position(&self) -> Option<Position> {
        self.pos
    }
    fn dedupe_key(&self) -> (&str, &str) {
        (&self.source, &self.id)
    }
    fn scope(&self) -> Scope {
        self.scope
    }
    fn delta(&self) -> bool {
        self.debug
    }
    fn bytes(&self) -> &[u8] {
        &self.raw
    }
    fn reread(bytes: Bytes) -> Option<T> {
        unsealed(&bytes)
    }
}
