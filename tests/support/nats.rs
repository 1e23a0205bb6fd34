//! A real nats-server for the cluster tests: [`NatsServer::start`] runs
//! `nats-server -a 127.0.0.1 -p -1 -m -1 -js -sd DIR --ports_file_dir DIR` in a fresh
//! temporary directory and learns its URL from the ports file. [`NatsServer::kill`] and
//! [`NatsServer::restart`] (same port, same store) make the engine outages,
//! [`NatsServer::pause`] and [`NatsServer::resume`] a stalled engine.
//!
//! nats-server is found on `PATH` (`.ci/run` installs Debian's package). When it is
//! missing a test skips with a message, except under `CI=true`, where it fails.

use super::WAIT;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A nats-server child process with JetStream, on loopback, with its own directory.
pub struct NatsServer {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

/// Where `nats-server` is on `PATH` (also `/usr/sbin`, where Debian puts it and a user's
/// `PATH` may not reach).
fn find_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

impl NatsServer {
    /// Starts a server, or `None` (after printing why) when nats-server is not installed.
    ///
    /// # Panics
    /// When nats-server is missing under `CI=true`, or when it does not come up within
    /// [`WAIT`].
    pub fn start() -> Option<NatsServer> {
        let Some(_) = find_binary() else {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("nats-server is not on PATH, and CI=true needs it (apt-get install nats-server)");
            }
            eprintln!("skipping: nats-server not on PATH");
            return None;
        };
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "aep-nats-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the nats-server directory");
        let mut s = NatsServer {
            child: None,
            dir,
            port: 0,
        };
        s.spawn(None);
        Some(s)
    }

    /// Runs the binary with `-p PORT` (or `-p -1`), waits for its ports file and a TCP
    /// connect.
    fn spawn(&mut self, port: Option<u16>) {
        let bin = find_binary().expect("nats-server vanished");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .expect("opening the nats-server log");
        let ports_dir = self.dir.join("ports");
        std::fs::create_dir_all(&ports_dir).expect("creating the ports directory");
        let port_arg = port.map_or("-1".to_string(), |p| p.to_string());
        let child = Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", &port_arg, "-m", "-1", "-js", "-sd"])
            .arg(self.dir.join("store"))
            .arg("--ports_file_dir")
            .arg(&ports_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting nats-server");
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + WAIT;
        let url = loop {
            if let Some(url) = read_ports_file(&ports_dir, pid) {
                break url;
            }
            self.check_alive("writing its ports file");
            if Instant::now() > deadline {
                panic!(
                    "nats-server wrote no ports file within {WAIT:?}; its log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let port: u16 = url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("a ports file URL without a port: {url}"));
        self.port = port;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            self.check_alive("accepting connections");
            if Instant::now() > deadline {
                panic!(
                    "nats-server does not accept on {port}; its log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn check_alive(&mut self, doing: &str) {
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            panic!(
                "nats-server exited ({status}) before {doing}; its log:\n{}",
                self.log()
            );
        }
    }

    /// The client URL, `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the server has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Kills the server with SIGKILL and reaps it; its store stays.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes the server (SIGSTOP): its connections stay open and it answers nothing,
    /// as an engine stalled by its host.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a [`NatsServer::pause`]d server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("nats-server is not running")
            .id();
        let ok = Command::new("kill")
            .arg(sig)
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid} failed");
    }

    /// Starts the server again on the same port with the same store (JetStream data
    /// survives); kills it first if it runs.
    pub fn restart(&mut self) {
        self.kill();
        let port = self.port;
        self.spawn(Some(port));
        assert_eq!(self.port, port, "nats-server came back on another port");
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The client URL from `{dir}/nats-server_{pid}.ports` (`{"nats":["nats://…"],…}`),
/// once the file is complete.
fn read_ports_file(dir: &Path, pid: u32) -> Option<String> {
    let suffix = format!("_{pid}.ports");
    let entry = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().ends_with(&suffix))?;
    let text = std::fs::read_to_string(entry.path()).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["nats"][0].as_str().map(str::to_string)
}

#[cfg(feature = "cluster")]
impl NatsServer {
    /// The consumers relay `relay` holds on the stream `AEP` (found by the description
    /// the bridge gives them, `aep-relay {relay}`), deleted with the JetStream API when
    /// `delete`; how many there are.
    pub fn consumers_of(&self, relay: &str, delete: bool) -> usize {
        use futures_util::StreamExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the test client");
        rt.block_on(async {
            let client = async_nats::connect(self.url())
                .await
                .expect("connecting the test client");
            let js = async_nats::jetstream::new(client);
            let stream = js.get_stream("AEP").await.expect("the stream AEP");
            let want = format!("aep-relay {relay}");
            let mut names = Vec::new();
            let mut list = stream.consumers();
            while let Some(info) = list.next().await {
                let info = info.expect("listing the consumers");
                if info.config.description.as_deref() == Some(want.as_str()) {
                    names.push(info.name);
                }
            }
            for n in names.iter().filter(|_| delete) {
                stream
                    .delete_consumer(n)
                    .await
                    .expect("deleting the consumer");
            }
            names.len()
        })
    }
}
