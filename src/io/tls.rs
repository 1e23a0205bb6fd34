//! Native TLS with rustls (ring provider): HTTPS, SSE over TLS and WSS on the same
//! listener (AEP-0003 §8.1: off-host bindings need TLS and a bearer token).
//!
//! `TlsStream` adapts a non-blocking `rustls::ServerConnection` over a mio socket to
//! `Read`/`Write` with the same would-block semantics as a plain socket, so protocol code
//! never branches on TLS. Plaintext is accepted only while no encrypted output is
//! pending, so a slow TLS peer pushes back into the connection's bounded output queue
//! instead of growing a buffer inside rustls.
//!
//! The write path: a connection's queued frames stay shared `Bytes` until
//! `TlsStream::write_vectored` is handed all of them at once; rustls seals them into
//! records of up to 16 KiB of plaintext each (RFC 8446 §5.1), records spanning frames, at
//! most [`SEAL_LIMIT`] bytes per call, and the records go to the socket in one `writev`.
//! So a flush costs about as many syscalls as in plaintext, and a record carries as many
//! frames as fit. What the socket did not take stays in rustls, bounded by
//! [`SEAL_LIMIT`], and counts in the connection's output queue (`TlsStream::held`).

use mio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{self, IoSlice, Read, Write};
use std::path::Path;
use std::sync::Arc;

/// Most bytes rustls holds sealed for one connection (its `set_buffer_limit`), and so
/// the most plaintext sealed per write call: records are sealed only once the previous
/// ones were all written, so the sealed bytes waiting stay within this plus one record's
/// overhead. 256 KiB: the plaintext path's `writev`s on loopback average ~100 KB for the
/// fan-out benchmark (up to the whole queue), so one seal and one `writev` per flush;
/// at rustls' default of 64 KiB a flush took two or three.
pub const SEAL_LIMIT: usize = 256 * 1024;

/// Why a certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
#[error("TLS: {0}")]
pub struct TlsError(pub String);

/// Builds a server configuration from PEM files: `cert` holds the certificate chain
/// (leaf first), `key` the private key (PKCS#8, PKCS#1 or SEC1).
///
/// # Errors
/// [`TlsError`] naming the file and what is wrong.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let cert_pem = std::fs::read(cert)
        .map_err(|e| TlsError(format!("cannot read certificate {}: {e}", cert.display())))?;
    let key_pem = std::fs::read(key)
        .map_err(|e| TlsError(format!("cannot read private key {}: {e}", key.display())))?;
    server_config_from_pem(&cert_pem, &key_pem)
}

/// Builds a server configuration from PEM text (see [`server_config`]).
///
/// # Errors
/// [`TlsError`].
pub fn server_config_from_pem(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError(format!("bad certificate PEM: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError("no certificate in the certificate PEM".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TlsError(format!("bad private key PEM: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError(format!("certificate and key do not work together: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Stateless session tickets (RFC 8446 §4.6.1; ChaCha20-Poly1305 under keys rotated
    // every 6 h, ring's `Ticketer`): any number of subscribers can resume after a
    // reconnection storm, where the default stateful cache of 256 sessions would make
    // almost every reconnection a full handshake at thousands of subscribers. Resumption
    // still runs a fresh ECDHE (rustls offers psk_dhe_ke only), so forward secrecy holds.
    config.ticketer = rustls::crypto::ring::Ticketer::new()
        .map_err(|e| TlsError(format!("session tickets: {e}")))?;
    Ok(Arc::new(config))
}

/// A TLS session over a non-blocking socket.
#[derive(Debug)]
pub(crate) struct TlsStream {
    pub(crate) tcp: TcpStream,
    tls: rustls::ServerConnection,
}

impl TlsStream {
    pub(crate) fn new(tcp: TcpStream, config: Arc<rustls::ServerConfig>) -> io::Result<TlsStream> {
        let mut tls = rustls::ServerConnection::new(config).map_err(io::Error::other)?;
        tls.set_buffer_limit(Some(SEAL_LIMIT));
        Ok(TlsStream { tcp, tls })
    }

    /// Sealed bytes (records) waiting for the socket; 0 once all went out.
    pub(crate) fn held(&mut self) -> usize {
        if !self.tls.wants_write() {
            return 0;
        }
        // Only rustls knows its buffer's length; `process_new_packets` reports it and
        // has nothing new to decode here (every read already ran it).
        match self.tls.process_new_packets() {
            Ok(state) => state.tls_bytes_to_write(),
            Err(_) => SEAL_LIMIT,
        }
    }

    /// Writes pending encrypted records; `Ok(true)` when some remain (would block).
    pub(crate) fn write_pending(&mut self) -> io::Result<bool> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.tcp) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    pub(crate) fn shutdown_write(&mut self) {
        self.tls.send_close_notify();
        let _ = self.write_pending();
        let _ = self.tcp.shutdown(std::net::Shutdown::Write);
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.tls.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            match self.tls.read_tls(&mut self.tcp) {
                Ok(0) => return Ok(0),
                Ok(_) => {
                    if let Err(e) = self.tls.process_new_packets() {
                        // Tell the peer why, then fail the connection.
                        let _ = self.write_pending();
                        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                    }
                    // Handshake messages may be due.
                    self.write_pending()?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Seals as much of `bufs` as [`SEAL_LIMIT`] allows, into records of up to 16 KiB
    /// that span the buffers (rustls' vectored write), then writes the records in one
    /// `writev` (several only past 64 records). Returns the plaintext bytes taken;
    /// `WouldBlock` while earlier records are still unwritten.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.write_pending()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.tls.writer().write_vectored(bufs)?;
        let _ = self.write_pending()?;
        Ok(n)
    }

    /// Writes the sealed records still waiting; `WouldBlock` while some remain.
    fn flush(&mut self) -> io::Result<()> {
        if self.write_pending()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(())
    }
}
