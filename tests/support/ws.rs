//! A blocking WebSocket client for `GET /socket` (AEP-0003 §3.5): tungstenite over a
//! real TCP connection to any [`Endpoint`], with read timeouts, plus a raw-frame client
//! for the malformed cases tungstenite refuses to send. Every wait is a read of the next
//! frame (bounded by [`WAIT`]); nothing sleeps.

use super::{read_head, Endpoint, WAIT};
use aep_relay::wire::ws::rfc6455::client_frame;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

/// A connected WebSocket (handshake done, nothing sent yet).
pub struct Ws {
    pub sock: WebSocket<TcpStream>,
    /// Relay `ping` frames seen and skipped by [`Ws::recv`].
    pub pings: usize,
}

impl Ws {
    /// Opens `ws://{addr}/socket?{query}`.
    pub fn connect(relay: &impl Endpoint, query: &str) -> Ws {
        let addr = relay.addr();
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(WAIT)).unwrap();
        let url = format!("ws://{addr}/socket?{query}");
        let (sock, resp) = tungstenite::client::client(url, tcp).expect("WebSocket handshake");
        assert_eq!(resp.status(), 101);
        Ws { sock, pings: 0 }
    }

    /// Connects and completes the `hello` exchange as `role`; `extra` members (an object)
    /// are merged into the hello. Returns the relay's hello.
    pub fn hello(relay: &impl Endpoint, query: &str, role: &str, extra: Value) -> (Ws, Value) {
        let mut ws = Ws::connect(relay, query);
        let mut h = json!({"type": "hello", "versions": ["0.1"], "role": role});
        if let (Some(h), Some(e)) = (h.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                h.insert(k.clone(), v.clone());
            }
        }
        ws.send_json(&h);
        let reply = ws.recv();
        assert_eq!(reply["type"], "hello", "{reply}");
        (ws, reply)
    }

    /// A consumer with no credentials.
    pub fn consumer(relay: &impl Endpoint) -> Ws {
        Ws::hello(relay, "", "consumer", json!({})).0
    }

    /// An emitter for agent `agent` (with optional extra hello members).
    pub fn emitter(relay: &impl Endpoint, query: &str, agent: &str, extra: Value) -> Ws {
        let mut e = json!({"identity": {"agent": agent}});
        if let (Some(m), Some(x)) = (e.as_object_mut(), extra.as_object()) {
            for (k, v) in x {
                m.insert(k.clone(), v.clone());
            }
        }
        Ws::hello(relay, query, "emitter", e).0
    }

    pub fn send(&mut self, text: &str) {
        self.sock.send(Message::text(text)).expect("send");
    }

    pub fn send_json(&mut self, v: &Value) {
        self.send(&v.to_string());
    }

    /// The next text frame as sent (relay `ping` frames skipped).
    pub fn recv_text(&mut self) -> String {
        loop {
            match self.sock.read() {
                Ok(Message::Text(t)) => {
                    if t.starts_with(r#"{"type":"ping""#) {
                        self.pings += 1;
                        continue;
                    }
                    return t.to_string();
                }
                Ok(Message::Ping(_)) | Ok(Message::Pong(_)) => continue,
                Ok(other) => panic!("expected a text frame, got {other:?}"),
                Err(e) => panic!("read failed (waited {WAIT:?}?): {e}"),
            }
        }
    }

    /// The next text frame as JSON (relay `ping` frames skipped).
    pub fn recv(&mut self) -> Value {
        let t = self.recv_text();
        serde_json::from_str(&t).unwrap_or_else(|e| panic!("frame is not JSON ({e}): {t}"))
    }

    /// The next text frame, `ping` frames included.
    pub fn recv_any(&mut self) -> Value {
        match self.sock.read().expect("read") {
            Message::Text(t) => serde_json::from_str(&t).unwrap(),
            other => panic!("expected a text frame, got {other:?}"),
        }
    }

    /// Subscribes and waits for `subscribed`.
    pub fn subscribe(&mut self, id: &str, members: Value) {
        let mut s = json!({"type": "subscribe", "id": id});
        for (k, v) in members.as_object().unwrap() {
            s[k] = v.clone();
        }
        self.send_json(&s);
        let r = self.recv();
        assert_eq!(r, json!({"type": "subscribed", "id": id}), "{r}");
    }

    /// Reads frames until the close frame; returns its code and the text frames before it.
    pub fn until_close(&mut self) -> (Option<u16>, Vec<Value>) {
        let mut frames = Vec::new();
        loop {
            match self.sock.read() {
                Ok(Message::Text(t)) => frames.push(serde_json::from_str(&t).unwrap()),
                Ok(Message::Close(c)) => {
                    return (c.map(|c| u16::from(c.code)), frames);
                }
                Ok(_) => {}
                Err(e) => panic!("connection ended without a close frame: {e}"),
            }
        }
    }

    /// Sends a close frame and checks the relay echoes it and ends the connection.
    pub fn close(mut self) {
        self.sock
            .close(Some(tungstenite::protocol::CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            }))
            .unwrap();
        loop {
            match self.sock.read() {
                Ok(_) => {}
                Err(tungstenite::Error::ConnectionClosed) => return,
                Err(e) => panic!("close handshake: {e}"),
            }
        }
    }
}

/// A raw client: the upgrade by hand, then frames built byte by byte (masked or not).
pub struct Raw {
    pub tcp: TcpStream,
}

impl Raw {
    pub fn connect(relay: &impl Endpoint) -> Raw {
        let (raw, head) = Raw::upgrade(relay.tcp(), "");
        assert!(head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="));
        raw
    }

    /// Upgrades `tcp` to a WebSocket by hand (RFC 6455 §4.1, the sample key of §1.3),
    /// with `headers` (whole header lines, each ending in CRLF, e.g. `Authorization`)
    /// after `Host`; asserts a `101` answer. Returns the client and the answer's head.
    pub fn upgrade(mut tcp: TcpStream, headers: &str) -> (Raw, String) {
        let request = format!(
            "GET /socket HTTP/1.1\r\nHost: x\r\n{headers}Upgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        );
        // One write, as a client sends a request head.
        tcp.write_all(request.as_bytes()).unwrap();
        let head = read_head(&mut tcp);
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        (Raw { tcp }, head)
    }

    /// One client frame: `first` is the FIN/RSV/opcode byte; masked unless `mask` is
    /// `None` (the library's [`client_frame`], RFC 6455 §5.2, §5.3).
    pub fn frame(first: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = Vec::new();
        client_frame(first, payload, mask, &mut out);
        out
    }

    /// Sends a masked frame.
    pub fn send(&mut self, first: u8, payload: &[u8]) {
        let f = Raw::frame(first, payload, Some([7, 1, 2, 9]));
        self.tcp.write_all(&f).unwrap();
    }

    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).unwrap();
    }

    /// Reads one server frame: (opcode byte with FIN, payload). Server frames are never
    /// masked.
    pub fn read(&mut self) -> (u8, Vec<u8>) {
        let mut h = [0u8; 2];
        self.tcp.read_exact(&mut h).expect("frame header");
        assert_eq!(h[1] & 0x80, 0, "server frames are unmasked");
        let len = match h[1] & 0x7f {
            126 => {
                let mut l = [0u8; 2];
                self.tcp.read_exact(&mut l).unwrap();
                u16::from_be_bytes(l) as usize
            }
            127 => {
                let mut l = [0u8; 8];
                self.tcp.read_exact(&mut l).unwrap();
                u64::from_be_bytes(l) as usize
            }
            n => n as usize,
        };
        let mut p = vec![0; len];
        self.tcp.read_exact(&mut p).unwrap();
        (h[0], p)
    }

    /// Sends `hello` as a consumer and reads the relay's hello.
    pub fn hello(&mut self) {
        self.send(
            0x81,
            br#"{"type":"hello","versions":["0.1"],"role":"consumer"}"#,
        );
        let (op, p) = self.read();
        assert_eq!(op, 0x81);
        let v: Value = serde_json::from_slice(&p).unwrap();
        assert_eq!(v["type"], "hello");
    }

    /// Reads frames until a close frame; returns its code. Then expects end of stream.
    pub fn expect_close(&mut self) -> u16 {
        loop {
            let (op, p) = self.read();
            if op == 0x88 {
                let code = u16::from_be_bytes([p[0], p[1]]);
                let mut rest = Vec::new();
                let _ = self.tcp.read_to_end(&mut rest);
                return code;
            }
        }
    }
}
