//! The opening handshake (RFC 6455 §4.2): checks an upgrade request head and builds the
//! `101 Switching Protocols` answer. The accept key comes from tungstenite.
//!
//! The one extension negotiated is `permessage-deflate` (RFC 7692, see
//! [`super::deflate`]), when enabled (`--ws-deflate`): a client offering it in a form the
//! relay can accept is answered `Sec-WebSocket-Extensions: permessage-deflate;
//! server_no_context_takeover…`; any other offer is declined by not answering it, and
//! the handshake succeeds without the extension (RFC 7692 §5). No subprotocol.

use super::deflate::{self, Agreed};
use crate::refusal::Code;
use crate::wire::http::RequestHead;

/// Why an upgrade request was refused, with the HTTP answer to give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeError {
    /// [`Code::UpgradeRequired`] (426) when the request is not a WebSocket upgrade or
    /// asks for another protocol version, [`Code::BadRequest`] (400) for a malformed one.
    pub code: Code,
    /// What was wrong.
    pub detail: &'static str,
}

/// Headers that go with a 426 answer (RFC 6455 §4.2.2 #4, §4.4).
pub const UPGRADE_HEADERS: [(&str, &str); 2] =
    [("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13")];

fn has_token(value: Option<&str>, token: &str) -> bool {
    value.is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// Checks `head` (a `GET /socket` request) and returns the `101` response that completes
/// the handshake, with the `permessage-deflate` parameters agreed when `deflate` is on
/// and the client offered the extension acceptably (RFC 7692 §5, §7.1; never an error
/// otherwise: the connection goes on uncompressed).
///
/// # Errors
/// [`UpgradeError`]: 426 `upgrade-required` without `Upgrade: websocket` and
/// `Connection: Upgrade` or with a `Sec-WebSocket-Version` other than 13; 400
/// `bad-request` for HTTP/1.0 or a missing or malformed `Sec-WebSocket-Key`.
///
/// # Spec
/// RFC 6455 §4.2.1, §4.2.2, §9.1; RFC 7692 §5; AEP-0003 §3.5 #1.
pub fn accept(
    head: &RequestHead,
    deflate: bool,
) -> Result<(Vec<u8>, Option<Agreed>), UpgradeError> {
    let upgrade_required = |detail| UpgradeError {
        code: Code::UpgradeRequired,
        detail,
    };
    let bad = |detail| UpgradeError {
        code: Code::BadRequest,
        detail,
    };
    if !has_token(head.header("upgrade"), "websocket")
        || !has_token(head.header("connection"), "upgrade")
    {
        return Err(upgrade_required(
            "/socket is the WebSocket binding: send Upgrade: websocket and Connection: Upgrade (AEP-0003 §3.5)",
        ));
    }
    if head.minor_version < 1 {
        return Err(bad("a WebSocket upgrade needs HTTP/1.1 (RFC 6455 §4.1)"));
    }
    if head.header("sec-websocket-version").map(str::trim) != Some("13") {
        return Err(upgrade_required(
            "Sec-WebSocket-Version must be 13 (RFC 6455 §4.2.1)",
        ));
    }
    let key = head
        .header("sec-websocket-key")
        .map(str::trim)
        .unwrap_or("");
    // A base64-encoded 16-byte nonce is 24 characters ending in "==".
    let well_formed = key.len() == 24
        && key.ends_with("==")
        && key[..22]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/');
    if !well_formed {
        return Err(bad(
            "Sec-WebSocket-Key must be a base64-encoded 16-byte nonce (RFC 6455 §4.2.1)",
        ));
    }
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    // Every `Sec-WebSocket-Extensions` line, in order (RFC 6455 §9.1: they combine).
    let agreed = deflate
        .then(|| {
            deflate::negotiate(
                head.headers
                    .iter()
                    .filter(|(n, _)| n == "sec-websocket-extensions")
                    .map(|(_, v)| v.as_str()),
            )
        })
        .flatten();
    let extensions = agreed
        .map(|a| format!("Sec-WebSocket-Extensions: {}\r\n", a.response()))
        .unwrap_or_default();
    let resp = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n{extensions}\r\n"
    );
    Ok((resp.into_bytes(), agreed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(headers: &[(&str, &str)]) -> RequestHead {
        RequestHead {
            method: "GET".into(),
            path: "/socket".into(),
            minor_version: 1,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn accepts_the_rfc_example() {
        let h = head(&[
            ("upgrade", "websocket"),
            ("connection", "keep-alive, Upgrade"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        let (resp, agreed) = accept(&h, true).unwrap();
        let resp = String::from_utf8(resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 101 "));
        assert!(resp.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
        assert!(
            !resp.contains("Extensions"),
            "nothing offered, nothing answered"
        );
        assert_eq!(agreed, None);
    }

    /// RFC 7692 §5: the first acceptable offer, over several header lines, is answered;
    /// with `--ws-deflate off` none is; a hostile offer alone leaves the handshake as is.
    #[test]
    fn negotiates_permessage_deflate_across_header_lines() {
        let mut h = head(&[
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            (
                "sec-websocket-extensions",
                "permessage-deflate; client_max_window_bits=7",
            ),
            (
                "sec-websocket-extensions",
                "permessage-deflate; client_no_context_takeover",
            ),
        ]);
        let (resp, agreed) = accept(&h, true).unwrap();
        let resp = String::from_utf8(resp).unwrap();
        assert!(resp.contains("\r\nSec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover\r\n\r\n"), "{resp}");
        assert!(!agreed.unwrap().client_context_takeover);
        let (resp, agreed) = accept(&h, false).unwrap();
        assert!(!String::from_utf8(resp).unwrap().contains("Extensions"));
        assert_eq!(agreed, None);
        h.headers.pop();
        let (resp, agreed) = accept(&h, true).unwrap();
        assert!(!String::from_utf8(resp).unwrap().contains("Extensions"));
        assert_eq!(agreed, None);
    }

    #[test]
    fn refuses_what_is_not_an_upgrade() {
        assert_eq!(
            accept(&head(&[]), true).unwrap_err().code.http_status(),
            426
        );
        let v8 = head(&[
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-version", "8"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        assert_eq!(accept(&v8, true).unwrap_err().code.http_status(), 426);
        let nokey = head(&[
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-version", "13"),
        ]);
        assert_eq!(accept(&nokey, true).unwrap_err().code.http_status(), 400);
    }
}
