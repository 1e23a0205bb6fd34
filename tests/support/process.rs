//! The real `aep-relay` binary as a child process: [`RelayProcess`] spawns it on an
//! ephemeral port (or a given address), learns the port from its start-up line and
//! collects its stderr; [`Lines`] collects any child's pipe and waits for a line with a
//! deadline. Every wait fails the test with a message after [`WAIT`].

use super::{Endpoint, WAIT};
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_aep-relay")
}

/// The lines so far, and whether the pipe has closed.
type Shared = Arc<(Mutex<(Vec<String>, bool)>, Condvar)>;

/// Lines a child wrote to one of its pipes, collected by a thread.
#[derive(Clone, Default)]
pub struct Lines(Shared);

impl Lines {
    /// Starts collecting `pipe`, echoing each line to the test's stderr with `tag`.
    pub fn collect(pipe: impl Read + Send + 'static, tag: &'static str) -> Lines {
        let lines = Lines::default();
        let l = lines.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(pipe);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let s = String::from_utf8_lossy(&buf).trim_end().to_string();
                        if !tag.is_empty() {
                            eprintln!("[{tag}] {s}");
                        }
                        let (m, cv) = &*l.0;
                        m.lock().unwrap().0.push(s);
                        cv.notify_all();
                    }
                }
            }
            let (m, cv) = &*l.0;
            m.lock().unwrap().1 = true;
            cv.notify_all();
        });
        lines
    }

    /// Everything collected so far.
    pub fn snapshot(&self) -> Vec<String> {
        self.0 .0.lock().unwrap().0.clone()
    }

    /// Waits until a line satisfying `pred` exists (at index `from` or later); returns
    /// its index and text. Fails the test after [`WAIT`] or when the pipe closes first.
    pub fn wait_from(
        &self,
        from: usize,
        what: &str,
        pred: impl Fn(&str) -> bool,
    ) -> (usize, String) {
        let deadline = Instant::now() + WAIT;
        let (m, cv) = &*self.0;
        let mut g = m.lock().unwrap();
        loop {
            if let Some((i, l)) = g.0.iter().enumerate().skip(from).find(|(_, l)| pred(l)) {
                return (i, l.clone());
            }
            if g.1 {
                panic!(
                    "waiting for {what}: the pipe closed first; it said:\n{}",
                    g.0.join("\n")
                );
            }
            let now = Instant::now();
            if now >= deadline {
                panic!("waited {WAIT:?} for {what}; got:\n{}", g.0.join("\n"));
            }
            g = cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// [`Lines::wait_from`] from the start.
    pub fn wait(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.wait_from(0, what, pred).1
    }

    /// Waits until at least `n` lines were collected; returns the first `n`.
    pub fn wait_count(&self, n: usize, what: &str) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        let (m, cv) = &*self.0;
        let mut g = m.lock().unwrap();
        loop {
            if g.0.len() >= n {
                return g.0[..n].to_vec();
            }
            let now = Instant::now();
            if g.1 || now >= deadline {
                panic!(
                    "waiting for {n} lines of {what}; got {}:\n{}",
                    g.0.len(),
                    g.0.join("\n")
                );
            }
            g = cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// Waits until the pipe closes; returns everything.
    pub fn wait_closed(&self, what: &str) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        let (m, cv) = &*self.0;
        let mut g = m.lock().unwrap();
        while !g.1 {
            let now = Instant::now();
            if now >= deadline {
                panic!(
                    "waited {WAIT:?} for {what} to end; got:\n{}",
                    g.0.join("\n")
                );
            }
            g = cv.wait_timeout(g, deadline - now).unwrap().0;
        }
        g.0.clone()
    }
}

/// A running `aep-relay` (the relay itself), SIGKILLed on drop. Its client side (POST,
/// SSE, raw TCP) is [`Endpoint`]'s.
pub struct RelayProcess {
    pub child: Child,
    pub addr: SocketAddr,
    /// Its standard error, line by line (echoed to the test's, tagged `[relay]`).
    pub stderr: Lines,
    /// Its standard input, when spawned with a pipe there.
    pub stdin: Option<ChildStdin>,
}

impl RelayProcess {
    /// Runs `aep-relay --listen 127.0.0.1:0 {args}` and waits for its start-up line.
    pub fn spawn(args: &[&str]) -> RelayProcess {
        RelayProcess::spawn_with(args, &[], false, "127.0.0.1:0")
    }

    /// Runs `aep-relay --listen {listen} {args}` with `AEP_LOG=info` and then `envs` in
    /// its environment, standard input a pipe kept in [`RelayProcess::stdin`] when
    /// `stdin` is set, and waits for its start-up line.
    pub fn spawn_with(
        args: &[&str],
        envs: &[(&str, &str)],
        stdin: bool,
        listen: &str,
    ) -> RelayProcess {
        let mut cmd = Command::new(bin());
        cmd.args(["--listen", listen])
            .args(args)
            .env("AEP_LOG", "info")
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        RelayProcess::start(cmd)
    }

    /// Runs `cmd` (the binary, or a wrapper that `exec`s it, with standard error piped)
    /// and waits for its start-up line.
    pub fn start(mut cmd: Command) -> RelayProcess {
        let mut child = cmd.spawn().expect("the binary starts");
        let stderr = Lines::collect(child.stderr.take().unwrap(), "relay");
        let line = stderr.wait("the start-up line", |l| {
            l.starts_with("aep-relay listening on ")
        });
        let addr = line["aep-relay listening on ".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|e| panic!("no address in {line:?}: {e}"));
        RelayProcess {
            stdin: child.stdin.take(),
            child,
            addr,
            stderr,
        }
    }

    /// Sends a signal (`"TERM"`, `"INT"`, `"KILL"`) to the process.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (at most [`WAIT`]) for the process to close its stderr and exit; returns
    /// its exit status and its whole stderr, one line per line.
    pub fn wait(mut self) -> (ExitStatus, String) {
        let lines = self.stderr.wait_closed("the relay's exit");
        let status = self.child.wait().unwrap();
        (status, lines.join("\n"))
    }
}

impl Endpoint for RelayProcess {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
