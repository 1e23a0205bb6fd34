//! A relay in a thread of the test process: [`TestRelay`], on 127.0.0.1 with an
//! ephemeral port and any [`Config`].

use super::{Endpoint, WAIT};
use aep_relay::{Config, Relay, StopHandle};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// A relay running on 127.0.0.1 with an ephemeral port, stopped on drop. Its client side
/// (POST, SSE, raw TCP) is [`Endpoint`]'s.
pub struct TestRelay {
    pub addr: SocketAddr,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
}

impl TestRelay {
    /// A relay with the default [`Config`].
    pub fn start() -> TestRelay {
        TestRelay::with(|_| {})
    }

    /// A relay with the default [`Config`] changed by `tweak` (`listen` is set first).
    pub fn with(tweak: impl FnOnce(&mut Config)) -> TestRelay {
        let mut config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..Config::default()
        };
        tweak(&mut config);
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut relay = Relay::bind(config).expect("relay binds");
            tx.send((relay.local_addr(), relay.stop_handle())).unwrap();
            relay.run().expect("relay runs");
        });
        let (addr, stop) = rx.recv_timeout(WAIT).expect("relay started");
        TestRelay {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Endpoint for TestRelay {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TestRelay {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
