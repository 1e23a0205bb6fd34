"""What tests/clients/clients.py and tests/clients/sdk.py share: the check primitives
(Failure, check, wait_until, log), the processes a run starts and stops (spawn, stop,
stop_all), the command line (arguments), a relay's start-up, one HTTP request, a real
nats-server (Nats), and running the checks (run_all).

Standard library only: sdk.py runs in a virtual environment that holds nothing but the
SDK. Each script calls configure() in its main() before any check runs; the bounds of
its waits stay its own.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

OUT = None  # the directory of logs (configure)
WAIT = 15.0  # the bound of any single wait, seconds (configure)
INTERVAL = 0.05  # how often wait_until polls, seconds (configure)
STOP_WAIT = 10.0  # how long stop() waits for a signalled process, seconds (configure)
PROCS = []  # every child process started, stopped at exit


def arguments(doc, out_help):
    """The command line both scripts take (--bin, --out, --only); each adds its own."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--bin", required=True, help="the aep-relay binary")
    ap.add_argument("--out", default=None, help=out_help)
    ap.add_argument("--only", default="", help="comma-separated check names")
    return ap


def configure(out, temp_prefix, wait, interval, stop_wait):
    """Sets up a run: its directory of logs (`out`, or a new temporary directory named
    `temp_prefix`...; created), the bounds of its waits, and SIGTERM ending it with 143
    (through the `finally` that stops every process). Returns the directory."""
    global OUT, WAIT, INTERVAL, STOP_WAIT
    OUT = out or tempfile.mkdtemp(prefix=temp_prefix)
    Path(OUT).mkdir(parents=True, exist_ok=True)
    WAIT, INTERVAL, STOP_WAIT = wait, interval, stop_wait
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return OUT


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def wait_until(pred, what, timeout=None, interval=None):
    """Polls `pred` until it returns a truthy value (returned) or `timeout` passes
    (default: the run's WAIT, polling every INTERVAL)."""
    timeout = WAIT if timeout is None else timeout
    interval = INTERVAL if interval is None else interval
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Failure:
            raise
        except Exception as e:  # a transient error while polling: keep trying
            last_exc = e
        time.sleep(interval)
    raise Failure(f"timed out after {timeout:.0f}s waiting for {what}"
                  + (f" (last error: {last_exc!r})" if last_exc else ""))


def log(msg):
    print(f"  {msg}", flush=True)


def run_check(name, fn):
    """Runs the check `fn` as `name`: a `==` line with its docstring, then PASS or FAIL
    with the time it took. True if it passed."""
    print(f"== {name}: {' '.join(fn.__doc__.split())}", flush=True)
    t = time.monotonic()
    try:
        fn()
        print(f"PASS {name} ({time.monotonic() - t:.1f}s)", flush=True)
        return True
    except Exception as e:
        detail = str(e) if isinstance(e, Failure) else traceback.format_exc()
        print(f"FAIL {name} ({time.monotonic() - t:.1f}s): {detail}", flush=True)
        return False


def run_all(checks, logs, after=None):
    """Runs each (name, fn) of `checks` (run_check), then `after()` if given; stops every
    process started; prints `logs`, then `N passed, N failed`. Returns the exit status
    (1 on any failure or when nothing ran)."""
    passed = failed = 0
    try:
        for name, fn in checks:
            try:
                if run_check(name, fn):
                    passed += 1
                else:
                    failed += 1
            finally:
                if after:
                    after()
    finally:
        stop_all()
    print(logs)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 1 if failed or not passed else 0


# ---------------------------------------------------------------- processes


def spawn(cmd, logfile, **kw):
    """Starts `cmd` in a process group of its own (so its children stop with it)."""
    f = open(logfile, "wb")
    with f:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=kw.pop("stdout", f),
                             stderr=f, start_new_session=True, **kw)
    PROCS.append(p)
    return p


def stop(p, sig=signal.SIGTERM, timeout=None):
    """Signals `p`'s process group and waits (bounded, default STOP_WAIT); SIGKILL past
    the bound."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(STOP_WAIT if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
    else:
        # The leader is gone; make sure nothing of its group is left.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return p.returncode


def stop_all():
    for p in reversed(PROCS):
        try:
            stop(p, signal.SIGKILL, 5)
        except Exception:
            pass


def start_relay(binary, port, args, logfile, who):
    """Starts the aep-relay `binary` on 127.0.0.1:`port` (0: ephemeral) with `args`,
    logging to `logfile`; waits for its start-up line. Returns (process, address)."""
    proc = spawn([binary, "--listen", f"127.0.0.1:{port}", *args], logfile)

    def addr():
        text = Path(logfile).read_text(errors="replace")
        m = re.search(r"^aep-relay listening on (\S+) \(", text, re.M)
        if m:
            return m.group(1)
        if proc.poll() is not None:
            raise Failure(f"{who} exited at start-up: {text[-2000:]}")
        return None
    return proc, wait_until(addr, f"the start-up line of {who}")


def http(method, url, body=None, token=None, headers=None):
    """One request; (status, body bytes)."""
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=WAIT) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ---------------------------------------------------------------- nats-server


def nats_binary():
    """nats-server on PATH, or where Debian puts it (/usr/sbin, which a PATH may lack)."""
    dirs = os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin", "/usr/local/sbin"]
    return next((str(Path(d) / "nats-server") for d in dirs
                 if d and os.access(Path(d) / "nats-server", os.X_OK)), None)


class Nats:
    """A real nats-server with JetStream on loopback, in a directory of its own under
    OUT, started as tests/support/nats.rs does; its URL comes from its ports file."""

    def __init__(self):
        binary = nats_binary()
        check(binary, "nats-server is not installed (run.sh and sdk.sh install Debian's "
                      "nats-server)")
        self.dir = Path(tempfile.mkdtemp(prefix="nats-", dir=OUT))
        ports = self.dir / "ports"
        ports.mkdir()
        self.proc = spawn([binary, "-a", "127.0.0.1", "-p", "-1", "-m", "-1", "-js",
                           "-sd", str(self.dir / "store"), "--ports_file_dir", str(ports)],
                          Path(OUT) / "nats-server.log")

        def url():
            if self.proc.poll() is not None:
                raise Failure("nats-server exited at start-up (see nats-server.log)")
            f = ports / f"nats-server_{self.proc.pid}.ports"
            # A file still being written does not parse: polled again.
            return f.exists() and json.loads(f.read_text())["nats"][0]
        self.url = wait_until(url, "nats-server's ports file")
        port = int(self.url.rsplit(":", 1)[1])
        wait_until(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close()
                   or True, "nats-server to accept connections")

    def stop(self):
        return stop(self.proc)
