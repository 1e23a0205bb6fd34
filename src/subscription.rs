//! The subscription model shared by both consuming bindings (AEP-0003 §5, §6, §7): what a
//! consumer asks for (a compiled attr-match filter, a capture ceiling, where replay
//! starts, whether to stay live), read from a `GET /stream` query (`sse::parse_request`)
//! or a WebSocket `subscribe` frame, and the refusals of the AEP-0003 §6.5 closed set.

use crate::envelope::Capture;
use crate::filter::Filter;
use crate::refusal::Code;
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
