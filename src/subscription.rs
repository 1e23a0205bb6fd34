//! The subscription model shared by both consuming bindings (AEP-0003 §5, §6, §7): what a
//! consumer asks for (a compiled attr-match filter, a capture ceiling, where replay
//! starts, whether to stay live), read from a `GET /stream` request
//! ([`parse_stream_request`], with its `Last-Event-ID`) or a WebSocket `subscribe` frame,
//! and the refusals of the AEP-0003 §6.5 closed set.

use crate::filter::{self, Filter};
use crate::refusal::Code;
use crate::wire::envelope::Capture;
use crate::wire::http::RequestHead;
use crate::wire::sse;
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
pub enum Resume {
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
    pub from: Resume,
    /// `false` for `live=0`: replay, then end the stream.
    pub live: bool,
}

impl SubscriptionRequest {
    /// The bare session names a replay-only request (`live=0`) replays from their
    /// earliest held Event because its filter names them exactly (`{"session": "s"}` or
    /// an array, [`crate::filter::Pins::session`]) and the request names no position:
    /// reading a session's history, as the AEP SDK's `subscribe(..., live=False)` does.
    /// `None` for a live request or one with positions or `all`, where the names only
    /// filter (a request with positions is a resume and replays exactly what they name).
    pub fn history_sessions(&self) -> Option<&[Box<str>]> {
        match (self.live, &self.from) {
            (false, Resume::Live) => self.filter.pins().session,
            _ => None,
        }
    }
}

/// Why a subscription request was refused: `code` is from the AEP-0003 §6.5 closed set
/// (`invalid-filter`, `limit-exceeded`), `detail` says which member and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    /// `invalid-filter` or `limit-exceeded`.
    pub code: Code,
    /// What was wrong, naming the member (and the limit, for `limit-exceeded`).
    pub detail: String,
}

pub(crate) fn invalid(detail: impl Into<String>) -> RequestError {
    RequestError {
        code: Code::InvalidFilter,
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
pub fn parse_from_value(v: &serde_json::Value, max: usize) -> Result<Resume, RequestError> {
    match v {
        serde_json::Value::String(s) if s == "all" => Ok(Resume::All),
        serde_json::Value::Array(items) => {
            if items.len() > max {
                return Err(RequestError {
                    code: Code::LimitExceeded,
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
            Ok(Resume::Positions(out))
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

/// Parses a `Last-Event-ID` value `{session}:{epoch}:{seq}` (AEP-0003 §3.3.2), the form
/// [`sse::event_id`] writes. The session may itself contain `:`, so the two numbers are
/// taken from the right; each is decimal digits only, within `u64`. The session is then
/// [`sse::unescape`]d. `None` for anything else (an empty session, a `%` not followed by
/// two hex digits, bytes that are not UTF-8).
///
/// ```
/// use aep_relay::wire::sse::event_id;
/// use aep_relay::subscription::parse_last_event_id;
/// let p = parse_last_event_id(&event_id("a:\n%", 2, 9)).unwrap();
/// assert_eq!((p.session.as_str(), p.epoch, p.seq), ("a:\n%", 2, 9));
/// ```
pub fn parse_last_event_id(v: &str) -> Option<Position> {
    let mut it = v.rsplitn(3, ':');
    let seq = decimal(it.next()?)?;
    let epoch = decimal(it.next()?)?;
    let session = sse::unescape(it.next()?)?;
    if session.is_empty() {
        return None;
    }
    Some(Position {
        session,
        epoch,
        seq,
    })
}

/// What `GET /stream` takes, for the refusal of anything else.
const STREAM_PARAMS: &str =
    "/stream takes filter, capture, from, live (0 or 1) and access_token (AEP-0003 §3.3)";

/// Reads the SSE subscription out of a `GET /stream` request (AEP-0003 §3.3): query
/// `filter`, `capture`, `from`, `live` (`0` or `1`), and the `Last-Event-ID` header
/// (`from` takes precedence). `access_token` is left to auth.
///
/// # Errors
/// [`RequestError`] (`invalid-filter`, or `limit-exceeded` for a long `from`); the HTTP
/// layer answers it with 400 before any stream header. Any other query parameter is
/// `invalid-filter` naming the known ones: a misspelled `filter` must not widen the
/// stream (fail closed, AEP-0003 §6.2, §11). A `Last-Event-ID` that
/// [`parse_last_event_id`] does not read is `invalid-filter` too; an empty (or
/// all-whitespace) one is no position, as if absent.
pub fn parse_stream_request(
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
                    filter::strict_json(v.as_bytes())
                        .map_err(|e| invalid(format!("`from` is not JSON: {e}")))?
                };
                from = Some(parse_from_value(&value, max_from)?);
            }
            "live" => {
                live = match v.as_str() {
                    "0" => false,
                    "1" => true,
                    _ => return Err(invalid(format!("`live` must be 0 or 1, got {v:?}"))),
                }
            }
            // Read by auth (AEP-0003 §8.1, the EventSource fallback).
            "access_token" => {}
            // A misspelled parameter (`fliter=`) must not leave the consumer with an
            // unfiltered stream: refuse it, fail closed (AEP-0003 §6.2, §11).
            _ => {
                return Err(invalid(format!(
                    "unknown subscription parameter {k:?}; {STREAM_PARAMS}"
                )))
            }
        }
    }
    let from = match from {
        Some(f) => f,
        // An empty `Last-Event-ID` names no session, so it is no position: WHATWG SSE
        // treats an empty last event ID as none, and AEP-0003 §3.3 #3 resumes "the
        // session it names". A client that sends it empty on a first connect gets a
        // live stream, not a 400.
        None => match head
            .header("last-event-id")
            .filter(|v| !v.trim().is_empty())
        {
            Some(id) => Resume::Positions(vec![parse_last_event_id(id).ok_or_else(|| {
                invalid(
                    "`Last-Event-ID` must be {session}:{epoch}:{seq}, the session with `%XX` escapes as the relay writes it in `id:` (AEP-0003 §3.3.2)",
                )
            })?]),
            None => Resume::Live,
        },
    };
    let filter = match filter {
        Some(f) => f,
        None => Filter::parse(b"{}").map_err(|e| invalid(e.to_string()))?,
    };
    let req = SubscriptionRequest {
        filter: Arc::new(filter),
        ceiling,
        from,
        live,
    };
    // The sessions a history read replays are as many positions as `from` would name:
    // the same bound applies (AEP-0003 §6.5 `limit-exceeded`).
    if let Some(names) = req.history_sessions().filter(|n| n.len() > max_from) {
        return Err(RequestError {
            code: Code::LimitExceeded,
            detail: format!(
                "with live=0 the filter's `session` names {} sessions to replay; this relay replays at most {max_from} (AEP_MAX_FROM)",
                names.len()
            ),
        });
    }
    Ok(req)
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
    fn last_event_id_reads_back_every_session_sse_writes() {
        let long = "é%\n:".repeat(256);
        let ordinary = ["s_8f2c", "a:b"];
        let hostile = sse::HOSTILE_SESSIONS.iter().copied();
        for s in ordinary.into_iter().chain(hostile).chain([long.as_str()]) {
            let p = parse_last_event_id(&sse::event_id(s, 3, 17)).unwrap();
            assert_eq!((p.session.as_str(), p.epoch, p.seq), (s, 3, 17));
        }
        for bad in ["%", "a%2", "%zz", "50%", "%g0", "%C3"] {
            assert_eq!(parse_last_event_id(&format!("{bad}:0:1")), None, "{bad}");
        }
    }

    #[test]
    fn from_limits_and_shapes() {
        let v: serde_json::Value =
            serde_json::from_str(r#"[{"session":"s","seq":3},{"session":"t","epoch":1,"seq":0}]"#)
                .unwrap();
        assert_eq!(
            parse_from_value(&v, 5).unwrap(),
            Resume::Positions(vec![
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
        assert_eq!(
            parse_from_value(&v, 1).unwrap_err().code,
            Code::LimitExceeded
        );
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
                Code::InvalidFilter,
                "{bad}"
            );
        }
    }
}
