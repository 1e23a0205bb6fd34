//! The SSE consuming binding (AEP-0003 §3.3): the subscription request (`filter`,
//! `capture`, `from`, `live`, `Last-Event-ID`) and the wire form of each message.

use crate::envelope::{Capture, Event, Scope};
use crate::filter::Filter;
use crate::http::RequestHead;
use bytes::{BufMut, Bytes, BytesMut};
use std::sync::Arc;

/// A resume position `(session, epoch, seq)` (AEP-0001 §7 rule 6, AEP-0003 §7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The session named.
    pub session: String,
    /// Its epoch (`0` when a `from` entry omits it).
    pub epoch: u64,
    /// The last `seq` the consumer durably processed.
    pub seq: u64,
}

/// Where a subscription's replay starts (AEP-0003 §5, §7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum From {
    /// No replay: live delivery only.
    Live,
    /// Strictly after each position, for the session it names.
    Positions(Vec<Position>),
    /// Every held session from its earliest Event (`from=all`).
    All,
}

/// A subscription as requested on `GET /stream` or in a WS `subscribe` frame.
#[derive(Debug, Clone)]
pub struct SubscriptionRequest {
    /// The compiled attr-match filter (`{}` when absent).
    pub filter: Arc<Filter>,
    /// The capture ceiling (AEP-0003 §6.4); `None` delivers Events as received.
    pub ceiling: Option<Capture>,
    /// Replay start.
    pub from: From,
    /// `false` for `live=0`: replay, then end the stream.
    pub live: bool,
}

/// Why a subscription request was refused: `code` is from the AEP-0003 §6.5 closed set
/// (`invalid-filter`, `limit-exceeded`), `detail` says which member and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    /// `invalid-filter` or `limit-exceeded`.
    pub code: &'static str,
    /// What was wrong, naming the member (and the limit, for `limit-exceeded`).
    pub detail: String,
}

fn invalid(detail: impl Into<String>) -> RequestError {
    RequestError {
        code: "invalid-filter",
        detail: detail.into(),
    }
}

/// Parses a capture ceiling (`none`, `metadata`, `redacted`, `full`).
///
/// # Errors
/// `invalid-filter` naming the value.
pub fn parse_capture(v: &str) -> Result<Capture, RequestError> {
    Capture::parse(v).ok_or_else(|| {
        invalid(format!(
            "`capture` must be one of none, metadata, redacted, full (AEP-0003 §6.4), got {v:?}"
        ))
    })
}

fn non_negative(v: &serde_json::Value, what: &str) -> Result<u64, RequestError> {
    v.as_u64()
        .ok_or_else(|| invalid(format!("`from` entry `{what}` must be an integer >= 0")))
}

/// Parses `from` as a JSON value: the string `"all"` or an array of
/// `{session, epoch?, seq}` objects (AEP-0003 §3.3.1, §6.5).
///
/// # Errors
/// `invalid-filter` for a malformed value; `limit-exceeded` for more than `max`
/// positions, naming the limit.
pub fn parse_from_value(v: &serde_json::Value, max: usize) -> Result<From, RequestError> {
    match v {
        serde_json::Value::String(s) if s == "all" => Ok(From::All),
        serde_json::Value::Array(items) => {
            if items.len() > max {
                return Err(RequestError {
                    code: "limit-exceeded",
                    detail: format!(
                        "`from` names {} positions; this relay replays at most {max} (AEP_MAX_FROM)",
                        items.len()
                    ),
                });
            }
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let obj = item.as_object().ok_or_else(|| {
                    invalid("`from` entries must be objects {session, epoch, seq}")
                })?;
                for k in obj.keys() {
                    if !matches!(k.as_str(), "session" | "epoch" | "seq") {
                        return Err(invalid(format!("`from` entry has unknown member `{k}`")));
                    }
                }
                let session = obj
                    .get("session")
                    .and_then(|s| s.as_str())
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| invalid("`from` entry needs a non-empty string `session`"))?;
                let seq = obj
                    .get("seq")
                    .ok_or_else(|| invalid("`from` entry needs `seq`"))
                    .and_then(|v| non_negative(v, "seq"))?;
                let epoch = match obj.get("epoch") {
                    None => 0,
                    Some(v) => non_negative(v, "epoch")?,
                };
                out.push(Position {
                    session: session.to_string(),
                    epoch,
                    seq,
                });
            }
            Ok(From::Positions(out))
        }
        _ => Err(invalid(
            "`from` must be \"all\" or an array of {session, epoch, seq}",
        )),
    }
}

/// A `u64` written as ASCII decimal digits only, the form the relay writes in `id:`
/// (`str::parse` alone would also take a leading `+`).
fn decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Parses a `Last-Event-ID` value `{session}:{epoch}:{seq}` (AEP-0003 §3.3.2). The
/// session may itself contain `:`, so the two numbers are taken from the right; each is
/// decimal digits only, within `u64`.
pub fn parse_last_event_id(v: &str) -> Option<Position> {
    let mut it = v.rsplitn(3, ':');
    let seq = decimal(it.next()?)?;
    let epoch = decimal(it.next()?)?;
    let session = it.next()?;
    if session.is_empty() {
        return None;
    }
    Some(Position {
        session: session.to_string(),
        epoch,
        seq,
    })
}

/// Reads the SSE subscription out of a `GET /stream` request (AEP-0003 §3.3): query
/// `filter`, `capture`, `from`, `live`, and the `Last-Event-ID` header (`from` takes
/// precedence).
///
/// # Errors
/// [`RequestError`]; the HTTP layer answers it with 400 before any stream header.
pub fn parse_request(
    head: &RequestHead,
    max_from: usize,
) -> Result<SubscriptionRequest, RequestError> {
    let mut filter = None;
    let mut ceiling = None;
    let mut from = None;
    let mut live = true;
    let mut seen = [false; 4];
    for (k, v) in head.query_pairs() {
        // A repeated subscription parameter is refused, like a duplicated JSON member:
        // `filter={"session":"a"}&filter={}` would be a session filter to a reader that
        // keeps the first and match-all to one that keeps the last (fail closed,
        // AEP-0003 §6.5, §11).
        if let Some(i) = ["filter", "capture", "from", "live"]
            .iter()
            .position(|p| *p == k)
        {
            if std::mem::replace(&mut seen[i], true) {
                return Err(invalid(format!("`{k}` is given more than once")));
            }
        }
        match k.as_str() {
            "filter" => {
                let f =
                    Filter::parse(v.as_bytes()).map_err(|e| invalid(format!("`filter`: {e}")))?;
                filter = Some(f);
            }
            "capture" => ceiling = Some(parse_capture(&v)?),
            "from" => {
                // Duplicate member names are refused, as in `filter`: a reader that keeps
                // the first `session` and one that keeps the last would resume different
                // sessions (AEP-0003 §6.5: a malformed `from` is `invalid-filter`).
                let value = if v == "all" {
                    serde_json::Value::String(v)
                } else {
                    crate::filter::strict_json(v.as_bytes())
                        .map_err(|e| invalid(format!("`from` is not JSON: {e}")))?
                };
                from = Some(parse_from_value(&value, max_from)?);
            }
            "live" => {
                live = match v.as_str() {
                    "0" | "false" => false,
                    "1" | "true" => true,
                    _ => return Err(invalid("`live` must be 0 or 1")),
                }
            }
            // access_token is read by auth; unknown parameters are ignored.
            _ => {}
        }
    }
    let from = match from {
        Some(f) => f,
        None => match head.header("last-event-id") {
            Some(id) => From::Positions(vec![parse_last_event_id(id).ok_or_else(|| {
                invalid("`Last-Event-ID` must be {session}:{epoch}:{seq} (AEP-0003 §3.3.2)")
            })?]),
            None => From::Live,
        },
    };
    let filter = match filter {
        Some(f) => f,
        None => Filter::parse(b"{}").map_err(|e| invalid(e.to_string()))?,
    };
    Ok(SubscriptionRequest {
        filter: Arc::new(filter),
        ceiling,
        from,
        live,
    })
}

/// The response head that opens an SSE stream.
pub const STREAM_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\nConnection: keep-alive\r\n\r\n: aep-relay stream open\n\n";

/// The heartbeat comment (AEP-0003 §3.3.4).
pub const PING: &[u8] = b": ping\n\n";

/// Builds one SSE message for `ev` carrying `payload` (the Event's original bytes, or a
/// down-leveled copy): `event: <type>`, `id: {session}:{epoch}:{seq}` for sequenced
/// Events, `data: <payload>` (AEP-0003 §3.3.2).
///
/// JSON cannot hold a raw CR or LF inside a string, so any CR/LF in `payload` is
/// insignificant whitespace between tokens; each is written as a space so the payload
/// stays on one `data:` line with its length and meaning unchanged.
pub fn message(ev: &Event, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(payload.len() + ev.event_type().len() + 64);
    write_message(ev, payload, &mut b);
    b.freeze()
}

/// Appends the SSE message of [`message`] to `out` (fan-out lays the messages of one
/// ingest unit back to back in one buffer, see `fanout`). Writes only into `out`'s spare
/// capacity when it suffices; allocates nothing else.
pub fn write_message(ev: &Event, payload: &[u8], b: &mut BytesMut) {
    let t = ev.event_type();
    b.reserve(payload.len() + t.len() + 64);
    b.put_slice(b"event: ");
    b.put_slice(t.as_bytes());
    b.put_u8(b'\n');
    if ev.scope() == Scope::Sequenced {
        if let (Some(s), Some(q)) = (ev.session(), ev.seq()) {
            b.put_slice(b"id: ");
            b.put_slice(s.as_bytes());
            b.put_u8(b':');
            put_decimal(b, ev.epoch());
            b.put_u8(b':');
            put_decimal(b, q);
            b.put_u8(b'\n');
        }
    }
    b.put_slice(b"data: ");
    let start = b.len();
    b.put_slice(payload);
    for c in &mut b[start..] {
        if *c == b'\n' || *c == b'\r' {
            *c = b' ';
        }
    }
    b.put_slice(b"\n\n");
}

/// Appends `v` in ASCII decimal (no allocation, unlike `format!`).
fn put_decimal(b: &mut BytesMut, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    b.put_slice(&digits[i..]);
}

/// The `: replay-exhausted {session} {epoch}:{seq}` comment (AEP-0003 §3.3.3).
pub fn replay_exhausted(session: &str, earliest: (u64, u64)) -> Bytes {
    let mut s = String::from(": replay-exhausted ");
    // A session containing CR/LF would break the comment line; such bytes cannot appear
    // in a valid JSON string unescaped, but may after decoding, so neutralise them.
    s.extend(
        session
            .chars()
            .map(|c| if c == '\n' || c == '\r' { ' ' } else { c }),
    );
    s.push_str(&format!(" {}:{}\n\n", earliest.0, earliest.1));
    Bytes::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_event_id_takes_numbers_from_the_right() {
        let p = parse_last_event_id("a:b:3:17").unwrap();
        assert_eq!((p.session.as_str(), p.epoch, p.seq), ("a:b", 3, 17));
        assert!(parse_last_event_id("s:x:1").is_none());
        assert!(parse_last_event_id(":1:2").is_none());
        assert!(parse_last_event_id("12").is_none());
    }

    #[test]
    fn from_limits_and_shapes() {
        let v: serde_json::Value =
            serde_json::from_str(r#"[{"session":"s","seq":3},{"session":"t","epoch":1,"seq":0}]"#)
                .unwrap();
        assert_eq!(
            parse_from_value(&v, 5).unwrap(),
            From::Positions(vec![
                Position {
                    session: "s".into(),
                    epoch: 0,
                    seq: 3
                },
                Position {
                    session: "t".into(),
                    epoch: 1,
                    seq: 0
                }
            ])
        );
        assert_eq!(parse_from_value(&v, 1).unwrap_err().code, "limit-exceeded");
        for bad in [
            r#"[{"session":"s","seq":-1}]"#,
            r#"[{"seq":1}]"#,
            r#"{"a":1}"#,
            r#""some""#,
            r#"[{"session":"s","seq":1,"x":2}]"#,
        ] {
            let v: serde_json::Value = serde_json::from_str(bad).unwrap();
            assert_eq!(
                parse_from_value(&v, 5).unwrap_err().code,
                "invalid-filter",
                "{bad}"
            );
        }
    }
}
