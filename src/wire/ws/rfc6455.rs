//! RFC 6455 framing for the server side, sans-IO: a [`Decoder`] that turns the bytes a
//! client sent into complete messages and control frames, and builders for the frames
//! the relay sends; [`client_frame`] builds the other side's frames, for test clients,
//! fuzz targets and load generators.
//!
//! Frame headers are parsed and formatted by tungstenite ([`FrameHeader`]); message
//! assembly, the protocol checks and every limit are ours, so they run inside the
//! relay's non-blocking reactor on its own read buffer and with its configured limits.
//!
//! Server frames are never masked (RFC 6455 §5.1), so a text frame carrying an Event is
//! the same bytes for every subscriber: [`text`] builds it once and fan-out shares it.

use super::deflate::{Agreed, InflateError, Inflater};
use bytes::{BufMut, Bytes, BytesMut};
use std::io::Cursor;
use tungstenite::protocol::frame::coding::{CloseCode, Control, Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

pub use crate::refusal::close_code;

/// Largest payload of a control frame (RFC 6455 §5.5).
const MAX_CONTROL_PAYLOAD: u64 = 125;

/// The room the decoder's text arena is made with, in bytes: an emitter's single-frame
/// text messages are copied into it back to back and handed out as slices of it.
pub const TEXT_ARENA: usize = 64 * 1024;

/// What the client sent, one complete unit at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// A complete text message (fragments reassembled), valid UTF-8. Once the text
    /// arena is on ([`Decoder::set_arena`]), a single-frame message of up to
    /// [`TEXT_ARENA`] bytes is a slice of it, which the messages of many reads share
    /// (one allocation per [`TEXT_ARENA`] bytes, not one per message), and keeps it
    /// alive while it lives; otherwise, and for a larger, reassembled or inflated
    /// message, an allocation of its own and of exactly its size.
    Text(Bytes),
    /// A ping; answer with a pong carrying the same payload (RFC 6455 §5.5.2).
    Ping(Bytes),
    /// A pong (liveness only).
    Pong,
    /// A close frame: the peer's code (`None` for an empty payload) and reason.
    Close(Option<u16>),
}

/// A protocol violation: close the connection with `code` and `reason` (RFC 6455 §7.1.7,
/// "Fail the WebSocket Connection").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Violation {
    /// The close code to send (1002, 1003, 1007 or 1009).
    pub code: u16,
    /// A short reason for the close frame (at most 123 bytes).
    pub reason: &'static str,
}

impl Violation {
    /// The refusal this is (counted under its name in `aep_events_rejected_total`):
    /// the RFC 6455 §7.4.1 name of the close code, prefixed `ws-`.
    pub fn refusal(&self) -> crate::refusal::Code {
        match self.code {
            close_code::UNSUPPORTED => crate::refusal::Code::WsUnsupportedData,
            close_code::INVALID_PAYLOAD => crate::refusal::Code::WsInvalidPayload,
            close_code::TOO_BIG => crate::refusal::Code::WsMessageTooBig,
            _ => crate::refusal::Code::WsProtocolError,
        }
    }
}

fn violation(code: u16, reason: &'static str) -> Violation {
    Violation { code, reason }
}

/// Reassembles client frames into [`Incoming`] units.
///
/// Invariant: `partial` is non-empty or `in_message` is set only while a fragmented text
/// message is being received; its length never exceeds `max_message`.
#[derive(Debug)]
pub struct Decoder {
    max_message: usize,
    partial: Vec<u8>,
    in_message: bool,
    /// `permessage-deflate` as negotiated (RFC 7692): RSV1 on a message's first frame
    /// then means compressed; without it RSV1 stays a protocol error.
    deflate: Option<Agreed>,
    /// Created at the first compressed message (most connections never send one).
    inflater: Option<Box<Inflater>>,
    /// The fragmented message being received is compressed (RSV1 on its first frame).
    compressed: bool,
    /// Where single-frame text messages are copied out of the read buffer while
    /// `use_arena` is set: always empty between messages, its room shared with the
    /// messages handed out before.
    arena: BytesMut,
    use_arena: bool,
}

impl Decoder {
    /// A decoder refusing messages longer than `max_message` bytes (after reassembly).
    pub fn new(max_message: usize) -> Decoder {
        Decoder::with_deflate(max_message, None)
    }

    /// A decoder for a connection that negotiated `permessage-deflate` with `deflate`
    /// (RFC 7692 §7.1), or none: compressed messages are inflated, bounded by
    /// `max_message` bytes of output (RFC 7692 §7.2.2; past it, close 1009).
    pub fn with_deflate(max_message: usize, deflate: Option<Agreed>) -> Decoder {
        Decoder {
            max_message,
            partial: Vec::new(),
            in_message: false,
            deflate,
            inflater: None,
            compressed: false,
            arena: BytesMut::new(),
            use_arena: false,
        }
    }

    /// Heap bytes the decoder keeps (a fragmented message's reassembly, the text arena's
    /// room), and whether it keeps an inflater (`permessage-deflate` from the client).
    pub fn heap_bytes(&self) -> (usize, bool) {
        (
            self.partial.capacity() + self.arena.capacity(),
            self.inflater.is_some(),
        )
    }

    /// Turns the text arena on or off. The relay turns it on for a connection whose
    /// `hello` declared it an emitter (AEP-0003 §4), whose messages are mostly Events,
    /// often many per read: no allocation per message, and at most [`TEXT_ARENA`] bytes
    /// kept between messages. Consumers, whose messages are few and small, keep it off
    /// and hold no room between messages. Turning it off lets go of the arena (messages
    /// still alive keep their bytes).
    pub fn set_arena(&mut self, on: bool) {
        if !on && self.use_arena {
            self.arena = BytesMut::new();
        }
        self.use_arena = on;
    }

    /// The messages wholly in `buf` that this decoder would accept, walked by their
    /// frame headers alone (nothing is decoded or consumed): `(messages, payload
    /// bytes)`, counting a message at its final data frame and the payload of every data
    /// frame. The walk stops at the first frame [`Decoder::next`] would refuse, and the
    /// count is at most one message per 64 bytes of payload (no Event is that small),
    /// so a peer cannot inflate it with cheap frames. The relay announces the result to
    /// the fan-out before decoding an emitter's read, so that the frames of the Events
    /// are placed in arenas sized once (as a `POST` announces its Events), not grown as
    /// they fill.
    pub fn data_ahead(&self, buf: &[u8]) -> (usize, usize) {
        let (mut messages, mut bytes, mut at) = (0usize, 0usize, 0usize);
        while let Some(rest) = buf.get(at..) {
            let mut cur = Cursor::new(rest);
            let Ok(Some((header, len))) = FrameHeader::parse(&mut cur) else {
                break;
            };
            let refused = self.check_header(&header, len).is_err()
                || matches!(
                    header.opcode,
                    OpCode::Control(Control::Reserved(_)) | OpCode::Data(Data::Reserved(_))
                );
            let Some(end) = usize::try_from(len)
                .ok()
                .and_then(|len| (cur.position() as usize).checked_add(len))
                .and_then(|n| at.checked_add(n))
                .filter(|&end| end <= buf.len() && !refused)
            else {
                break;
            };
            if let OpCode::Data(_) = header.opcode {
                bytes += len as usize;
                messages += usize::from(header.is_final);
            }
            at = end;
        }
        (messages.min(bytes / 64), bytes)
    }

    /// The checks a frame's header alone decides (RFC 6455 §5.1-§5.5, RFC 7692 §6,
    /// AEP-0003 §3.5), in the order [`Decoder::next`] reports them: the frame is masked,
    /// no reserved bit is set (RSV1 only on the first frame of a compressed message,
    /// once the extension was negotiated), a control frame is final and at most 125
    /// bytes, and it is not binary. Returns the mask and whether the frame starts a
    /// compressed message.
    fn check_header(&self, header: &FrameHeader, len: u64) -> Result<([u8; 4], bool), Violation> {
        let Some(mask) = header.mask else {
            return Err(violation(
                close_code::PROTOCOL,
                "client frames must be masked",
            ));
        };
        // RFC 7692 §6: RSV1 marks a compressed message, on its first frame only and
        // only once the extension was negotiated; control frames and continuations
        // never carry it (§6.1). Anything else reserved is a protocol error.
        let compressed_start = header.rsv1
            && self.deflate.is_some()
            && matches!(header.opcode, OpCode::Data(Data::Text | Data::Binary));
        if (header.rsv1 && !compressed_start) || header.rsv2 || header.rsv3 {
            return Err(violation(close_code::PROTOCOL, "reserved bits set"));
        }
        let control = matches!(header.opcode, OpCode::Control(_));
        if control && (len > MAX_CONTROL_PAYLOAD || !header.is_final) {
            return Err(violation(
                close_code::PROTOCOL,
                "control frames must be final and carry at most 125 bytes",
            ));
        }
        if let OpCode::Data(Data::Binary) = header.opcode {
            return Err(violation(
                close_code::UNSUPPORTED,
                "binary frames are reserved in AEP 0.1 (AEP-0003 §3.5)",
            ));
        }
        Ok((mask, compressed_start))
    }

    /// A single-frame text message: checked to be UTF-8, then, with the text arena on
    /// and at most [`TEXT_ARENA`] bytes, copied into the arena and handed out as its
    /// slice (its room taken back once no message points into it, or made anew:
    /// [`crate::buf::reclaim_or_fresh`]); otherwise copied into an allocation of its own.
    fn text_message(&mut self, payload: &[u8]) -> Result<Incoming, Violation> {
        std::str::from_utf8(payload).map_err(|_| invalid_utf8())?;
        if !self.use_arena || payload.len() > TEXT_ARENA {
            return Ok(Incoming::Text(Bytes::copy_from_slice(payload)));
        }
        crate::buf::reclaim_or_fresh(&mut self.arena, payload.len(), TEXT_ARENA);
        self.arena.extend_from_slice(payload);
        Ok(Incoming::Text(self.arena.split().freeze()))
    }

    /// Inflates a compressed message's payload and checks it is UTF-8 text.
    fn inflate(&mut self, payload: &[u8]) -> Result<Incoming, Violation> {
        let agreed = self
            .deflate
            .as_ref()
            .expect("RSV1 is refused without the extension");
        let inflater = self
            .inflater
            .get_or_insert_with(|| Box::new(Inflater::new(agreed)));
        match inflater.message(payload, self.max_message) {
            Ok(text) => match String::from_utf8(text) {
                // Exact size, as for a reassembled message.
                Ok(s) => Ok(Incoming::Text(Bytes::from(
                    s.into_bytes().into_boxed_slice(),
                ))),
                Err(_) => Err(invalid_utf8()),
            },
            Err(InflateError::TooBig) => Err(violation(
                close_code::TOO_BIG,
                "message inflates past the relay's limit (RFC 7692 §7.2.2)",
            )),
            Err(InflateError::Corrupt) => Err(violation(
                close_code::INVALID_PAYLOAD,
                "compressed message is not valid DEFLATE data (RFC 7692 §7.2.2)",
            )),
        }
    }

    /// Decodes the next unit from `buf` (the unread client bytes), unmasking payloads in
    /// place. Frames consumed are counted into `*used`; the caller drops `buf[..*used]`
    /// once it is done with the buffer. Returns `Ok(None)` when `buf` holds no complete
    /// unit (a fragment consumed so far is kept inside the decoder).
    ///
    /// A frame is refused from its header alone when it would take the message past
    /// the limit, so no more than `max_message` payload bytes are ever buffered.
    ///
    /// # Errors
    /// [`Violation`]: an unmasked frame, reserved bits or opcodes, a fragmented or
    /// oversized control frame, a continuation without a message or a new message
    /// inside one, a malformed close payload (1002); a binary frame (1003); text or a
    /// close reason that is not UTF-8 (1007); a message over the limit (1009).
    ///
    /// # Spec
    /// RFC 6455 §5.1–§5.6, §7.4; AEP-0003 §3.5 #2.
    pub fn next(
        &mut self,
        buf: &mut [u8],
        used: &mut usize,
    ) -> Result<Option<Incoming>, Violation> {
        loop {
            let rest = &mut buf[*used..];
            let mut cur = Cursor::new(&rest[..]);
            let (header, len) = match FrameHeader::parse(&mut cur) {
                Ok(Some(h)) => h,
                Ok(None) => return Ok(None),
                Err(_) => return Err(violation(close_code::PROTOCOL, "reserved opcode")),
            };
            let head_len = cur.position() as usize;
            let (mask, compressed_start) = self.check_header(&header, len)?;
            let control = matches!(header.opcode, OpCode::Control(_));
            match header.opcode {
                OpCode::Data(Data::Continue) if !self.in_message => {
                    return Err(violation(
                        close_code::PROTOCOL,
                        "continuation without a message",
                    ))
                }
                OpCode::Data(Data::Text) if self.in_message => {
                    return Err(violation(
                        close_code::PROTOCOL,
                        "new message inside a fragmented one",
                    ))
                }
                _ => {}
            }
            if !control && (self.partial.len() as u64).saturating_add(len) > self.max_message as u64
            {
                return Err(violation(
                    close_code::TOO_BIG,
                    "message over the relay's limit",
                ));
            }
            let len = len as usize;
            if rest.len() - head_len < len {
                return Ok(None);
            }
            *used += head_len + len;
            let payload = &mut rest[head_len..head_len + len];
            unmask(payload, mask);
            let payload = &*payload;
            match header.opcode {
                OpCode::Control(Control::Ping) => {
                    return Ok(Some(Incoming::Ping(Bytes::copy_from_slice(payload))))
                }
                OpCode::Control(Control::Pong) => return Ok(Some(Incoming::Pong)),
                OpCode::Control(Control::Close) => return parse_close(payload).map(Some),
                OpCode::Control(Control::Reserved(_)) | OpCode::Data(Data::Reserved(_)) => {
                    return Err(violation(close_code::PROTOCOL, "reserved opcode"))
                }
                OpCode::Data(Data::Binary) => unreachable!("refused above"),
                OpCode::Data(Data::Text) | OpCode::Data(Data::Continue) => {
                    if header.is_final && !self.in_message {
                        if compressed_start {
                            return self.inflate(payload).map(Some);
                        }
                        // The common case: one frame, one message, one copy out of the
                        // read buffer (into the text arena, when it is on).
                        return self.text_message(payload).map(Some);
                    }
                    if !self.in_message {
                        self.compressed = compressed_start;
                    }
                    self.partial.extend_from_slice(payload);
                    self.in_message = !header.is_final;
                    if header.is_final {
                        let msg = std::mem::take(&mut self.partial);
                        if std::mem::take(&mut self.compressed) {
                            return self.inflate(&msg).map(Some);
                        }
                        return match String::from_utf8(msg) {
                            // Exact size (the buffer grew by doubling): an Event
                            // held from this message must not keep the slack alive.
                            Ok(s) => Ok(Some(Incoming::Text(Bytes::from(
                                s.into_bytes().into_boxed_slice(),
                            )))),
                            Err(_) => Err(invalid_utf8()),
                        };
                    }
                }
            }
        }
    }
}

/// Unmasks a client frame's payload in place (RFC 6455 §5.3: byte `i` XOR
/// `mask[i % 4]`), eight bytes at a time: the payload starts at mask index 0, so every
/// 8-byte word takes the mask twice over.
#[inline]
fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    let word = u64::from_ne_bytes([
        mask[0], mask[1], mask[2], mask[3], mask[0], mask[1], mask[2], mask[3],
    ]);
    let mut chunks = payload.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(w) ^ word).to_ne_bytes());
    }
    // The tail starts at a multiple of 8, so at mask index 0 again.
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i & 3];
    }
}

fn invalid_utf8() -> Violation {
    violation(close_code::INVALID_PAYLOAD, "text is not valid UTF-8")
}

fn parse_close(payload: &[u8]) -> Result<Incoming, Violation> {
    match payload.len() {
        0 => Ok(Incoming::Close(None)),
        1 => Err(violation(close_code::PROTOCOL, "close payload of one byte")),
        _ => {
            let code = u16::from_be_bytes([payload[0], payload[1]]);
            if !CloseCode::from(code).is_allowed() {
                return Err(violation(
                    close_code::PROTOCOL,
                    "close code not allowed on the wire",
                ));
            }
            std::str::from_utf8(&payload[2..]).map_err(|_| invalid_utf8())?;
            Ok(Incoming::Close(Some(code)))
        }
    }
}

/// One unmasked, final server frame with `opcode` around `payload`.
fn frame(opcode: OpCode, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::new();
    write_frame(opcode, payload, &mut out);
    out.freeze()
}

/// Appends one unmasked, final server frame with `opcode` around `payload` to `out`.
fn write_frame(opcode: OpCode, payload: &[u8], out: &mut BytesMut) {
    let header = FrameHeader {
        is_final: true,
        rsv1: false,
        rsv2: false,
        rsv3: false,
        opcode,
        mask: None,
    };
    let len = payload.len() as u64;
    // RFC 6455 §5.2: the header is 2, 4 or 10 bytes, unmasked from a server.
    let mut head = [0u8; 10];
    let mut cursor = Cursor::new(&mut head[..]);
    header
        .format(len, &mut cursor)
        .expect("a frame header fits in 10 bytes");
    let n = cursor.position() as usize;
    out.reserve(n + payload.len());
    out.put_slice(&head[..n]);
    out.put_slice(payload);
}

/// The frame the relay wrote at the front of `b` (unmasked): its first byte (FIN, RSV1,
/// opcode), header length and payload length; `None` when `b` holds less than its
/// header.
pub(crate) fn server_frame(b: &[u8]) -> Option<(u8, usize, usize)> {
    let (&b0, &b1) = (b.first()?, b.get(1)?);
    Some(match b1 & 0x7f {
        126 => (
            b0,
            4,
            usize::from(u16::from_be_bytes(b.get(2..4)?.try_into().ok()?)),
        ),
        127 => {
            let n = u64::from_be_bytes(b.get(2..10)?.try_into().ok()?);
            (b0, 10, usize::try_from(n).ok()?)
        }
        n => (b0, 2, usize::from(n)),
    })
}

/// Appends the server text frame of [`text`] to `out` (fan-out lays the frames of one
/// ingest unit back to back in one buffer, see `fanout`).
pub fn write_text(payload: &[u8], out: &mut BytesMut) {
    write_frame(OpCode::Data(Data::Text), payload, out)
}

/// A server text frame carrying `payload` (an Event's bytes or an AEP frame's JSON):
/// a 2-, 4- or 10-byte header and the payload, unmasked, in one buffer that fan-out
/// shares between subscribers.
///
/// ```
/// let f = aep_relay::wire::ws::rfc6455::text(b"{}");
/// assert_eq!(&f[..], b"\x81\x02{}");
/// ```
pub fn text(payload: &[u8]) -> Bytes {
    frame(OpCode::Data(Data::Text), payload)
}

/// A pong echoing a ping's payload (RFC 6455 §5.5.3).
pub fn pong(payload: &[u8]) -> Bytes {
    frame(OpCode::Control(Control::Pong), payload)
}

/// A close frame with `code` and `reason` (cut to the 123 bytes a control frame holds,
/// on a character boundary).
pub fn close(code: u16, reason: &str) -> Bytes {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut p = Vec::with_capacity(2 + end);
    p.extend_from_slice(&code.to_be_bytes());
    p.extend_from_slice(&reason.as_bytes()[..end]);
    frame(OpCode::Control(Control::Close), &p)
}

/// Appends one client-to-server frame to `out`, for test clients, fuzz targets and load
/// generators (the relay itself only decodes client frames).
///
/// `first_byte` is the frame's first byte as sent: FIN (0x80), RSV1–3 (0x40, 0x20, 0x10)
/// and the opcode in the low nibble, e.g. 0x81 a final text frame, 0x01 a first text
/// fragment, 0x80 the last continuation, 0x89 a ping, 0x88 a close; it is written as
/// given, so reserved bits and opcodes can be sent on purpose. The length takes the
/// shortest form of RFC 6455 §5.2 (7 bits, then 16, then 64). With `Some(key)` the mask
/// bit is set, the 4-byte key follows and the payload is XORed with it (§5.3); `None`
/// builds the unmasked frame a conformant server must refuse (§5.1: the relay closes
/// with 1002). `out` grows by 2 to 14 header bytes plus `payload.len()`.
///
/// ```
/// use aep_relay::wire::ws::rfc6455::{client_frame, Decoder, Incoming};
///
/// let mut buf = Vec::new();
/// client_frame(0x81, br#"{"type":"ping","t":1}"#, Some([1, 2, 3, 4]), &mut buf);
/// assert_eq!(&buf[..2], &[0x81, 0x80 | 21]);
/// let (mut decoder, mut used) = (Decoder::new(1024), 0);
/// assert_eq!(
///     decoder.next(&mut buf, &mut used),
///     Ok(Some(Incoming::Text(br#"{"type":"ping","t":1}"#.as_ref().into())))
/// );
/// assert_eq!(used, buf.len());
///
/// let mut unmasked = Vec::new();
/// client_frame(0x81, b"{}", None, &mut unmasked);
/// assert_eq!(unmasked, b"\x81\x02{}");
/// assert_eq!(decoder.next(&mut unmasked, &mut 0).unwrap_err().code, 1002);
/// ```
pub fn client_frame(first_byte: u8, payload: &[u8], mask: Option<[u8; 4]>, out: &mut Vec<u8>) {
    let header = FrameHeader {
        is_final: first_byte & 0x80 != 0,
        rsv1: first_byte & 0x40 != 0,
        rsv2: first_byte & 0x20 != 0,
        rsv3: first_byte & 0x10 != 0,
        opcode: OpCode::from(first_byte & 0x0F),
        mask,
    };
    out.reserve(14 + payload.len());
    header
        .format(payload.len() as u64, out)
        .expect("writing to a Vec cannot fail");
    match mask {
        Some(key) => out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i & 3])),
        None => out.extend_from_slice(payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame.
    fn client(first: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        client_frame(first, payload, Some([0x11, 0x22, 0x33, 0x44]), &mut out);
        out
    }

    /// The word-wise unmask equals the byte-wise definition (RFC 6455 §5.3) at every
    /// length around the word size, for masks with every byte distinct.
    #[test]
    fn unmask_matches_the_bytewise_definition() {
        let mask = [0x01, 0x80, 0x7f, 0xfe];
        for len in 0..40 {
            let plain: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(37)).collect();
            let mut got = plain.clone();
            unmask(&mut got, mask);
            let want: Vec<u8> = plain
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ mask[i % 4])
                .collect();
            assert_eq!(got, want, "len {len}");
        }
    }

    fn decode_all(d: &mut Decoder, mut bytes: Vec<u8>) -> Result<Vec<Incoming>, Violation> {
        let mut used = 0;
        let mut out = Vec::new();
        while let Some(u) = d.next(&mut bytes, &mut used)? {
            out.push(u);
        }
        assert_eq!(used, bytes.len(), "every complete frame is consumed");
        Ok(out)
    }

    fn text_of(u: Incoming) -> Bytes {
        match u {
            Incoming::Text(t) => t,
            other => panic!("expected text, got {other:?}"),
        }
    }

    /// A text message of `len` bytes that no other `(i, len)` repeats: its index in
    /// decimal, then filler.
    fn msg(i: usize, len: usize) -> Vec<u8> {
        let mut m = format!("{i:08}").into_bytes();
        m.extend((0..len.saturating_sub(8)).map(|k| b'a' + ((i * 7 + k) % 26) as u8));
        m.truncate(len);
        m
    }

    /// Messages `0..count` of `len` bytes (`msg`), sent in one read and decoded: their
    /// texts, checked.
    fn texts(d: &mut Decoder, count: usize, len: usize) -> Vec<Bytes> {
        let mut wire = Vec::new();
        for i in 0..count {
            wire.extend(client(0x81, &msg(i, len)));
        }
        let got: Vec<Bytes> = decode_all(d, wire)
            .unwrap()
            .into_iter()
            .map(text_of)
            .collect();
        for (i, t) in got.iter().enumerate() {
            assert_eq!(&t[..], &msg(i, len)[..]);
        }
        got
    }

    /// With the text arena on, single-frame text messages are slices of one arena, back
    /// to back (no allocation per message); once none of them is alive the message
    /// that does not fit takes the arena's room back; a message still held is never
    /// overwritten, however many follow it (they go to other room); a message larger
    /// than the arena gets its own allocation.
    #[test]
    fn single_frame_texts_share_the_text_arena_and_held_ones_stay_intact() {
        let mut d = Decoder::new(1 << 20);
        d.set_arena(true);
        let got = texts(&mut d, 3, 500);
        // Adjacent in one allocation.
        assert_eq!(got[0].as_ptr().wrapping_add(500), got[1].as_ptr());
        assert_eq!(got[1].as_ptr().wrapping_add(500), got[2].as_ptr());
        let first = got[0].as_ptr();
        drop(got);

        // One message at a time, each dropped once handled (as the relay does).
        let one = |d: &mut Decoder, i: usize| -> Bytes {
            let mut used = 0;
            let mut wire = client(0x81, &msg(i, 500));
            let t = text_of(d.next(&mut wire, &mut used).unwrap().unwrap());
            assert_eq!(&t[..], &msg(i, 500)[..]);
            t
        };
        let n = TEXT_ARENA / 500 + 1;
        let at: Vec<_> = (0..n).map(|i| one(&mut d, i).as_ptr()).collect();
        assert!(at.contains(&first), "the arena's room was taken back");

        // Held: the arena cannot take its room back while it lives.
        let held = one(&mut d, 1_000_000);
        let span = held.as_ptr() as usize..held.as_ptr() as usize + held.len();
        for i in 0..3 * n {
            let t = one(&mut d, i);
            assert!(
                !span.contains(&(t.as_ptr() as usize)),
                "message {i} over the held one"
            );
        }
        assert_eq!(&held[..], &msg(1_000_000, 500)[..]);

        // Exactly the arena's size fits it; one byte more gets an allocation of its own.
        for len in [TEXT_ARENA, TEXT_ARENA + 1, TEXT_ARENA * 2 + 5] {
            let big = msg(3, len);
            let got = decode_all(&mut d, client(0x81, &big)).unwrap();
            assert_eq!(&text_of(got.into_iter().next().unwrap())[..], &big[..]);
        }
    }

    /// With the text arena off (the default; a consumer), each message has an allocation
    /// of its own and the decoder keeps no room between messages; turning it off lets go
    /// of the arena, and a message handed out before keeps its bytes.
    #[test]
    fn without_the_text_arena_each_message_is_its_own_allocation() {
        let mut d = Decoder::new(1 << 20);
        let got = texts(&mut d, 2, 100);
        assert_ne!(got[0].as_ptr().wrapping_add(100), got[1].as_ptr());
        assert_eq!(d.arena.capacity(), 0, "no room kept");
        d.set_arena(true);
        let kept = text_of(
            decode_all(&mut d, client(0x81, &msg(7, 100)))
                .unwrap()
                .remove(0),
        );
        assert!(d.arena.capacity() > 0);
        d.set_arena(false);
        assert_eq!(d.arena.capacity(), 0, "the arena let go");
        assert_eq!(&kept[..], &msg(7, 100)[..]);
    }

    /// `data_ahead` counts the messages wholly read that the decoder would accept
    /// (at their final frame) and their payload bytes, not control frames nor a frame
    /// still arriving; it stops at a frame `next` would refuse, never counts more than a
    /// message per 64 payload bytes, and consumes nothing.
    #[test]
    fn data_ahead_counts_acceptable_messages_only() {
        let d = Decoder::new(1 << 20);
        let mut b = client(0x81, &[b'a'; 100]);
        b.extend(client(0x89, b"ping"));
        b.extend(client(0x01, &[b'b'; 300]));
        b.extend(client(0x80, &[b'c'; 50]));
        assert_eq!(d.data_ahead(&b), (2, 450));
        let mut cut = b.clone();
        cut.extend(&client(0x81, &[b'c'; 200])[..150]);
        assert_eq!(d.data_ahead(&cut), (2, 450), "a partial frame waits");
        assert_eq!(d.data_ahead(&[]), (0, 0));
        // Stops at what would be refused: unmasked, binary.
        for bad in [vec![0x81, 0x02, b'h', b'i'], client(0x82, &[0; 100])] {
            let mut r = b.clone();
            r.extend(bad);
            r.extend(client(0x81, &[b'd'; 100]));
            assert_eq!(d.data_ahead(&r), (2, 450));
        }
        // Many empty messages do not announce many Events.
        let mut cheap = Vec::new();
        for _ in 0..100 {
            cheap.extend(client(0x81, b""));
        }
        assert_eq!(d.data_ahead(&cheap), (0, 0));
        // A header claiming more than can ever arrive stops the walk.
        let mut huge = vec![0x81, 0xff];
        huge.extend(u64::MAX.to_be_bytes());
        huge.extend([1, 2, 3, 4]);
        assert_eq!(d.data_ahead(&huge), (0, 0));
    }

    #[test]
    fn fragments_reassemble_around_control_frames() {
        let mut d = Decoder::new(1024);
        let mut b = client(0x01, b"{\"a\":");
        b.extend(client(0x89, b"hi"));
        b.extend(client(0x00, b"1"));
        b.extend(client(0x80, b"}"));
        let got = decode_all(&mut d, b).unwrap();
        assert_eq!(
            got,
            vec![
                Incoming::Ping(Bytes::from_static(b"hi")),
                Incoming::Text(Bytes::from_static(b"{\"a\":1}"))
            ]
        );
    }

    #[test]
    fn partial_input_consumes_nothing_until_complete() {
        let mut d = Decoder::new(1024);
        let full = client(0x81, b"hello");
        for cut in 0..full.len() {
            let mut part = full[..cut].to_vec();
            let mut used = 0;
            assert_eq!(d.next(&mut part, &mut used), Ok(None));
            assert_eq!(used, 0);
        }
    }

    #[test]
    fn violations_map_to_rfc_close_codes() {
        let cases: Vec<(Vec<u8>, u16)> = vec![
            (client(0x82, b"bin"), 1003),
            (client(0x81, &[0xff, 0xfe]), 1007),
            (vec![0x81, 0x02, b'h', b'i'], 1002),
            (client(0x80, b"x"), 1002),
            (client(0xC1, b"x"), 1002),
            (client(0x83, b"x"), 1002),
            (client(0x09, b"x"), 1002),
            (client(0x88, b"\x03"), 1002),
            (client(0x88, b"\x03\xed"), 1002),
            (client(0x81, &vec![b'a'; 2000]), 1009),
        ];
        for (bytes, code) in cases {
            let mut d = Decoder::new(1024);
            let got = decode_all(&mut d, bytes.clone()).unwrap_err();
            assert_eq!(got.code, code, "{bytes:?}");
        }
        // Oversize is refused from the header alone, before the payload arrives.
        let mut d = Decoder::new(1024);
        let mut head = client(0x81, &vec![b'a'; 70_000])[..14].to_vec();
        assert_eq!(d.next(&mut head, &mut 0).unwrap_err().code, 1009);
    }

    #[test]
    fn close_frames_parse_and_build() {
        let mut d = Decoder::new(1024);
        let got = decode_all(&mut d, client(0x88, b"\x03\xe8bye")).unwrap();
        assert_eq!(got, vec![Incoming::Close(Some(1000))]);
        let got = decode_all(&mut d, client(0x88, b"")).unwrap();
        assert_eq!(got, vec![Incoming::Close(None)]);
        let long = "é".repeat(100);
        let c = close(1001, &long);
        assert_eq!(c[0], 0x88);
        assert!(c.len() <= 127);
        assert!(std::str::from_utf8(&c[4..]).is_ok());
    }

    #[test]
    fn client_frames_round_trip_at_every_length_form() {
        for len in [0, 1, 125, 126, 65_535, 65_536, 70_000] {
            let payload: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let mut f = Vec::new();
            client_frame(0x81, &payload, Some([0xde, 0xad, 0xbe, 0xef]), &mut f);
            let head = match len {
                0..=125 => 6,
                126..=65_535 => 8,
                _ => 14,
            };
            assert_eq!(f.len(), head + len, "shortest length form for {len}");
            assert_eq!(f[1] & 0x80, 0x80, "mask bit");
            let got = decode_all(&mut Decoder::new(1 << 20), f).unwrap();
            assert_eq!(got, vec![Incoming::Text(Bytes::from(payload))]);
        }
        // The first byte is sent as given: reserved bits reach the decoder.
        let mut f = Vec::new();
        client_frame(0xC1, b"x", Some([1, 2, 3, 4]), &mut f);
        assert_eq!(f[0], 0xC1);
        let got = decode_all(&mut Decoder::new(1024), f).unwrap_err();
        assert_eq!(got.code, close_code::PROTOCOL);
    }

    #[test]
    fn server_frames_use_the_shortest_length_form() {
        assert_eq!(text(&[b'x'; 125])[1], 125);
        let f = text(&[b'x'; 126]);
        assert_eq!((f[1], &f[2..4]), (126, &[0u8, 126][..]));
        let f = text(&vec![b'x'; 70_000]);
        assert_eq!(f[1], 127);
        assert_eq!(f.len(), 10 + 70_000);
        assert_eq!(&pong(b"p")[..], b"\x8a\x01p");
    }
}
