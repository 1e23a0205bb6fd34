//! Cluster mode on NATS JetStream: the boundary between the relay and the bus, and the
//! pure naming helpers both sides share.
//!
//! ```text
//!  reactor (mio, one thread)                 bridge thread "aep-cluster" (feature `cluster`)
//!  ┌───────────────────────┐   ToBus    ┌──────────────────────────────────────────────┐
//!  │ core decides what to  │ ─────────► │ async-nats on a current-thread tokio runtime  │
//!  │ publish, claim, reply │  bounded   │  publish (pipelined) ─► stream {stream}       │
//!  │                       │ ◄───────── │  ordered consumer over the whole stream       │
//!  │ admits once per       │  FromBus   │  KV bucket {stream}_claims (watch)            │
//!  │ stream sequence       │  + Waker   │  requests on {prefix}.relay.{relay}.cmd       │
//!  └───────────────────────┘            └──────────────────────────────────────────────┘
//! ```
//!
//! This module is always compiled and holds no I/O: the two message enums ([`ToBus`],
//! [`FromBus`]), the engine settings ([`ClusterConfig`]) and the names on the bus
//! (subjects, message ids, KV keys). The thread that speaks NATS is the bridge, in the I/O
//! layer (`aep_relay::bridge`, `src/io/bridge.rs`), behind the cargo feature `cluster`. Keeping the boundary a pair of small enums means a client
//! spoken by the reactor itself could replace the bridge without touching the core.
//!
//! # Names on the bus
//!
//! | what | subject or key |
//! | --- | --- |
//! | a session-scoped Event (AEP-0001 §5.2) | [`event_subject`]: `{prefix}.ev.{agent}.{session}` |
//! | an agent-scoped Event (`agent.*`, AEP-0001 §5.2) | [`agent_subject`]: `{prefix}.ag.{agent}` |
//! | a relay's own requests (forwarded commands, AEP-0004 §4) | [`relay_subject`]: `{prefix}.relay.{relay}.cmd` |
//! | the stream's message id | [`publish_id`]: the relay, its start and a publish serial (AEP-0003 §5) |
//! | a claims KV key | [`kv_key`] of its parts |
//!
//! Every variable token is encoded with [`subject_token`], which is reversible for names up
//! to a length and hashed past it. Relays route on the Event's scanned attributes, never on
//! the subject: the subject only places an Event under the stream's per-subject limit, so
//! that each session's retention in the engine is bounded on its own.

use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// What the core asks of the bus. Sent to the bridge with `Bridge::send`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToBus {
    /// Publish one stream message to the stream on `subject`: one Event's raw bytes,
    /// unchanged, or several Events of that subject, one per line (`\n` between them,
    /// none holding a raw line break; the engine's cost is per message), with the header
    /// `Nats-Msg-Id: {msg_id}` so that the stream's duplicate window collapses this
    /// relay's own retry of this publish, and nothing else ([`publish_id`]).
    ///
    /// Pipelined: the bridge never awaits one ack before sending the next publish, and it
    /// sends publishes in the order it receives them. Answered by [`FromBus::Acked`] or
    /// [`FromBus::PublishFailed`] with the same `ticket`, in any order; at once with
    /// `PublishFailed` (`"not-connected"`) while the bridge is not connected.
    Publish {
        /// The caller's handle for the answer.
        ticket: u64,
        /// The subject: [`event_subject`] or [`agent_subject`].
        subject: String,
        /// The message id: [`publish_id`] (the same on a retry of this publish).
        msg_id: String,
        /// The Events as their emitters sent them, one per line.
        payload: Bytes,
    },
    /// Put a claim record in the claims KV bucket (`{stream}_claims`). The key is already
    /// KV-safe ([`kv_key`]). Claims and their deletions are applied in the order sent; a
    /// failure is logged and not answered (a claim is refreshed while it lives).
    PutClaim {
        /// The KV key.
        key: String,
        /// The claim record (the core's encoding).
        value: Bytes,
    },
    /// Delete a claim record from the claims KV bucket.
    DeleteClaim {
        /// The KV key.
        key: String,
    },
    /// Send a request (a forwarded command, AEP-0004 §4) to relay `relay`'s own subject
    /// ([`relay_subject`]). Answered by [`FromBus::Response`] with the same `ticket`, at the
    /// latest after [`ClusterConfig::request_timeout`]; at once with `"not-connected"` while
    /// the bridge is not connected.
    Request {
        /// The caller's handle for the answer.
        ticket: u64,
        /// The target relay's id ([`ClusterConfig::relay_id`] there), unencoded.
        relay: String,
        /// The request body.
        payload: Bytes,
    },
    /// Answer a [`FromBus::Request`]. An unknown or expired `reply` is dropped (the
    /// requester has timed out by then).
    Reply {
        /// The `reply` of the [`FromBus::Request`].
        reply: u64,
        /// The answer body.
        payload: Bytes,
    },
}

/// What the bus tells the core. Taken from the bridge with `Bridge::try_recv`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromBus {
    /// Connected to the engine, with the stream and the claims bucket in place (also after
    /// each reconnect). `max_payload` is the server's limit on one message, in bytes
    /// (headers included); `last_seq` is the stream's last sequence at that moment (0 when
    /// the stream is empty), the point the relay has caught up at once its consumer has
    /// delivered it. Always precedes the [`FromBus::Message`]s that follow it.
    Connected {
        /// The server's `max_payload`, in bytes.
        max_payload: usize,
        /// The stream's last sequence (0: empty).
        last_seq: u64,
    },
    /// The connection to the engine is lost; the client reconnects by itself, and
    /// [`FromBus::Connected`] follows when it has. Publishes and requests made meanwhile
    /// fail at once (`"not-connected"`); claim puts and deletes wait and are applied
    /// after the reconnect (the latest per key).
    Disconnected {
        /// What was last reported about the connection (an error text, or "disconnected").
        reason: String,
    },
    /// The engine stopped answering on a connection that stays up: the bridge's probe
    /// (a JetStream API round trip every [`PROBE_EVERY`]) went unanswered
    /// [`PROBE_MISSES`] times in a row. Reported whether or not this relay ingests
    /// anything. [`FromBus::Answering`] follows when a probe is answered again.
    Stalled {
        /// What the probes saw.
        reason: String,
    },
    /// A probe is answered again after [`FromBus::Stalled`].
    Answering,
    /// One stream message from this relay's ordered consumer over the whole stream, in
    /// stream order, each `stream_seq` once: strictly increasing across resets and
    /// reconnects.
    Message {
        /// The message's stream sequence.
        stream_seq: u64,
        /// Messages still pending for the consumer after this one (the lag).
        pending: u64,
        /// The payload as published: one Event, or several one per line (see
        /// [`ToBus::Publish`]).
        payload: Bytes,
        /// The message's `Nats-Msg-Id` when it starts with this relay's
        /// [`publish_id_prefix`] (a publish of this relay's own), else `None`.
        own_id: Option<String>,
    },
    /// The ordered consumer was recreated (after a gap, a deletion, missed heartbeats or a
    /// reconnect); it resumes after the last `stream_seq` delivered.
    ConsumerReset,
    /// A [`ToBus::Publish`] is stored in the stream.
    Acked {
        /// The publish's ticket.
        ticket: u64,
        /// Its stream sequence (for a duplicate, the original's).
        stream_seq: u64,
        /// The stream already held this msg id within its duplicate window.
        duplicate: bool,
    },
    /// A [`ToBus::Publish`] was not stored (or its ack did not come in time): the caller
    /// may publish it again with the same msg id.
    PublishFailed {
        /// The publish's ticket.
        ticket: u64,
        /// What went wrong.
        error: String,
    },
    /// A claims KV entry changed: the current values on start and after each reconnect,
    /// then every change. `None`: deleted, purged, or expired (no put within
    /// [`ClusterConfig::claim_ttl`]; the engine expires entries silently, so the bridge
    /// reports that itself).
    Claim {
        /// The KV key.
        key: String,
        /// The claim record, or `None` when it is gone.
        value: Option<Bytes>,
    },
    /// A request on this relay's own subject ([`relay_subject`]). Answer it with
    /// [`ToBus::Reply`] within the requester's timeout.
    Request {
        /// The handle to answer with.
        reply: u64,
        /// The request body.
        payload: Bytes,
    },
    /// The answer to [`ToBus::Request`]: `Ok(reply body)`, or `Err` with
    /// [`NO_RESPONDERS`] (no relay listens on that subject), [`TIMEOUT`], [`NOT_CONNECTED`],
    /// or another text.
    Response {
        /// The request's ticket.
        ticket: u64,
        /// The reply body or the failure.
        result: Result<Bytes, String>,
    },
}

/// How to authenticate to the engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ClusterAuth {
    /// No credentials.
    #[default]
    None,
    /// A token (`authorization { token }` in nats-server).
    Token(String),
    /// A user and password.
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// A NATS credentials file (`.creds`: a user JWT and its NKey seed).
    Credentials(PathBuf),
}

/// The error of a [`ToBus::Publish`] or a [`ToBus::Request`] made while the bridge is not
/// connected (before [`FromBus::Connected`], or after [`FromBus::Disconnected`]).
pub const NOT_CONNECTED: &str = "not-connected";
/// The error of a [`ToBus::Request`] that no relay listens for.
pub const NO_RESPONDERS: &str = "no-responders";
/// The error of a [`ToBus::Request`] not answered within [`ClusterConfig::request_timeout`].
pub const TIMEOUT: &str = "timeout";

/// How often the bridge probes the engine with a round trip (a JetStream API request)
/// while connected, so that a stalled engine is noticed without any ingest.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long one probe waits for its answer before it counts as missed.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Missed probes in a row that make [`FromBus::Stalled`].
pub const PROBE_MISSES: u32 = 3;

/// The default stream name ([`ClusterConfig::stream`]).
pub const DEFAULT_STREAM: &str = "AEP";
/// The default subject prefix ([`ClusterConfig::prefix`]).
pub const DEFAULT_PREFIX: &str = "aep";
/// The default lifetime of a claims KV entry without a refresh (10 seconds).
pub const DEFAULT_CLAIM_TTL: Duration = Duration::from_secs(10);
/// The default timeout of a [`ToBus::Request`] (2 seconds).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The default time a publish waits for its ack, and a JetStream API call for its answer
/// (5 seconds).
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// The default age past which the stream drops an Event (24 hours).
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// The default number of Events the stream keeps per subject, that is per session or per
/// agent's agent-scoped Events (4096).
pub const DEFAULT_MAX_MSGS_PER_SUBJECT: i64 = 4096;
/// The default duplicate window of the stream: a publish with a msg id seen within it is
/// acknowledged as a duplicate and not stored again (2 minutes).
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Where the engine is and how the relay uses it.
///
/// When the stream `stream` exists already it is used as it is; otherwise it is created
/// with the limits here. Only fields that nats-server 2.9 knows are sent (2.9 silently
/// ignores newer ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The servers, `nats://host:port` (or `tls://…`); the client picks among them and
    /// reconnects to any.
    pub urls: Vec<String>,
    /// This relay's id: unique in the cluster; names its request subject
    /// ([`relay_subject`]) and its connection.
    pub relay_id: String,
    /// The JetStream stream holding every Event; the claims bucket is `{stream}_claims`.
    pub stream: String,
    /// The first subject token of every subject ([`event_subject`], …).
    pub prefix: String,
    /// Credentials.
    pub auth: ClusterAuth,
    /// A PEM file of root certificates to verify the servers' TLS certificates with.
    pub tls_ca: Option<PathBuf>,
    /// How long a claim lives in the KV bucket without a refresh (its `max_age`).
    pub claim_ttl: Duration,
    /// How long a [`ToBus::Request`] waits for its answer.
    pub request_timeout: Duration,
    /// How long a publish waits for its ack, and a JetStream API call for its answer.
    pub ack_timeout: Duration,
    /// The stream's `max_age` (zero: no limit).
    pub max_age: Duration,
    /// The stream's `max_msgs_per_subject` (-1: no limit).
    pub max_msgs_per_subject: i64,
    /// The stream's `duplicate_window`.
    pub duplicate_window: Duration,
    /// What ingest does while the engine is unreachable (`--cluster-degrade`).
    pub degrade: Degrade,
    /// Most Events kept in the outbox while degraded (ingested locally, not yet in the
    /// stream); past it ingest answers 503 `cluster-unavailable`.
    pub outbox: usize,
}

/// What ingest does while the engine is unreachable (`--cluster-degrade`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Degrade {
    /// Keep serving locally: admit, fan out to local subscribers, keep the Event in the
    /// bounded outbox and publish it on reconnect.
    #[default]
    Local,
    /// Refuse ingest with 503 `cluster-unavailable`.
    Refuse,
}

/// The default outbox bound, in Events.
pub const DEFAULT_OUTBOX: usize = 10_000;

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            urls: vec!["nats://127.0.0.1:4222".to_string()],
            relay_id: String::new(),
            stream: DEFAULT_STREAM.to_string(),
            prefix: DEFAULT_PREFIX.to_string(),
            auth: ClusterAuth::None,
            tls_ca: None,
            claim_ttl: DEFAULT_CLAIM_TTL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            max_age: DEFAULT_MAX_AGE,
            max_msgs_per_subject: DEFAULT_MAX_MSGS_PER_SUBJECT,
            duplicate_window: DEFAULT_DUPLICATE_WINDOW,
            degrade: Degrade::Local,
            outbox: DEFAULT_OUTBOX,
        }
    }
}

impl ClusterConfig {
    /// The claims KV bucket's name: `{stream}_claims`.
    pub fn claims_bucket(&self) -> String {
        format!("{}_claims", self.stream)
    }
}

/// The longest encoded token kept reversible; a longer one is hashed.
pub const MAX_TOKEN_LEN: usize = 64;

/// Encodes `s` as one token, keeping `[A-Za-z0-9_-]` and writing every other byte as
/// `{esc}XX` (uppercase hex), the escape byte itself included; the empty string becomes
/// `{esc}` alone. An encoding longer than [`MAX_TOKEN_LEN`] is replaced by `{esc}h` and
/// the first 32 hex digits of SHA-256(`s`): `h` is no hex digit, so no escaped token
/// reads that way.
fn encode_with(s: &str, esc: char) -> String {
    if s.is_empty() {
        return esc.to_string();
    }
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            let _ = write!(out, "{esc}{b:02X}");
        }
        if out.len() > MAX_TOKEN_LEN {
            break;
        }
    }
    if out.len() > MAX_TOKEN_LEN {
        let digest = Sha256::digest(s.as_bytes());
        out.clear();
        out.push(esc);
        out.push('h');
        for b in &digest[..16] {
            let _ = write!(out, "{b:02x}");
        }
    }
    out
}

/// The inverse of [`encode_with`] for the reversible form; `None` for a hashed or
/// malformed token, or one that is not this function's own output.
fn decode_with(token: &str, esc: u8) -> Option<String> {
    let t = token.as_bytes();
    if t.is_empty() {
        return None;
    }
    if t == [esc] {
        return Some(String::new());
    }
    let mut out = Vec::with_capacity(t.len());
    let mut i = 0;
    while i < t.len() {
        let b = t[i];
        if b == esc {
            let hex = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'A'..=b'F' => Some(c - b'A' + 10),
                _ => None,
            };
            let hi = hex(*t.get(i + 1)?)?;
            let lo = hex(*t.get(i + 2)?)?;
            let v = hi << 4 | lo;
            if v.is_ascii_alphanumeric() || v == b'_' || v == b'-' {
                return None; // kept bytes are never escaped
            }
            out.push(v);
            i += 3;
        } else if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

/// Encodes one subject token, reversibly and safely for NATS subjects.
///
/// `[A-Za-z0-9_-]` is kept; every other byte (`.`, `*`, `>`, spaces, control bytes, each
/// byte of a non-ASCII character, and `~` itself) is written as `~XX` in uppercase hex. The
/// empty string is `~`. A result longer than [`MAX_TOKEN_LEN`] bytes is replaced by `~h`
/// and the first 32 hex digits of SHA-256 of `s`. Agent and session names are free strings
/// (AEP-0001 §5.1 #7, #8), hence the escape.
///
/// ```
/// use aep_relay::cluster::{decode_token, subject_token};
/// assert_eq!(subject_token("claude-code"), "claude-code");
/// assert_eq!(subject_token("a.b c"), "a~2Eb~20c");
/// assert_eq!(decode_token("a~2Eb~20c").as_deref(), Some("a.b c"));
/// assert!(subject_token(&"x".repeat(65)).starts_with("~h"));
/// ```
pub fn subject_token(s: &str) -> String {
    encode_with(s, '~')
}

/// Decodes a token made by [`subject_token`]; `None` for a hashed token (`~h…`) or one
/// that [`subject_token`] cannot have produced.
pub fn decode_token(token: &str) -> Option<String> {
    decode_with(token, b'~')
}

/// The subject of a session-scoped Event (AEP-0001 §5.2): `{prefix}.ev.{agent}.{session}`,
/// `agent` and `session` encoded with [`subject_token`]. The prefix is used as given (it
/// may hold dots).
pub fn event_subject(prefix: &str, agent: &str, session: &str) -> String {
    format!(
        "{prefix}.ev.{}.{}",
        subject_token(agent),
        subject_token(session)
    )
}

/// The subject of an agent-scoped Event (`agent.*`, AEP-0001 §5.2): `{prefix}.ag.{agent}`.
pub fn agent_subject(prefix: &str, agent: &str) -> String {
    format!("{prefix}.ag.{}", subject_token(agent))
}

/// The subject relay `relay_id` takes requests on (forwarded commands, AEP-0004 §4):
/// `{prefix}.relay.{relay_id}.cmd`.
pub fn relay_subject(prefix: &str, relay_id: &str) -> String {
    format!("{prefix}.relay.{}.cmd", subject_token(relay_id))
}

/// The stream's message id (`Nats-Msg-Id`) of one publish: `{relay}.{boot}.{serial}`,
/// the relay's id encoded with [`subject_token`], the relay's start (milliseconds since the
/// Unix epoch: a restarted relay never reuses an id within the duplicate window) and a
/// serial counted per publish by that relay.
///
/// It names the publish, never the Event: the stream's duplicate window then collapses
/// only a relay's own retries of one publish (an ack lost or timed out), never two
/// deliveries of one Event. AEP-0003 §5 makes a buffering fan-out endpoint a
/// non-terminal hop: "live fan-out forwards Events as received: at-least-once redelivery
/// MUST be able to traverse the hop". An id derived from the Event's `(source, id)`
/// would swallow an emitter's re-send and a target's byte-identical re-acknowledgement
/// (AEP-0004 §3) in the engine.
/// Buffer admission still dedupes on `(source, id)` at every relay (AEP-0001 §7.4).
///
/// ```
/// use aep_relay::cluster::publish_id;
/// assert_eq!(publish_id("r1", 1_700_000_000_000, 7), "r1.1700000000000.7");
/// assert_eq!(publish_id("r 1", 5, 1), "r~201.5.1");
/// ```
pub fn publish_id(relay_id: &str, boot: u64, serial: u64) -> String {
    format!("{}.{boot}.{serial}", subject_token(relay_id))
}

/// The start of every [`publish_id`] of relay `relay_id`: `{relay}.` (a relay recognises
/// its own publishes when the stream delivers them).
pub fn publish_id_prefix(relay_id: &str) -> String {
    format!("{}.", subject_token(relay_id))
}

/// A claims KV key from its parts, joined with `.`.
///
/// KV keys allow only `[-/_=.a-zA-Z0-9]`: each part keeps `[A-Za-z0-9_-]` and writes every
/// other byte as `=XX` (uppercase hex; `=` itself included), the empty part is `=`, and a
/// part longer than [`MAX_TOKEN_LEN`] encoded is `=h` and 32 hex digits of its SHA-256, as
/// in [`subject_token`]. No part is empty, so the key never starts or ends with a dot.
/// [`decode_kv_part`] reverses one part.
///
/// ```
/// use aep_relay::cluster::kv_key;
/// assert_eq!(kv_key(&["relay-1", "aep://h/agent/a", "s 1"]), "relay-1.aep=3A=2F=2Fh=2Fagent=2Fa.s=201");
/// ```
pub fn kv_key(parts: &[&str]) -> String {
    let mut out = String::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(&encode_with(p, '='));
    }
    out
}

/// Decodes one part of a [`kv_key`] (split the key on `.` first); `None` for a hashed or
/// malformed part.
pub fn decode_kv_part(part: &str) -> Option<String> {
    decode_with(part, b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token is safe for a NATS subject: non-empty, no `.`, `*`, `>`, whitespace or
    /// control byte, ASCII only.
    fn subject_safe(t: &str) -> bool {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_graphic() && b != b'.' && b != b'*' && b != b'>')
    }

    fn kv_safe(key: &str) -> bool {
        !key.is_empty()
            && !key.starts_with('.')
            && !key.ends_with('.')
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-/_=.".contains(&b))
    }

    const SAMPLES: &[&str] = &[
        "",
        "a",
        "claude-code",
        "under_score",
        "a.b",
        "*",
        ">",
        "a b",
        "tab\there",
        "nl\nx",
        "\0",
        "\u{7f}",
        "~",
        "~2E",
        "=",
        "%41",
        "é",
        "日本語",
        "emoji 🙂",
        "aep://host/agent/a/session/s",
    ];

    #[test]
    fn subject_tokens_round_trip_and_are_safe() {
        for s in SAMPLES {
            let t = subject_token(s);
            assert!(subject_safe(&t), "{s:?} -> {t:?}");
            assert!(t.len() <= MAX_TOKEN_LEN, "{s:?} -> {t:?}");
            assert_eq!(decode_token(&t).as_deref(), Some(*s), "{s:?} -> {t:?}");
        }
    }

    #[test]
    fn subject_tokens_are_injective_on_samples() {
        let mut seen = std::collections::HashMap::new();
        for s in SAMPLES {
            if let Some(prev) = seen.insert(subject_token(s), *s) {
                panic!("{prev:?} and {s:?} encode alike");
            }
        }
    }

    #[test]
    fn escapes_are_exact() {
        assert_eq!(subject_token(""), "~");
        assert_eq!(subject_token("a.b"), "a~2Eb");
        assert_eq!(subject_token("*>"), "~2A~3E");
        assert_eq!(subject_token("~"), "~7E");
        assert_eq!(subject_token("é"), "~C3~A9");
        assert_eq!(subject_token("x y"), "x~20y");
    }

    #[test]
    fn long_tokens_are_hashed() {
        // 64 kept bytes stay; 65 are hashed.
        let at = "x".repeat(MAX_TOKEN_LEN);
        assert_eq!(subject_token(&at), at);
        let over = "x".repeat(MAX_TOKEN_LEN + 1);
        let t = subject_token(&over);
        assert_eq!(t.len(), 2 + 32);
        assert!(t.starts_with("~h"));
        assert!(subject_safe(&t));
        assert_eq!(decode_token(&t), None);
        // Escapes count towards the length: 22 dots are 66 bytes encoded.
        let dots = ".".repeat(22);
        assert!(subject_token(&dots).starts_with("~h"));
        assert_eq!(subject_token(&".".repeat(21)).len(), 63);
        // Different long names hash apart, and the hash is stable.
        assert_ne!(subject_token(&over), subject_token(&"y".repeat(65)));
        assert_eq!(subject_token(&over), subject_token(&over));
    }

    #[test]
    fn decode_refuses_what_encode_never_makes() {
        for bad in [
            "~2", "~zz", "~2e", "a.b", "~41", "a b", "~h00", "~~", "", "~C3",
        ] {
            assert_eq!(decode_token(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn subjects() {
        assert_eq!(event_subject("aep", "a", "s"), "aep.ev.a.s");
        assert_eq!(event_subject("aep", "a.b", ""), "aep.ev.a~2Eb.~");
        assert_eq!(agent_subject("x.y", "a*"), "x.y.ag.a~2A");
        assert_eq!(relay_subject("aep", "r 1"), "aep.relay.r~201.cmd");
        // Each encoded name is exactly one token.
        let s = event_subject("aep", "a.b.c", "d>e");
        assert_eq!(s.split('.').count(), 4, "{s}");
    }

    #[test]
    fn publish_ids_name_the_publish_and_never_collide_across_relays_or_starts() {
        let a = publish_id("r1", 10, 1);
        assert_eq!(a, "r1.10.1");
        assert_ne!(a, publish_id("r1", 10, 2));
        assert_ne!(a, publish_id("r1", 11, 1), "a restarted relay");
        assert_ne!(a, publish_id("r2", 10, 1), "another relay");
        // A relay id with a dot cannot pose as another relay's prefix.
        assert_ne!(publish_id("r1.10", 1, 1), publish_id("r1", 10, 11));
        assert!(publish_id("r.1", 3, 4).starts_with(&publish_id_prefix("r.1")));
        assert!(!publish_id("r1x", 3, 4).starts_with(&publish_id_prefix("r1")));
    }

    #[test]
    fn kv_keys_are_valid_and_reversible() {
        for a in SAMPLES {
            for b in ["", "s", "a.b", "=", "x/y"] {
                let key = kv_key(&[a, b]);
                assert!(kv_safe(&key), "{a:?},{b:?} -> {key:?}");
                let parts: Vec<_> = key.split('.').collect();
                assert_eq!(parts.len(), 2, "{key}");
                assert_eq!(decode_kv_part(parts[0]).as_deref(), Some(*a), "{key}");
                assert_eq!(decode_kv_part(parts[1]).as_deref(), Some(b), "{key}");
            }
        }
        assert_eq!(kv_key(&["="]), "=3D");
        assert_eq!(kv_key(&[""]), "=");
        let long = kv_key(&[&"z".repeat(100)]);
        assert!(long.starts_with("=h") && long.len() == 34 && kv_safe(&long));
        assert_eq!(decode_kv_part(&long), None);
    }
}
