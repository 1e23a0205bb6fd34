//! The byte transport under a connection, owned by the reactor: plain TCP or TLS over
//! TCP. The core never knows which one it talks to: it writes into any `Write`.

#[cfg(feature = "tls")]
use super::tls::TlsStream;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use std::io::{self, IoSlice, Read, Write};

/// A connection's transport.
#[derive(Debug)]
pub(crate) enum Transport {
    /// A non-blocking TCP socket registered with the poller.
    Tcp(TcpStream),
    /// TLS over a non-blocking TCP socket.
    #[cfg(feature = "tls")]
    Tls(Box<TlsStream>),
}

impl Transport {
    pub(crate) fn register(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            Transport::Tcp(s) => r.register(s, t, i),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => r.register(&mut s.tcp, t, i),
        }
    }

    pub(crate) fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            Transport::Tcp(s) => r.reregister(s, t, i),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => r.reregister(&mut s.tcp, t, i),
        }
    }

    pub(crate) fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        match self {
            Transport::Tcp(s) => r.deregister(s),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => r.deregister(&mut s.tcp),
        }
    }

    /// Half-closes the writing side.
    pub(crate) fn shutdown_write(&mut self) {
        match self {
            Transport::Tcp(s) => {
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.shutdown_write(),
        }
    }

    /// Writes output the transport itself still holds (TLS records); `Ok(true)` while
    /// some remains.
    pub(crate) fn write_pending(&mut self) -> io::Result<bool> {
        match self {
            Transport::Tcp(_) => Ok(false),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.write_pending(),
        }
    }
}

impl Transport {
    /// Bytes the transport holds of its own, already taken from the connection's queue
    /// (sealed TLS records the socket has not taken); 0 for plain TCP.
    pub(crate) fn held(&mut self) -> usize {
        match self {
            Transport::Tcp(_) => 0,
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.held(),
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Tcp(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Transport::Tcp(s) => s.write_vectored(bufs),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Tcp(_) => Ok(()),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.flush(),
        }
    }
}
