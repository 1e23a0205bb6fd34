//! The checker's HTTP side: the target URL, plain requests and an SSE reader, all over
//! `ureq` (HTTPS through [`crate::tls`]) with a deadline on every request (connect, head and body included), so no wait
//! outlives [`super::Options::timeout`].

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::Duration;

use crate::tls::{Client, UreqConnector};

use serde_json::Value;

/// A relay's base URL, split for the schemes the checker speaks (`http://` and
/// `https://` for HTTP and SSE, `ws://` and `wss://` for the WebSocket binding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `host:port` (port 80, or 443 over TLS, when the URL names none).
    pub authority: String,
    /// The base path without a trailing `/` (empty at the origin root).
    pub base_path: String,
    /// Whether the URL is `https://`: every request and WebSocket goes over TLS.
    pub tls: bool,
}

impl Target {
    /// Parses `http://HOST[:PORT][/BASE]` or `https://…` (a trailing `/` is ignored).
    ///
    /// # Errors
    /// A message for any other scheme, a missing host, a query or a fragment.
    ///
    /// ```
    /// use aep_check::Target;
    /// let t = Target::parse("http://127.0.0.1:8787/aep/").unwrap();
    /// assert_eq!((t.authority.as_str(), t.base_path.as_str()), ("127.0.0.1:8787", "/aep"));
    /// assert_eq!(t.http("/events"), "http://127.0.0.1:8787/aep/events");
    /// assert_eq!(t.ws("/socket"), "ws://127.0.0.1:8787/aep/socket");
    /// let t = Target::parse("https://relay.example").unwrap();
    /// assert_eq!(t.ws("/socket"), "wss://relay.example:443/socket");
    /// assert!(Target::parse("ftp://relay.example").is_err());
    /// ```
    pub fn parse(url: &str) -> Result<Target, String> {
        let usage = || format!("{url}: expected http://HOST[:PORT][/BASE] or https://…");
        let (tls, rest) = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (false, rest),
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (true, rest),
            _ => return Err(usage()),
        };
        if rest.contains(['?', '#']) {
            return Err(format!("{url}: a base URL has no query or fragment"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(usage());
        }
        let has_port = match authority.rfind(':') {
            Some(i) => !authority[i..].contains(']'),
            None => false,
        };
        let authority = if has_port {
            authority.to_string()
        } else {
            format!("{authority}:{}", if tls { 443 } else { 80 })
        };
        Ok(Target {
            authority,
            base_path: path.trim_end_matches('/').to_string(),
            tls,
        })
    }

    /// The host part of the authority (what a TLS certificate must name).
    pub fn host(&self) -> &str {
        match self.authority.rfind(':') {
            Some(i) => &self.authority[..i],
            None => &self.authority,
        }
    }

    fn join(&self, scheme: &str, endpoint: &str) -> String {
        if endpoint.contains("://") {
            return endpoint.to_string();
        }
        let sep = if endpoint.starts_with('/') { "" } else { "/" };
        format!(
            "{scheme}://{}{}{sep}{endpoint}",
            self.authority, self.base_path
        )
    }

    /// The `http://` (`https://`) URL of an advertised endpoint (a path relative to
    /// the base, or an absolute URL, kept as it is).
    pub fn http(&self, endpoint: &str) -> String {
        self.join(if self.tls { "https" } else { "http" }, endpoint)
    }

    /// The `ws://` (`wss://`) URL of an advertised endpoint.
    pub fn ws(&self, endpoint: &str) -> String {
        self.join(if self.tls { "wss" } else { "ws" }, endpoint)
    }
}

/// One HTTP answer, body read whole.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

impl Answer {
    /// The body as JSON, when it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }

    /// `status body` for a detail, the body shortened.
    pub fn show(&self) -> String {
        let mut b: String = self.body.chars().take(200).collect();
        if b.len() < self.body.len() {
            b.push('…');
        }
        format!("{} {}", self.status, b.trim_end())
    }
}

/// One item of an SSE stream (WHATWG `text/event-stream`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SseItem {
    /// A comment line, without the leading `:` and one space.
    Comment(String),
    /// A message: its `event`, `id` and `data` (data lines joined by `\n`).
    Message {
        event: Option<String>,
        id: Option<String>,
        data: String,
    },
}

/// How a read of an SSE stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The server ended the stream.
    Closed,
    /// The caller's predicate was satisfied.
    Stopped,
    /// The deadline passed (or the connection failed mid-stream).
    TimedOut,
}

/// HTTP with a bearer token and a deadline on every request.
pub(crate) struct Http {
    agent: ureq::Agent,
    token: Option<String>,
    timeout: Duration,
}

impl Http {
    /// `tls`: the client for `https://` URLs (without it they fail).
    pub fn new(token: Option<String>, timeout: Duration, tls: Option<Client>) -> Http {
        let mut agent = ureq::AgentBuilder::new()
            .timeout_connect(timeout)
            .timeout(timeout)
            .redirects(0);
        if let Some(c) = tls {
            agent = agent.tls_connector(Arc::new(UreqConnector(c)));
        }
        let agent = agent.build();
        Http {
            agent,
            token,
            timeout,
        }
    }

    fn request(&self, method: &str, url: &str, headers: &[(&str, &str)]) -> ureq::Request {
        let mut req = self.agent.request(method, url).timeout(self.timeout);
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.set(k, v);
        }
        req
    }

    fn answer(result: Result<ureq::Response, ureq::Error>) -> Result<Answer, String> {
        let resp = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => return Err(format!("transport error: {e}")),
        };
        let status = resp.status();
        let content_type = resp.header("content-type").unwrap_or_default().to_string();
        let body = resp
            .into_string()
            .map_err(|e| format!("reading the {status} answer's body: {e}"))?;
        Ok(Answer {
            status,
            content_type,
            body,
        })
    }

    /// `GET url`.
    pub fn get(&self, url: &str, headers: &[(&str, &str)]) -> Result<Answer, String> {
        Http::answer(self.request("GET", url, headers).call())
    }

    /// `POST url` with `body`, `Content-Type` and (when given) `AEP-Version`.
    pub fn post(
        &self,
        url: &str,
        content_type: &str,
        version: Option<&str>,
        body: &str,
    ) -> Result<Answer, String> {
        let mut headers = vec![("Content-Type", content_type)];
        if let Some(v) = version {
            headers.push(("AEP-Version", v));
        }
        Http::answer(self.request("POST", url, &headers).send_string(body))
    }

    /// Opens `url` as an SSE stream (`Accept: text/event-stream`). A non-200 answer or
    /// another content type is an `Err` naming what came back.
    pub fn sse_open(&self, url: &str, headers: &[(&str, &str)]) -> Result<SseStream, String> {
        let mut all = vec![("Accept", "text/event-stream")];
        all.extend_from_slice(headers);
        let resp = match self.request("GET", url, &all).call() {
            Ok(r) => r,
            Err(ureq::Error::Status(s, r)) => {
                let body = r.into_string().unwrap_or_default();
                return Err(format!("the stream answered {s} {}", body.trim_end()));
            }
            Err(e) => return Err(format!("transport error opening the stream: {e}")),
        };
        let ct = resp.header("content-type").unwrap_or_default().to_string();
        if !ct.starts_with("text/event-stream") {
            return Err(format!(
                "the stream answered Content-Type {ct:?}, not text/event-stream"
            ));
        }
        Ok(SseStream {
            reader: BufReader::new(resp.into_reader()),
            items: Vec::new(),
            event: None,
            id: None,
            data: None,
            ended: None,
        })
    }

    /// [`Http::sse_open`], then [`SseStream::read`] with `stop`.
    pub fn sse(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        stop: impl FnMut(&[SseItem]) -> bool,
    ) -> Result<(Vec<SseItem>, Ended), String> {
        let mut s = self.sse_open(url, headers)?;
        let ended = s.read(stop);
        Ok((s.items, ended))
    }
}

/// An open SSE stream; its request's deadline bounds every read.
pub(crate) struct SseStream {
    reader: BufReader<Box<dyn std::io::Read + Send + Sync + 'static>>,
    /// Every item read so far.
    pub items: Vec<SseItem>,
    event: Option<String>,
    id: Option<String>,
    data: Option<String>,
    ended: Option<Ended>,
}

impl SseStream {
    /// Reads items until `stop` says enough (it sees every item read so far, after each
    /// new one), the server ends the stream, or the deadline passes.
    pub fn read(&mut self, mut stop: impl FnMut(&[SseItem]) -> bool) -> Ended {
        if let Some(e) = self.ended {
            return e;
        }
        let mut line = String::new();
        loop {
            line.clear();
            match self.reader.read_line(&mut line) {
                Ok(0) => {
                    self.ended = Some(Ended::Closed);
                    return Ended::Closed;
                }
                Ok(_) => {}
                Err(_) => {
                    self.ended = Some(Ended::TimedOut);
                    return Ended::TimedOut;
                }
            }
            let l = line.trim_end_matches('\n').trim_end_matches('\r');
            let before = self.items.len();
            if l.is_empty() {
                if let Some(d) = self.data.take() {
                    self.items.push(SseItem::Message {
                        event: self.event.take(),
                        id: self.id.take(),
                        data: d,
                    });
                }
                self.event = None;
                self.id = None;
            } else if let Some(c) = l.strip_prefix(':') {
                let c = c.strip_prefix(' ').unwrap_or(c).to_string();
                self.items.push(SseItem::Comment(c));
            } else {
                let (field, value) = match l.split_once(':') {
                    Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                    None => (l, ""),
                };
                match field {
                    "event" => self.event = Some(value.to_string()),
                    "id" => self.id = Some(value.to_string()),
                    "data" => match &mut self.data {
                        Some(d) => {
                            d.push('\n');
                            d.push_str(value);
                        }
                        None => self.data = Some(value.to_string()),
                    },
                    _ => {}
                }
            }
            if self.items.len() > before && stop(&self.items) {
                return Ended::Stopped;
            }
        }
    }
}

/// Builds a query string from pairs, each value percent-encoded.
pub(crate) fn query(pairs: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let t = Target::parse("http://relay.example").unwrap();
        assert_eq!(t.authority, "relay.example:80");
        assert_eq!(t.http("/events"), "http://relay.example:80/events");
        let t = Target::parse("HTTP://[::1]:9/").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.base_path.as_str()),
            ("[::1]:9", "")
        );
        let t = Target::parse("http://[::1]").unwrap();
        assert_eq!(t.authority, "[::1]:80");
        assert_eq!(t.ws("ws://elsewhere/s"), "ws://elsewhere/s");
        let t = Target::parse("https://[::1]/base/").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.host(), t.tls),
            ("[::1]:443", "[::1]", true)
        );
        assert_eq!(t.http("/e"), "https://[::1]:443/base/e");
        for bad in [
            "127.0.0.1:8787",
            "ftp://x",
            "http://",
            "http://x/?a=1",
            "ws://x",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}
