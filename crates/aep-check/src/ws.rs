//! The checker's WebSocket side: tungstenite's blocking client over a `TcpStream` (or
//! TLS over one, for `wss://`) whose read timeout is re-armed before every read, so each
//! wait ends at its deadline.
//!
//! Received text frames are classified as AEP-0003 §2 says: an object whose `type`
//! contains a dot is an Event, any other object a frame. The raw text is kept, because
//! byte identity is what several checks assert.

use std::io::{self, ErrorKind};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::client::IntoClientRequest;
use tungstenite::handshake::HandshakeError;
use tungstenite::http::HeaderValue;
use tungstenite::{Message, WebSocket};

use crate::tls::{self, Client};

/// The socket under a WebSocket: TCP, or TLS over TCP (`wss://`).
pub(crate) type Conn = tls::Stream;

/// One message from the endpoint.
#[derive(Debug, Clone)]
pub(crate) enum Incoming {
    /// A frame (`type` without a dot): the parsed object and its text.
    Frame(Value, String),
    /// An Event (`type` with a dot): the parsed object and its exact text.
    Event(Value, String),
    /// A text message that is not a JSON object with a string `type`.
    Other(String),
    /// The endpoint closed the connection (close frame, or the socket ended).
    Closed,
}

impl Incoming {
    /// The frame's `type`, for frames.
    pub fn frame_type(&self) -> Option<&str> {
        match self {
            Incoming::Frame(v, _) => v["type"].as_str(),
            _ => None,
        }
    }

    /// A short description for details.
    pub fn show(&self) -> String {
        let text = match self {
            Incoming::Frame(_, t) | Incoming::Event(_, t) | Incoming::Other(t) => t.as_str(),
            Incoming::Closed => return "the connection closed".into(),
        };
        let mut s: String = text.chars().take(200).collect();
        if s.len() < text.len() {
            s.push('…');
        }
        s
    }
}

/// Why a connection could not be opened.
#[derive(Debug, Clone)]
pub(crate) enum ConnectError {
    /// The endpoint answered the upgrade request with this HTTP status.
    Refused(u16),
    /// Anything else (resolution, TCP, a handshake that went wrong).
    Other(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Refused(s) => write!(f, "the upgrade was answered {s}"),
            ConnectError::Other(e) => f.write_str(e),
        }
    }
}

/// A WebSocket client connection.
pub(crate) struct Ws {
    sock: WebSocket<Conn>,
    timeout: Duration,
    closed: bool,
}

impl Ws {
    /// Connects to `url` (`ws://…`, or `wss://…` with `tls`), with `Authorization:
    /// Bearer` when `token` is given.
    pub fn connect(
        url: &str,
        token: Option<&str>,
        timeout: Duration,
        tls: Option<&Client>,
    ) -> Result<Ws, ConnectError> {
        let mut req = url
            .into_client_request()
            .map_err(|e| ConnectError::Other(format!("{url}: {e}")))?;
        if let Some(t) = token {
            let v = HeaderValue::from_str(&format!("Bearer {t}"))
                .map_err(|_| ConnectError::Other("the token is not a header value".into()))?;
            req.headers_mut().insert("Authorization", v);
        }
        let secure = req.uri().scheme_str() == Some("wss");
        let host = req.uri().host().unwrap_or_default().to_string();
        let port = req
            .uri()
            .port_u16()
            .unwrap_or(if secure { 443 } else { 80 });
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<_> = (host, port)
            .to_socket_addrs()
            .map_err(|e| ConnectError::Other(format!("resolving {host}: {e}")))?
            .collect();
        let mut last = format!("{host}:{port} did not resolve");
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = format!("connecting to {a}: {e}"),
            }
        }
        let stream = stream.ok_or(ConnectError::Other(last))?;
        let io = |e: io::Error| ConnectError::Other(e.to_string());
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let conn = match (secure, tls) {
            (false, _) => tls::Stream::Plain(stream),
            (true, Some(c)) => tls::Stream::Tls(Box::new(
                c.handshake(host, stream)
                    .map_err(|e| ConnectError::Other(format!("TLS: {e}")))?,
            )),
            (true, None) => {
                return Err(ConnectError::Other(format!(
                    "{url}: wss:// needs an https:// target"
                )))
            }
        };
        match tungstenite::client::client(req, conn) {
            Ok((sock, _)) => Ok(Ws {
                sock,
                timeout,
                closed: false,
            }),
            Err(HandshakeError::Failure(tungstenite::Error::Http(resp))) => {
                Err(ConnectError::Refused(resp.status().as_u16()))
            }
            Err(e) => Err(ConnectError::Other(format!("WebSocket handshake: {e}"))),
        }
    }

    /// Sends one text frame.
    pub fn send_text(&mut self, text: &str) -> Result<(), String> {
        self.sock
            .send(Message::text(text))
            .map_err(|e| format!("sending a frame: {e}"))
    }

    /// Sends one JSON object as a text frame.
    pub fn send(&mut self, v: &Value) -> Result<(), String> {
        self.send_text(&v.to_string())
    }

    /// The next message before `deadline`; `Ok(None)` when the deadline passed first.
    /// The endpoint's own `ping` frames are answered with `pong` and not returned.
    pub fn recv_until(&mut self, deadline: Instant) -> Result<Option<Incoming>, String> {
        loop {
            if self.closed {
                return Ok(Some(Incoming::Closed));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let _ = self
                .sock
                .get_ref()
                .tcp()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))));
            match self.sock.read() {
                Ok(Message::Text(t)) => {
                    let t = t.to_string();
                    let v: Value = match serde_json::from_str(&t) {
                        Ok(v @ Value::Object(_)) => v,
                        _ => return Ok(Some(Incoming::Other(t))),
                    };
                    let Some(ty) = v["type"].as_str() else {
                        return Ok(Some(Incoming::Other(t)));
                    };
                    if ty.contains('.') {
                        return Ok(Some(Incoming::Event(v, t)));
                    }
                    if ty == "ping" {
                        let pong = match v.get("t") {
                            Some(stamp) => json!({"type": "pong", "t": stamp}),
                            None => json!({"type": "pong"}),
                        };
                        let _ = self.send(&pong);
                        continue;
                    }
                    return Ok(Some(Incoming::Frame(v, t)));
                }
                Ok(Message::Close(_)) => {
                    self.closed = true;
                    return Ok(Some(Incoming::Closed));
                }
                Ok(Message::Binary(_)) => {
                    return Ok(Some(Incoming::Other("(a binary frame)".into())));
                }
                Ok(_) => continue, // WS-level ping/pong; tungstenite answers pings itself.
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    continue
                }
                Err(
                    tungstenite::Error::ConnectionClosed
                    | tungstenite::Error::AlreadyClosed
                    | tungstenite::Error::Protocol(_)
                    | tungstenite::Error::Io(_),
                ) => {
                    self.closed = true;
                    return Ok(Some(Incoming::Closed));
                }
                Err(e) => return Err(format!("reading a frame: {e}")),
            }
        }
    }

    /// The next message within the default wait.
    pub fn recv(&mut self) -> Result<Option<Incoming>, String> {
        self.recv_until(Instant::now() + self.timeout)
    }

    /// Reads until `want` accepts a message (returned), with every message read before
    /// it in `skipped`; `Err` when the wait ends first, naming `what`.
    pub fn expect(
        &mut self,
        what: &str,
        skipped: &mut Vec<Incoming>,
        mut want: impl FnMut(&Incoming) -> bool,
    ) -> Result<Incoming, String> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.recv_until(deadline)? {
                Some(m) if want(&m) => return Ok(m),
                Some(Incoming::Closed) => {
                    return Err(format!(
                        "waiting for {what}, the connection closed{}",
                        shown(skipped)
                    ))
                }
                Some(m) => skipped.push(m),
                None => {
                    return Err(format!(
                        "{what} did not come within {:?}{}",
                        self.timeout,
                        shown(skipped)
                    ))
                }
            }
        }
    }

    /// The frame of `ty` with `id` (or `cause`) equal to `key`.
    pub fn expect_reply(
        &mut self,
        ty: &str,
        field: &str,
        key: &str,
        skipped: &mut Vec<Incoming>,
    ) -> Result<Value, String> {
        let what = format!("a `{ty}` frame with {field} {key:?}");
        match self.expect(&what, skipped, |m| match m {
            Incoming::Frame(v, _) => v["type"] == ty && v[field] == key,
            _ => false,
        })? {
            Incoming::Frame(v, _) => Ok(v),
            _ => unreachable!("expect returns what the predicate accepted"),
        }
    }

    /// Sends a `hello` (`versions` `["0.1"]`, `role`, and `more` members merged in) and
    /// returns the endpoint's first frame, which must be its `hello`.
    pub fn hello(&mut self, role: &str, more: Value) -> Result<Value, String> {
        let mut h = json!({
            "type": "hello",
            "versions": ["0.1"],
            "role": role,
            "identity": { "agent": "aep-relay-check", "instance": format!("aep-relay-check/{}", std::process::id()) },
            "capabilities": { "filters": ["attr-match"] },
        });
        if let (Some(h), Some(m)) = (h.as_object_mut(), more.as_object()) {
            for (k, v) in m {
                h.insert(k.clone(), v.clone());
            }
        }
        self.send(&h)?;
        match self.recv()? {
            Some(Incoming::Frame(v, _)) if v["type"] == "hello" => Ok(v),
            Some(other) => Err(format!(
                "the first frame answering a {role} hello was {}",
                other.show()
            )),
            None => Err(format!(
                "no hello answered a {role} hello within {:?}",
                self.timeout
            )),
        }
    }

    /// Whether the endpoint closes the connection before the default wait ends (every
    /// message before the close goes to `skipped`).
    pub fn closes(&mut self, skipped: &mut Vec<Incoming>) -> Result<bool, String> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.recv_until(deadline)? {
                Some(Incoming::Closed) => return Ok(true),
                Some(m) => skipped.push(m),
                None => return Ok(false),
            }
        }
    }

    /// Collects every message that arrives within `window` (a quiet period: nothing
    /// more is expected, and anything that arrives is evidence).
    pub fn drain(&mut self, window: Duration) -> Result<Vec<Incoming>, String> {
        let deadline = Instant::now() + window;
        let mut out = Vec::new();
        while let Some(m) = self.recv_until(deadline)? {
            let closed = matches!(m, Incoming::Closed);
            out.push(m);
            if closed {
                break;
            }
        }
        Ok(out)
    }

    /// Closes the connection (best effort, bounded).
    pub fn close(mut self) {
        if !self.closed {
            let _ = self.sock.close(None);
            let _ = self
                .sock
                .get_ref()
                .tcp()
                .set_read_timeout(Some(Duration::from_millis(200)));
            let deadline = Instant::now() + Duration::from_millis(500);
            while Instant::now() < deadline {
                if self.sock.read().is_err() {
                    break;
                }
            }
        }
    }
}

/// `; before it: …` listing what arrived, for a detail.
fn shown(skipped: &[Incoming]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let list: Vec<String> = skipped.iter().take(3).map(Incoming::show).collect();
    let more = if skipped.len() > 3 {
        format!(" and {} more", skipped.len() - 3)
    } else {
        String::new()
    };
    format!("; received instead: {}{more}", list.join(" | "))
}
