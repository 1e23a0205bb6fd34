//! The WebSocket `permessage-deflate` extension (RFC 7692), sans-IO: the negotiation of
//! the opening handshake ([`negotiate`]), the relay's one shared compressor
//! ([`Deflater`]) and a connection's bounded decompressor ([`Inflater`]).
//!
//! **Compressed once per Event, shared.** The relay always answers
//! `server_no_context_takeover` (RFC 7692 §7.1.1.1): each message it sends is compressed
//! on its own, with an empty LZ77 window. So the compressed form of an Event's frame is
//! the same bytes for every subscriber that negotiated the extension, and fan-out builds
//! it once per Event and capture level, like the plain frame (see `fanout`), instead of
//! once per connection as a compressor with context takeover must. The price is the
//! ratio a shared window would add across messages; AEP Events are JSON with their own
//! redundancy (≈ 35-45% smaller each, alone).
//!
//! **Every offer can accept the same bytes.** The compressor's window is 32 KiB (15
//! bits). A client that limits the relay's window (`server_max_window_bits=N`, §7.1.2.1)
//! is answered with that `N`, and is sent a compressed frame only when the message is at
//! most `2^N` bytes long: a message compressed without context never refers further back
//! than its own length, so it fits any window at least that long. Longer messages go to
//! it uncompressed (RSV1 clear), which §6 allows message by message.
//!
//! **Inflating is bounded.** A compressed message from a client is inflated into at most
//! `max_message + 1` bytes (§7.2.2): one that would inflate past the relay's message
//! limit fails the connection with 1009 after that much work, never more (a deflate
//! bomb costs the relay one message's worth of memory and CPU).

use bytes::{BufMut, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The extension's token in `Sec-WebSocket-Extensions` (RFC 7692 §7).
pub const EXTENSION: &str = "permessage-deflate";

/// Payloads shorter than this many bytes are sent uncompressed: deflate saves nothing
/// worth the CPU there (RFC 7692 §6 lets each message choose).
pub const MIN_COMPRESS: usize = 64;

/// The compression level of the shared compressor (zlib's 0-9). Paid once per Event and
/// capture level, not per subscriber, so a mid level: measured on the golden corpus
/// (`cargo bench --bench deflate`), 6 saves a few points over 1 at a few µs per Event.
pub const LEVEL: u32 = 6;

/// The RFC 7692 §7.2.1 tail a sync flush ends with, removed before sending and appended
/// again before inflating (§7.2.2).
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// What was agreed with one client (RFC 7692 §7.1): the relay's answer, and what the
/// compressor and decompressor of that connection must respect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// The relay's LZ77 window limit, in bits (8-15): the offer's
    /// `server_max_window_bits` (§7.1.2.1), or 15 when it named none. Messages longer
    /// than `2^server_window_bits` bytes go to this client uncompressed (module docs).
    pub server_window_bits: u8,
    /// Whether the client may keep its LZ77 window from one message to the next: false
    /// when it offered `client_no_context_takeover` (§7.1.1.2), which the relay then
    /// answers. When true the connection keeps one [`Inflater`] for its life.
    pub client_context_takeover: bool,
    /// The client's window, in bits (8-15): the value of its `client_max_window_bits`
    /// (§7.1.2.2), answered back, or 15 (none, or the parameter without a value).
    pub client_window_bits: u8,
    /// Whether the offer named `server_max_window_bits` (then the answer must, §7.1.2.1).
    server_window_named: bool,
    /// Whether the offer gave `client_max_window_bits` a value (then the relay answers
    /// it, §7.1.2.2).
    client_window_named: bool,
}

impl Agreed {
    /// The `Sec-WebSocket-Extensions` value of the `101` answer, e.g.
    /// `permessage-deflate; server_no_context_takeover` (RFC 7692 §7.1).
    pub fn response(&self) -> String {
        let mut r = format!("{EXTENSION}; server_no_context_takeover");
        if self.server_window_named {
            r.push_str(&format!(
                "; server_max_window_bits={}",
                self.server_window_bits
            ));
        }
        if !self.client_context_takeover {
            r.push_str("; client_no_context_takeover");
        }
        if self.client_window_named {
            r.push_str(&format!(
                "; client_max_window_bits={}",
                self.client_window_bits
            ));
        }
        r
    }
}

/// Splits `s` at `sep` outside double quotes (RFC 7230 §3.2.6 `quoted-string`, with
/// backslash escapes).
fn split_unquoted(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    let bytes = s.as_bytes();
    let (mut start, mut i, mut quoted) = (0, 0, false);
    std::iter::from_fn(move || {
        if start > bytes.len() {
            return None;
        }
        while i < bytes.len() {
            match bytes[i] {
                b'\\' if quoted => i += 1,
                b'"' => quoted = !quoted,
                b if b == sep && !quoted => {
                    let part = &s[start..i];
                    i += 1;
                    start = i;
                    return Some(part);
                }
                _ => {}
            }
            i += 1;
        }
        let part = &s[start.min(bytes.len())..];
        start = bytes.len() + 1;
        Some(part)
    })
}

/// A window size parameter's value (RFC 7692 §7.1.2: `8`-`15`, no leading zero; a
/// quoted-string that unquotes to that, §7.1).
fn window_bits(value: &str) -> Option<u8> {
    let v = value.trim();
    let v = match v.strip_prefix('"') {
        Some(q) => q.strip_suffix('"')?,
        None => v,
    };
    match v {
        "8" | "9" | "10" | "11" | "12" | "13" | "14" | "15" => v.parse().ok(),
        _ => None,
    }
}

/// One offer's parameters checked (RFC 7692 §7.1: a server declines an offer with an
/// unknown parameter, an invalid value or a parameter twice); `None` declines it.
fn accept_offer(params: &str) -> Option<Agreed> {
    let mut agreed = Agreed {
        server_window_bits: 15,
        client_context_takeover: true,
        client_window_bits: 15,
        server_window_named: false,
        client_window_named: false,
    };
    let (mut snct, mut cnct, mut smwb, mut cmwb) = (false, false, false, false);
    if params.trim().is_empty() {
        return Some(agreed);
    }
    for param in split_unquoted(params, b';') {
        let (name, value) = match param.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v)),
            None => (param.trim(), None),
        };
        let seen = match name.to_ascii_lowercase().as_str() {
            // §7.1.1.1: the relay answers it whether offered or not.
            "server_no_context_takeover" if value.is_none() => &mut snct,
            "client_no_context_takeover" if value.is_none() => {
                agreed.client_context_takeover = false;
                &mut cnct
            }
            "server_max_window_bits" => {
                agreed.server_window_bits = window_bits(value?)?;
                agreed.server_window_named = true;
                &mut smwb
            }
            "client_max_window_bits" => {
                if let Some(v) = value {
                    agreed.client_window_bits = window_bits(v)?;
                    agreed.client_window_named = true;
                }
                &mut cmwb
            }
            _ => return None,
        };
        if std::mem::replace(seen, true) {
            return None;
        }
    }
    Some(agreed)
}

/// Picks the first `permessage-deflate` offer the relay can accept among the
/// `Sec-WebSocket-Extensions` header values of a handshake (RFC 7692 §5, §7.1; RFC 6455
/// §9.1), in the client's order of preference; `None` when there is no such offer. An
/// offer that is malformed (unknown or repeated parameter, a window size outside 8-15,
/// a value where none belongs) is declined, never an error: the connection then goes on
/// without the extension (RFC 7692 §5: the server declines by not answering it).
///
/// ```
/// use aep_relay::wire::ws::deflate::negotiate;
/// let a = negotiate(["permessage-deflate; client_max_window_bits"]).unwrap();
/// assert_eq!(a.response(), "permessage-deflate; server_no_context_takeover");
/// assert!(negotiate(["permessage-deflate; client_max_window_bits=7"]).is_none());
/// let a = negotiate(["permessage-deflate; x=1, permessage-deflate; server_max_window_bits=10"]);
/// assert_eq!(a.unwrap().server_window_bits, 10);
/// ```
pub fn negotiate<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<Agreed> {
    for value in values {
        for offer in split_unquoted(value, b',') {
            let (name, params) = match offer.split_once(';') {
                Some((n, p)) => (n.trim(), p),
                None => (offer.trim(), ""),
            };
            if !name.eq_ignore_ascii_case(EXTENSION) {
                continue;
            }
            if let Some(a) = accept_offer(params) {
                return Some(a);
            }
        }
    }
    None
}

/// The relay's one compressor (RFC 7692 §7.2.1), shared by every connection: with
/// `server_no_context_takeover` each message starts from an empty window, so one
/// context serves all of them, reset between messages. Holds zlib's state (≈ 270 KiB
/// at level 6) and a scratch buffer that keeps its capacity.
pub struct Deflater {
    compress: Compress,
    scratch: Vec<u8>,
    /// Messages compressed so far.
    messages: u64,
}

impl std::fmt::Debug for Deflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deflater").finish_non_exhaustive()
    }
}

impl Default for Deflater {
    fn default() -> Deflater {
        Deflater::new(LEVEL)
    }
}

impl Deflater {
    /// A raw-deflate compressor at `level` (0-9) with a 15-bit window.
    pub fn new(level: u32) -> Deflater {
        Deflater {
            compress: Compress::new_with_window_bits(Compression::new(level), false, 15),
            scratch: Vec::new(),
            messages: 0,
        }
    }

    /// How many payloads [`Deflater::message`] compressed so far (those under
    /// [`MIN_COMPRESS`] not counted): fan-out compresses once per Event and capture
    /// level, whatever the number of subscribers.
    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// Compresses `payload` as one message with no context (RFC 7692 §7.2.1: DEFLATE,
    /// a sync flush, the trailing `00 00 ff ff` removed) and returns the compressed
    /// bytes, valid until the next call; `None` when compressing does not make it
    /// smaller (or it is under [`MIN_COMPRESS`] bytes): send it plain. Allocates only
    /// while the scratch buffer grows to the largest payload seen.
    pub fn message(&mut self, payload: &[u8]) -> Option<&[u8]> {
        if payload.len() < MIN_COMPRESS {
            return None;
        }
        self.messages += 1;
        self.compress.reset();
        self.scratch.clear();
        // Worth sending only when smaller: room for that and the tail, no more.
        self.scratch.reserve(payload.len() + TAIL.len());
        let status = self
            .compress
            .compress_vec(payload, &mut self.scratch, FlushCompress::Sync)
            .ok()?;
        let done = self.compress.total_in() == payload.len() as u64
            && self.scratch.len() < self.scratch.capacity()
            && status == Status::Ok;
        if !done || !self.scratch.ends_with(&TAIL) {
            return None;
        }
        let n = self.scratch.len() - TAIL.len();
        (n < payload.len()).then(|| &self.scratch[..n])
    }
}

/// Why a compressed message could not be inflated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateError {
    /// It inflates past the bound (close 1009, RFC 6455 §7.4.1).
    TooBig,
    /// It is not valid DEFLATE data (close 1007).
    Corrupt,
}

/// One connection's decompressor for what its client sends compressed (RFC 7692
/// §7.2.2). Created at the first compressed message; with client context takeover it
/// keeps its window for the connection's life, otherwise it is reset after each
/// message.
pub struct Inflater {
    decompress: Decompress,
    context_takeover: bool,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("context_takeover", &self.context_takeover)
            .finish_non_exhaustive()
    }
}

/// Inflates one message the relay compressed (RSV1, no context takeover, a 15-bit
/// window), for reading back what a queue discards; `None` past `max` bytes or for data
/// that does not inflate.
pub(crate) fn inflate_own(payload: &[u8], max: usize) -> Option<Vec<u8>> {
    let mut i = Inflater {
        decompress: Decompress::new(false),
        context_takeover: false,
    };
    i.message(payload, max).ok()
}

impl Inflater {
    /// The decompressor for a client with `agreed` parameters: a window of
    /// `client_window_bits` (at least 9, zlib's smallest raw window; a wider window
    /// inflates anything a narrower one compressed).
    pub fn new(agreed: &Agreed) -> Inflater {
        let bits = agreed.client_window_bits.clamp(9, 15);
        Inflater {
            decompress: Decompress::new_with_window_bits(false, bits),
            context_takeover: agreed.client_context_takeover,
        }
    }

    /// Inflates one message's payload (the frames' payloads concatenated, RSV1 on the
    /// first: RFC 7692 §6.1, §7.2.2), writing at most `max + 1` bytes.
    ///
    /// # Errors
    /// [`InflateError::TooBig`] once the output passes `max` bytes (the rest is not
    /// inflated); [`InflateError::Corrupt`] for invalid DEFLATE data. Either fails the
    /// connection, so the state left behind does not matter.
    pub fn message(&mut self, payload: &[u8], max: usize) -> Result<Vec<u8>, InflateError> {
        let limit = max.saturating_add(1);
        let mut out = Vec::with_capacity(limit.min(payload.len().saturating_mul(4).max(256)));
        let mut ended = false;
        for input in [payload, &TAIL[..]] {
            let base = self.decompress.total_in();
            loop {
                let used = (self.decompress.total_in() - base) as usize;
                if used == input.len() && out.len() < out.capacity() {
                    break;
                }
                if out.len() == out.capacity() {
                    if out.len() >= limit {
                        return Err(InflateError::TooBig);
                    }
                    let grow = out.capacity().max(256).min(limit - out.len());
                    out.reserve_exact(grow);
                }
                let before = (self.decompress.total_in(), out.len());
                let status = self
                    .decompress
                    .decompress_vec(&input[used..], &mut out, FlushDecompress::Sync)
                    .map_err(|_| InflateError::Corrupt)?;
                if status == Status::StreamEnd {
                    // A final block (§7.2.3.3 allows BFINAL): the message ends here.
                    ended = true;
                    break;
                }
                if (self.decompress.total_in(), out.len()) == before && out.len() < out.capacity() {
                    // No progress with room to spare: the input is exhausted.
                    break;
                }
            }
            if ended {
                break;
            }
        }
        if out.len() > max {
            return Err(InflateError::TooBig);
        }
        if ended || !self.context_takeover {
            self.decompress.reset(false);
        }
        Ok(out)
    }
}

/// Appends the server text frame carrying the compressed `deflated` message (RSV1 set,
/// RFC 7692 §6) to `out`.
pub fn write_compressed_text(deflated: &[u8], out: &mut BytesMut) {
    let len = deflated.len();
    // RFC 6455 §5.2: FIN + RSV1 + opcode 1, then the shortest length form, unmasked.
    out.reserve(10 + len);
    out.put_u8(0x80 | 0x40 | 0x01);
    match len {
        0..=125 => out.put_u8(len as u8),
        126..=65_535 => {
            out.put_u8(126);
            out.put_u16(len as u16);
        }
        _ => {
            out.put_u8(127);
            out.put_u64(len as u64);
        }
    }
    out.put_slice(deflated);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agreed(v: &str) -> Option<Agreed> {
        negotiate([v])
    }

    /// RFC 7692 §7.1: what the browsers and Python `websockets` offer is accepted with
    /// `server_no_context_takeover` answered.
    #[test]
    fn common_offers_are_accepted() {
        for offer in [
            "permessage-deflate",
            "permessage-deflate; client_max_window_bits",
            "permessage-deflate; server_max_window_bits=15; client_max_window_bits",
            "PerMessage-Deflate ;  Client_Max_Window_Bits",
        ] {
            let a = agreed(offer).unwrap_or_else(|| panic!("{offer}"));
            assert!(
                a.response()
                    .starts_with("permessage-deflate; server_no_context_takeover"),
                "{offer}"
            );
            assert!(a.client_context_takeover);
        }
        let a = agreed("permessage-deflate; client_no_context_takeover; client_max_window_bits=10; server_max_window_bits=\"12\"").unwrap();
        assert_eq!(
            a.response(),
            "permessage-deflate; server_no_context_takeover; server_max_window_bits=12; client_no_context_takeover; client_max_window_bits=10"
        );
        assert_eq!((a.server_window_bits, a.client_window_bits), (12, 10));
    }

    /// RFC 7692 §7.1: unknown parameters, invalid values and repeats decline the offer;
    /// a later acceptable offer is taken instead (§5: the client's order).
    #[test]
    fn hostile_offers_are_declined() {
        for offer in [
            "permessage-deflate; client_max_window_bits=7",
            "permessage-deflate; client_max_window_bits=16",
            "permessage-deflate; client_max_window_bits=010",
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; client_max_window_bits; client_max_window_bits=9",
            "permessage-deflate; mystery",
            "permessage-deflate; \"unterminated",
            "x-webkit-deflate-frame",
            "",
            ";;;,,,\"\"\\",
        ] {
            assert_eq!(agreed(offer), None, "{offer}");
        }
        let a = negotiate([
            "permessage-deflate; mystery=1",
            "permessage-deflate; server_max_window_bits=9",
        ]);
        assert_eq!(a.unwrap().server_window_bits, 9);
        let a = agreed("foo; a=\"x,y\", permessage-deflate").unwrap();
        assert_eq!(a.server_window_bits, 15);
    }

    fn frame_payload(f: &[u8]) -> &[u8] {
        match f[1] {
            126 => &f[4..],
            127 => &f[10..],
            _ => &f[2..],
        }
    }

    /// RFC 7692 §7.2.1 and §7.2.2 round trip, through one shared compressor for many
    /// messages and a context-keeping inflater on the other side.
    #[test]
    fn messages_round_trip_through_the_shared_compressor() {
        let mut d = Deflater::default();
        let a = agreed("permessage-deflate").unwrap();
        let mut i = Inflater::new(&a);
        for n in 0..50 {
            let msg = format!(
                r#"{{"aep":"0.1","id":"e{n}","type":"tool.completed","data":{{"output":"{}"}}}}"#,
                "abc".repeat(n * 10)
            );
            let Some(z) = d.message(msg.as_bytes()) else {
                assert!(msg.len() < 200, "{} bytes did not compress", msg.len());
                continue;
            };
            let mut f = BytesMut::new();
            write_compressed_text(z, &mut f);
            assert_eq!(f[0], 0xC1, "FIN, RSV1, text");
            assert!(f.len() < msg.len());
            let got = i.message(frame_payload(&f), 1 << 20).unwrap();
            assert_eq!(got, msg.as_bytes());
            // Alone, with a fresh window (server_no_context_takeover), to the last byte.
            let mut fresh = Decompress::new(false);
            let mut input = z.to_vec();
            input.extend_from_slice(&TAIL);
            let mut out = Vec::with_capacity(msg.len() * 2 + 64);
            fresh
                .decompress_vec(&input, &mut out, FlushDecompress::Sync)
                .unwrap();
            assert_eq!(out, msg.as_bytes());
            assert_eq!(fresh.total_in() as usize, input.len(), "message {n}");
        }
        assert_eq!(d.message(b"{}"), None, "below the threshold");
    }

    /// A deflate bomb inflates to the bound plus one byte and no further.
    #[test]
    fn inflating_stops_at_the_bound() {
        let big = vec![b'a'; 10 << 20];
        let mut c = Compress::new(Compression::best(), false);
        let mut z = Vec::with_capacity(1 << 20);
        c.compress_vec(&big, &mut z, FlushCompress::Sync).unwrap();
        assert!(z.len() < 20_000, "{}", z.len());
        let z = &z[..z.len() - 4];
        let a = agreed("permessage-deflate").unwrap();
        let mut i = Inflater::new(&a);
        assert_eq!(i.message(z, 1 << 20), Err(InflateError::TooBig));
        let mut i = Inflater::new(&a);
        assert_eq!(i.message(z, 11 << 20).map(|v| v.len()), Ok(10 << 20));
        let mut i = Inflater::new(&a);
        assert_eq!(
            i.message(b"\xff\xff\xff\xff", 1024),
            Err(InflateError::Corrupt)
        );
    }
}
