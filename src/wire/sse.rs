//! The SSE consuming binding's wire form (AEP-0003 §3.3): the `id:` escape and each
//! message and comment of a stream. Reading a `GET /stream` request and its
//! `Last-Event-ID` into a subscription is the subscription model's
//! ([`crate::subscription::parse_stream_request`]).

use crate::wire::envelope::{Event, Scope};
use bytes::{BufMut, Bytes, BytesMut};

/// Whether byte `b` of a session (at byte offset `at`) is written `%XX` in an SSE line:
/// `%` (the escape itself), every C0 control and DEL (CR and LF end an SSE line, a NUL
/// makes the WHATWG parser drop the whole `id:`, and none of them can travel back in a
/// `Last-Event-ID` header, RFC 9110 §5.5), every non-ASCII byte and a leading space
/// (HTTP strips leading whitespace from a header value). Browsers send a non-ASCII
/// `lastEventId` back as UTF-8, but many SSE clients cannot: Node's `http` and the
/// Fetch `Headers` behind most `EventSource` polyfills refuse characters beyond
/// Latin-1, and clients that write header strings as Latin-1 (Python's `http.client`)
/// garble them; an ASCII `id:` resumes from all of them. A raw UTF-8 `Last-Event-ID`
/// is still read as itself.
fn escaped_byte(b: u8, at: usize) -> bool {
    b == b'%' || !(0x20..0x7f).contains(&b) || (at == 0 && b == b' ')
}

/// A session (or any producer string) as written in an SSE `id:` or comment line
/// (AEP-0003 §3.3.2, §3.3.3): printable ASCII other than `%` stays as it is, so ordinary
/// sessions (`s_8f2c`, `a:b`, `run 7`) are written unchanged; `%`, C0 controls (CR, LF,
/// NUL, TAB, ESC, …), DEL, each byte of a non-ASCII character and a leading space are
/// written `%XX` (two upper-case hex digits of the UTF-8 byte). The result is printable
/// ASCII without CR, LF or NUL; [`unescape`] reverses it exactly.
///
/// Borrows when nothing needs escaping (no allocation for ordinary sessions).
///
/// ```
/// use aep_relay::wire::sse::escape;
/// assert_eq!(escape("s_8f2c"), "s_8f2c");
/// assert_eq!(escape("a%b\nc"), "a%25b%0Ac");
/// assert_eq!(escape(" é"), "%20%C3%A9");
/// ```
pub fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    let b = s.as_bytes();
    let Some(first) = b.iter().enumerate().position(|(i, &c)| escaped_byte(c, i)) else {
        return std::borrow::Cow::Borrowed(s);
    };
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(b.len() + 16);
    out.push_str(&s[..first]);
    for (i, &c) in b.iter().enumerate().skip(first) {
        if escaped_byte(c, i) {
            out.push('%');
            out.push(char::from(HEX[usize::from(c >> 4)]));
            out.push(char::from(HEX[usize::from(c & 0xf)]));
        } else {
            out.push(char::from(c));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Reverses [`escape`]: each `%XX` (two hex digits, either case) becomes the byte `XX`,
/// everything else is kept. `None` when a `%` is not followed by two hex digits or the
/// bytes are not UTF-8. Lenient in what it takes: `%41` reads as `A`, as an unescaped
/// non-ASCII character reads as itself.
///
/// ```
/// use aep_relay::wire::sse::unescape;
/// assert_eq!(unescape("a%25b%0ac").as_deref(), Some("a%b\nc"));
/// assert_eq!(unescape("50%"), None);
/// ```
pub fn unescape(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_string());
    }
    let hex = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hi = hex(*b.get(i + 1)?)?;
            let lo = hex(*b.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The SSE `id:` value of a position: `{escaped session}:{epoch}:{seq}` (AEP-0003
/// §3.3.2; the session as [`escape`] writes it).
/// [`crate::subscription::parse_last_event_id`] reads it back.
///
/// ```
/// use aep_relay::wire::sse::event_id;
/// assert_eq!(event_id("s_8f2c", 0, 187), "s_8f2c:0:187");
/// ```
pub fn event_id(session: &str, epoch: u64, seq: u64) -> String {
    format!("{}:{epoch}:{seq}", escape(session))
}

/// An SSE response head with the given `Connection` value, and the opening comment.
macro_rules! stream_head {
    ($connection:literal) => {
        concat!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\nConnection: ",
            $connection,
            "\r\n\r\n: aep-relay stream open\n\n"
        )
        .as_bytes()
    };
}

/// The response head that opens an SSE stream.
pub const STREAM_HEAD: &[u8] = stream_head!("keep-alive");

/// The response head of a replay-only stream (`live=0`): as [`STREAM_HEAD`], but the
/// relay closes the connection once the replay ends, and says so, so that a client
/// pipelining a request behind it knows it will not be answered there.
pub const REPLAY_HEAD: &[u8] = stream_head!("close");

/// The `retry:` field that sets a consumer's reconnection delay to `ms` milliseconds
/// (WHATWG HTML, "Server-sent events", interpreting an event stream: a `retry` field of
/// ASCII digits), as a message of its own: with no `data` field it dispatches nothing.
/// Sent once per stream, after the head, with a per-stream jitter so that consumers
/// dropped together reconnect spread out.
///
/// ```
/// assert_eq!(&aep_relay::wire::sse::retry(2500)[..], b"retry: 2500\n\n");
/// ```
pub fn retry(ms: u64) -> Bytes {
    Bytes::from(format!("retry: {ms}\n\n"))
}

/// The heartbeat comment (AEP-0003 §3.3.4).
pub const PING: &[u8] = b": ping\n\n";

/// The comment that ends a replay-only stream (`live=0`) once everything it asked for
/// was delivered (also when nothing was held), before the close; a replay cut short
/// ends without it (AEP-0003 §3.3, §5).
pub const REPLAY_COMPLETE: &[u8] = b": replay-complete\n\n";

/// The comment that ends an SSE stream dropped for the relay's memory budget, after the
/// last whole Event it was sent (its `Last-Event-ID` resumes exactly).
pub const MEMORY_BUDGET: &[u8] = b": closing: memory budget\n\n";

/// The comment that ends an SSE stream whose token expired (its JWT `exp`): the
/// consumer reconnects with a fresh token and resumes from its last `id:`.
pub const TOKEN_EXPIRED: &[u8] = b": closing: token expired\n\n";

/// The comment that ends every SSE stream at a graceful shutdown.
pub const SHUTTING_DOWN: &[u8] = b": shutting-down\n\n";

/// Builds one SSE message for `ev` carrying `payload` (the Event's original bytes, or a
/// down-leveled copy): `event: <type>`, `id: {session}:{epoch}:{seq}` for sequenced
/// Events (the session [`escape`]d, as [`event_id`] writes it), `data: <payload>`
/// (AEP-0003 §3.3.2).
///
/// No line carries a raw CR, LF or NUL, so a producer string cannot add a field or a
/// message to any consumer's stream: the session is escaped, the `type` too (a valid
/// type is `[a-z0-9_.-]` and unchanged). JSON cannot hold a raw CR or LF inside a
/// string, so any CR/LF in `payload` is insignificant whitespace between tokens; each is
/// written as a space so the payload stays on one `data:` line with its length and
/// meaning unchanged.
pub fn message(ev: &Event, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(payload.len() + ev.event_type().len() + 96);
    write_message(ev, payload, &mut b);
    b.freeze()
}

/// Appends the SSE message of [`message`] to `out` (fan-out lays the messages of one
/// ingest unit back to back in one buffer, see `fanout`). Allocates only when `out`
/// lacks the room, or for the escaped form of a session that needs escaping (once per
/// Event and binding, never per delivery).
pub fn write_message(ev: &Event, payload: &[u8], b: &mut BytesMut) {
    let t = escape(ev.event_type());
    b.reserve(payload.len() + t.len() + 96);
    b.put_slice(b"event: ");
    b.put_slice(t.as_bytes());
    b.put_u8(b'\n');
    if ev.scope() == Scope::Sequenced {
        if let (Some(s), Some(q)) = (ev.session(), ev.seq()) {
            b.put_slice(b"id: ");
            b.put_slice(escape(s).as_bytes());
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
    // The scan knows whether the Event as received holds a line break; a down-leveled
    // payload is other bytes, looked at.
    if ev.has_line_breaks() || !std::ptr::eq(payload, &ev.bytes()[..]) {
        crate::wire::envelope::line_breaks_to_spaces(&mut b[start..]);
    }
    b.put_slice(b"\n\n");
}

/// Appends `v` in ASCII decimal (no allocation, unlike `format!`; `itoa` writes two
/// digits per division).
fn put_decimal(b: &mut BytesMut, v: u64) {
    b.put_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// The `: dropped {n} debug={d} info={i}` comment (AEP-0003 §8.4): `n` Events, `d` of
/// severity `debug` and `i` of `info`, were not delivered to this consumer since the
/// previous such comment (or since the stream opened) because it read too slowly.
/// The relay writes it just before the next Event it delivers after them, between two
/// messages: where the missing Events would have been. `n = d + i`, all three in ASCII
/// decimal, both severities always named. [`dropped_len`] bytes long.
///
/// ```
/// assert_eq!(&aep_relay::wire::sse::dropped(10, 2)[..], b": dropped 12 debug=10 info=2\n\n");
/// ```
pub fn dropped(debug: u64, info: u64) -> Bytes {
    let mut b = BytesMut::with_capacity(dropped_len(debug, info));
    b.put_slice(b": dropped ");
    put_decimal(&mut b, debug.saturating_add(info));
    b.put_slice(b" debug=");
    put_decimal(&mut b, debug);
    b.put_slice(b" info=");
    put_decimal(&mut b, info);
    b.put_slice(b"\n\n");
    b.freeze()
}

/// The length of [`dropped`]`(debug, info)` in bytes, without building it.
pub fn dropped_len(debug: u64, info: u64) -> usize {
    let digits = |v: u64| v.checked_ilog10().map_or(1, |l| l as usize + 1);
    let count = debug.saturating_add(info);
    ": dropped  debug= info=\n\n".len() + digits(count) + digits(debug) + digits(info)
}

/// The `: replay-exhausted {session} {epoch}:{seq}` comment (AEP-0003 §3.3.3), the
/// session [`escape`]d as in `id:` (so it names exactly the session a consumer resumes
/// with, and the line holds no CR, LF or NUL).
pub fn replay_exhausted(session: &str, earliest: (u64, u64)) -> Bytes {
    Bytes::from(format!(
        ": replay-exhausted {} {}:{}\n\n",
        escape(session),
        earliest.0,
        earliest.1
    ))
}

/// Session names an SSE `id:` line must carry safely (escaped, then read back
/// exactly): the escape character itself, line breaks, NUL, controls, leading blanks,
/// non-ASCII, a forged field and the separator. For the tests of the escape and of
/// reading `Last-Event-ID` back (`subscription`).
#[cfg(test)]
pub(crate) const HOSTILE_SESSIONS: &[&str] = &[
    "%",
    "%25",
    "a%b",
    "\r",
    "\n",
    "\0",
    "a\r\nb",
    " lead",
    "  ",
    "\t\u{1b}[31m\u{7f}",
    "é",
    "会话",
    "𝄞",
    "s1\ndata: {\"fake\":true}\n\nid: x",
    "a:0:1",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dropped_comment_is_one_line_of_fixed_shape_and_known_length() {
        assert_eq!(&dropped(0, 7)[..], b": dropped 7 debug=0 info=7\n\n");
        let widest = dropped(u64::MAX, u64::MAX);
        assert_eq!(
            &widest[..],
            format!(": dropped {m} debug={m} info={m}\n\n", m = u64::MAX).as_bytes()
        );
        for (d, i) in [(0, 0), (9, 0), (9, 1), (10, 99), (12345, 0), (u64::MAX, 1)] {
            assert_eq!(dropped(d, i).len(), dropped_len(d, i), "{d} {i}");
        }
        assert_eq!(widest.len(), dropped_len(u64::MAX, u64::MAX));
    }

    #[test]
    fn escape_round_trips_and_keeps_ordinary_sessions() {
        for s in ["s_8f2c", "a:b", "run 7", "x-y.z~!*'()", "a\\b"] {
            assert_eq!(escape(s), s);
        }
        let long = "é%\n:".repeat(256);
        for s in HOSTILE_SESSIONS.iter().copied().chain([long.as_str()]) {
            let e = escape(s);
            assert!(
                e.bytes()
                    .all(|b| (0x20..0x7f).contains(&b) && b != b'\r' && b != b'\n'),
                "{e:?}"
            );
            assert!(!e.starts_with(' '), "{e:?}");
            assert_eq!(unescape(&e).as_deref(), Some(s), "{e:?}");
        }
        assert_eq!(escape("a%b"), "a%25b");
        assert_eq!(escape("\r\n\0"), "%0D%0A%00");
        for bad in ["%", "a%2", "%zz", "50%", "%g0", "%C3"] {
            assert_eq!(unescape(bad), None, "{bad}");
        }
        assert_eq!(
            unescape("%41%c3%a9").as_deref(),
            Some("Aé"),
            "lenient: any hex case"
        );
    }
}
