//! HTTP/1.1 request sequencing in the core (RFC 9112; AEP-0003 §3.2, §3.3, §3.4): the
//! head, the body (Content-Length or chunked), routing, the answers and their order,
//! pipelining, request backpressure, and the hand-over to SSE or the WebSocket binding.
//! Every refusal is answered, counted and logged once (`Core::refused`).

use super::conn::{Answer, BodyReader, Phase, ReplayJob, Step};
use super::routes::{self, Handler, Lookup};
use super::{
    history_streams, lost_markers, note_refusal, refusal_answer, replay_sessions, ConnId, Core,
    Origin,
};
use crate::auth::{Grant, Scopes};
use crate::fanout::{Binding, Subscription};
use crate::refusal::{Code, Refusal};
use crate::subscription;
use crate::wire::envelope::{self, Event};
use crate::wire::http::{self, ChunkError, Framing, FramingError, RequestHead};
use crate::wire::sse;
use bytes::Bytes;
use serde_json::json;

/// The status page served at `GET /` (one self-contained file, no external assets).
#[cfg(feature = "status-page")]
const STATUS_PAGE: &str = include_str!("../status.html");

/// The largest body buffer kept for the next body (`Core::spare_body`), in bytes of
/// capacity: a 64-Event batch of 4 KiB Events fits; a larger body allocates its own.
pub(super) const SPARE_BODY_MAX: usize = 1 << 20;

/// `METHOD /path` of a request for the log: never its query string (it may carry
/// `access_token`, AEP-0003 §8.1).
fn request_line(head: &RequestHead) -> String {
    format!("{} {}", head.method, head.path)
}

impl Core {
    /// Answers on `key`; with `close`, this is the connection's last answer.
    pub(super) fn reply(&mut self, key: ConnId, bytes: Vec<u8>, close: bool) {
        self.end_unit();
        let close = close || self.shutdown_deadline.is_some();
        if let Some(conn) = self.conns.get_mut(key) {
            if let Some(t) = conn.request.post_since.take() {
                let d = self.now.saturating_duration_since(t);
                self.metrics.post_duration.observe(d);
            }
            let bytes = match &conn.request.cors {
                Some(origin) => http::insert_headers(&bytes, &http::cors_lines(origin)),
                None => bytes,
            };
            if !conn.request.answers.is_empty() {
                // Behind a `POST` that waits for the stream (cluster mode): in order.
                conn.request.answers.push_back(Answer::Ready(bytes, close));
                if close {
                    // Nothing more is read; the close comes after this answer goes.
                    conn.enter(Phase::Closing);
                    conn.rbuf.clear();
                    self.orders.rearm(key, conn, &self.config);
                }
                return;
            }
            conn.answer(bytes, close, self.now);
            self.orders.mark_dirty(key, conn);
            // Its request clock restarted, or it lingers now.
            self.orders.rearm(key, conn, &self.config);
        }
    }

    /// Refuses what was read on `key` before it was a request with a head (a head too
    /// large or malformed, a request too slow) or a body that cannot be read: counted,
    /// logged (see [`Core::refused`]) and answered.
    pub(super) fn reply_error(&mut self, key: ConnId, code: Code, detail: &str, close: bool) {
        let status = code.http_status();
        self.refused(key, "request", Some(status), code, detail);
        let body = http::error_response(status, code.as_str(), detail, &[], &[], close);
        self.reply(key, body, close);
    }

    /// The one place every refusal the relay answers passes through, once, whatever
    /// the binding: it is counted under `code` (`aep_events_rejected_total{reason}`,
    /// `/status`) and logged at `info` as
    /// `refused {what} from {peer}: {status} {code}: {detail}` (docs/operating.md, "Logging").
    /// `what` is the method and path of a request (`POST /events`) or the kind of
    /// WebSocket unit (`WebSocket hello`); `status` the HTTP status or the close code,
    /// `None` for an in-band `error` frame that leaves the connection open. Query strings
    /// and credentials are never part of it; control characters in `detail` are escaped
    /// and a long detail is cut.
    pub(crate) fn refused(
        &mut self,
        key: ConnId,
        what: &str,
        status: Option<u16>,
        code: Code,
        detail: &str,
    ) {
        let peer = self.conns.get(key).map(|c| c.peer);
        note_refusal(&mut self.metrics, peer, what, status, code, detail);
    }

    /// Runs the HTTP state machine over the connection's read buffer ([`Conn::step`](super::conn::Conn::step)),
    /// acting on each step: a head is routed, a body ingested, a refusal answered. While
    /// a group of `POST`s waits for the stream (cluster mode), only a pipelined
    /// `POST /events` joins it; while the answers queued reach `max_output_bytes`
    /// ([`Conn::over_output_bound`](super::conn::Conn::over_output_bound)), reading pauses.
    /// With `resume` (reading had paused), the socket is read again once the requests
    /// read are handled, unless reading paused again or a group waits for the stream.
    pub(super) fn process(&mut self, key: ConnId, resume: bool) {
        let limits = (self.config.max_head_bytes, self.config.max_body_bytes);
        // The head just handled, given back at the next step for its strings' reuse.
        let mut handled = None;
        let conn = loop {
            // A request of this turn may open the group the next ones join.
            let open_group = self.open_group();
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            if let Some(head) = handled.take() {
                conn.keep_head(head);
            }
            if matches!(conn.phase, Phase::Head) && !conn.rbuf.is_empty() && !conn.close_after_flush
            {
                if conn.request.awaiting.is_some() && !super::cluster::may_join(open_group, conn) {
                    break conn;
                }
                if conn.over_output_bound(self.config.max_output_bytes) {
                    self.orders.set_interest(key, conn, Some(false), None);
                    break conn;
                }
            }
            // A refusal or an answer that closes leaves the connection closing: its next
            // step is `Wait`.
            match conn.step(limits.0, limits.1, self.now) {
                Step::Wait => break conn,
                Step::Again => {}
                Step::Head(head) => {
                    // Its answers carry the CORS headers its `Origin` is allowed.
                    conn.request.cors = cors_origin(&self.config.cors_origins, &head);
                    let cross_origin = conn.request.cors.is_some();
                    self.on_head(key, &head, cross_origin);
                    handled = Some(head);
                }
                Step::Body {
                    body,
                    close,
                    batch,
                    emit_as,
                } => self.on_request(key, close, batch, emit_as, body),
                Step::Refuse(code, detail) => self.reply_error(key, code, &detail, true),
                Step::BadChunks(e) => self.chunk_error(key, e),
                Step::EndAfterAnswer => {
                    conn.end_after_answer(self.now);
                    self.orders.mark_dirty(key, conn);
                }
                Step::Ws => {
                    if resume {
                        self.orders.set_interest(key, conn, Some(true), None);
                    }
                    return self.ws_process(key);
                }
            }
        };
        if resume && !conn.request.read_paused && conn.request.awaiting.is_none() {
            self.orders.set_interest(key, conn, Some(true), None);
        }
    }

    pub(super) fn chunk_error(&mut self, key: ConnId, e: ChunkError) {
        match e {
            ChunkError::TooLarge => {
                let d = format!(
                    "the request body exceeds {} bytes (AEP_MAX_BODY)",
                    self.config.max_body_bytes
                );
                self.reply_error(key, Code::BodyTooLarge, &d, true)
            }
            ChunkError::Malformed => {
                self.reply_error(key, Code::BadRequest, "malformed chunked body", true)
            }
        }
    }

    /// Answers a request whose body we will not use: keep the connection when the body
    /// can be skipped, close it otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reply_skipping_body(
        &mut self,
        key: ConnId,
        head: &RequestHead,
        code: Code,
        detail: &str,
        more: &[(&str, serde_json::Value)],
        extra: &[(&str, &str)],
    ) {
        let resp_status = code.http_status();
        let what = request_line(head);
        self.refused(key, &what, Some(resp_status), code, detail);
        let framing = http::framing(head, self.config.max_body_bytes);
        let expect = head.header("expect").is_some();
        let close = head.wants_close()
            || expect
            || !matches!(
                framing,
                Ok(Framing::None) | Ok(Framing::Length(_)) | Ok(Framing::Chunked)
            );
        let body = http::error_response(resp_status, code.as_str(), detail, more, extra, close);
        self.reply(key, body, close);
        if !close {
            // The answer may have closed the connection after all (a shutdown began).
            if let Some(conn) = self
                .conns
                .get_mut(key)
                .filter(|c| !matches!(c.phase, Phase::Closing))
            {
                conn.enter(match framing {
                    Ok(Framing::Length(n)) => Phase::Discard(BodyReader::Length(n)),
                    Ok(Framing::Chunked) => Phase::Discard(BodyReader::Chunked(Default::default())),
                    _ => Phase::Head,
                });
            }
        }
    }

    /// A request head arrived on `key`: refuses what no route takes, answers a CORS
    /// preflight, checks the token against the route's scope (AEP-0003 §8.1), then
    /// answers or starts what the route serves ([`Core::answer`]). `cross_origin`: its
    /// `Origin` is one `cors_origins` allows.
    pub(super) fn on_head(&mut self, key: ConnId, head: &RequestHead, cross_origin: bool) {
        // Only `POST /events` reads a body; any other request that declares one has it
        // skipped and is refused, never left in the buffer to parse as the next request
        // (RFC 9112 §6.3: the framing headers delimit a body whatever the method).
        if head.method != "POST"
            && !matches!(
                http::framing(head, self.config.max_body_bytes),
                Ok(Framing::None)
            )
        {
            let d = format!("a {} request carries no body", head.method);
            return self.reply_skipping_body(key, head, Code::BadRequest, &d, &[], &[]);
        }
        if head.method == "OPTIONS" && cross_origin && self.preflight(key, head) {
            return;
        }
        let route = match routes::lookup(&head.method, &head.path) {
            Lookup::Found(r) => r,
            Lookup::NotFound => {
                let d = format!("no resource at {}", head.path);
                return self.reply_skipping_body(key, head, Code::NotFound, &d, &[], &[]);
            }
            Lookup::MethodNotAllowed(allow) => {
                let d = format!(
                    "{} is not allowed on {}; use {allow}",
                    head.method, head.path
                );
                let extra = [("Allow", allow.as_str())];
                return self.reply_skipping_body(
                    key,
                    head,
                    Code::MethodNotAllowed,
                    &d,
                    &[],
                    &extra,
                );
            }
        };
        let grant = match self.config.auth.check(head, self.unix_secs()) {
            Ok(g) => g,
            // Health and readiness are answered whatever the credentials.
            Err(_) if matches!(route.handler, Handler::Health | Handler::Ready) => {
                Grant::open(Scopes::NONE)
            }
            Err(e) => {
                let extra = [("WWW-Authenticate", "Bearer")];
                return self.reply_skipping_body(
                    key,
                    head,
                    Code::Unauthorized,
                    e.detail(),
                    &[],
                    &extra,
                );
            }
        };
        if !grant.scopes.contains(route.scope) {
            let d = format!(
                "this token lacks the `{}` scope needed for {} {} (AEP-0003 §8.1)",
                route.scope.name(),
                head.method,
                head.path
            );
            return self.reply_skipping_body(key, head, Code::Forbidden, &d, &[], &[]);
        }
        self.answer(key, head, route.handler, grant);
    }

    /// Answers a CORS preflight (Fetch standard §3.2.2) with the methods of its path;
    /// `false` when the path has none (the request goes on to be refused as any other).
    fn preflight(&mut self, key: ConnId, head: &RequestHead) -> bool {
        // Only a preflight needs the path's methods (building them allocates).
        let Some(methods) = &routes::allow(&head.path) else {
            return false;
        };
        let close = head.wants_close();
        let resp = http::response(
            204,
            "text/plain",
            &[
                ("Access-Control-Allow-Methods", methods),
                (
                    "Access-Control-Allow-Headers",
                    "Authorization, AEP-Version, Content-Type, Last-Event-ID",
                ),
                ("Access-Control-Max-Age", "600"),
            ],
            b"",
            close,
        );
        self.reply(key, resp, close);
        true
    }

    /// Answers, or starts serving, route `handler` for a request admitted with `grant`.
    fn answer(&mut self, key: ConnId, head: &RequestHead, handler: Handler, grant: Grant) {
        let close = head.wants_close();
        let json =
            |status: u16, body: &[u8]| http::response(status, "application/json", &[], body, close);
        let resp = match handler {
            Handler::Ingest => return self.begin_ingest(key, head, &grant),
            Handler::Stream => return self.begin_sse(key, head, grant),
            Handler::Socket => return self.begin_ws(key, head, grant),
            Handler::Discovery => json(200, &self.discovery()),
            Handler::Status => json(200, &self.status_json(&grant)),
            Handler::Connections => {
                let limit = head.query_pairs().into_iter().find(|(k, _)| k == "limit");
                match limit.map(|(_, v)| v.parse::<usize>()) {
                    None => json(200, &self.connections_json(None)),
                    Some(Ok(n)) => json(200, &self.connections_json(Some(n))),
                    Some(Err(_)) => {
                        let d = "`limit` must be a number of rows";
                        return self.reply_skipping_body(key, head, Code::BadRequest, d, &[], &[]);
                    }
                }
            }
            Handler::Health => {
                // The counts only to an authenticated caller.
                json(200, &self.health(grant.authenticated || !self.config.auth.enabled()))
            }
            Handler::Ready => {
                let ready = self.ready();
                let mut doc = serde_json::json!({ "ready": ready });
                if let Some(s) = self.cluster_state() {
                    doc["cluster"] = s.as_str().into();
                }
                let body = serde_json::to_vec(&doc).unwrap_or_default();
                json(if ready { 200 } else { 503 }, &body)
            }
            #[cfg(feature = "status-page")]
            Handler::StatusPage => http::response(
                200,
                "text/html; charset=utf-8",
                &[(
                    "Content-Security-Policy",
                    "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:",
                )],
                STATUS_PAGE.as_bytes(),
                close,
            ),
            Handler::Metrics => http::response(
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                &[],
                self.metrics_text(&grant).as_bytes(),
                close,
            ),
        };
        self.reply(key, resp, close);
    }

    /// A `POST /events` head on `key`, its credentials checked: refused when its framing,
    /// `AEP-Version` or media type is not one it may send ([`ingest_head`]), otherwise
    /// its body is read (`Phase::Body`) under `grant`'s `agent`, or, with none, it is
    /// answered at once.
    pub(super) fn begin_ingest(&mut self, key: ConnId, head: &RequestHead, grant: &Grant) {
        let checked = ingest_head(head, self.config.max_body_bytes);
        let body = match checked {
            Ok((Framing::Length(n), ..)) => self.body_buffer(n),
            _ => Vec::new(),
        };
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        // `aep_post_duration_seconds`: from the head's first byte (for a pipelined
        // request, from the answer before it) to this request's answer (`reply`).
        conn.request.post_since = Some(conn.since);
        let (framing, close, batch) = match checked {
            Ok(c) => c,
            // Unreadable framing: `reply_skipping_body` closes after the answer.
            Err((code, d, more)) => {
                let more = more.as_ref().map(|v| ("versions", v.clone()));
                let more = more.as_slice();
                return self.reply_skipping_body(key, head, code, &d, more, &[]);
            }
        };
        let emit_as = grant.agent().map(Box::from);
        let reader = match framing {
            Framing::None => return self.on_request(key, close, batch, emit_as, Vec::new()),
            Framing::Length(n) => BodyReader::Length(n),
            Framing::Chunked => BodyReader::Chunked(Default::default()),
        };
        conn.enter(Phase::Body {
            reader,
            body,
            close,
            batch,
            emit_as,
        });
        let expects = head.header("expect");
        if expects.is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) {
            conn.send(&b"HTTP/1.1 100 Continue\r\n\r\n"[..]);
            self.orders.mark_dirty(key, conn);
        }
    }

    /// Answers a `POST /events` whose body is read: `close` when its head asked for the
    /// connection to close after the answer, `batch` for an NDJSON body.
    pub(super) fn on_request(
        &mut self,
        key: ConnId,
        close: bool,
        batch: bool,
        emit_as: Option<Box<str>>,
        body: Vec<u8>,
    ) {
        let emit_as = emit_as.as_deref();
        if self.clustered() {
            let submitted = self
                .validate_body(Bytes::from(body), batch, emit_as)
                .and_then(|events| self.submit(events, super::cluster::Waiter::Post(key, close)));
            let outcome = match submitted {
                Ok(super::cluster::Submitted::Waiting) => return,
                Ok(super::cluster::Submitted::Now(n)) => {
                    self.metrics.ingested_http += n as u64;
                    Ok(n)
                }
                Err(r) => Err(r),
            };
            let resp = self.post_answer(key, outcome, close);
            return self.reply(key, resp, close);
        }
        let body = Bytes::from(body);
        let outcome = self.ingest_body(body.clone(), batch, emit_as, Origin::Http);
        self.keep_body_buffer(body);
        let resp = self.post_answer(key, outcome, close);
        self.reply(key, resp, close);
    }

    /// A buffer for a body of `len` bytes, `len` long (initialized, filled from the
    /// front as the body arrives, `Conn::body_room`): the kept one when it is large
    /// enough (zeroed only past what an earlier body already wrote), else a new one.
    fn body_buffer(&mut self, len: usize) -> Vec<u8> {
        if len <= self.spare_body.capacity() {
            let mut body = std::mem::take(&mut self.spare_body);
            body.resize(len, 0);
            body
        } else {
            vec![0; len]
        }
    }

    /// Keeps the buffer of an ingested body for the next body (`Core::spare_body`) when
    /// nothing points into it any more: the store holds copies of what it admitted and
    /// the frames are copies, so only Events still waiting in a paused publication hold
    /// it (then it is simply dropped). Buffers over [`SPARE_BODY_MAX`] are not kept.
    /// The buffer keeps its length: those bytes are initialized, so the next body of up
    /// to that length needs no zeroing.
    fn keep_body_buffer(&mut self, body: Bytes) {
        if body.len() > SPARE_BODY_MAX || self.spare_body.capacity() >= body.len() {
            return;
        }
        if let Ok(buf) = body.try_into_mut() {
            let buf = Vec::from(buf);
            if buf.capacity() <= SPARE_BODY_MAX {
                self.spare_body = buf;
            }
        }
    }

    /// The answer to `POST /events` (AEP-0003 §3.2.3): 202 `{"accepted":n}`, or the
    /// refusal's status and JSON body, counted and logged ([`Core::refused`]).
    pub(super) fn post_answer(
        &mut self,
        key: ConnId,
        outcome: Result<usize, Refusal>,
        close: bool,
    ) -> Vec<u8> {
        match outcome {
            Ok(n) => http::accepted_response(n, close),
            Err(r) => {
                let peer = self.conns.get(key).map(|c| c.peer);
                refusal_answer(&mut self.metrics, peer, &r, close)
            }
        }
    }

    /// Counts `n` Events accepted from `origin` (`aep_events_ingested_total{binding}`).
    pub(super) fn count_ingested(&mut self, origin: Origin, n: usize) {
        match origin {
            Origin::Ws => self.metrics.ingested_ws += n as u64,
            Origin::Http => self.metrics.ingested_http += n as u64,
            Origin::Jsonl => self.metrics.ingested_jsonl += n as u64,
        }
    }

    /// Validates every Event of a body, then ingests them all in order, or none.
    /// `emit_as`: the one `agent` the Events may name (the token's `agent` grant).
    pub(super) fn ingest_body(
        &mut self,
        body: Bytes,
        batch: bool,
        emit_as: Option<&str>,
        origin: Origin,
    ) -> Result<usize, Refusal> {
        // The Vec the Events are parsed into is kept between bodies of up to ~128
        // Events (no allocation per request); a larger batch's is not kept (its room
        // would stay allocated, ~200 bytes an Event).
        let mut ok = std::mem::take(&mut self.body_events);
        let done = self
            .validate_body_into(body, batch, emit_as, &mut ok)
            .and_then(|()| {
                // Kept in the history before it is published or answered.
                self.persist(&ok)?;
                let n = ok.len();
                self.count_ingested(origin, n);
                // One ingest unit: the batch's frames are coalesced (see `fanout`).
                self.size_unit(&ok);
                self.publish_unit(ok.drain(..));
                Ok(n)
            });
        ok.clear();
        if ok.capacity() <= 128 {
            self.body_events = ok;
        }
        done
    }

    /// Parses and validates every Event of a body, in order: all or none, the first
    /// failure (in line order) is the refusal. Each Event is a slice of `body` (no copy;
    /// a replay buffer keeps its own copy of what it holds, `store`).
    pub(super) fn validate_body(
        &mut self,
        body: Bytes,
        batch: bool,
        emit_as: Option<&str>,
    ) -> Result<Vec<Event>, Refusal> {
        let mut ok = Vec::new();
        self.validate_body_into(body, batch, emit_as, &mut ok)?;
        Ok(ok)
    }

    /// [`Core::validate_body`] into `ok` (empty on entry; what it holds after a refusal
    /// is to be discarded).
    fn validate_body_into(
        &mut self,
        body: Bytes,
        batch: bool,
        emit_as: Option<&str>,
        ok: &mut Vec<Event>,
    ) -> Result<(), Refusal> {
        if !batch {
            return match Event::parse(body) {
                Ok(ev) if ev.is_command() => Err(Refusal::Command {
                    line: 1,
                    event_type: ev.event_type().to_string(),
                }),
                Ok(ev) if !agent_allowed(&ev, emit_as) => Err(agent_refusal(1, &ev, emit_as)),
                Ok(ev) => {
                    ok.push(ev);
                    Ok(())
                }
                Err(e) => Err(Refusal::InvalidEvent {
                    line: 1,
                    detail: e.detail,
                }),
            };
        }
        // The Events are counted as they are parsed: a body over the bound is refused
        // as too many (before any invalid line, as if counted first), without a pass
        // over the bytes only to count their lines.
        let max = self.config.max_batch_events;
        let too_many = |rest: &[u8], so_far: usize| {
            let real = so_far + non_blank_lines(rest);
            (real > max).then_some(Refusal::TooManyEvents { count: real, max })
        };
        let mut start = 0;
        let mut line = 0;
        while start < body.len() {
            let end = memchr::memchr(b'\n', &body[start..]).map_or(body.len(), |i| start + i);
            line += 1;
            if !body[start..end].iter().all(|b| b.is_ascii_whitespace()) {
                if ok.len() == max {
                    return Err(too_many(&body[start..], ok.len()).expect("over the bound"));
                }
                let refusal = match Event::parse(body.slice(start..end)) {
                    Ok(ev) if ev.is_command() => Refusal::Command {
                        line,
                        event_type: ev.event_type().to_string(),
                    },
                    Ok(ev) if !agent_allowed(&ev, emit_as) => agent_refusal(line, &ev, emit_as),
                    Ok(ev) => {
                        ok.push(ev);
                        start = end + 1;
                        continue;
                    }
                    Err(e) => Refusal::InvalidEvent {
                        line,
                        detail: e.detail,
                    },
                };
                return Err(too_many(&body[end..], ok.len() + 1).unwrap_or(refusal));
            }
            start = end + 1;
        }
        Ok(())
    }

    pub(super) fn begin_sse(&mut self, key: ConnId, head: &RequestHead, grant: Grant) {
        if let Some(d) = self.catching_up() {
            let code = Code::ClusterUnavailable;
            return self.reply_skipping_body(key, head, code, d, &[], &[("Retry-After", "1")]);
        }
        let req = match subscription::parse_stream_request(head, self.config.max_from_positions) {
            Ok(r) => r,
            Err(e) => {
                return self.reply_skipping_body(key, head, e.code, &e.detail, &[], &[]);
            }
        };
        // A live stream's consumer reconnects when it ends: when, with jitter.
        let retry = req.live.then(|| self.sse_retry_ms());
        // The grant narrows what the consumer gets (AEP-0003 §6.1, a conjunction) and
        // caps its ceiling; the sessions a replay-only request reads the history of stay
        // the ones it names (`history_sessions`), read through the narrowed filter.
        let filter = grant.narrow(req.filter.clone());
        let ceiling = grant.ceiling(req.ceiling);
        // A replay-only stream (`live=0`) ends by itself: its token's expiry does not
        // cut the replay it was admitted for.
        let expires_at = grant
            .expires
            .filter(|_| req.live)
            .and_then(|e| self.instant_at_unix(e));
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.expires_at = expires_at;
        let head = if req.live {
            sse::STREAM_HEAD
        } else {
            sse::REPLAY_HEAD
        };
        match &conn.request.cors {
            Some(origin) => conn.send(http::insert_headers(head, &http::cors_lines(origin))),
            None => conn.send(head),
        }
        if let Some(ms) = retry {
            conn.send(sse::retry(ms));
        }
        conn.last_write = self.now;
        // Replay precedes live delivery (AEP-0003 §5, §7), paced by the consumer's reading
        // (see `relay::replay`): no gap and no duplicate across the boundary.
        let sub = req.live.then(|| {
            self.hub.insert(Subscription {
                conn: key,
                filter: filter.clone(),
                ceiling,
                binding: Binding::Sse,
            })
        });
        conn.enter(match sub {
            Some(sub) => Phase::Sse {
                sub,
                grant: Box::new(grant),
            },
            None => Phase::Closing,
        });
        for (name, _, earliest) in lost_markers(&self.store, &req.from) {
            if filter.admits_session(&name) {
                conn.subscriber
                    .out
                    .push(sse::replay_exhausted(&name, earliest));
            }
        }
        // A live stream is told of drops with a comment (AEP-0003 §8.4, `sse::dropped`).
        conn.subscriber.announce_drops = true;
        let mut sessions = replay_sessions(&self.store, &req.from);
        if let Some(names) = req.history_sessions() {
            sessions.extend(history_streams(&self.store, names));
        }
        let job = ReplayJob {
            sub,
            ws_id: None,
            pending: sessions.iter().map(|(s, _)| *s).collect(),
            sessions,
            filter,
            ceiling,
            end_after: !req.live,
            lost: false,
        };
        let max = self.config.max_output_bytes;
        super::replay::start(conn, job, &self.store, &mut self.hub, max);
        self.orders.mark_dirty(key, conn);
        if self.shutdown_deadline.is_some() {
            self.end_stream(key, self.now);
        }
    }
}

/// The lines of `bytes` that are not blank (all ASCII whitespace): the Events of an
/// NDJSON body (AEP-0003 §3.2.2).
fn non_blank_lines(bytes: &[u8]) -> usize {
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.iter().all(|b| b.is_ascii_whitespace()))
        .count()
}

/// Whether `ev` names the agent `emit_as` (the token's `agent` grant; `None`: any). The
/// scanner's `agent`, no JSON parse.
pub(super) fn agent_allowed(ev: &Event, emit_as: Option<&str>) -> bool {
    emit_as.is_none_or(|a| ev.attr(envelope::Attr::Agent) == Some(a))
}

/// The 403 of an Event on `line` whose `agent` is not `emit_as`.
fn agent_refusal(line: usize, ev: &Event, emit_as: Option<&str>) -> Refusal {
    Refusal::Agent {
        line,
        agent: serde_json::to_string(&ev.attr(envelope::Attr::Agent)).unwrap_or_default(),
        allowed: emit_as.unwrap_or_default().to_owned(),
    }
}

/// The `Access-Control-Allow-Origin` value for a request, when its `Origin` is one of
/// `allowed` (the `cors_origins` setting; `*` allows any).
fn cors_origin(allowed: &[String], head: &RequestHead) -> Option<String> {
    let origin = head.header("origin")?;
    if allowed.iter().any(|o| o == "*") {
        Some("*".to_string())
    } else if allowed.iter().any(|o| o == origin) {
        Some(origin.to_string())
    } else {
        None
    }
}

/// A refusal of a request head: its code and detail, and the versions offered when
/// it names an unsupported `AEP-Version`.
type HeadRefusal = (Code, String, Option<serde_json::Value>);

/// What a `POST /events` head says of its body, when it may send one (AEP-0003 §3.2):
/// its framing (at most `max_body` bytes), whether the connection closes after the
/// answer, and whether it is an NDJSON batch.
///
/// # Errors
/// The refusal's code and detail, with the versions offered for an unsupported
/// `AEP-Version`: `body-too-large`, `bad-request` (framing), `version-required`,
/// `version-unsupported`, `unsupported-media-type`.
fn ingest_head(head: &RequestHead, max_body: usize) -> Result<(Framing, bool, bool), HeadRefusal> {
    let framing = match http::framing(head, max_body) {
        Ok(f) => f,
        Err(FramingError::TooLarge(n)) => {
            let d = format!(
                "the request body is {n} bytes; at most {max_body} are accepted (AEP_MAX_BODY)"
            );
            return Err((Code::BodyTooLarge, d, None));
        }
        Err(FramingError::Bad(why)) => return Err((Code::BadRequest, why.to_owned(), None)),
    };
    match head.header("aep-version") {
        None => {
            let d = "the AEP-Version request header is required (AEP-0003 §3.2.2)";
            return Err((Code::VersionRequired, d.to_owned(), None));
        }
        Some(v) if !envelope::header_version_supported(v) => {
            let d = format!("AEP-Version {v:?} is not supported (AEP-0003 §3.2.2)");
            let versions = json!(envelope::SUPPORTED_VERSIONS);
            return Err((Code::VersionUnsupported, d, Some(versions)));
        }
        Some(_) => {}
    }
    let media = head.media_type_as_sent().unwrap_or("");
    let batch = media.eq_ignore_ascii_case("application/x-ndjson");
    if !batch && !media.eq_ignore_ascii_case("application/json") {
        let d = format!(
            "Content-Type must be application/json (one Event) or application/x-ndjson (a batch), got {} (AEP-0003 §3.2.1)",
            head.media_type().as_deref().unwrap_or("none")
        );
        return Err((Code::UnsupportedMediaType, d, None));
    }
    Ok((framing, head.wants_close(), batch))
}
