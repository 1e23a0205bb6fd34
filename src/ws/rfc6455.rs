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

/// The room the decoder's text arena is made with, in bytes: single-frame text messages
/// are copied into it back to back and handed out as slices of it.
pub const TEXT_ARENA: usize = 64 * 1024;

/// What the client sent, one complete unit at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// A complete text message (fragments reassembled), valid UTF-8. A single-frame
    /// message of up to [`TEXT_ARENA`] bytes is a slice of the decoder's text arena,
    /// which the messages of many reads share (one allocation per [`TEXT_ARENA`] bytes,
    /// not one per message); a larger, reassembled or inflated one has an allocation of
    /// its own. Whoever keeps an Event from it for long copies its bytes (the replay
    /// buffer does).
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
    pub fn refusal(&self) -> crate::Code {
        match self.code {
            close_code::UNSUPPORTED => crate::Code::WsUnsupportedData,
            close_code::INVALID_PAYLOAD => crate::Code::WsInvalidPayload,
            close_code::TOO_BIG => crate::Code::WsMessageTooBig,
            _ => crate::Code::WsProtocolError,
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
    /// Where single-frame text messages are copied out of the read buffer: always empty
    /// between messages, its room shared with the messages handed out before.
    arena: BytesMut,
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
        }
    }

    /// The data frames wholly in `buf`, walked by their headers alone (nothing is
    /// decoded or consumed): `(frames, payload bytes)`. The relay announces them to the
    /// fan-out before decoding, so that the frames of the Events they carry are placed
    /// in arenas sized once (as a `POST` body's length sizes them), not grown as they
    /// fill. An estimate: control frames are left out, fragments each count as a frame.
    pub fn data_ahead(&self, buf: &[u8]) -> (usize, usize) {
        let (mut frames, mut bytes, mut at) = (0usize, 0usize, 0usize);
        while let Some(rest) = buf.get(at..) {
            let mut cur = Cursor::new(rest);
            let Ok(Some((header, len))) = FrameHeader::parse(&mut cur) else {
                break;
            };
            let Some(end) = usize::try_from(len)
                .ok()
                .and_then(|len| (cur.position() as usize).checked_add(len))
                .and_then(|n| at.checked_add(n))
                .filter(|&end| end <= buf.len())
            else {
                break;
            };
            if matches!(header.opcode, OpCode::Data(_)) {
                frames += 1;
                bytes += end - at;
            }
            at = end;
        }
        (frames, bytes)
    }

    /// A single-frame text message: checked to be UTF-8, copied into the text arena and
    /// handed out as its slice. The arena's room is taken back once no message points
    /// into it any more (`try_reclaim`, no allocation), or made anew; it is never grown
    /// in place, which would copy the messages before it. A message larger than
    /// [`TEXT_ARENA`] gets an allocation of its own, so a connection keeps at most that
    /// much room between messages.
    fn text_message(&mut self, payload: &[u8]) -> Result<Incoming, Violation> {
        std::str::from_utf8(payload).map_err(|_| invalid_utf8())?;
        if payload.len() > TEXT_ARENA {
            return Ok(Incoming::Text(Bytes::copy_from_slice(payload)));
        }
        if self.arena.capacity() < payload.len() && !self.arena.try_reclaim(TEXT_ARENA) {
            self.arena = BytesMut::with_capacity(TEXT_ARENA);
        }
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
                // Exact size, as for a reassembled message (see `Incoming::Text`).
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
            let Some(mask) = header.mask else {
                return Err(violation(
                    close_code::PROTOCOL,
                    "client frames must be masked",
                ));
            };
            let control = matches!(header.opcode, OpCode::Control(_));
            // RFC 7692 §6: RSV1 marks a compressed message, on its first frame only and
            // only once the extension was negotiated; control frames and continuations
            // never carry it (§6.1). Anything else reserved is a protocol error.
            let compressed_start = header.rsv1
                && self.deflate.is_some()
                && matches!(header.opcode, OpCode::Data(Data::Text | Data::Binary));
            if (header.rsv1 && !compressed_start) || header.rsv2 || header.rsv3 {
                return Err(violation(close_code::PROTOCOL, "reserved bits set"));
            }
            if control && (len > MAX_CONTROL_PAYLOAD || !header.is_final) {
                return Err(violation(
                    close_code::PROTOCOL,
                    "control frames must be final and carry at most 125 bytes",
                ));
            }
            match header.opcode {
                OpCode::Data(Data::Binary) => {
                    return Err(violation(
                        close_code::UNSUPPORTED,
                        "binary frames are reserved in AEP 0.1 (AEP-0003 §3.5)",
                    ))
                }
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
                        // read buffer into the text arena.
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
/// let f = aep_relay::ws::rfc6455::text(b"{}");
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
/// use aep_relay::ws::rfc6455::{client_frame, Decoder, Incoming};
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

    /// Single-frame text messages are slices of one arena, back to back (no allocation
    /// per message); once none of them is alive the next message reuses the arena's
    /// room; a message still held keeps its bytes, however many messages follow it
    /// (they go to a fresh arena); a message larger than the arena gets its own allocation.
    #[test]
    fn single_frame_texts_share_the_text_arena_and_held_ones_stay_intact() {
        let mut d = Decoder::new(1 << 20);
        let msg = |i: usize, len: usize| -> Vec<u8> {
            (0..len).map(|k| b'a' + ((i + k) % 26) as u8).collect()
        };
        let mut wire = Vec::new();
        for i in 0..3 {
            wire.extend(client(0x81, &msg(i, 500)));
        }
        let got: Vec<Bytes> = decode_all(&mut d, wire)
            .unwrap()
            .into_iter()
            .map(text_of)
            .collect();
        for (i, t) in got.iter().enumerate() {
            assert_eq!(&t[..], &msg(i, 500)[..]);
        }
        // Adjacent in one allocation.
        assert_eq!(got[0].as_ptr().wrapping_add(500), got[1].as_ptr());
        assert_eq!(got[1].as_ptr().wrapping_add(500), got[2].as_ptr());
        let first = got[0].as_ptr();
        drop(got);

        // Enough to run past the arena's room, each message dropped once handled (as
        // the relay does): the one that does not fit takes the arena's room back,
        // rather than a new one being made.
        let n = TEXT_ARENA / 500 + 1;
        let mut wire = Vec::new();
        for i in 0..n {
            wire.extend(client(0x81, &msg(i, 500)));
        }
        let mut used = 0;
        let mut at = Vec::new();
        while let Some(u) = d.next(&mut wire, &mut used).unwrap() {
            let t = text_of(u);
            assert_eq!(&t[..], &msg(at.len(), 500)[..]);
            at.push(t.as_ptr());
        }
        assert_eq!(at.len(), n);
        assert!(at.contains(&first), "the arena's room was taken back");

        // A held message is never overwritten: the arena cannot take its room back.
        let mut used = 0;
        let mut wire = client(0x81, &msg(n - 1, 500));
        let held = text_of(d.next(&mut wire, &mut used).unwrap().unwrap());
        let mut wire = Vec::new();
        for i in 0..3 * n {
            wire.extend(client(0x81, &msg(i + 7, 500)));
        }
        for (i, u) in decode_all(&mut d, wire).unwrap().into_iter().enumerate() {
            assert_eq!(&text_of(u)[..], &msg(i + 7, 500)[..]);
        }
        assert_eq!(&held[..], &msg(n - 1, 500)[..]);

        // Larger than the arena: an allocation of its own.
        let big = msg(3, TEXT_ARENA * 2 + 5);
        let got = decode_all(&mut d, client(0x81, &big)).unwrap();
        assert_eq!(&text_of(got.into_iter().next().unwrap())[..], &big[..]);
    }

    /// `data_ahead` counts the data frames wholly read (header and payload bytes), not
    /// control frames nor a frame still arriving, and consumes nothing.
    #[test]
    fn data_ahead_counts_complete_data_frames_only() {
        let d = Decoder::new(1 << 20);
        let mut b = client(0x81, &[b'a'; 100]);
        let first = b.len();
        b.extend(client(0x89, b"ping"));
        b.extend(client(0x01, &[b'b'; 300]));
        let second = b.len() - first - client(0x89, b"ping").len();
        assert_eq!(d.data_ahead(&b), (2, first + second));
        let mut cut = b.clone();
        cut.extend(&client(0x81, &[b'c'; 200])[..150]);
        assert_eq!(
            d.data_ahead(&cut),
            (2, first + second),
            "a partial frame waits"
        );
        assert_eq!(d.data_ahead(&[]), (0, 0));
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
