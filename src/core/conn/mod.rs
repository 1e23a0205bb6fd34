//! One connection as the core sees it: its read buffer, bounded output queue, protocol
//! phase and deadline. Never a socket: the reactor owns that, under the same [`ConnId`].

use crate::auth::Grant;
use crate::config::Config;
use crate::filter::Filter;
use crate::ids::{ConnId, SubId};
use crate::refusal::Code;
use crate::store::{ReplayFrom, StreamId};
use crate::wire::envelope::{Capture, Severity};
use crate::wire::http::{self, ChunkError, ChunkedDecoder, HeadError, RequestHead};
use bytes::Bytes;
use slab::Slab;
use std::collections::HashSet;
use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) mod websocket;

/// Most heap bytes a connection keeps in its reused request head between requests
/// ([`Conn::keep_head`]); a larger head is dropped once handled.
const KEPT_HEAD_BYTES: usize = 4096;

/// How long a connection that got its final answer keeps draining input before it is
/// dropped (so the peer sees the answer rather than a reset).
const LINGER: Duration = Duration::from_secs(2);

/// The most buffers one `writev` takes on Linux (`IOV_MAX`, `<limits.h>`); the standard
/// library caps a longer slice to it.
pub(crate) const IOV_MAX: usize = 1024;

/// A connection's queued output: reference-counted buffers written in order with
/// vectored writes. Fan-out pushes clones of shared frames here (no copy).
///
/// Invariant: `bytes` equals the sum of the lengths of `bufs` minus `front_off`.
///
/// A transport with a buffer of its own (TLS: records sealed from this queue and not
/// yet taken by the socket) reports it in `held` ([`OutQueue::set_held`]); [`len`] counts
/// it, so the bound of AEP-0003 §8.4, `aep_output_queued_bytes` and every "is anything
/// still to go" decision see the sealed bytes exactly as they saw them queued.
///
/// [`len`]: OutQueue::len
#[derive(Debug, Default)]
#[repr(C)] // the counters fan-out reads per delivery first (see `Conn`)
pub(crate) struct OutQueue {
    bytes: usize,
    /// Bytes the transport holds for this connection, already taken from `bufs`.
    held: usize,
    /// Bytes ever queued (never decreases): a connection's `offered` mark compares with
    /// it to tell whether anything was queued since its socket was last offered the
    /// queue.
    pushed: u64,
    front_off: usize,
    /// Bytes of the queued buffers that are this queue's own (not slices of a shared
    /// chunk): what the memory budget charges to this connection.
    own: usize,
    /// Each buffer with the shared chunk it is a slice of (`Chunks`), or [`UNSHARED`].
    bufs: VecDeque<(Bytes, Tag)>,
}

/// Which shared chunk a queued buffer is a slice of (an index into [`Chunks`]).
pub(crate) type Tag = u32;
/// The tag of a buffer that is its queue's own.
pub(crate) const UNSHARED: Tag = u32::MAX;

/// The frame chunks that output queues hold slices of, each counted once for the memory
/// budget however many queues share it: a chunk is the frames one ingest unit placed in
/// one arena (`fanout::Unit`), with the number of queued buffers that are slices of it.
/// It stops counting when the last of them was written or discarded.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    live: slab::Slab<(usize, u32)>,
    bytes: usize,
}

impl Chunks {
    /// A new chunk of `len` bytes, with no slice queued yet.
    pub(crate) fn open(&mut self, len: usize) -> Tag {
        self.bytes += len;
        self.live.insert((len, 0)) as Tag
    }

    /// One more queued slice of chunk `tag`.
    pub(crate) fn take(&mut self, tag: Tag) {
        if let Some(c) = self.live.get_mut(tag as usize) {
            c.1 += 1;
        }
    }

    /// One queued slice of chunk `tag` is gone; the chunk stops counting with its last.
    pub(crate) fn release(&mut self, tag: Tag) {
        let Some(c) = self.live.get_mut(tag as usize) else {
            return;
        };
        c.1 = c.1.saturating_sub(1);
        if c.1 == 0 {
            let (len, _) = self.live.remove(tag as usize);
            self.bytes -= len;
        }
    }

    /// Bytes of the chunks some queue holds a slice of.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

/// What a flush achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Flush {
    /// Everything queued was written.
    Done,
    /// The socket would block; some output remains.
    Blocked,
    /// The peer is gone.
    Closed,
}

impl OutQueue {
    /// Queues one buffer of the queue's own.
    pub(crate) fn push(&mut self, b: Bytes) {
        if b.is_empty() {
            return;
        }
        self.own += b.len();
        self.push_tagged(b, UNSHARED);
    }

    /// Queues a slice of the shared chunk `tag` (the caller took a reference on it,
    /// [`Chunks::take`]).
    pub(crate) fn push_shared(&mut self, b: Bytes, tag: Tag) {
        debug_assert!(!b.is_empty());
        self.push_tagged(b, tag);
    }

    fn push_tagged(&mut self, b: Bytes, tag: Tag) {
        self.bytes += b.len();
        self.pushed += b.len() as u64;
        self.bufs.push_back((b, tag));
    }

    /// Panics when the queue's counts disagree with its buffers (the invariant in the
    /// type's docs: `bytes` is the buffers' lengths less `front_off`; `own` is the
    /// lengths of the buffers that are the queue's own). Debug builds check it after
    /// each call that handled the connection (`Core::check_conn`).
    #[cfg(debug_assertions)]
    pub(crate) fn check(&self) {
        let all: usize = self.bufs.iter().map(|(b, _)| b.len()).sum();
        assert_eq!(
            self.bytes + self.front_off,
            all,
            "OutQueue: bytes + front_off"
        );
        let own: usize = self
            .bufs
            .iter()
            .filter(|(_, t)| *t == UNSHARED)
            .map(|(b, _)| b.len())
            .sum();
        assert_eq!(self.own, own, "OutQueue: own");
        assert!(
            self.front_off == 0 || !self.bufs.is_empty(),
            "OutQueue: front_off"
        );
    }

    /// Bytes the transport holds for this connection ([`OutQueue::set_held`]).
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Bytes queued that are this queue's own (not slices of shared chunks).
    pub(crate) fn own(&self) -> usize {
        self.own
    }

    /// Drops the front buffer (written, or discarded), releasing its chunk.
    fn pop(&mut self, chunks: &mut Chunks) {
        if let Some((b, tag)) = self.bufs.pop_front() {
            if tag == UNSHARED {
                self.own -= b.len();
            } else {
                chunks.release(tag);
            }
        }
    }

    /// Empties the queue (the connection is gone), releasing every chunk it held.
    pub(crate) fn release_all(&mut self, chunks: &mut Chunks) {
        while !self.bufs.is_empty() {
            self.pop(chunks);
        }
        self.front_off = 0;
        self.bytes = 0;
    }

    /// Discards everything queued except the rest of the frame being written (the
    /// front buffer, partly written, cut at `frame_end(front, front_off)`), handing each
    /// discarded buffer to `seen` first. Returns the bytes discarded.
    pub(crate) fn discard_unwritten(
        &mut self,
        chunks: &mut Chunks,
        frame_end: impl Fn(&[u8], usize) -> usize,
        mut seen: impl FnMut(&[u8]),
    ) -> usize {
        let before = self.bytes;
        let mut kept = None;
        if self.front_off > 0 {
            if let Some((b, tag)) = self.bufs.front() {
                let end = frame_end(b, self.front_off).clamp(self.front_off, b.len());
                seen(&b[end..]);
                let rest = b.len() - end;
                kept = Some((b.slice(..end), *tag, rest));
            }
            self.bufs.pop_front();
        }
        while let Some((b, _)) = self.bufs.front() {
            seen(b);
            self.bytes -= b.len();
            self.pop(chunks);
        }
        if let Some((b, tag, rest)) = kept {
            // The front buffer's tag moves to its cut slice (still one reference).
            self.bytes -= rest;
            if tag == UNSHARED {
                self.own -= rest;
            }
            self.bufs.push_back((b, tag));
        }
        before - self.bytes
    }

    /// Bytes ever queued.
    pub(crate) fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Moves buffers from the front of `self` to the end of `other` while `other` stays
    /// within `max` bytes (an empty `other` takes one buffer whatever its size).
    pub(crate) fn move_until(&mut self, other: &mut OutQueue, max: usize) {
        debug_assert_eq!(self.front_off, 0);
        while let Some((b, _)) = self.bufs.front() {
            if !other.is_empty() && other.len() + b.len() > max {
                break;
            }
            let (b, tag) = self.bufs.pop_front().expect("front");
            self.bytes -= b.len();
            if tag == UNSHARED {
                self.own -= b.len();
                other.own += b.len();
            }
            other.push_tagged(b, tag);
        }
    }

    /// Bytes queued and not yet written: those still queued plus those the transport
    /// holds (sealed TLS records not yet written).
    pub(crate) fn len(&self) -> usize {
        self.bytes + self.held
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes still queued (not yet handed to the transport): `pushed() - queued()` is
    /// how many the transport took.
    pub(crate) fn queued(&self) -> usize {
        self.bytes
    }

    /// Records how many bytes the transport holds for this connection (see the type's
    /// docs); the reactor reports it after each write.
    pub(crate) fn set_held(&mut self, held: usize) {
        self.held = held;
    }

    /// Writes as much as the socket takes: the whole queue in one vectored write of up
    /// to [`IOV_MAX`] buffers, looping only on a partial write (or while more than
    /// `IOV_MAX` buffers are queued), until the queue is empty or the socket would block.
    /// So a subscriber keeping up gets one write syscall per flush, however many frames
    /// a batch queued on it. Once the queue is empty, `w.flush()` asks the transport to
    /// write what it holds of its own (TLS records): `Done` only when nothing is left
    /// anywhere, `Blocked` when the transport would block.
    pub(crate) fn flush<W: Write>(&mut self, w: &mut W, chunks: &mut Chunks) -> Flush {
        while !self.bufs.is_empty() {
            // The iovec array lives on the stack, sized to the queue (no allocation, and
            // no 16 KiB of zeroing for the common short queue).
            let result = match self.bufs.len() {
                // One frame queued (the common case for a keeping-up consumer): a plain
                // write, no iovec array to set up.
                1 => w.write(&self.bufs[0].0[self.front_off..]),
                2..=16 => self.write_vectored::<16, W>(w),
                17..=128 => self.write_vectored::<128, W>(w),
                _ => self.write_vectored::<IOV_MAX, W>(w),
            };
            match result {
                Ok(0) => return Flush::Closed,
                Ok(mut written) => {
                    self.bytes -= written;
                    while written > 0 {
                        let front = self.bufs.front().map(|b| b.0.len()).unwrap_or(0);
                        let left = front - self.front_off;
                        if written >= left {
                            written -= left;
                            self.pop(chunks);
                            self.front_off = 0;
                        } else {
                            self.front_off += written;
                            written = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Flush::Blocked,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Flush::Closed,
            }
        }
        loop {
            match w.flush() {
                Ok(()) => {
                    self.held = 0;
                    return Flush::Done;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Flush::Blocked,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Flush::Closed,
            }
        }
    }

    /// One `writev` of the first `N` (at most) queued buffers. Not inlined, so that
    /// `flush`'s own frame stays small for the single-frame case.
    #[inline(never)]
    fn write_vectored<const N: usize, W: Write>(&self, w: &mut W) -> io::Result<usize> {
        let mut iov = [IoSlice::new(&[]); N];
        let mut n = 0;
        for (slot, (b, _)) in iov.iter_mut().zip(self.bufs.iter()) {
            *slot = if n == 0 {
                IoSlice::new(&b[self.front_off..])
            } else {
                IoSlice::new(b)
            };
            n += 1;
        }
        w.write_vectored(&iov[..n])
    }
}

#[cfg(test)]
impl OutQueue {
    /// Buffers queued (fan-out coalescing tests).
    pub(crate) fn entries(&self) -> usize {
        self.bufs.len()
    }

    /// Everything queued, in order.
    pub(crate) fn concat(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.bytes);
        for (i, (b, _)) in self.bufs.iter().enumerate() {
            v.extend_from_slice(if i == 0 { &b[self.front_off..] } else { b });
        }
        v
    }
}

/// One connection's share of the memory used (counted by `memory`), or the sum over
/// every connection: bytes of its struct and buffers, of its queues, and estimates of its
/// TLS and deflate state.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Charge {
    pub(super) conn: usize,
    pub(super) queues: usize,
    pub(super) tls: usize,
    pub(super) deflate: usize,
}

impl Charge {
    pub(super) fn add(&mut self, c: Charge) {
        self.conn += c.conn;
        self.queues += c.queues;
        self.tls += c.tls;
        self.deflate += c.deflate;
    }

    pub(super) fn sub(&mut self, c: Charge) {
        self.conn -= c.conn;
        self.queues -= c.queues;
        self.tls -= c.tls;
        self.deflate -= c.deflate;
    }
}

/// Events not delivered to one consumer because of backpressure, by severity
/// (AEP-0003 §8.4: only `debug` and `info` are ever dropped).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Drops {
    /// `debug` Events dropped.
    pub(crate) debug: u64,
    /// `info` Events dropped.
    pub(crate) info: u64,
}

impl Drops {
    /// Counts one dropped Event of `severity` (`debug`, or else `info`: nothing above
    /// `info` is ever dropped).
    pub(crate) fn count(&mut self, severity: Severity) {
        if severity == Severity::Debug {
            self.debug += 1;
        } else {
            self.info += 1;
        }
    }

    /// Events dropped, both severities.
    pub(crate) fn total(&self) -> u64 {
        self.debug + self.info
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.debug == 0 && self.info == 0
    }
}

/// A replay in progress for one subscription (AEP-0003 §5, §7), advanced a page at a
/// time as the consumer reads, so its memory stays bounded however much the store holds.
#[derive(Debug)]
pub(crate) struct ReplayJob {
    /// Hub key of the live subscription this replay precedes (`None`: SSE `live=0`).
    pub(crate) sub: Option<SubId>,
    /// The WS subscription id, for WS-framed output; `None` frames for SSE.
    pub(crate) ws_id: Option<Box<str>>,
    pub(crate) filter: Arc<Filter>,
    pub(crate) ceiling: Option<Capture>,
    /// Streams still to replay (owning streams `(source, session)`, AEP-0001 §5.2), in
    /// order, each with where it continues.
    pub(crate) sessions: VecDeque<(StreamId, ReplayFrom)>,
    /// The same streams, for the per-Event check in fan-out.
    pub(crate) pending: HashSet<StreamId>,
    /// End the stream when this replay is done (SSE `live=0`).
    pub(crate) end_after: bool,
    /// A stream this replay still had to read left the store (`--max-sessions` evicted
    /// it): its Events were not all delivered, so the stream must not say
    /// `: replay-complete`.
    pub(crate) lost: bool,
}

/// How a request body is being read.
#[derive(Debug)]
pub(crate) enum BodyReader {
    /// This many bytes still to come.
    Length(usize),
    /// Chunked.
    Chunked(ChunkedDecoder),
}

impl BodyReader {
    /// Moves body bytes from the front of `rbuf` into `body` (decoding chunked framing,
    /// never past `max_body` in total). `Ok(true)` once the body is complete; bytes
    /// after it stay in `rbuf` (the next pipelined request).
    ///
    /// # Errors
    /// [`ChunkError`] for malformed chunked framing or a body over `max_body`.
    pub(crate) fn take(
        &mut self,
        rbuf: &mut Vec<u8>,
        body: &mut Vec<u8>,
        max_body: usize,
    ) -> Result<bool, ChunkError> {
        match self {
            BodyReader::Length(rem) => {
                let take = (*rem).min(rbuf.len());
                // A body of known length is sized up front and filled from the front
                // (`Phase::Body`); a discarded one has no buffer.
                let at = body.len().checked_sub(*rem);
                if let Some(dst) = at.and_then(|at| body.get_mut(at..at + take)) {
                    dst.copy_from_slice(&rbuf[..take]);
                }
                rbuf.drain(..take);
                *rem -= take;
                Ok(*rem == 0)
            }
            BodyReader::Chunked(d) => {
                let (used, done) = d.decode(rbuf, body, max_body)?;
                rbuf.drain(..used);
                Ok(done)
            }
        }
    }
}

/// What the connection is doing.
#[derive(Debug)]
pub(crate) enum Phase {
    /// Reading a request head (keep-alive idle when the read buffer is empty).
    Head,
    /// Reading the body of a `POST /events`: how it is framed, the bytes so far, and
    /// what its head said (`Connection: close` or HTTP/1.0; an NDJSON batch), and the one
    /// `agent` its Events may name (its token's `agent` grant; `None`: any). A body of
    /// known length (`BodyReader::Length(rem)`) is `Content-Length` bytes long from the
    /// start, its first `len - rem` received ([`Conn::body_room`]); a chunked one grows.
    Body {
        reader: BodyReader,
        body: Vec<u8>,
        close: bool,
        batch: bool,
        emit_as: Option<Box<str>>,
    },
    /// Discarding a body whose request was already answered, then back to `Head`.
    Discard(BodyReader),
    /// Streaming SSE for the subscription with this key, under the request's grant
    /// (kept for its holder and its expiry).
    Sse { sub: SubId, grant: Box<Grant> },
    /// Upgraded to the WebSocket binding (`GET /socket`).
    Ws(Box<websocket::WsState>),
    /// Answered for the last time: flush, half-close, then discard input until EOF.
    Closing,
}

impl Phase {
    /// The phase's name, for logs and assertions.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Phase::Head => "head",
            Phase::Body { .. } => "body",
            Phase::Discard(_) => "discard",
            Phase::Sse { .. } => "sse",
            Phase::Ws(_) => "ws",
            Phase::Closing => "closing",
        }
    }
}

/// Whether a connection may go from phase `from` to phase `to` ([`Conn::enter`]).
fn legal(from: &Phase, to: &Phase) -> bool {
    matches!(
        (from, to),
        (_, Phase::Closing)
            | (Phase::Head, _)
            | (
                Phase::Body { .. } | Phase::Discard(_),
                Phase::Head | Phase::Discard(_)
            )
    )
}

/// What one step of a connection's HTTP state machine ([`Conn::step`]) leaves for the
/// core to do.
#[derive(Debug)]
#[must_use]
pub(crate) enum Step {
    /// Nothing more until more bytes arrive (or the phase reads none).
    Wait,
    /// A body was drained (discarded) and the connection reads heads again: step again.
    Again,
    /// A complete request head, taken off the read buffer: route it.
    Head(RequestHead),
    /// A complete `POST /events` body, with what its head said (`Connection: close` or
    /// HTTP/1.0; an NDJSON batch) and the `agent` its Events may name: ingest it.
    Body {
        body: Vec<u8>,
        close: bool,
        batch: bool,
        emit_as: Option<Box<str>>,
    },
    /// Bytes that are no request: refuse them with this code and detail, then close.
    Refuse(Code, String),
    /// Malformed or oversized chunked framing of a body being read.
    BadChunks(ChunkError),
    /// A body being discarded after its answer turned out malformed: close after what is
    /// queued, with no second answer.
    EndAfterAnswer,
    /// The connection is a WebSocket: its frames are the WebSocket binding's.
    Ws,
}

/// One answer of a connection's pipelined requests in cluster mode (see
/// [`Request::answers`]).
#[derive(Debug)]
pub(crate) enum Answer {
    /// A `POST /events` waiting for the stream, with its request's
    /// `Access-Control-Allow-Origin` value.
    Waiting(Option<String>),
    /// An answer ready to go once every answer before it went: its bytes (CORS headers
    /// in) and whether the connection closes after it.
    Ready(Vec<u8>, bool),
}

/// What a connection keeps while it reads and answers HTTP requests (the `Head`, `Body`
/// and `Discard` phases, and the `Closing` after an answer): the head being parsed, the
/// CORS origin and the clock of the request being answered, the pause of a peer that
/// does not read its answers, and, in cluster mode, the answers waiting for the stream.
/// Reset ([`Conn::enter`]) when the connection becomes an SSE stream or a WebSocket, so a
/// stream holds none of it.
#[derive(Debug, Default)]
pub(crate) struct Request {
    /// The head of the request being handled, parsed in place (`http::parse_head_into`)
    /// so its strings are reused from one request to the next; emptied when the
    /// connection leaves HTTP requests or a head was large ([`Conn::keep_head`]).
    pub(crate) head: RequestHead,
    /// In `Phase::Head`: how many bytes at the front of `rbuf` were already looked at
    /// without completing the head (`Core::process` parses again only once a line
    /// feed arrives after them: linear work for a head trickled in byte by byte).
    pub(crate) head_scanned: usize,
    /// Reading and request processing are paused because the queued answers reached
    /// `max_output_bytes` (a peer pipelining requests without reading the answers);
    /// `Core::write_to` resumes them once the queue is below the bound.
    pub(crate) read_paused: bool,
    /// Cluster mode: the serial of the group of `POST`s whose stream acknowledgements
    /// this connection waits for. While that group is open (the reactor turn that read
    /// them), further pipelined `POST /events` join it; no other request is read.
    pub(crate) awaiting: Option<u64>,
    /// Cluster mode: the answers of the requests read while `awaiting`, in request
    /// order (HTTP/1.1 answers in order, RFC 9112 §9.3): a `POST` still waiting for
    /// the stream, or an answer that is ready and must wait behind it. Empty otherwise.
    pub(crate) answers: VecDeque<Answer>,
    /// `Access-Control-Allow-Origin` value for the current request's answers.
    pub(crate) cors: Option<String>,
    /// When the `POST /events` being handled began (`aep_post_duration_seconds`), until
    /// its answer is queued.
    pub(crate) post_since: Option<Instant>,
}

/// What fan-out reads and writes of one connection, and nothing else: the output queue
/// (which HTTP answers and WebSocket replies share, in order), the live frames held
/// behind a replay, the replays in progress, the drop counts (AEP-0003 §8.4) and the
/// marks of the fan-out in progress. Fan-out reaches connections only through
/// [`Subscribers`], which hands out this part of each and never its socket buffers,
/// request head or phase.
///
/// Laid out in declaration order: the fields fan-out reads and writes for every
/// delivery come first, so one delivery touches a few adjacent cache lines rather than
/// lines spread over the whole connection.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Subscriber {
    /// Fan-out serial of the last Event queued here (single delivery per connection).
    pub(crate) mark: u64,
    /// The publication number of the last Event fan-out decided for this connection
    /// (queued, dropped or doomed): a paused fan-out, tried again, skips it.
    pub(crate) decided: u64,
    /// While `mark` is the current fan-out's serial: this connection's slot in the
    /// hub's per-fan-out target list.
    pub(crate) fan_slot: usize,
    /// The fan-out unit generation this connection last took frames in; while it is
    /// the hub's current one and `unit_pending > 0`, `unit_run` indexes its open run
    /// (see `fanout::Unit`).
    pub(crate) unit_generation: u64,
    pub(crate) unit_run: usize,
    /// Bytes of frames pending in the open unit (not yet in `out` or `backlog`).
    pub(crate) unit_pending: usize,
    /// `out.pushed()` when the reactor last wrote this connection's queue: a consumer is
    /// judged slow only once its socket was offered everything queued (see
    /// `Hub::fanout`).
    pub(crate) offered: u64,
    /// Of `dropped`, those the consumer was not told of yet: the notice goes before the
    /// next Event delivered to it (counted only while `announce_drops`).
    pub(crate) unannounced: Drops,
    /// `!unannounced.is_empty()`, kept as one flag: fan-out tests it for every delivery.
    pub(crate) owes_notice: bool,
    /// Disconnected for backpressure (AEP-0003 §8.4) and waiting for the core to close
    /// it: fan-out skips it, so it is counted once, however many Events meet it.
    pub(crate) doomed: bool,
    /// Queued in one of the core's lists of connections to announce as
    /// [`super::Output::Writable`] (deliveries, or answers, which go first).
    pub(crate) dirty: bool,
    /// `permessage-deflate` on this WebSocket (RFC 7692): 0 when not negotiated, else
    /// the relay's window limit in bits (`ws::deflate::Agreed::server_window_bits`).
    /// Fan-out reads it here, beside `mark`, to pick the shared compressed frame.
    pub(crate) deflate_window: u8,
    /// Whether this consumer is told of drops in its stream: every SSE stream (a
    /// comment), a WebSocket that asked in its `hello` (a `dropped` frame).
    pub(crate) announce_drops: bool,
    /// Replays still in progress, oldest first (paced by `replay::pump`).
    pub(crate) replay: VecDeque<ReplayJob>,
    pub(crate) out: OutQueue,
    /// Live frames held back while a replay is in progress, so they follow it in order.
    /// Bounded like `out` (the backpressure rule applies to it).
    pub(crate) backlog: OutQueue,
    /// Events not delivered because of backpressure since the connection opened, by
    /// severity (AEP-0003 §8.4).
    pub(crate) dropped: Drops,
}

/// One client connection: what fan-out sees of it ([`Subscriber`], first, so a delivery
/// touches the connection's first cache lines), then its request state and deadlines.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Conn {
    pub(crate) subscriber: Subscriber,
    pub(crate) peer: SocketAddr,
    pub(crate) rbuf: Vec<u8>,
    /// The state of the HTTP request being read and answered ([`Request`]).
    pub(crate) request: Request,
    pub(crate) phase: Phase,
    /// Whether WRITABLE interest is registered.
    pub(crate) want_write: bool,
    /// Close once the output queue is flushed.
    pub(crate) close_after_flush: bool,
    /// Whether the reactor is told to read this connection ([`super::Interest::read`]).
    pub(crate) reading: bool,
    /// The deadline armed in the timer for this connection, with its generation
    /// (see `timer::Timers`).
    pub(crate) armed: Option<(Instant, u64)>,
    /// When the current phase's clock started (request timeouts, idle, linger).
    pub(crate) since: Instant,
    /// Last time anything was written to this connection (heartbeats).
    pub(crate) last_write: Instant,
    /// Whether the write side has been shut down.
    pub(crate) write_shut: bool,
    /// Whether the peer closed its writing side.
    pub(crate) peer_eof: bool,
    /// When a streaming connection's token expires (its JWT `exp`), closing it: an SSE
    /// stream after its last whole Event, a WebSocket with `closing`. `None`: never.
    pub(crate) expires_at: Option<Instant>,
    /// A sampled delivery (`aep_delivery_latency_seconds`): `out.pushed()` just past
    /// the fan-out frames queued in one settle, and the time they were queued; observed
    /// by `Core::write_to` once the socket took them. One at a time per connection.
    pub(crate) latency_mark: Option<(u64, Instant)>,
    /// The publication number (`decided`) of the last sampled delivery: a new sample
    /// starts only when fan-out decided a later Event for this connection.
    pub(crate) sampled: u64,
    /// This connection's share of the memory used, as last counted (`Ledger::recount`).
    pub(crate) charged: Charge,
    /// When the connection was accepted (its age in `GET /connections`).
    pub(crate) opened: Instant,
    /// The publication number (`Subscriber::decided`) of the last Event known written
    /// to the socket, and the mark that moves it: `out.pushed()` just past what fan-out
    /// had queued in one settle, with the `decided` of then. Moved per write, never per
    /// Event; `GET /connections` reports `decided - written_publication` as how far
    /// behind the consumer is.
    pub(crate) written_publication: u64,
    pub(crate) lag_mark: Option<(u64, u64)>,
}

impl Conn {
    /// The unfilled rest of a body of known length being read, when at least `min`
    /// (and at least 1) of its bytes are still to come, with that count, which filling
    /// it must lower; `None` in any other phase.
    pub(crate) fn body_room(&mut self, min: usize) -> Option<(&mut [u8], &mut usize)> {
        match &mut self.phase {
            Phase::Body {
                reader: BodyReader::Length(rem),
                body,
                ..
            } if *rem >= min.max(1) => {
                let at = body.len().checked_sub(*rem)?;
                Some((body.get_mut(at..)?, rem))
            }
            _ => None,
        }
    }

    /// The grant a streaming connection was admitted with (an SSE stream, a WebSocket):
    /// its holder, scopes, restrictions and expiry (AEP-0003 §8.1). `None` in any other
    /// phase.
    pub(crate) fn grant(&self) -> Option<&Grant> {
        match &self.phase {
            Phase::Sse { grant, .. } => Some(grant),
            Phase::Ws(ws) => Some(&ws.grant),
            _ => None,
        }
    }

    /// Moves the connection to phase `next` and returns the phase it leaves: the one
    /// place a connection's phase changes. The legal changes: from `Head` to any phase
    /// (a request read, its body, an upgrade, a stream); from `Body` or `Discard` back to
    /// `Head` or on to `Discard`; from anything to `Closing`. Any other is a bug: a debug
    /// build panics on it (a stream or a socket never goes back to reading requests).
    /// Entering a stream or a socket drops the HTTP request state ([`Request`]).
    pub(crate) fn enter(&mut self, next: Phase) -> Phase {
        debug_assert!(
            legal(&self.phase, &next),
            "illegal phase change {} -> {}",
            self.phase.name(),
            next.name()
        );
        if matches!(next, Phase::Sse { .. } | Phase::Ws(_)) {
            debug_assert!(
                self.request.awaiting.is_none() && self.request.answers.is_empty(),
                "a stream starts with no answer waiting"
            );
            self.request = Request::default();
        }
        std::mem::replace(&mut self.phase, next)
    }

    /// When this connection must be looked at next, from its phase (see `timer`): the
    /// SSE heartbeat, the WebSocket ping or idle close, a stream's token expiry, the request, keep-alive or
    /// linger timeout, or, while a `POST` waits for the stream (cluster mode),
    /// `post_wait` after it began. `None`: nothing is timed.
    pub(crate) fn deadline(&self, c: &Config, post_wait: Duration) -> Option<Instant> {
        let conn = self;
        if conn.request.awaiting.is_some() {
            return Some(conn.since + post_wait);
        }
        let expiry = |t: Instant| conn.expires_at.map_or(t, |e| t.min(e));
        Some(match &conn.phase {
            Phase::Sse { .. } => expiry(conn.last_write + c.heartbeat),
            Phase::Ws(ws) => {
                let idle = ws.last_read + c.ws_idle_timeout;
                expiry(match ws.hello {
                    Some(_) => idle.min(ws.last_ping + c.heartbeat),
                    None => idle,
                })
            }
            // No request in flight: nothing yet, or only answers the peer has not read (RFC
            // 9112 §9.3: a 408 would answer no request), or requests paused behind them.
            Phase::Head if conn.rbuf.is_empty() || conn.request.read_paused => {
                conn.since + c.idle_timeout
            }
            Phase::Head | Phase::Body { .. } | Phase::Discard(_) => {
                if conn.close_after_flush {
                    return None;
                }
                conn.since + c.request_timeout
            }
            Phase::Closing => {
                if conn.subscriber.out.is_empty() {
                    conn.since + LINGER
                } else {
                    conn.since + c.request_timeout.max(LINGER)
                }
            }
        })
    }

    /// Takes the next step of the HTTP state machine over the read buffer, as far as
    /// the connection alone can (RFC 9112): a complete head parsed (at most `max_head`
    /// bytes), a body read to its end (at most `max_body` bytes), a discarded body
    /// drained. Reading a head again only once a line feed arrived keeps a head trickled
    /// in byte by byte linear work. What needs the relay (routing, ingest, answers) is
    /// the returned [`Step`]'s, for the core to act on.
    pub(crate) fn step(&mut self, max_head: usize, max_body: usize, now: Instant) -> Step {
        if self.close_after_flush {
            self.rbuf.clear();
            return Step::Wait;
        }
        match &mut self.phase {
            Phase::Head => {
                if self.rbuf.is_empty() {
                    return Step::Wait;
                }
                // A head ends with a line feed, so it can only have completed if one
                // arrived since the last parse. Without this, a head of `max_head`
                // bytes (192 KiB by default) trickled in a byte at a time would be
                // parsed from its start once per byte: quadratic work on the reactor.
                // The first bytes are always parsed, so garbage is refused at once.
                let fresh = match self.rbuf.get(self.request.head_scanned..) {
                    Some(new) => {
                        self.request.head_scanned == 0 || memchr::memchr(b'\n', new).is_some()
                    }
                    None => true,
                };
                let mut head = std::mem::take(&mut self.request.head);
                let parsed = if fresh {
                    http::parse_head_into(&self.rbuf, &mut head)
                } else {
                    // No new line feed: still incomplete, as `parse_head` would say.
                    Ok(None)
                };
                let too_large = || {
                    let d = format!("the request head exceeds {max_head} bytes");
                    Step::Refuse(Code::HeadTooLarge, d)
                };
                if !matches!(parsed, Ok(Some(_))) {
                    // Its strings are reused by the next parse.
                    self.request.head = std::mem::take(&mut head);
                }
                match parsed {
                    Ok(Some(n)) if n > max_head => too_large(),
                    Ok(Some(n)) => {
                        self.rbuf.drain(..n);
                        self.request.head_scanned = 0;
                        Step::Head(head)
                    }
                    Ok(None) => {
                        self.request.head_scanned = self.rbuf.len();
                        if self.rbuf.len() > max_head {
                            return too_large();
                        }
                        Step::Wait
                    }
                    Err(HeadError::TooManyHeaders) => {
                        let d = format!("more than {} header lines", http::MAX_HEADERS);
                        Step::Refuse(Code::HeadTooLarge, d)
                    }
                    Err(HeadError::Malformed(why)) => {
                        let d = format!("malformed request head: {why}");
                        Step::Refuse(Code::BadRequest, d)
                    }
                }
            }
            Phase::Body { reader, body, .. } => {
                match reader.take(&mut self.rbuf, body, max_body) {
                    Ok(true) => {}
                    Ok(false) => return Step::Wait,
                    Err(e) => return Step::BadChunks(e),
                }
                let Phase::Body {
                    body,
                    close,
                    batch,
                    emit_as,
                    ..
                } = self.enter(Phase::Head)
                else {
                    unreachable!("in the body phase")
                };
                self.since = now;
                Step::Body {
                    body,
                    close,
                    batch,
                    emit_as,
                }
            }
            Phase::Discard(reader) => {
                // The answer went out already: read the body to its end and drop it.
                // A body that turns out malformed gets no second answer (one request,
                // one response): the connection just closes after what is queued.
                match reader.take(&mut self.rbuf, &mut Vec::new(), max_body) {
                    Ok(true) => {}
                    Ok(false) => return Step::Wait,
                    Err(_) => return Step::EndAfterAnswer,
                }
                self.enter(Phase::Head);
                self.since = now;
                Step::Again
            }
            Phase::Sse { .. } | Phase::Closing => {
                self.rbuf.clear();
                Step::Wait
            }
            Phase::Ws(_) => Step::Ws,
        }
    }

    /// Takes `head`, handled, back for the next request, unless the connection
    /// no longer reads requests (a stream, a WebSocket, closing) or the head's strings
    /// grew past [`KEPT_HEAD_BYTES`]: an idle connection keeps no more than that.
    pub(crate) fn keep_head(&mut self, head: RequestHead) {
        let conn = self;
        let reading = matches!(
            conn.phase,
            Phase::Head | Phase::Body { .. } | Phase::Discard(_)
        );
        let held = head.method.capacity()
            + head.path.capacity()
            + head.query.capacity()
            + head.headers.capacity() * std::mem::size_of::<(String, String)>()
            + head
                .headers
                .iter()
                .map(|(n, v)| n.capacity() + v.capacity())
                .sum::<usize>();
        if reading && held <= KEPT_HEAD_BYTES {
            conn.request.head = head;
        }
    }

    /// Queues one answer (its bytes complete, CORS headers in); with `close`, it is the
    /// last: nothing more is read, and the connection closes once it is flushed. The
    /// request clock restarts at `now`.
    pub(crate) fn answer(&mut self, bytes: Vec<u8>, close: bool, now: Instant) {
        self.send(bytes);
        if close {
            self.end_after_answer(now);
        } else {
            self.since = now;
        }
    }

    /// Ends this connection, whose current request already has its answer (a body being
    /// discarded turned out malformed, too large or too slow): flush, then close, with no
    /// second answer. HTTP/1.1 gives one final response per request (RFC 9112 §9.3); an
    /// extra one is paired by a client or a proxy with its next request.
    pub(crate) fn end_after_answer(&mut self, now: Instant) {
        self.close_after_flush = true;
        self.enter(Phase::Closing);
        self.rbuf.clear();
        self.since = now;
    }

    /// Request backpressure: whether the answers queued here have reached `max_output`
    /// bytes, in which case reading and request processing pause ([`Request::read_paused`])
    /// until a flush brings the queue back under the bound; the caller stops reading the
    /// socket. Without it a peer pipelining requests and never reading the answers grows
    /// the queue without limit (each ~25-byte `GET /events` queues a ~400-byte answer).
    /// Only the HTTP request phases pause: streams and closing connections discard their
    /// input (and must see EOF), and WebSockets bound their replies themselves.
    pub(crate) fn over_output_bound(&mut self, max_output: usize) -> bool {
        let request = matches!(
            self.phase,
            Phase::Head | Phase::Body { .. } | Phase::Discard(_)
        );
        if !request || self.subscriber.out.len() < max_output {
            return false;
        }
        self.request.read_paused = true;
        true
    }

    pub(crate) fn new(peer: SocketAddr, now: Instant) -> Conn {
        Conn {
            subscriber: Subscriber {
                mark: 0,
                decided: 0,
                fan_slot: 0,
                unit_generation: u64::MAX,
                unit_run: 0,
                unit_pending: 0,
                offered: 0,
                unannounced: Drops::default(),
                owes_notice: false,
                doomed: false,
                dirty: false,
                deflate_window: 0,
                announce_drops: false,
                replay: VecDeque::new(),
                out: OutQueue::default(),
                backlog: OutQueue::default(),
                dropped: Drops::default(),
            },
            peer,
            rbuf: Vec::new(),
            request: Request::default(),
            phase: Phase::Head,
            want_write: false,
            close_after_flush: false,
            reading: true,
            armed: None,
            since: now,
            last_write: now,
            write_shut: false,
            peer_eof: false,
            expires_at: None,
            latency_mark: None,
            sampled: 0,
            charged: Default::default(),
            opened: now,
            written_publication: 0,
            lag_mark: None,
        }
    }

    /// Ends this SSE stream for good with `last` (a comment saying why: shutting down,
    /// a token expired), after what it has queued, and closes once that is flushed.
    /// Returns the subscription the caller removes from the hub.
    pub(crate) fn end_sse(&mut self, last: &'static [u8], now: Instant) -> Option<SubId> {
        let Phase::Sse { sub, .. } = self.phase else {
            return None;
        };
        self.subscriber.end_streaming();
        self.send(last);
        self.enter(Phase::Closing);
        self.close_after_flush = true;
        self.since = now;
        Some(sub)
    }

    /// Queues raw bytes. Never while fan-out frames are pending for this connection in
    /// an open unit (they would be overtaken): callers end the unit first.
    pub(crate) fn send(&mut self, b: impl Into<Bytes>) {
        debug_assert_eq!(
            self.subscriber.unit_pending, 0,
            "output queued past a pending fan-out run"
        );
        self.subscriber.out.push(b.into());
    }
}

impl Subscriber {
    /// Whether a live Event just placed in the streams `placed` (`Store::last_placed`)
    /// is to be left to subscription `sub`'s replay in progress: one of those streams is
    /// still to be replayed for it, and the replay will reach the Event there, in order.
    pub(crate) fn replay_covers(&self, sub: SubId, placed: &[StreamId]) -> bool {
        !placed.is_empty()
            && !self.replay.is_empty()
            && self
                .replay
                .iter()
                .any(|j| j.sub == Some(sub) && placed.iter().any(|s| j.pending.contains(s)))
    }

    /// Ends what is in progress toward this consumer before a last frame: a replay not yet
    /// read from the store is dropped (nothing of it was delivered, so `closing` and SSE
    /// ids stay exact); the live frames held back behind it were counted as delivered, so
    /// they go into the output queue, in order, before the last frame.
    pub(crate) fn end_streaming(&mut self) {
        self.replay.clear();
        self.backlog.move_until(&mut self.out, usize::MAX);
    }
}

/// The core's connection table, keyed by [`ConnId`]: the reactor keeps each socket under
/// the same id. Ids of closed connections are reused.
#[derive(Debug, Default)]
pub(crate) struct Conns(Slab<Conn>);

impl Conns {
    /// An empty table with room for `n` connections.
    pub(crate) fn with_capacity(n: usize) -> Conns {
        Conns(Slab::with_capacity(n))
    }

    /// Adds `conn`; returns its id, and the connection as it now lives in the table.
    pub(crate) fn insert(&mut self, conn: Conn) -> (ConnId, &mut Conn) {
        let entry = self.0.vacant_entry();
        let id = ConnId(entry.key());
        (id, entry.insert(conn))
    }

    /// Removes connection `id` (which must be open).
    pub(crate) fn remove(&mut self, id: ConnId) -> Conn {
        self.0.remove(id.0)
    }

    pub(crate) fn contains(&self, id: ConnId) -> bool {
        self.0.contains(id.0)
    }

    pub(crate) fn get(&self, id: ConnId) -> Option<&Conn> {
        self.0.get(id.0)
    }

    pub(crate) fn get_mut(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.0.get_mut(id.0)
    }

    /// Open connections.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every open connection with its id, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ConnId, &Conn)> {
        self.0.iter().map(|(k, c)| (ConnId(k), c))
    }

    /// Every open connection with its id, in id order.
    #[cfg(test)]
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (ConnId, &mut Conn)> {
        self.0.iter_mut().map(|(k, c)| (ConnId(k), c))
    }

    /// The ids of every open connection, in id order.
    pub(crate) fn ids(&self) -> Vec<ConnId> {
        self.0.iter().map(|(k, _)| ConnId(k)).collect()
    }

    /// The table as fan-out sees it.
    pub(crate) fn subscribers(&mut self) -> Subscribers<'_> {
        Subscribers(&mut self.0)
    }
}

impl std::ops::Index<ConnId> for Conns {
    type Output = Conn;

    fn index(&self, id: ConnId) -> &Conn {
        &self.0[id.0]
    }
}

impl std::ops::IndexMut<ConnId> for Conns {
    fn index_mut(&mut self, id: ConnId) -> &mut Conn {
        &mut self.0[id.0]
    }
}

/// The connection table as fan-out sees it: each connection's [`Subscriber`] by
/// [`ConnId`], and nothing else of it.
#[derive(Debug)]
pub(crate) struct Subscribers<'a>(&'a mut Slab<Conn>);

impl Subscribers<'_> {
    /// Connection `id`'s subscriber part; `None` when it is gone.
    #[inline(always)]
    pub(crate) fn get_mut(&mut self, id: ConnId) -> Option<&mut Subscriber> {
        self.0.get_mut(id.0).map(|c| &mut c.subscriber)
    }

    /// Connection `id`'s subscriber part; `None` when it is gone.
    #[inline(always)]
    pub(crate) fn get(&self, id: ConnId) -> Option<&Subscriber> {
        self.0.get(id.0).map(|c| &c.subscriber)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most `cap` bytes per call and then blocks once.
    struct Trickle {
        cap: usize,
        got: Vec<u8>,
        block_next: bool,
    }
    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            if self.block_next {
                self.block_next = false;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.block_next = true;
            let n = b.len().min(self.cap);
            self.got.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn queue_keeps_order_across_partial_writes() {
        let mut q = OutQueue::default();
        let mut want = Vec::new();
        for i in 0..50u8 {
            let b = vec![i; (i as usize % 7) + 1];
            want.extend_from_slice(&b);
            q.push(Bytes::from(b));
        }
        let mut w = Trickle {
            cap: 3,
            got: Vec::new(),
            block_next: false,
        };
        while q.flush(&mut w, &mut Chunks::default()) == Flush::Blocked {
            assert_eq!(q.len(), want.len() - w.got.len());
        }
        assert!(q.is_empty());
        assert_eq!(w.got, want);
    }

    /// Records each call: how many buffers it was handed and how many bytes it took.
    /// Takes everything, except that the first call takes at most `first_cap` bytes.
    struct Counting {
        calls: Vec<(usize, usize)>,
        got: Vec<u8>,
        first_cap: usize,
    }
    impl Write for Counting {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[IoSlice::new(b)])
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            let mut cap = if self.calls.is_empty() {
                self.first_cap
            } else {
                usize::MAX
            };
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(cap);
                self.got.extend_from_slice(&b[..take]);
                n += take;
                cap -= take;
            }
            self.calls.push((bufs.len(), n));
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn queued(frames: usize) -> (OutQueue, Vec<u8>) {
        let mut q = OutQueue::default();
        let mut want = Vec::new();
        for i in 0..frames {
            let b = vec![(i % 251) as u8; 1 + i % 5];
            want.extend_from_slice(&b);
            q.push(Bytes::from(b));
        }
        (q, want)
    }

    /// A flush drains the whole queue with one `writev` (a batch of 64 WS deliveries
    /// queues ~128 buffers), not one per 16 buffers.
    #[test]
    fn flush_drains_the_queue_in_one_writev() {
        for frames in [2, 16, 17, 128, 129, 300, IOV_MAX] {
            let (mut q, want) = queued(frames);
            let mut w = Counting {
                calls: Vec::new(),
                got: Vec::new(),
                first_cap: usize::MAX,
            };
            assert_eq!(q.flush(&mut w, &mut Chunks::default()), Flush::Done);
            assert_eq!(w.calls, vec![(frames, want.len())], "{frames} buffers");
            assert_eq!(w.got, want);
            assert!(q.is_empty());
        }
    }

    /// Past `IOV_MAX` buffers the flush takes `IOV_MAX` at a time.
    #[test]
    fn flush_takes_iov_max_buffers_per_writev() {
        let (mut q, want) = queued(IOV_MAX + 476);
        let mut w = Counting {
            calls: Vec::new(),
            got: Vec::new(),
            first_cap: usize::MAX,
        };
        assert_eq!(q.flush(&mut w, &mut Chunks::default()), Flush::Done);
        let counts: Vec<usize> = w.calls.iter().map(|c| c.0).collect();
        assert_eq!(counts, vec![IOV_MAX, 476]);
        assert_eq!(w.got, want);
    }

    /// A partial write (the kernel took part of the batch) is followed by another write
    /// of what is left, from the middle of the cut buffer on.
    #[test]
    fn flush_loops_on_a_partial_write() {
        let (mut q, want) = queued(200);
        let mut w = Counting {
            calls: Vec::new(),
            got: Vec::new(),
            first_cap: 101,
        };
        assert_eq!(q.flush(&mut w, &mut Chunks::default()), Flush::Done);
        assert_eq!(w.calls.len(), 2, "{:?}", w.calls);
        assert_eq!(w.calls[0], (200, 101));
        assert_eq!(w.calls[1].1, want.len() - 101);
        assert_eq!(w.got, want);
        assert!(q.is_empty());
    }

    /// A transport that holds bytes of its own (TLS: sealed records), as its `flush`
    /// reports them: would block until `drained`.
    struct Holding {
        got: Vec<u8>,
        drained: bool,
    }
    impl Write for Holding {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.got.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            if self.drained {
                Ok(())
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            }
        }
    }

    /// Bytes the transport took but still holds (sealed, unwritten) keep the queue
    /// non-empty and counted in `len` (its bound, `aep_output_queued_bytes`), and the
    /// flush is `Blocked`, not `Done`, until the transport wrote them; `queued` counts
    /// only what the transport has not taken.
    #[test]
    fn bytes_the_transport_holds_count_until_it_wrote_them() {
        let (mut q, want) = queued(3);
        let mut w = Holding {
            got: Vec::new(),
            drained: false,
        };
        assert_eq!(q.flush(&mut w, &mut Chunks::default()), Flush::Blocked);
        assert_eq!(w.got, want, "the transport took everything");
        assert_eq!(q.queued(), 0);
        q.set_held(want.len() + 66);
        assert_eq!(q.len(), want.len() + 66);
        assert!(!q.is_empty());
        assert_eq!(q.flush(&mut w, &mut Chunks::default()), Flush::Blocked);
        w.drained = true;
        assert_eq!(q.flush(&mut w, &mut Chunks::default()), Flush::Done);
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
    }

    /// A queue cut short keeps only the rest of the frame being written (shared or its
    /// own), releasing every chunk it discards, and tells what it discarded.
    #[test]
    fn discarding_keeps_the_frame_being_written() {
        let mut chunks = Chunks::default();
        let tag = chunks.open(8);
        chunks.take(tag);
        let mut q = OutQueue::default();
        q.push(Bytes::from_static(b"aaaa|bbbb|"));
        q.push_shared(Bytes::from_static(b"cccc|dddd"), tag);
        let mut w = Trickle {
            cap: 2,
            got: Vec::new(),
            block_next: false,
        };
        assert_eq!(q.flush(&mut w, &mut chunks), Flush::Blocked);
        assert_eq!(q.own(), 10);
        let mut seen = Vec::new();
        let end =
            |b: &[u8], off: usize| off + b[off..].iter().position(|&c| c == b'|').unwrap() + 1;
        let n = q.discard_unwritten(&mut chunks, end, |b| seen.extend_from_slice(b));
        assert_eq!(n, 5 + 9);
        assert_eq!(seen, b"bbbb|cccc|dddd");
        assert_eq!(q.concat(), b"aa|");
        assert_eq!((q.len(), q.own()), (3, 5));
        assert_eq!(chunks.bytes(), 0, "the shared chunk was released");
        w.block_next = false;
        w.cap = 100;
        assert_eq!(q.flush(&mut w, &mut chunks), Flush::Done);
        assert_eq!(w.got, b"aaaa|");
        assert_eq!(q.own(), 0);
    }
}
