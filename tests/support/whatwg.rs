//! A WHATWG-conformant `text/event-stream` reader, written from the HTML standard's
//! "Interpreting an event stream" rules
//! (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation),
//! so tests see a stream exactly as a browser's `EventSource` does:
//!
//! - the stream is UTF-8 (a leading BOM dropped, bad bytes replaced);
//! - lines end with CRLF, LF or CR;
//! - a blank line dispatches; a line starting with `:` is a comment;
//! - otherwise the field is what precedes the first `:` and the value what follows it,
//!   one leading space removed (a line without `:` is a field with an empty value);
//! - `event` sets the type buffer, `data` appends its value and LF, `id` sets the last
//!   event ID buffer unless the value holds U+0000 (then the whole field is ignored),
//!   `retry` takes digits only, anything else is ignored;
//! - at dispatch the last event ID (which persists across messages) becomes the
//!   buffer's value; with an empty data buffer nothing is dispatched; one trailing LF
//!   is removed from the data; the type defaults to `message`;
//! - a message not ended by a blank line when the stream ends is discarded.
//!
//! Besides what `EventSource` exposes, each message keeps every field line seen since
//! the previous dispatch (to catch an injected field) and the comment lines before it.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// One dispatched message, as `EventSource` would deliver it, plus what led to it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Message {
    /// `MessageEvent.type`: the `event` field, `message` when none.
    pub event_type: String,
    /// `MessageEvent.data`.
    pub data: String,
    /// `MessageEvent.lastEventId`: the last `id` accepted on this stream so far.
    pub last_event_id: String,
    /// Every `(field, value)` line since the previous dispatch (or blank line), in order,
    /// `id` lines that were ignored (U+0000) included.
    pub fields: Vec<(String, String)>,
    /// Comment lines (without the `:` and one leading space) since the previous message.
    pub comments: Vec<String>,
}

/// The parser state of the standard: buffers and the pending (unfinished) line.
#[derive(Debug, Default)]
pub struct Parser {
    line: Vec<u8>,
    /// The previous byte was a CR: an LF right after it belongs to the same line end.
    after_cr: bool,
    started: bool,
    data: String,
    event_type: String,
    last_event_id_buffer: String,
    /// The stream's last event ID string (what `lastEventId` shows).
    pub last_event_id: String,
    /// The reconnection time, when a valid `retry` field set it.
    pub retry: Option<u64>,
    fields: Vec<(String, String)>,
    comments: Vec<String>,
    /// Messages dispatched and not yet taken.
    pub out: VecDeque<Message>,
}

impl Parser {
    /// Feeds stream bytes; dispatched messages are appended to `out`.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\r' => {
                    self.after_cr = true;
                    self.end_line();
                }
                b'\n' => self.end_line(),
                _ => self.line.push(b),
            }
        }
    }

    fn end_line(&mut self) {
        let mut bytes = std::mem::take(&mut self.line);
        if !self.started {
            self.started = true;
            if bytes.starts_with(b"\xEF\xBB\xBF") {
                bytes.drain(..3);
            }
        }
        let line = String::from_utf8_lossy(&bytes).into_owned();
        if line.is_empty() {
            self.dispatch();
            return;
        }
        if let Some(c) = line.strip_prefix(':') {
            self.comments
                .push(c.strip_prefix(' ').unwrap_or(c).to_string());
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f.to_string(), v.strip_prefix(' ').unwrap_or(v).to_string()),
            None => (line.clone(), String::new()),
        };
        match field.as_str() {
            "event" => self.event_type = value.clone(),
            "data" => {
                self.data.push_str(&value);
                self.data.push('\n');
            }
            // An `id` holding U+0000 is ignored whole.
            "id" if !value.contains('\0') => self.last_event_id_buffer = value.clone(),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry = value.parse().ok();
            }
            _ => {}
        }
        self.fields.push((field, value));
    }

    fn dispatch(&mut self) {
        self.last_event_id = self.last_event_id_buffer.clone();
        let fields = std::mem::take(&mut self.fields);
        if self.data.is_empty() {
            self.event_type.clear();
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        let event_type = match std::mem::take(&mut self.event_type) {
            t if t.is_empty() => "message".to_string(),
            t => t,
        };
        self.out.push_back(Message {
            event_type,
            data,
            last_event_id: self.last_event_id.clone(),
            fields,
            comments: std::mem::take(&mut self.comments),
        });
    }
}

/// `GET {target}` over a raw TCP connection, read with [`Parser`].
pub struct Stream {
    sock: TcpStream,
    parser: Parser,
    ended: bool,
}

/// The non-200 answer to a stream request: status and body.
#[derive(Debug)]
pub struct Refused {
    pub status: u16,
    pub body: serde_json::Value,
}

impl Stream {
    /// Sends `GET {target}` with `headers` (written as given, bytes and all) and reads
    /// the response head. `Err` with the answer when it is not a 200 event stream.
    pub fn open(
        addr: SocketAddr,
        target: &str,
        headers: &[(&str, &str)],
    ) -> Result<Stream, Refused> {
        let mut sock = TcpStream::connect(addr).unwrap();
        sock.set_read_timeout(Some(super::WAIT)).unwrap();
        let mut req =
            format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        sock.write_all(req.as_bytes()).unwrap();
        let head = super::read_head(&mut sock);
        let (status, headers) = super::parse_head(&head);
        if status != 200 {
            let body = super::read_body(&mut sock, &headers);
            let body = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            return Err(Refused { status, body });
        }
        let lower = head.to_ascii_lowercase();
        assert!(
            lower.contains("content-type: text/event-stream"),
            "not an event stream: {head}"
        );
        Ok(Stream {
            sock,
            parser: Parser::default(),
            ended: false,
        })
    }

    /// The next dispatched message; `None` once the server ended the stream. Comments
    /// (heartbeats too) are kept on the message they precede.
    pub fn next(&mut self) -> Option<Message> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            if let Some(m) = self.parser.out.pop_front() {
                return Some(m);
            }
            if self.ended {
                return None;
            }
            let n = self
                .sock
                .read(&mut buf)
                .unwrap_or_else(|e| panic!("SSE read failed (waited {:?}?): {e}", super::WAIT));
            if n == 0 {
                // An unfinished message is discarded at the end of the stream.
                self.ended = true;
            } else {
                self.parser.feed(&buf[..n]);
            }
        }
    }

    /// The next message, which must exist.
    pub fn expect(&mut self) -> Message {
        self.next().expect("the stream ended early")
    }

    /// Every message until the server ends the stream.
    pub fn rest(&mut self) -> Vec<Message> {
        std::iter::from_fn(|| self.next()).collect()
    }

    /// Comments after the last message (read to the end of the stream first).
    pub fn trailing_comments(&self) -> &[String] {
        &self.parser.comments
    }
}
