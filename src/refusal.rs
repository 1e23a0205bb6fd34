//! Every refusal the relay answers, in one type: its [`Code`] gives the JSON `error`
//! code (which is also the `/metrics` label, `aep_events_rejected_total{reason}`), the
//! HTTP status, and, on a WebSocket, whether it is an in-band `error` frame that leaves
//! the connection open or ends it with a close code. Adding a code means answering all
//! three here, in one `match` each.
//!
//! [`Refusal`] is the refusal of an ingest (an Event, a batch, a `POST`): one of these
//! codes with what the answer says about it (the failing line, the limit). Its JSON body,
//! [`Refusal::body`], is written in [`crate::wire::http`] beside every other answer's, so
//! that this module is a leaf the wire formats and the core both use.

/// A refusal's code (AEP-0003 §3.2.3, §3.5, §4, §6.5, §8.1; AEP-0004 §4.2; RFC 6455
/// §7.4.1 for the WebSocket protocol violations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// A malformed request, head or body (400).
    BadRequest,
    /// A request head over `max_head_bytes` or with too many lines (431).
    HeadTooLarge,
    /// A body over `max_body_bytes` (413).
    BodyTooLarge,
    /// The request did not arrive within `request_timeout` (408).
    RequestTimeout,
    /// No resource at the path (404).
    NotFound,
    /// The path exists, not with this method (405 with `Allow`).
    MethodNotAllowed,
    /// No or a wrong credential (401), or on a WebSocket a role or scope that does not
    /// allow it (AEP-0003 §4 rule 2, §8.1; AEP-0004 §4.1).
    Unauthorized,
    /// The credential lacks the scope, or a command over HTTP (403).
    Forbidden,
    /// `POST /events` without `AEP-Version` (400, AEP-0003 §3.2.2).
    VersionRequired,
    /// No version in common (426; a WebSocket `hello` is then closed 1008).
    VersionUnsupported,
    /// A `Content-Type` other than JSON or NDJSON (415).
    UnsupportedMediaType,
    /// `GET /socket` without the upgrade headers (426).
    UpgradeRequired,
    /// At `max_connections` (503 with `Retry-After`).
    TooManyConnections,
    /// The peer's address has `max_connections_per_ip` open (503 with `Retry-After`,
    /// the request unread).
    TooManyConnectionsPerIp,
    /// The accept bucket (`accept_rate`, `accept_burst`) is empty (503 with a
    /// `Retry-After` that spreads the refused peers' return, the request unread).
    AcceptRateLimited,
    /// Not a valid Event (400; AEP-0001 §5).
    InvalidEvent,
    /// A batch over `max_batch_events` (413).
    TooManyEvents,
    /// The durable history could not keep the Events (503).
    HistoryUnavailable,
    /// A subscription's filter, capture or `from` is malformed (400; AEP-0003 §6.5).
    InvalidFilter,
    /// A filter dialect other than `attr-match` (400; AEP-0003 §6.5).
    UnknownDialect,
    /// A per-connection or per-request limit (400; AEP-0003 §6.5).
    LimitExceeded,
    /// The first WebSocket frame was not a `hello` (close 1008; AEP-0003 §3.5 #1).
    HelloRequired,
    /// A `hello` without what AEP-0003 §4 requires of it (close 1008).
    InvalidHello,
    /// A frame missing a member it needs (`unsubscribe` without `id`).
    InvalidFrame,
    /// Command routing: no claimant (AEP-0004 §4.2).
    NoRoute,
    /// Command routing: more than one claimant (AEP-0004 §4.5).
    Ambiguous,
    /// Command routing: the claimant's `control.accepts` lacks the type.
    Unsupported,
    /// An RFC 6455 protocol violation (close 1002).
    WsProtocolError,
    /// A text message that is not UTF-8 (close 1007).
    WsInvalidPayload,
    /// A message over `max_ws_message_bytes` (close 1009).
    WsMessageTooBig,
    /// A binary message (close 1003).
    WsUnsupportedData,
    /// Cluster mode: the engine (NATS JetStream) cannot take the Events now, and the
    /// relay does not degrade to local ingest (`--cluster-degrade refuse`) or its outbox
    /// is full (503).
    ClusterUnavailable,
    /// Cluster mode: one Event is larger than the engine's `max_payload` (413).
    EventTooLarge,
}

impl Code {
    /// The JSON `error` code, and the `/metrics` label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::BadRequest => "bad-request",
            Code::HeadTooLarge => "head-too-large",
            Code::BodyTooLarge => "body-too-large",
            Code::RequestTimeout => "request-timeout",
            Code::NotFound => "not-found",
            Code::MethodNotAllowed => "method-not-allowed",
            Code::Unauthorized => "unauthorized",
            Code::Forbidden => "forbidden",
            Code::VersionRequired => "version-required",
            Code::VersionUnsupported => "version-unsupported",
            Code::UnsupportedMediaType => "unsupported-media-type",
            Code::UpgradeRequired => "upgrade-required",
            Code::TooManyConnections => "too-many-connections",
            Code::TooManyConnectionsPerIp => "too-many-connections-per-ip",
            Code::AcceptRateLimited => "accept-rate-limited",
            Code::InvalidEvent => "invalid-event",
            Code::TooManyEvents => "too-many-events",
            Code::HistoryUnavailable => "history-unavailable",
            Code::InvalidFilter => "invalid-filter",
            Code::UnknownDialect => "unknown-dialect",
            Code::LimitExceeded => "limit-exceeded",
            Code::HelloRequired => "hello-required",
            Code::InvalidHello => "invalid-hello",
            Code::InvalidFrame => "invalid-frame",
            Code::NoRoute => "no-route",
            Code::Ambiguous => "ambiguous",
            Code::Unsupported => "unsupported",
            Code::WsProtocolError => "ws-protocol-error",
            Code::WsInvalidPayload => "ws-invalid-payload",
            Code::WsMessageTooBig => "ws-message-too-big",
            Code::WsUnsupportedData => "ws-unsupported-data",
            Code::ClusterUnavailable => "cluster-unavailable",
            Code::EventTooLarge => "event-too-large",
        }
    }

    /// The HTTP status of this refusal as an HTTP answer. WebSocket-only codes (sent
    /// in frames after the upgrade) have the status the same refusal would have over
    /// HTTP.
    pub fn http_status(self) -> u16 {
        match self {
            Code::BadRequest
            | Code::VersionRequired
            | Code::InvalidEvent
            | Code::InvalidFilter
            | Code::UnknownDialect
            | Code::LimitExceeded
            | Code::HelloRequired
            | Code::InvalidHello
            | Code::InvalidFrame
            | Code::WsProtocolError
            | Code::WsInvalidPayload
            | Code::WsUnsupportedData => 400,
            Code::Unauthorized => 401,
            Code::Forbidden => 403,
            Code::NotFound => 404,
            Code::MethodNotAllowed => 405,
            Code::RequestTimeout => 408,
            Code::BodyTooLarge
            | Code::TooManyEvents
            | Code::WsMessageTooBig
            | Code::EventTooLarge => 413,
            Code::UnsupportedMediaType => 415,
            Code::VersionUnsupported | Code::UpgradeRequired => 426,
            Code::HeadTooLarge => 431,
            Code::TooManyConnections
            | Code::TooManyConnectionsPerIp
            | Code::AcceptRateLimited
            | Code::HistoryUnavailable
            | Code::ClusterUnavailable => 503,
            Code::NoRoute | Code::Ambiguous | Code::Unsupported => 409,
        }
    }

    /// On a WebSocket: the close code when this refusal ends the connection (the
    /// `hello` refusals, RFC 6455 violations), `None` for an in-band `error` frame that
    /// leaves the connection and its subscriptions as they were.
    pub fn ws_close(self) -> Option<u16> {
        match self {
            Code::HelloRequired | Code::InvalidHello | Code::VersionUnsupported => {
                Some(close_code::POLICY)
            }
            Code::WsProtocolError => Some(close_code::PROTOCOL),
            Code::WsInvalidPayload => Some(close_code::INVALID_PAYLOAD),
            Code::WsMessageTooBig => Some(close_code::TOO_BIG),
            Code::WsUnsupportedData => Some(close_code::UNSUPPORTED),
            _ => None,
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Close codes the relay sends (RFC 6455 §7.4.1), also at `ws::rfc6455::close_code`.
///
/// Kept here, beside [`Code::ws_close`], so that `refusal` is a leaf that the codec
/// (`ws`) and the core both use.
pub mod close_code {
    /// 1000: normal closure (the close handshake the peer started).
    pub const NORMAL: u16 = 1000;
    /// 1001: going away (shutdown, idle peer).
    pub const GOING_AWAY: u16 = 1001;
    /// 1002: protocol error (unmasked or malformed frame).
    pub const PROTOCOL: u16 = 1002;
    /// 1003: unsupported data (a binary frame: AEP-0003 §3.5 #2 reserves them).
    pub const UNSUPPORTED: u16 = 1003;
    /// 1007: invalid payload data (text that is not UTF-8).
    pub const INVALID_PAYLOAD: u16 = 1007;
    /// 1008: policy violation (the AEP `hello` exchange failed).
    pub const POLICY: u16 = 1008;
    /// 1009: message too big (over `max_ws_message_bytes`).
    pub const TOO_BIG: u16 = 1009;
    /// 1013: try again later (backpressure: resume from the `closing` positions).
    pub const TRY_AGAIN: u16 = 1013;
}

/// Why an Event, a batch or a request was refused. Each refusal has exactly one HTTP
/// status and JSON error code (see [`Refusal::status`], [`Refusal::code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// An Event failed envelope validation (400 `invalid-event`); `line` is 1-based.
    #[error("line {line}: {detail}")]
    InvalidEvent {
        /// 1-based line of the failing Event in the body (1 for a single Event).
        line: usize,
        /// What was wrong, naming the attribute and section.
        detail: String,
    },
    /// A batch held more Events than `max_batch_events` (413 `too-many-events`).
    #[error("the batch holds {count} Events; at most {max} are accepted (AEP_MAX_BATCH)")]
    TooManyEvents {
        /// Events in the batch.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A command arrived on a binding that may not carry control (403 `forbidden`),
    /// AEP-0004 §4.1.
    #[error("line {line}: `{event_type}` is a command; control flows only on an authenticated duplex binding (WebSocket), never over HTTP POST (AEP-0004 §4.1)")]
    Command {
        /// 1-based line.
        line: usize,
        /// The command type.
        event_type: String,
    },
    /// An Event names an `agent` its token's grant does not let it emit as (403
    /// `forbidden`): a token granted `agent` emits as that agent only.
    #[error("line {line}: this token may emit as agent {allowed:?} only, and the Event's `agent` is {agent} (the token's `agent` grant)")]
    Agent {
        /// 1-based line.
        line: usize,
        /// The Event's `agent` as JSON (`null` when absent).
        agent: String,
        /// The agent the grant allows.
        allowed: String,
    },
    /// The durable history (`--history`) could not keep the Events, so none of them was
    /// accepted (503 `history-unavailable`): disk full, unwritable directory, I/O error.
    #[error(
        "the relay's history cannot keep these Events, so none was accepted; retry later: {detail}"
    )]
    HistoryUnavailable {
        /// The failed operation and the OS error.
        detail: String,
    },
    /// Cluster mode: the engine cannot take the Events now and the relay may not keep
    /// them locally (503 `cluster-unavailable`); nothing was accepted.
    #[error("the cluster engine cannot take these Events now, so none was accepted; retry later: {detail}")]
    ClusterUnavailable {
        /// Why (the engine is unreachable, the outbox is full, a publish failed).
        detail: String,
    },
    /// Cluster mode: an Event larger than the engine's `max_payload` (413
    /// `event-too-large`).
    #[error("line {line}: the Event is {size} bytes; the cluster engine takes at most {max} per message")]
    EventTooLarge {
        /// 1-based line.
        line: usize,
        /// The Event's size in bytes.
        size: usize,
        /// The engine's `max_payload`.
        max: usize,
    },
}

impl Refusal {
    /// The HTTP status for this refusal (its code's).
    pub fn status(&self) -> u16 {
        self.code().http_status()
    }

    /// The refusal's code (its JSON `error` and metric label: [`Code::as_str`]).
    pub fn code(&self) -> Code {
        match self {
            Refusal::InvalidEvent { .. } => Code::InvalidEvent,
            Refusal::TooManyEvents { .. } => Code::TooManyEvents,
            Refusal::Command { .. } | Refusal::Agent { .. } => Code::Forbidden,
            Refusal::HistoryUnavailable { .. } => Code::HistoryUnavailable,
            Refusal::ClusterUnavailable { .. } => Code::ClusterUnavailable,
            Refusal::EventTooLarge { .. } => Code::EventTooLarge,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ws_close_codes_are_the_rfc_6455_ones() {
        assert_eq!(Code::HelloRequired.ws_close(), Some(1008));
        assert_eq!(Code::WsMessageTooBig.ws_close(), Some(1009));
        assert_eq!(Code::InvalidFilter.ws_close(), None);
        assert_eq!(Code::NotFound.as_str(), "not-found");
        assert_eq!(Code::HeadTooLarge.http_status(), 431);
    }
}
