//! The byte transport under a connection: plain TCP, or an in-memory pipe that lets
//! tests, fuzz targets, benchmarks and embedding hosts drive a connection's whole state
//! machine without sockets. Protocol code never knows which one it talks to.

#[cfg(feature = "tls")]
use crate::tls::TlsStream;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use std::io::{self, IoSlice, Read, Write};

/// An in-memory connection: bytes fed by the host are read by the relay; bytes the relay
/// writes are collected for the host.
#[derive(Debug, Default)]
pub(crate) struct MemoryPipe {
    /// Bytes fed and not yet read by the relay.
    pub(crate) input: Vec<u8>,
    /// Read position in `input`.
    pub(crate) pos: usize,
    /// The host closed its writing side: reads return end-of-stream once `input` is used.
    pub(crate) eof: bool,
    /// What the relay wrote.
    pub(crate) output: Vec<u8>,
    /// When set, writes stop (would block) once `output` holds this many bytes: a
    /// consumer that stopped reading.
    pub(crate) write_limit: Option<usize>,
}

/// A connection's transport.
#[derive(Debug)]
pub(crate) enum Transport {
    /// A non-blocking TCP socket registered with the poller.
    Tcp(TcpStream),
    /// TLS over a non-blocking TCP socket.
    #[cfg(feature = "tls")]
    Tls(Box<TlsStream>),
    /// An in-memory pipe (no poller registration).
    Memory(MemoryPipe),
}

impl Transport {
    pub(crate) fn register(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            Transport::Tcp(s) => r.register(s, t, i),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => r.register(&mut s.tcp, t, i),
            Transport::Memory(_) => Ok(()),
        }
    }

    pub(crate) fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            Transport::Tcp(s) => r.reregister(s, t, i),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => r.reregister(&mut s.tcp, t, i),
            Transport::Memory(_) => Ok(()),
        }
    }

    pub(crate) fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        match self {
            Transport::Tcp(s) => r.deregister(s),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => r.deregister(&mut s.tcp),
            Transport::Memory(_) => Ok(()),
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
            Transport::Memory(_) => {}
        }
    }

    /// Writes output the transport itself still holds (TLS records); `Ok(true)` while
    /// some remains.
    pub(crate) fn write_pending(&mut self) -> io::Result<bool> {
        match self {
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.write_pending(),
            _ => Ok(false),
        }
    }

    pub(crate) fn memory(&mut self) -> Option<&mut MemoryPipe> {
        match self {
            Transport::Memory(m) => Some(m),
            _ => None,
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Tcp(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.read(buf),
            Transport::Memory(m) => {
                let left = &m.input[m.pos..];
                if left.is_empty() {
                    m.input.clear();
                    m.pos = 0;
                    return if m.eof {
                        Ok(0)
                    } else {
                        Err(io::ErrorKind::WouldBlock.into())
                    };
                }
                let n = left.len().min(buf.len());
                buf[..n].copy_from_slice(&left[..n]);
                m.pos += n;
                Ok(n)
            }
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
            Transport::Memory(m) => {
                let room = m
                    .write_limit
                    .map_or(usize::MAX, |l| l.saturating_sub(m.output.len()));
                if room == 0 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                let mut n = 0;
                for b in bufs {
                    let take = b.len().min(room - n);
                    m.output.extend_from_slice(&b[..take]);
                    n += take;
                    if n == room {
                        break;
                    }
                }
                Ok(n)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
