//! HTTP/1.1 for the relay: request heads (httparse), body framing (`Content-Length` and
//! `Transfer-Encoding: chunked`), responses and their JSON error bodies.
//!
//! Everything here is sans-IO: it takes bytes and returns decisions or bytes to send.

use crate::refusal::Refusal;
use serde_json::json;
use std::io::Write as _;

/// Most header lines in one request head.
pub const MAX_HEADERS: usize = 64;

/// The parts of a request head the relay acts on. Header names are matched
/// case-insensitively; values are kept as sent (trimmed).
#[derive(Debug, Clone, Default)]
pub struct RequestHead {
    /// `GET`, `POST`, …
    pub method: String,
    /// The path without the query string (`/stream`).
    pub path: String,
    /// The raw query string after `?`, without the `?` (may be empty).
    pub query: String,
    /// HTTP minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// All header lines in order, names lowercased.
    pub headers: Vec<(String, String)>,
}

impl RequestHead {
    /// The request target as sent: path plus `?query` when there is one. Scrub it
    /// with [`crate::auth::scrub_query`] before logging.
    pub fn target(&self) -> String {
        if self.query.is_empty() {
            self.path.clone()
        } else {
            format!("{}?{}", self.path, self.query)
        }
    }

    /// The first header named `name` (lowercase), trimmed.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the connection should close after the response (`Connection: close`, or
    /// HTTP/1.0 without `keep-alive`).
    pub fn wants_close(&self) -> bool {
        let has = |v: &str, token: &str| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token));
        match self.header("connection") {
            Some(v) if has(v, "close") => true,
            Some(v) if has(v, "keep-alive") => false,
            _ => self.minor_version == 0,
        }
    }

    /// The media type of `Content-Type` without parameters, lowercased.
    pub fn media_type(&self) -> Option<String> {
        self.media_type_as_sent().map(str::to_ascii_lowercase)
    }

    /// The media type of `Content-Type` without parameters, trimmed, in the case it was
    /// sent (compare with `eq_ignore_ascii_case`; no allocation, unlike [`Self::media_type`]).
    pub fn media_type_as_sent(&self) -> Option<&str> {
        self.header("content-type")
            .map(|v| v.split(';').next().unwrap_or("").trim())
    }

    /// The query string's `name=value` pairs, percent- and `+`-decoded.
    pub fn query_pairs(&self) -> Vec<(String, String)> {
        form_urlencoded::parse(self.query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }
}

/// Why a request head could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadError {
    /// Malformed head (400), with httparse's reason.
    Malformed(String),
    /// More header lines than [`MAX_HEADERS`] (431).
    TooManyHeaders,
}

/// Parses a request head from the start of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, `Ok(Some((head, consumed)))` when the
/// head is complete (`consumed` bytes, through the blank line).
///
/// # Errors
/// [`HeadError`] for a malformed head or too many headers.
pub fn parse_head(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let mut head = RequestHead::default();
    Ok(parse_head_into(buf, &mut head)?.map(|n| (head, n)))
}

/// [`parse_head`] into `head`, reusing its strings and header list (a connection keeps
/// one `RequestHead` for its requests, so a head parsed into it allocates nothing once
/// the strings have grown to its requests' sizes).
///
/// Returns `Ok(None)` when more bytes are needed, `Ok(Some(consumed))` when the head is
/// complete (`consumed` bytes, through the blank line) and `head` holds it, exactly as
/// [`parse_head`] would return it. On `Ok(None)` or an error `head` holds nothing usable.
///
/// # Errors
/// [`HeadError`] for a malformed head or too many headers.
pub fn parse_head_into(buf: &[u8], head: &mut RequestHead) -> Result<Option<usize>, HeadError> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut storage);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(n)) => {
            let target = req.path.unwrap_or("/");
            let (path, query) = match target.split_once('?') {
                Some((p, q)) => (p, q),
                None => (target, ""),
            };
            let set = |s: &mut String, v: &str| {
                s.clear();
                s.push_str(v);
            };
            set(&mut head.method, req.method.unwrap_or(""));
            set(&mut head.path, path);
            set(&mut head.query, query);
            head.minor_version = req.version.unwrap_or(1);
            let lines = req.headers.len();
            for (i, h) in req.headers.iter().enumerate() {
                let value = String::from_utf8_lossy(h.value);
                let value = value.trim();
                match head.headers.get_mut(i) {
                    Some((name, v)) => {
                        set(name, h.name);
                        name.make_ascii_lowercase();
                        set(v, value);
                    }
                    None => head
                        .headers
                        .push((h.name.to_ascii_lowercase(), value.to_string())),
                }
            }
            head.headers.truncate(lines);
            Ok(Some(n))
        }
        Err(httparse::Error::TooManyHeaders) => Err(HeadError::TooManyHeaders),
        Err(e) => Err(HeadError::Malformed(e.to_string())),
    }
}

/// How a request's body is delimited (RFC 9112 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Why a request's framing headers are unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FramingError {
    /// Malformed or conflicting `Content-Length` / `Transfer-Encoding` (400).
    Bad(&'static str),
    /// `Content-Length` over the limit (413), with the declared length.
    TooLarge(u64),
}

/// Reads the body framing of `head`, refusing a declared length over `max_body` before
/// any body byte is read.
///
/// # Errors
/// [`FramingError`].
pub fn framing(head: &RequestHead, max_body: usize) -> Result<Framing, FramingError> {
    let te = head.header("transfer-encoding");
    let mut cls = head
        .headers
        .iter()
        .filter(|(n, _)| n == "content-length")
        .map(|(_, v)| v.as_str());
    let first = cls.next();
    if let Some(te) = te {
        if first.is_some() {
            return Err(FramingError::Bad(
                "both Content-Length and Transfer-Encoding are present",
            ));
        }
        if te.eq_ignore_ascii_case("chunked") {
            return Ok(Framing::Chunked);
        }
        return Err(FramingError::Bad(
            "only Transfer-Encoding: chunked is supported",
        ));
    }
    let Some(first) = first else {
        return Ok(Framing::None);
    };
    if cls.any(|v| v != first) {
        return Err(FramingError::Bad("conflicting Content-Length headers"));
    }
    if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
        return Err(FramingError::Bad("Content-Length is not a number"));
    }
    let n: u64 = first
        .parse()
        .map_err(|_| FramingError::Bad("Content-Length is out of range"))?;
    if n > max_body as u64 {
        return Err(FramingError::TooLarge(n));
    }
    Ok(if n == 0 {
        Framing::None
    } else {
        Framing::Length(n as usize)
    })
}

/// Incremental decoder for `Transfer-Encoding: chunked` (RFC 9112 §7.1). Chunk extensions
/// and trailer fields are read and discarded.
#[derive(Debug, Clone, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
    size: u64,
    size_digits: u8,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf,
    FinalLf,
    Done,
}

/// Why a chunked body is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkError {
    /// Malformed chunk framing (400).
    Malformed,
    /// The decoded body would exceed the limit (413).
    TooLarge,
}

impl ChunkedDecoder {
    /// Decodes as much of `input` as possible, appending body bytes to `out` (never
    /// beyond `max_body` bytes in total).
    ///
    /// Returns `(consumed, done)`: bytes of `input` used, and whether the terminating
    /// chunk and trailers have been read (bytes after that belong to the next request).
    ///
    /// # Errors
    /// [`ChunkError`].
    pub fn decode(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        max_body: usize,
    ) -> Result<(usize, bool), ChunkError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                ChunkState::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let d = (b as char).to_digit(16).unwrap_or(0) as u64;
                        self.size_digits += 1;
                        if self.size_digits > 15 {
                            return Err(ChunkError::TooLarge);
                        }
                        self.size = self.size * 16 + d;
                        i += 1;
                    }
                    b';' | b' ' | b'\t' if self.size_digits > 0 => {
                        self.state = ChunkState::Ext;
                        i += 1;
                    }
                    b'\r' if self.size_digits > 0 => {
                        self.state = ChunkState::SizeLf;
                        i += 1;
                    }
                    _ => return Err(ChunkError::Malformed),
                },
                ChunkState::Ext => {
                    match b {
                        b'\r' => self.state = ChunkState::SizeLf,
                        b'\n' => return Err(ChunkError::Malformed),
                        _ => {}
                    }
                    i += 1;
                }
                ChunkState::SizeLf => {
                    if b != b'\n' {
                        return Err(ChunkError::Malformed);
                    }
                    i += 1;
                    if self.size == 0 {
                        self.state = ChunkState::TrailerStart;
                    } else {
                        if out.len() as u64 + self.size > max_body as u64 {
                            return Err(ChunkError::TooLarge);
                        }
                        self.state = ChunkState::Data;
                    }
                }
                ChunkState::Data => {
                    let take = (self.size as usize).min(input.len() - i);
                    out.extend_from_slice(&input[i..i + take]);
                    i += take;
                    self.size -= take as u64;
                    if self.size == 0 {
                        self.state = ChunkState::DataCr;
                    }
                }
                ChunkState::DataCr => {
                    if b != b'\r' {
                        return Err(ChunkError::Malformed);
                    }
                    self.state = ChunkState::DataLf;
                    i += 1;
                }
                ChunkState::DataLf => {
                    if b != b'\n' {
                        return Err(ChunkError::Malformed);
                    }
                    self.state = ChunkState::Size;
                    self.size = 0;
                    self.size_digits = 0;
                    i += 1;
                }
                ChunkState::TrailerStart => {
                    i += 1;
                    self.state = if b == b'\r' {
                        ChunkState::FinalLf
                    } else {
                        ChunkState::TrailerLine
                    };
                }
                ChunkState::TrailerLine => {
                    if b == b'\r' {
                        self.state = ChunkState::TrailerLf;
                    }
                    i += 1;
                }
                ChunkState::TrailerLf => {
                    if b != b'\n' {
                        return Err(ChunkError::Malformed);
                    }
                    self.state = ChunkState::TrailerStart;
                    i += 1;
                }
                ChunkState::FinalLf => {
                    if b != b'\n' {
                        return Err(ChunkError::Malformed);
                    }
                    self.state = ChunkState::Done;
                    i += 1;
                    return Ok((i, true));
                }
                ChunkState::Done => return Ok((i, true)),
            }
        }
        Ok((i, self.state == ChunkState::Done))
    }
}

/// The reason phrase for the status codes the relay sends.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        426 => "Upgrade Required",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// A complete response: status line, `Content-Type`, `Content-Length`, the `extra`
/// header lines (each without CRLF), `Connection: close` when `close`, then `body`.
/// The vector is exactly as long as its capacity (so `Bytes::from` it allocates nothing
/// more).
pub fn response(
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &[u8],
    close: bool,
) -> Vec<u8> {
    const CLOSE: &str = "Connection: close\r\n";
    let reason = reason(status);
    let len = "HTTP/1.1 ".len()
        + digits(status as usize)
        + 1
        + reason.len()
        + "\r\nContent-Type: ".len()
        + content_type.len()
        + "\r\nContent-Length: ".len()
        + digits(body.len())
        + "\r\nCache-Control: no-store\r\n".len()
        + extra
            .iter()
            .map(|(k, v)| k.len() + 2 + v.len() + 2)
            .sum::<usize>()
        + if close { CLOSE.len() } else { 0 }
        + 2
        + body.len();
    let mut out = Vec::with_capacity(len);
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n",
        status,
        reason,
        content_type,
        body.len()
    );
    for (k, v) in extra {
        let _ = write!(out, "{k}: {v}\r\n");
    }
    if close {
        out.extend_from_slice(CLOSE.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    debug_assert_eq!(out.len(), len);
    out
}

/// The `202 Accepted` answer to a `POST /events` that admitted `n` Events, body
/// `{"accepted":n}` (AEP-0003 §3.2.3): [`response`] without a body buffer of its own.
pub fn accepted_response(n: usize, close: bool) -> Vec<u8> {
    let mut body = [0u8; 40];
    let mut w = &mut body[..];
    let _ = write!(w, "{{\"accepted\":{n}}}");
    let left = w.len();
    response(202, "application/json", &[], &body[..40 - left], close)
}

/// Decimal digits of `n`.
fn digits(mut n: usize) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// The header lines (CRLF-terminated) that let a browser page of `origin` read an
/// answer: `Access-Control-Allow-Origin` with `Vary: Origin`, for [`insert_headers`].
pub fn cors_lines(origin: &str) -> String {
    format!("Access-Control-Allow-Origin: {origin}\r\nVary: Origin\r\n")
}

/// Inserts header lines right after the status line of a response head in `resp`.
pub fn insert_headers(resp: &[u8], lines: &str) -> Vec<u8> {
    match memchr::memmem::find(resp, b"\r\n") {
        Some(i) => {
            let mut out = Vec::with_capacity(resp.len() + lines.len());
            out.extend_from_slice(&resp[..i + 2]);
            out.extend_from_slice(lines.as_bytes());
            out.extend_from_slice(&resp[i + 2..]);
            out
        }
        None => resp.to_vec(),
    }
}

/// A JSON response body `{"error": code, "detail": detail, ...more}` as bytes.
pub fn error_body(code: &str, detail: &str, more: &[(&str, serde_json::Value)]) -> Vec<u8> {
    let mut m = serde_json::Map::new();
    m.insert("error".into(), code.into());
    m.insert("detail".into(), detail.into());
    for (k, v) in more {
        m.insert((*k).into(), v.clone());
    }
    serde_json::to_vec(&serde_json::Value::Object(m)).unwrap_or_default()
}

/// An error response with a JSON body (see [`error_body`]).
pub fn error_response(
    status: u16,
    code: &str,
    detail: &str,
    more: &[(&str, serde_json::Value)],
    extra: &[(&str, &str)],
    close: bool,
) -> Vec<u8> {
    response(
        status,
        "application/json",
        extra,
        &error_body(code, detail, more),
        close,
    )
}

// A refusal's body is written here, beside `error_body`, so that `refusal` names no
// other module of the crate.
impl Refusal {
    /// The full JSON error body.
    pub fn body(&self) -> Vec<u8> {
        match self {
            Refusal::InvalidEvent { line, detail } => {
                error_body(self.code().as_str(), detail, &[("line", json!(line))])
            }
            Refusal::Command { line, .. } | Refusal::Agent { line, .. } => error_body(
                self.code().as_str(),
                &self.to_string(),
                &[("line", json!(line))],
            ),
            _ => error_body(self.code().as_str(), &self.to_string(), &[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_decodes_split_at_every_offset() {
        let wire = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        for split in 0..wire.len() {
            let mut d = ChunkedDecoder::default();
            let mut out = Vec::new();
            let (a, done_a) = d.decode(&wire[..split], &mut out, 1024).unwrap();
            let consumed = if done_a {
                a
            } else {
                assert_eq!(a, split, "all of a partial input is consumed");
                let (b, done) = d.decode(&wire[split..], &mut out, 1024).unwrap();
                assert!(done);
                split + b
            };
            assert_eq!(out, b"hello, world");
            assert_eq!(&wire[consumed..], b"NEXT");
        }
    }

    #[test]
    fn chunked_refuses_oversize_and_garbage() {
        let mut out = Vec::new();
        assert_eq!(
            ChunkedDecoder::default().decode(b"10\r\n", &mut out, 8),
            Err(ChunkError::TooLarge)
        );
        assert_eq!(
            ChunkedDecoder::default().decode(b"zz\r\n", &mut out, 8),
            Err(ChunkError::Malformed)
        );
        assert_eq!(
            ChunkedDecoder::default().decode(b"1\r\nab", &mut out, 8),
            Err(ChunkError::Malformed)
        );
    }

    /// A head parsed into a reused `RequestHead` (a connection's) is exactly the head
    /// `parse_head` returns, whatever the heads parsed into it before (more or fewer
    /// header lines, longer or shorter strings, a query or none).
    #[test]
    fn parse_head_into_a_reused_head_equals_a_fresh_parse() {
        let heads: [&[u8]; 4] = [
            b"POST /events HTTP/1.1\r\nHost: a\r\nContent-Type: application/x-ndjson\r\nContent-Length: 3\r\nX-Long: aaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n",
            b"GET /stream?session=s1&live=0 HTTP/1.0\r\nCONNECTION:  Keep-Alive \r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"OPTIONS /events HTTP/1.1\r\nOrigin: http://x\r\nA: 1\r\nB: \xff2\r\nC: 3\r\nD: 4\r\nE: 5\r\n\r\nrest",
        ];
        let mut reused = RequestHead::default();
        for round in 0..2 {
            for (i, wire) in heads.iter().enumerate() {
                let (fresh, n) = parse_head(wire).unwrap().unwrap();
                assert_eq!(parse_head_into(wire, &mut reused), Ok(Some(n)));
                let show = |h: &RequestHead| format!("{h:?}");
                assert_eq!(show(&reused), show(&fresh), "round {round}, head {i}");
            }
        }
        assert_eq!(parse_head_into(b"GET / HT", &mut reused), Ok(None));
    }

    /// `response` writes exactly the bytes it always did, into a buffer exactly as long
    /// as its capacity, and `accepted_response` is the 202 `{"accepted":n}` answer.
    #[test]
    fn responses_fill_their_buffer_exactly() {
        for (status, extra, body, close) in [
            (202u16, &[][..], &b"{\"accepted\":64}"[..], false),
            (
                204,
                &[("Allow", "GET, POST"), ("Vary", "Origin")][..],
                &b""[..],
                true,
            ),
            (413, &[][..], &[b'x'; 12345][..], true),
        ] {
            let out = response(status, "application/json", extra, body, close);
            assert_eq!(out.len(), out.capacity());
            let mut want = format!(
                "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nCache-Control: no-store\r\n",
                reason(status),
                body.len()
            );
            for (k, v) in extra {
                want.push_str(&format!("{k}: {v}\r\n"));
            }
            if close {
                want.push_str("Connection: close\r\n");
            }
            want.push_str("\r\n");
            let mut want = want.into_bytes();
            want.extend_from_slice(body);
            assert_eq!(out, want);
        }
        for (n, close) in [
            (0, false),
            (9, true),
            (10, false),
            (1000, false),
            (usize::MAX, true),
        ] {
            let body = format!("{{\"accepted\":{n}}}");
            let want = response(202, "application/json", &[], body.as_bytes(), close);
            assert_eq!(accepted_response(n, close), want);
        }
    }

    #[test]
    fn connection_and_media_type_match_any_case() {
        let mut h = RequestHead {
            minor_version: 1,
            ..Default::default()
        };
        assert!(!h.wants_close());
        h.headers
            .push(("connection".into(), "Keep-Alive, CLOSE".into()));
        h.headers.push((
            "content-type".into(),
            " Application/X-NDJSON ; charset=utf-8".into(),
        ));
        assert!(h.wants_close());
        assert_eq!(h.media_type_as_sent(), Some("Application/X-NDJSON"));
        assert_eq!(h.media_type().as_deref(), Some("application/x-ndjson"));
        h.minor_version = 0;
        h.headers[0].1 = "keep-alive".into();
        assert!(!h.wants_close());
    }

    #[test]
    fn framing_rules() {
        let mut h = RequestHead::default();
        h.headers.push(("content-length".into(), "10".into()));
        assert_eq!(framing(&h, 100), Ok(Framing::Length(10)));
        assert_eq!(framing(&h, 5), Err(FramingError::TooLarge(10)));
        h.headers
            .push(("transfer-encoding".into(), "chunked".into()));
        assert!(matches!(framing(&h, 100), Err(FramingError::Bad(_))));
    }
}
