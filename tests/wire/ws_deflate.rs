//! `permessage-deflate` on `/socket` (RFC 7692), over real TCP with raw clients that
//! inflate with flate2 on their side: what is negotiated, that compressing and plain
//! subscribers on one relay get the same Events from the same fan-out (byte-identical
//! after inflation, live and replayed), that hostile offers never fail the handshake, and
//! that a deflate bomb from an emitter closes only its own connection, with 1009, in
//! bounded memory.

use crate::support;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use serde_json::{json, Value};
use support::*;

/// An offer as Chromium and Python `websockets` send it.
const OFFER: &str = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n";

/// The relay's answer to [`OFFER`] (RFC 7692 §7.1.1.1: no context takeover on its side).
const ANSWER: &str = "Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover\r\n";

/// Inflates one message as RFC 7692 §7.2.2 says, with a fresh window: the relay
/// promised `server_no_context_takeover`, so each message must inflate on its own.
fn inflate(payload: &[u8]) -> Vec<u8> {
    let mut d = Decompress::new(false);
    let mut input = payload.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut out = Vec::with_capacity(1 << 20);
    let status = d
        .decompress_vec(&input, &mut out, FlushDecompress::Sync)
        .expect("valid DEFLATE");
    assert_eq!(
        d.total_in() as usize,
        input.len(),
        "all input inflated ({status:?}): {}",
        String::from_utf8_lossy(&out)
    );
    out
}

/// Compresses one client message (RFC 7692 §7.2.1): raw deflate, sync flush, tail cut.
fn deflate(payload: &[u8], level: u32) -> Vec<u8> {
    let mut c = Compress::new(Compression::new(level), false);
    let mut out = Vec::with_capacity(payload.len() / 2 + 1024);
    let mut at = 0;
    loop {
        out.reserve(1 << 20);
        let before = c.total_in() as usize;
        c.compress_vec(&payload[at..], &mut out, FlushCompress::Sync)
            .unwrap();
        at += c.total_in() as usize - before;
        if at == payload.len() && out.len() < out.capacity() {
            break;
        }
    }
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    out
}

/// A raw client that upgraded with `headers`, said hello, and subscribed as `sub` with
/// `members`; returns it with the upgrade answer's head.
fn subscriber(relay: &impl Endpoint, headers: &str, sub: &str, members: Value) -> (Raw, String) {
    let (mut raw, head) = Raw::upgrade(relay.tcp(), headers);
    raw.hello();
    let mut s = json!({"type": "subscribe", "id": sub});
    for (k, v) in members.as_object().unwrap() {
        s[k] = v.clone();
    }
    raw.send(0x81, s.to_string().as_bytes());
    let (op, p) = raw.read();
    assert_eq!(op, 0x81, "control frames are sent uncompressed");
    let v: Value = serde_json::from_slice(&p).unwrap();
    assert_eq!(v, json!({"type": "subscribed", "id": sub}));
    (raw, head)
}

/// What one client received: each Event's text (inflated when RSV1 was set), and how
/// many frames came compressed and their bytes on the wire.
#[derive(Default, Debug)]
struct Received {
    texts: Vec<Vec<u8>>,
    compressed: usize,
    wire: usize,
}

/// Reads text frames until one whose text is `fence`; relay `ping` frames skipped.
fn until(raw: &mut Raw, fence: &[u8]) -> Received {
    let mut got = Received::default();
    loop {
        let (op, p) = raw.read();
        let text = match op {
            0x81 => p.clone(),
            0xC1 => {
                got.compressed += 1;
                inflate(&p)
            }
            other => panic!("unexpected frame {other:#x}"),
        };
        if text.starts_with(br#"{"type":"ping""#) {
            continue;
        }
        got.wire += p.len();
        let done = text == fence;
        got.texts.push(text);
        if done {
            return got;
        }
    }
}

/// The Events posted: the golden corpus (its commands aside: they are routed, not fanned
/// out, AEP-0004 §4) when `../shared` is there, and generated Events of every size
/// around the compression threshold and the window limit of 512 bytes.
fn corpus() -> Vec<String> {
    // Without ../shared (cfg `no_fixtures`, set by build.rs) the generated Events alone.
    let mut lines: Vec<String> = if cfg!(no_fixtures) {
        Vec::new()
    } else {
        fixture("aep-fixtures/golden/golden.jsonl")
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.contains(r#""type":"control."#))
            .map(str::to_owned)
            .collect()
    };
    for (i, pad) in [0usize, 40, 200, 300, 330, 400, 900, 5000]
        .into_iter()
        .enumerate()
    {
        let extra = format!(r#","data":{{"output":"{}"}}"#, "ab".repeat(pad / 2));
        lines.push(event(
            "s_deflate",
            0,
            i as u64 + 1,
            "tool.completed",
            &extra,
        ));
    }
    lines
}

/// RFC 7692 §7.1 and AEP-0003 §3.5 #2: on one relay, a subscriber that offered nothing
/// gets plain frames, one that offered the extension gets the same Events compressed
/// (RSV1), and one that limited the relay's window to 512 bytes gets compressed frames
/// only for messages that fit it; after inflation all three have the same bytes, which
/// are the bytes posted, live and then replayed (`from: "all"`).
#[test]
fn plain_and_compressing_subscribers_get_the_same_events() {
    let relay = TestRelay::start();
    let lines = corpus();
    let (mut plain, head) = subscriber(&relay, "", "p", json!({}));
    assert!(!head.contains("Sec-WebSocket-Extensions"), "{head}");
    let (mut zipped, head) = subscriber(&relay, OFFER, "z", json!({}));
    assert!(head.contains(ANSWER), "{head}");
    let small = "Sec-WebSocket-Extensions: permessage-deflate; server_max_window_bits=9\r\n";
    let (mut narrow, head) = subscriber(&relay, small, "n", json!({}));
    assert!(
        head.contains(
            "permessage-deflate; server_no_context_takeover; server_max_window_bits=9\r\n"
        ),
        "{head}"
    );

    relay.post_ok(&lines);
    let fence = lines.last().unwrap().as_bytes();
    let want: Vec<Vec<u8>> = lines.iter().map(|l| l.as_bytes().to_vec()).collect();
    let p = until(&mut plain, fence);
    let z = until(&mut zipped, fence);
    let n = until(&mut narrow, fence);
    assert_eq!(p.texts, want, "the plain subscriber gets the bytes posted");
    assert_eq!(p.compressed, 0);
    assert_eq!(z.texts, want, "the compressing subscriber, after inflation");
    assert_eq!(
        n.texts, want,
        "the narrow-window subscriber, after inflation"
    );
    assert!(
        z.compressed >= lines.len() - 2,
        "{} of {}",
        z.compressed,
        lines.len()
    );
    assert!(n.compressed > 0 && n.compressed < z.compressed, "{n:?}");
    assert!(z.wire * 10 < p.wire * 8, "{} vs {} bytes", z.wire, p.wire);

    // Replayed: a new subscription on each connection, from the start of every stream.
    // Only sequenced Events are buffered (AEP-0003 §5); the fence is the last of them.
    let replay = json!({"from": "all", "filter": {"session": ["s_deflate"]}});
    let want: Vec<Vec<u8>> = want
        .iter()
        .filter(|l| l.windows(21).any(|w| w == br#""session":"s_deflate""#))
        .cloned()
        .collect();
    for raw in [&mut plain, &mut zipped, &mut narrow] {
        let mut s = json!({"type": "subscribe", "id": "r"});
        for (k, v) in replay.as_object().unwrap() {
            s[k] = v.clone();
        }
        raw.send(0x81, s.to_string().as_bytes());
        let first = until(raw, br#"{"type":"subscribed","id":"r"}"#);
        assert_eq!(first.texts.len(), 1);
        let got = until(raw, fence);
        assert_eq!(got.texts, want, "replayed, byte-identical after inflation");
    }
}

/// RFC 7692 §5, §7.1: an offer the relay cannot accept is declined, and the handshake
/// still succeeds (a `101` without the extension, or with the next acceptable offer's
/// valid parameters); a connection without the extension refuses RSV1 with 1002
/// (RFC 6455 §5.2), as ever.
#[test]
fn hostile_offers_never_fail_the_handshake() {
    let relay = TestRelay::start();
    let declined = [
        "permessage-deflate; client_max_window_bits=7",
        "permessage-deflate; server_max_window_bits=16",
        "permessage-deflate; server_max_window_bits",
        "permessage-deflate; server_max_window_bits=10; server_max_window_bits=10",
        "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
        "permessage-deflate; client_max_window_bits=\"08\"",
        "permessage-deflate; x-unknown=1",
        "permessage-deflate; server_no_context_takeover=yes",
        "permessage-deflate;;",
        "permessage-deflate; \"",
        "x-webkit-deflate-frame",
        ";;,,==\"\\\"",
        "",
    ];
    for offer in declined {
        let headers = format!("Sec-WebSocket-Extensions: {offer}\r\n");
        let (mut raw, head) = Raw::upgrade(relay.tcp(), &headers);
        assert!(
            !head.contains("Sec-WebSocket-Extensions"),
            "{offer:?}: {head}"
        );
        raw.hello();
        raw.send(0xC1, &deflate(br#"{"type":"ping","t":1}"#, 6));
        assert_eq!(
            raw.expect_close(),
            1002,
            "RSV1 without the extension: {offer:?}"
        );
    }
    // Several offers, the first unacceptable: the second is answered, valid.
    let headers = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits=7, \
                   permessage-deflate; client_no_context_takeover; client_max_window_bits=12\r\n";
    let (mut raw, head) = Raw::upgrade(relay.tcp(), headers);
    assert!(
        head.contains(
            "Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; \
             client_no_context_takeover; client_max_window_bits=12\r\n"
        ),
        "{head}"
    );
    raw.hello();
    // It may now send compressed messages (RSV1 on the first frame), fragmented too.
    let z = deflate(br#"{"type":"ping","t":"z"}"#, 6);
    let (a, b) = z.split_at(z.len() / 2);
    raw.send(0x41, a);
    raw.send(0x80, b);
    assert_eq!(raw.read(), (0x81, br#"{"type":"pong","t":"z"}"#.to_vec()));
    // RSV1 on a continuation or a control frame stays a protocol error (RFC 7692 §6.1).
    raw.send(0xC9, b"");
    assert_eq!(raw.expect_close(), 1002);
}

/// `--ws-deflate off` (the real binary): the offer every browser makes is declined.
#[test]
fn ws_deflate_off_declines_every_offer() {
    let relay = RelayProcess::spawn(&["--ws-deflate", "off"]);
    let (mut raw, head) = Raw::upgrade(relay.tcp(), OFFER);
    assert!(!head.contains("Sec-WebSocket-Extensions"), "{head}");
    raw.hello();
    raw.send(0xC1, &deflate(br#"{"type":"ping","t":1}"#, 6));
    assert_eq!(raw.expect_close(), 1002);
}

/// The high-water mark of the process's resident memory, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// RFC 7692 §7.2.2, RFC 6455 §7.4.1: a message that inflates past the message limit
/// (here 256 KiB; the bomb inflates to 128 MiB from ≈ 130 KB) closes that emitter's
/// connection with 1009, after at most the limit was inflated: the relay's peak memory
/// grows by far less than the bomb. A consumer and another compressing emitter on the
/// same relay go on as before (AEP-0003 §8.4: one peer's input never disturbs another).
#[test]
fn a_deflate_bomb_closes_1009_in_bounded_memory() {
    let relay = RelayProcess::spawn(&["--max-ws-message", "262144"]);
    let (mut consumer, _) = subscriber(&relay, OFFER, "all", json!({}));
    let emitter = |agent: &str| {
        let (mut raw, head) = Raw::upgrade(relay.tcp(), OFFER);
        assert!(head.contains(ANSWER), "{head}");
        let hello = json!({"type": "hello", "versions": ["0.1"], "role": "emitter",
                           "identity": {"agent": agent}});
        raw.send(0xC1, &deflate(hello.to_string().as_bytes(), 6));
        let (op, p) = raw.read();
        assert_eq!(op, 0x81, "{}", String::from_utf8_lossy(&p));
        assert_eq!(
            serde_json::from_slice::<Value>(&p).unwrap()["type"],
            "hello"
        );
        raw
    };
    let mut good = emitter("good");
    let mut bomber = emitter("bomber");
    // 128 MiB of spaces: 32 copies of one 4 MiB segment compressed alone, each ending
    // in its sync flush (byte-aligned, non-final blocks), so they concatenate into one
    // valid DEFLATE stream (RFC 1951 §3.2.3) without compressing 128 MiB here.
    let mut segment = deflate(&vec![b' '; 4 << 20], 9);
    segment.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut bomb = segment.repeat(32);
    bomb.truncate(bomb.len() - 4);
    assert!(
        bomb.len() < 262_144,
        "the bomb passes the frame size check: {}",
        bomb.len()
    );
    let before = peak_rss_kib(relay.child.id());
    bomber.send(0xC1, &bomb);
    assert_eq!(bomber.expect_close(), 1009);
    let grew = peak_rss_kib(relay.child.id()).saturating_sub(before);
    assert!(
        grew < 32 * 1024,
        "peak RSS grew by {grew} KiB for a 128 MiB bomb"
    );

    // Undisturbed: the other emitter's compressed Event reaches the consumer.
    let e = ev("good", "s_after_bomb", 1);
    good.send(0xC1, &deflate(e.as_bytes(), 6));
    let got = until(&mut consumer, e.as_bytes());
    assert_eq!(got.texts, vec![e.into_bytes()]);
}
