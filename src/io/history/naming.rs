//! Naming: the file of a stream. `agent` and `session` each become one path component
//! ([`encode_component`], reversed by [`decode_component`]) and a session's log is
//! `{agent}/{session}.jsonl` under the root ([super#layout-and-the-name-mapping]).

use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// Longest encoded component, in bytes, before the `{prefix}~{sha256}` form is used:
/// 240, so `{component}.jsonl` fits `NAME_MAX` (255 bytes).
pub const MAX_COMPONENT: usize = 240;
/// The file name suffix of a session log.
pub const SUFFIX: &str = ".jsonl";

fn plain(b: u8, first: bool) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-' || (b == b'.' && !first)
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Encodes a producer-controlled value (an `agent` or a `session`) as one safe path
/// component; see the [module docs](super#layout-and-the-name-mapping) for the rules.
///
/// The result is 1 to [`MAX_COMPONENT`] bytes of `[a-z0-9._%A-F~-]`, never starts with
/// `.`, and is distinct for distinct values even under case folding. The empty string
/// (which a valid envelope never carries) encodes as `~`.
///
/// ```
/// use aep_relay::history::{decode_component, encode_component, Decoded};
/// assert_eq!(encode_component("s_8f2c"), "s_8f2c");
/// assert_eq!(encode_component("../etc/Passwd"), "%2E.%2Fetc%2F%50asswd");
/// assert_eq!(encode_component("é"), "%C3%A9");
/// assert_eq!(decode_component("%2E.%2Fetc%2F%50asswd"), Some(Decoded::Exact("../etc/Passwd".into())));
/// assert!(encode_component(&"x".repeat(300)).contains('~'));
/// ```
pub fn encode_component(raw: &str) -> String {
    if raw.is_empty() {
        return "~".into();
    }
    let mut out = String::with_capacity(raw.len());
    for (i, &b) in raw.as_bytes().iter().enumerate() {
        if plain(b, i == 0) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 15) as usize] as char);
        }
    }
    if out.len() <= MAX_COMPONENT {
        return out;
    }
    // `{prefix}~{64 hex}`: cut the prefix at an escape boundary.
    let mut cut = MAX_COMPONENT - 1 - 64;
    let bytes = out.as_bytes();
    for back in 1..=2 {
        if cut >= back && bytes[cut - back] == b'%' {
            cut -= back;
            break;
        }
    }
    let digest = Sha256::digest(raw.as_bytes());
    let mut long = String::with_capacity(MAX_COMPONENT);
    long.push_str(&out[..cut]);
    long.push('~');
    for b in digest {
        long.push_str(&format!("{b:02x}"));
    }
    long
}

/// What a path component produced by [`encode_component`] says about the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// The value, exactly.
    Exact(String),
    /// A long value: the first bytes of its UTF-8 (possibly ending inside a character)
    /// and the SHA-256 of the whole value, lower hex. The full value is in the file.
    Long {
        /// Leading bytes of the value.
        prefix: Vec<u8>,
        /// SHA-256 of the value, 64 lower-case hex digits.
        sha256: String,
    },
}

/// Reverses [`encode_component`]. `None` when `name` is not an encoding this module
/// produces (a file someone else put in the history directory).
pub fn decode_component(name: &str) -> Option<Decoded> {
    if name == "~" {
        return Some(Decoded::Exact(String::new()));
    }
    let (body, digest) = match name.split_once('~') {
        Some((b, d)) => (b, Some(d)),
        None => (name, None),
    };
    let mut raw = Vec::with_capacity(body.len());
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = |c: u8| HEX.iter().position(|&h| h == c);
            let hi = hex(*bytes.get(i + 1)?)?;
            let lo = hex(*bytes.get(i + 2)?)?;
            let v = (hi * 16 + lo) as u8;
            if plain(v, raw.is_empty()) {
                return None; // not canonical: we never escape a plain byte
            }
            raw.push(v);
            i += 3;
        } else if plain(b, raw.is_empty()) {
            raw.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    match digest {
        None => String::from_utf8(raw).ok().map(Decoded::Exact),
        Some(d)
            if d.len() == 64
                && d.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) =>
        {
            Some(Decoded::Long {
                prefix: raw,
                sha256: d.to_string(),
            })
        }
        Some(_) => None,
    }
}

/// The file of `(agent, session)`, relative to the history root:
/// `{encode(agent)}/{encode(session)}.jsonl`.
pub fn relative_path(agent: &str, session: &str) -> PathBuf {
    PathBuf::from(relative_key(agent, session))
}

pub(super) fn relative_key(agent: &str, session: &str) -> String {
    let mut p = encode_component(agent);
    p.push('/');
    p.push_str(&encode_component(session));
    p.push_str(SUFFIX);
    p
}
