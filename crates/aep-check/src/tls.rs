//! The TLS client of `aep-relay check`, `aep-relay tail` and `aep-load`: rustls (ring
//! provider, TLS 1.2 and 1.3), trusting the system's roots by default or exactly the
//! certificates of one PEM file (`--cacert FILE`, for a private CA or a self-signed
//! relay).
//!
//! The handshake is completed eagerly, before the first request byte, so that a
//! certificate the client does not trust, a name it does not match, or a plaintext
//! server behind an `https://` URL is reported as one [`Failure`] with a sentence a
//! person can act on, instead of surfacing later as an I/O error in the middle of a
//! request.
//!
//! ```text
//! # a test certificate for a relay on this machine (ECDSA P-256):
//! openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
//!     -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
//!     -keyout key.pem -out cert.pem
//! aep-relay --tls-cert cert.pem --tls-key key.pem --listen 127.0.0.1:8443 &
//! aep-relay tail https://localhost:8443 --cacert cert.pem
//! aep-relay check https://localhost:8443 --cacert cert.pem
//! ```

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{CertificateError, ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// A TLS handshake that failed for a reason retrying would not fix: the server's
/// certificate is not trusted, not valid for the name, expired; the server is not
/// speaking TLS; or no protocol version or cipher suite is shared. Its `Display` is one
/// line naming the server and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

/// A TLS client: its rustls configuration and where its trusted roots came from.
#[derive(Debug, Clone)]
pub struct Client {
    /// The ring provider, TLS 1.2 and 1.3, no client certificate, ALPN `http/1.1`, and
    /// rustls' default session cache (256 sessions), so connections sharing this config
    /// resume their sessions (TLS 1.3 tickets) when the server offers it.
    pub config: Arc<ClientConfig>,
    /// Whether the roots are exactly a `--cacert` file's (else the system's).
    pub from_file: bool,
}

impl Client {
    /// A client trusting `cacert`'s certificates only, when given (a PEM file with one or
    /// more `CERTIFICATE` blocks: a private CA, or a self-signed server certificate),
    /// else the system's roots (`rustls-native-certs`: `SSL_CERT_FILE` / `SSL_CERT_DIR`,
    /// else the distribution's bundle).
    ///
    /// # Errors
    /// One line naming the file and what is wrong: unreadable, not PEM (no
    /// `CERTIFICATE` block), a block that is not a certificate; or no system roots.
    pub fn new(cacert: Option<&Path>) -> Result<Client, String> {
        Client::with_suites(cacert, None)
    }

    /// [`Client::new`] offering only `suites` (e.g. one TLS 1.3 suite, so that every
    /// server of a benchmark negotiates the same cipher); `None` offers the provider's.
    ///
    /// # Errors
    /// As [`Client::new`]; and when the suites leave no protocol version.
    pub fn with_suites(
        cacert: Option<&Path>,
        suites: Option<Vec<rustls::SupportedCipherSuite>>,
    ) -> Result<Client, String> {
        let roots = root_store(cacert)?;
        let mut provider = rustls::crypto::ring::default_provider();
        if let Some(s) = suites {
            provider.cipher_suites = s;
        }
        let provider = Arc::new(provider);
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Client {
            config: Arc::new(config),
            from_file: cacert.is_some(),
        })
    }

    /// Connects TLS over `io` to `host` and completes the handshake (blocking; the
    /// socket's own timeouts bound it).
    ///
    /// # Errors
    /// `Err(io::Error)`: either a transport error (connection reset, timeout, the
    /// server closed: a retry may help), or one whose inner error is a [`Failure`] (see
    /// [`failure`]).
    pub fn handshake<S: Read + Write>(
        &self,
        host: &str,
        mut io: S,
    ) -> io::Result<StreamOwned<ClientConnection, S>> {
        let name = server_name(host).map_err(io::Error::other)?;
        let mut conn =
            ClientConnection::new(self.config.clone(), name).map_err(io::Error::other)?;
        while conn.is_handshaking() {
            if let Err(e) = conn.complete_io(&mut io) {
                return Err(self.explain(e, host));
            }
        }
        Ok(StreamOwned::new(conn, io))
    }

    /// Turns a handshake error whose cause is TLS itself (not the transport) into a
    /// [`Failure`] with a one-line reason.
    fn explain(&self, e: io::Error, host: &str) -> io::Error {
        let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
            return e;
        };
        let hint = if self.from_file {
            "(it was not signed by a certificate of --cacert)"
        } else {
            "(pass --cacert FILE with the CA or certificate that signed it)"
        };
        let why = match tls {
            rustls::Error::InvalidCertificate(c) => {
                // The variant's name without its context fields, for a short line.
                let debug = format!("{c:?}");
                let name = debug
                    .split(['{', '(', ' '])
                    .next()
                    .unwrap_or_default()
                    .to_string();
                match c {
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. } => format!(
                        "TLS: the certificate of {host} is not valid for the name {host:?} (hostname mismatch: connect by a name the certificate lists)"
                    ),
                    CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                        format!("TLS: the certificate of {host} has expired")
                    }
                    CertificateError::NotValidYet
                    | CertificateError::NotValidYetContext { .. } => {
                        format!("TLS: the certificate of {host} is not valid yet")
                    }
                    _ if debug.contains("CaUsedAsEndEntity") => format!(
                        "TLS: the certificate of {host} is a CA certificate (basicConstraints CA:TRUE), not a server certificate: make the server's with CA:FALSE"
                    ),
                    CertificateError::UnknownIssuer => format!(
                        "TLS: the certificate of {host} is not trusted: its issuer is not among the trusted roots {hint}"
                    ),
                    _ => format!(
                        "TLS: the certificate of {host} is not trusted ({name}) {hint}"
                    ),
                }
            }
            rustls::Error::InvalidMessage(_)
            | rustls::Error::InappropriateHandshakeMessage { .. }
            | rustls::Error::InappropriateMessage { .. } => {
                format!(
                    "TLS: {host} does not speak TLS here ({tls}); is it a plain http:// listener?"
                )
            }
            other => format!("TLS: the handshake with {host} failed: {other}"),
        };
        io::Error::new(io::ErrorKind::InvalidData, Failure(why))
    }
}

fn root_store(cacert: Option<&Path>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let Some(path) = cacert else {
        let found = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            let why = found
                .errors
                .first()
                .map_or(String::new(), |e| format!(" ({e})"));
            return Err(format!(
                "no system root certificates found{why}; pass --cacert FILE with the CA that signed the server's certificate"
            ));
        }
        return Ok(roots);
    };
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("--cacert {shown}: cannot read it: {e}"))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--cacert {shown}: not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "--cacert {shown}: not a PEM certificate file (no -----BEGIN CERTIFICATE----- block)"
        ));
    }
    for (i, c) in certs.into_iter().enumerate() {
        roots
            .add(c)
            .map_err(|e| format!("--cacert {shown}: certificate {} is not usable: {e}", i + 1))?;
    }
    Ok(roots)
}

/// The server name to verify for `host` (a DNS name, or an IP address, with or
/// without IPv6 brackets).
///
/// # Errors
/// [`Failure`] when `host` is neither.
pub fn server_name(host: &str) -> Result<ServerName<'static>, Failure> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(h.to_string())
        .map_err(|_| Failure(format!("{host}: not a DNS name or IP address to verify")))
}

/// The [`Failure`] inside an error, when it has one: `err` itself, an `io::Error`
/// carrying one, or any error in its `source` chain (such as a `ureq::Error`).
pub fn failure<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Failure> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(f) = e.downcast_ref::<Failure>() {
            return Some(f);
        }
        if let Some(f) = e
            .downcast_ref::<io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<Failure>())
        {
            return Some(f);
        }
        cur = e.source();
    }
    None
}

/// A TLS connection over a TCP socket, as `ureq` streams it.
struct UreqStream(StreamOwned<ClientConnection, Box<dyn ureq::ReadWrite>>);

impl fmt::Debug for UreqStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsStream")
    }
}

impl Read for UreqStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        read_tls(&mut self.0, buf)
    }
}

impl Write for UreqStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl ureq::ReadWrite for UreqStream {
    fn socket(&self) -> Option<&TcpStream> {
        self.0.sock.socket()
    }
}

/// A client's socket: TCP, or TLS over TCP (`https://`, `wss://`). Reads and writes go
/// through TLS when there is TLS; the peer closing the TCP connection without a
/// `close_notify` alert reads as an end of stream.
pub enum Stream {
    /// Plain TCP (`http://`, `ws://`).
    Plain(TcpStream),
    /// TLS over TCP, the handshake done ([`Client::handshake`]).
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    /// The TCP socket (for its timeouts, or to shut it down).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => read_tls(s, buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// Reads plaintext; the peer closing the TCP connection without a `close_notify` alert
/// is an end of stream, as the relay's server side treats it.
pub(crate) fn read_tls<S: Read + Write>(
    s: &mut StreamOwned<ClientConnection, S>,
    buf: &mut [u8],
) -> io::Result<usize> {
    match s.read(buf) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
        r => r,
    }
}

/// `https://` for a `ureq` agent (`AgentBuilder::tls_connector`) with a
/// [`Client`]: the handshake is completed inside `connect`, so a [`Failure`] is the
/// request's error (find it with [`failure`]).
pub struct UreqConnector(pub Client);

impl ureq::TlsConnector for UreqConnector {
    fn connect(
        &self,
        dns_name: &str,
        io: Box<dyn ureq::ReadWrite>,
    ) -> Result<Box<dyn ureq::ReadWrite>, ureq::Error> {
        let s = self.0.handshake(dns_name, io)?;
        Ok(Box::new(UreqStream(s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cacert_that_is_not_pem_is_refused_in_one_line() {
        let dir = std::env::temp_dir().join(format!("aep-check-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, b"\x30\x82\x01\x0a binary DER, not PEM").unwrap();
        let e = Client::new(Some(&not_pem)).unwrap_err();
        assert!(e.contains("not a PEM certificate file"), "{e}");
        assert!(!e.contains('\n'));
        let missing = dir.join("missing.pem");
        let e = Client::new(Some(&missing)).unwrap_err();
        assert!(e.contains("cannot read it"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn failures_are_found_through_io_errors() {
        let io = io::Error::new(io::ErrorKind::InvalidData, Failure("x".into()));
        assert_eq!(failure(&io), Some(&Failure("x".into())));
        let plain = io::Error::new(io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(failure(&plain), None);
    }

    #[test]
    fn server_names_take_ips_with_or_without_brackets() {
        assert!(server_name("[::1]").is_ok());
        assert!(server_name("127.0.0.1").is_ok());
        assert!(server_name("localhost").is_ok());
        assert!(server_name("bad name").is_err());
    }
}
