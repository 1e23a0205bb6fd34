//! The SSE subscription request (`subscription::parse_stream_request`): query parameters `filter`,
//! `capture`, `from`, `live`, and the `Last-Event-ID` header (AEP-0003 §3.3, §5, §6, §7).
//!
//! Input: the raw query string (what follows `?`), then optionally `\n` and a
//! `Last-Event-ID` header value. Both must be UTF-8 (httparse hands the relay a `&str`
//! target; header values are read lossily).
//!
//! Invariants asserted:
//! 1. `parse_stream_request`, `parse_last_event_id`, `parse_from_value` never panic.
//! 2. `parse_last_event_id` accepts exactly `{session}:{epoch}:{seq}` with a non-empty
//!    session (which may itself hold `:`, and `%XX` escapes: each `%` followed by two hex
//!    digits, the unescaped bytes UTF-8) and two decimal integers in `u64` (AEP-0003
//!    §3.3.2, the form the relay itself writes in `id:`), and round-trips what it accepts
//!    through `sse::event_id`, whose output holds no CR, LF, NUL or other control.
//! 3. `parse_stream_request` agrees with a reference reading of the parameters, in order, each
//!    at most once (a repeated `filter`, `capture`, `from` or `live` is refused, like a
//!    duplicated JSON member, rather than resolved first- or last-wins): `filter` is a
//!    valid attr-match filter
//!    (compared as compiled), `capture` one of the four levels (§6.4), `from` the string
//!    `all` or a JSON array of at most `max_from` objects `{session, epoch?, seq}` with
//!    nothing else and no duplicate member (`limit-exceeded` beyond the limit, §6.5),
//!    `live` `0` or `1`; `access_token` is left to auth and any other parameter is
//!    refused (a misspelled `filter` must not widen the stream, §6.2, §11); `from` takes
//!    precedence over `Last-Event-ID` (§3.3.3), and an empty (all-whitespace)
//!    `Last-Event-ID` is no position. Refusals carry a code from the closed
//!    set of §6.5.
#![no_main]

use aep_relay::filter::Filter;
use aep_relay::subscription::{self, Position, Resume};
use aep_relay::wire::envelope::Capture;
use aep_relay::wire::http::RequestHead;
use aep_relay::wire::sse;
use aep_relay_fuzz::strict;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const MAX_FROM: usize = 4;

/// §3.3.2 `{session}:{epoch}:{seq}`: numbers are ASCII decimal digits.
fn reference_last_event_id(v: &str) -> Option<Position> {
    let num = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let (rest, seq) = v.rsplit_once(':')?;
    let (session, epoch) = rest.rsplit_once(':')?;
    // `%XX` escapes (the relay writes `%`, controls, non-ASCII and a leading space so).
    let mut bytes = Vec::new();
    let mut parts = session.split('%');
    bytes.extend_from_slice(parts.next()?.as_bytes());
    for part in parts {
        let hex = part
            .get(..2)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))?;
        bytes.push(u8::from_str_radix(hex, 16).ok()?);
        bytes.extend_from_slice(&part.as_bytes()[2..]);
    }
    let session = String::from_utf8(bytes).ok()?;
    if session.is_empty() {
        return None;
    }
    Some(Position {
        session,
        epoch: num(epoch)?,
        seq: num(seq)?,
    })
}

/// Why the reference refuses: `(code, what)`.
type Refused = (&'static str, String);

fn reference_from(v: &str) -> Result<Resume, Refused> {
    if v == "all" {
        return Ok(Resume::All);
    }
    let bad = |why: &str| ("invalid-filter", why.to_owned());
    // `from` is URL-encoded JSON (§3.3.1), so the JSON string `"all"` is the literal too
    // (it is what a WS `subscribe` frame carries, §6.5).
    let items = match strict(v.as_bytes()).map_err(|e| bad(&e))? {
        Value::String(s) if s == "all" => return Ok(Resume::All),
        Value::Array(items) => items,
        _ => return Err(bad("not an array")),
    };
    if items.len() > MAX_FROM {
        return Err(("limit-exceeded", format!("{} positions", items.len())));
    }
    let mut out = Vec::new();
    for item in items {
        let Value::Object(m) = item else {
            return Err(bad("entry not an object"));
        };
        if m.keys()
            .any(|k| !matches!(k.as_str(), "session" | "epoch" | "seq"))
        {
            return Err(bad("unknown member"));
        }
        let session = m
            .get("session")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("session"))?;
        let seq = m
            .get("seq")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("seq"))?;
        let epoch = match m.get("epoch") {
            None => 0,
            Some(e) => e.as_u64().ok_or_else(|| bad("epoch"))?,
        };
        out.push(Position {
            session: session.to_owned(),
            epoch,
            seq,
        });
    }
    Ok(Resume::Positions(out))
}

struct Want {
    filter: Filter,
    ceiling: Option<Capture>,
    from: Resume,
    live: bool,
}

fn reference(head: &RequestHead) -> Result<Want, Refused> {
    let bad = |why: String| ("invalid-filter", why);
    let mut want = Want {
        filter: Filter::match_all(),
        ceiling: None,
        from: Resume::Live,
        live: true,
    };
    let mut from = None;
    let mut seen = std::collections::HashSet::new();
    for (k, v) in head.query_pairs() {
        // Decision (same class as duplicate JSON members): a repeated subscription
        // parameter is refused, never resolved first- or last-wins.
        let known = matches!(k.as_str(), "filter" | "capture" | "from" | "live");
        if known && !seen.insert(k.clone()) {
            return Err(bad(format!("{k} repeated")));
        }
        match k.as_str() {
            "filter" => want.filter = Filter::parse(v.as_bytes()).map_err(|e| bad(e.detail))?,
            "capture" => want.ceiling = Some(Capture::parse(&v).ok_or_else(|| bad(v.clone()))?),
            "from" => from = Some(reference_from(&v)?),
            "live" => {
                want.live = match v.as_str() {
                    "0" => false,
                    "1" => true,
                    _ => return Err(bad(v)),
                }
            }
            "access_token" => {}
            _ => return Err(bad(format!("unknown parameter {k}"))),
        }
    }
    // An empty (all-whitespace) `Last-Event-ID` names no session: no position (WHATWG
    // SSE; AEP-0003 §3.3 #3), as if the header were absent.
    let last_event_id = head
        .header("last-event-id")
        .filter(|v| !v.trim().is_empty());
    want.from = match (from, last_event_id) {
        (Some(f), _) => f,
        (None, Some(id)) => Resume::Positions(vec![
            reference_last_event_id(id).ok_or_else(|| bad(id.to_owned()))?
        ]),
        (None, None) => Resume::Live,
    };
    Ok(want)
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (query, lei) = match text.split_once('\n') {
        Some((q, h)) => (q, Some(h.trim())),
        None => (text, None),
    };

    if let Some(id) = lei {
        let got = subscription::parse_last_event_id(id);
        assert_eq!(got, reference_last_event_id(id), "Last-Event-ID {id:?}");
        if let Some(p) = got {
            let again = sse::event_id(&p.session, p.epoch, p.seq);
            assert!(
                again.bytes().all(|b| (0x20..0x7f).contains(&b)) && !again.starts_with(' '),
                "{again:?}"
            );
            assert_eq!(subscription::parse_last_event_id(&again), Some(p));
        }
    }

    let mut head = RequestHead {
        method: "GET".into(),
        path: "/stream".into(),
        query: query.to_owned(),
        minor_version: 1,
        headers: Vec::new(),
    };
    if let Some(id) = lei {
        head.headers.push(("last-event-id".into(), id.to_owned()));
    }
    let got = subscription::parse_stream_request(&head, MAX_FROM);
    match (got, reference(&head)) {
        (Ok(r), Ok(w)) => {
            assert_eq!(*r.filter, w.filter, "filter for {query:?}");
            assert_eq!(r.ceiling, w.ceiling, "capture for {query:?}");
            assert_eq!(r.from, w.from, "from for {query:?} / {lei:?}");
            assert_eq!(r.live, w.live, "live for {query:?}");
        }
        (Err(e), Err((code, _))) => {
            assert_eq!(
                e.code.as_str(),
                code,
                "refusal code for {query:?}: {}",
                e.detail
            );
            assert!(!e.detail.is_empty());
        }
        (Ok(r), Err(why)) => panic!("accepted {query:?} / {lei:?} ({r:?}); reference: {why:?}"),
        (Err(e), Ok(_)) => panic!("refused {query:?} / {lei:?} ({e:?}); reference accepts"),
    }
});
