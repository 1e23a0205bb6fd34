//! The HTTP client side: [`Endpoint`] (what every relay under test answers: POST
//! /events, GET /stream, raw TCP), ureq with bounded reads ([`agent`]), and a raw
//! HTTP/1.1 response reader for requests written byte by byte.

use super::{SseStream, WAIT};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// A relay reachable at [`Endpoint::addr`] (a [`super::TestRelay`] or a
/// [`super::RelayProcess`]), with the requests tests make of it.
pub trait Endpoint {
    /// The relay's listening address.
    fn addr(&self) -> SocketAddr;

    /// `http://{addr}{path}`.
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr(), path)
    }

    /// `GET {path}` (e.g. `/metrics`): the body as text, as [`get_text`].
    fn get_text(&self, path: &str) -> String {
        get_text(&self.url(path))
    }

    /// POSTs `body` to /events with `AEP-Version: 0.1`; returns (status, JSON body).
    fn post(&self, content_type: &str, body: &str) -> (u16, serde_json::Value) {
        let resp = agent()
            .post(&self.url("/events"))
            .set("AEP-Version", "0.1")
            .set("Content-Type", content_type)
            .send_string(body);
        status_json(resp)
    }

    /// POSTs `lines` as one NDJSON batch (each line ended by LF); returns (status, JSON
    /// body).
    fn post_lines(&self, lines: &[impl AsRef<str>]) -> (u16, serde_json::Value) {
        let mut body = String::new();
        for l in lines {
            body.push_str(l.as_ref());
            body.push('\n');
        }
        self.post("application/x-ndjson", &body)
    }

    /// POSTs an NDJSON batch and asserts 202 with the count.
    fn post_ok(&self, lines: &[impl AsRef<str>]) {
        let (status, json) = self.post_lines(lines);
        assert_eq!(status, 202, "POST answered {status} {json}");
        assert_eq!(json["accepted"], lines.len());
    }

    /// Opens `GET /stream?{query}` with extra headers; asserts a 200 event stream.
    fn sse(&self, query: &str, headers: &[(&str, &str)]) -> SseStream {
        let mut req = agent()
            .get(&format!("{}?{}", self.url("/stream"), query))
            .set("Accept", "text/event-stream");
        for (k, v) in headers {
            req = req.set(k, v);
        }
        let resp = req.call().expect("stream opens");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.header("content-type"), Some("text/event-stream"));
        SseStream::new(resp.into_reader())
    }

    /// The data of every Event `from=all&live=0` replays, in order.
    fn replay_all(&self) -> Vec<String> {
        self.sse("from=all&live=0", &[])
            .rest()
            .into_iter()
            .map(|m| m.data)
            .collect()
    }

    /// Opens a raw TCP connection to the relay, reads bounded by [`WAIT`].
    fn tcp(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr()).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s
    }
}

/// A ureq agent whose reads wait at most [`WAIT`].
pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout_read(WAIT).build()
}

/// `GET {url}` of any relay: the body as text. Panics on a transport error or an error
/// status.
pub fn get_text(url: &str) -> String {
    agent().get(url).call().unwrap().into_string().unwrap()
}

/// Status and JSON body (`Null` when empty) of a ureq result, error statuses included.
pub fn status_json(resp: Result<ureq::Response, ureq::Error>) -> (u16, serde_json::Value) {
    let resp = match resp {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = resp.status();
    let text = resp.into_string().unwrap();
    let json = if text.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("body is not JSON ({e}): {text}"))
    };
    (status, json)
}

/// Reads a response head up to and including its blank line, a byte at a time so that
/// nothing after it is consumed. Panics when the connection closes or a read fails
/// first.
pub fn read_head(stream: &mut impl Read) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).expect("a response head");
        assert!(
            n > 0,
            "connection closed before a response head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.push(byte[0]);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// The status and the headers (names lowercased, values trimmed) of a head.
pub fn parse_head(head: &str) -> (u16, Vec<(String, String)>) {
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    (status, headers)
}

/// Reads the `Content-Length` body (empty without one) that follows a head.
pub fn read_body(stream: &mut impl Read, headers: &[(String, String)]) -> Vec<u8> {
    let len = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map(|(_, v)| v.parse::<usize>().unwrap())
        .unwrap_or(0);
    let mut body = vec![0; len];
    stream.read_exact(&mut body).unwrap();
    body
}

/// Reads one HTTP response (status, lowercased headers, body).
pub fn read_response(stream: &mut impl Read) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let (status, headers) = parse_head(&read_head(stream));
    let body = read_body(stream, &headers);
    (status, headers, body)
}

/// Writes `bytes` on a fresh connection and reads one response (its body as JSON,
/// `Null` when it is not).
pub fn raw_request(
    relay: &impl Endpoint,
    bytes: &[u8],
) -> (u16, Vec<(String, String)>, serde_json::Value) {
    let mut s = relay.tcp();
    s.write_all(bytes).unwrap();
    let (status, headers, body) = read_response(&mut s);
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    (status, headers, json)
}

/// URL-encodes a query value.
pub fn enc(v: &str) -> String {
    form_urlencoded::byte_serialize(v.as_bytes()).collect()
}
