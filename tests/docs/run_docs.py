"""Runs the commands of README.md and docs/*.md against real relays, and compares the
output each transcript shows (tests/docs/run.sh sets it up; CI runs it).

How a page's fenced blocks are read (the info string after the backticks):

- ```console   a transcript: `$ COMMAND` lines (a line ending in `\\`, `|`, `&&` or `||`
               continues it), each followed by the output it prints (standard output
               and error together).
               The output must match: `...` alone on a line stands for any lines, `[..]`
               for any text within a line, `[exit N]` as the last line for the status
               (0 otherwise). A command ending in `&` runs in the background: its output
               is not compared, and when it names a listen address the next command
               waits until that address accepts connections.
- ```sh        commands run as one bash script (`set -euo pipefail`); it must exit 0.
               Background commands as above.
- ```sh not-run: REASON` and ```console not-run: REASON`   shown, not run; the reason is
               required (a systemd host, a package install, a command CI runs itself).
- ```rust file=PATH`   must be exactly the file PATH (which CI compiles).
- anything else (text, json, python, …) is shown, not run: a frame, a file's contents, a
  log line.

Every page runs in a scratch directory of its own, where `examples/` and `contrib/` are
the repository's, `aep-relay` is the binary under test and `python3` has `websockets`.
Each `127.0.0.1:PORT` a page names (and nats-server's `-p PORT`) is replaced by a free
port, consistently for the page (in commands and in expected output). Unless the page starts a relay itself on
127.0.0.1:8787, one is started for it before its first command (`aep-relay` with no
flags, so `AEP_LISTEN` points it at the page's port). Every process a page started is
stopped when the page ends.

Prints one PASS/FAIL line per command or block, then `N passed, N failed, N skipped`,
and exits 1 on any failure.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60  # seconds any one command may take
WAIT = 30  # seconds a background server may take to accept connections

FENCE = re.compile(r"^(```+)(.*)$")


def blocks(path):
    """(line number, info string, text) of every fenced block of a markdown file."""
    out, lines, i = [], path.read_text().split("\n"), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start, body = m.group(1), m.group(2).strip(), i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        out.append((start, info, "\n".join(body) + "\n"))
        i += 1
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepts(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def continues(line):
    """Whether a command line goes on on the next line, as bash reads it."""
    return line.rstrip().endswith(("\\", "|", "&&", "||"))


def transcript(text):
    """[(command, expected output lines)] of a console block."""
    out, cmd, expect, cont = [], None, [], False
    for line in text.rstrip("\n").split("\n"):
        if cont:
            cmd += "\n" + line
            cont = continues(line)
        elif line.startswith("$ "):
            if cmd is not None:
                out.append((cmd, expect))
            cmd, expect = line[2:], []
            cont = continues(line)
        elif cmd is None:
            raise ValueError(f"output before the first `$ ` command: {line!r}")
        else:
            expect.append(line)
    if cmd is not None:
        out.append((cmd, expect))
    return out


def line_matches(want, got):
    pattern = ".*".join(re.escape(p) for p in want.split("[..]"))
    return re.fullmatch(pattern, got) is not None


def lines_match(want, got):
    if not want:
        return not got
    if want[0] == "...":
        return any(lines_match(want[1:], got[k:]) for k in range(len(got) + 1))
    return bool(got) and line_matches(want[0], got[0]) and lines_match(want[1:], got[1:])


def trim(lines):
    lines = [l.rstrip() for l in lines]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


class Page:
    """A page's scratch directory, port map, environment and processes."""

    def __init__(self, path, args):
        self.path, self.args = path, args
        self.name = path.relative_to(ROOT).as_posix()
        self.dir = Path(args.out).resolve() / self.name.replace("/", "_")
        shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "bin").mkdir(parents=True)
        (self.dir / "bin/aep-relay").symlink_to(Path(args.bin).resolve())
        for d in ("examples", "contrib"):
            (self.dir / d).symlink_to(ROOT / d)
        text = path.read_text()
        named = set(re.findall(r"127\.0\.0\.1:(\d+)", text)) - {"0"}
        self.ports = {p: free_port() for p in sorted(named)}
        self.ports.setdefault("8787", free_port())
        self.env = dict(os.environ)
        self.env["PATH"] = f"{self.dir / 'bin'}:{Path(args.venv).resolve() / 'bin'}:{os.environ['PATH']}:/usr/sbin"
        self.env["AEP_LISTEN"] = f"127.0.0.1:{self.ports['8787']}"
        self.env.pop("AEP_TOKEN", None)
        self.groups = []
        self.logs = 0

    def sub(self, text):
        for doc, real in self.ports.items():
            # 127.0.0.1:PORT anywhere (URLs, --listen), and nats-server's `-p PORT`.
            text = re.sub(rf"(127\.0\.0\.1:|\s-p\s+){doc}(?![0-9])", rf"\g<1>{real}", text)
        return text

    def spawn(self, cmd):
        """A background command; its output goes to a log file of its own."""
        self.logs += 1
        log = open(self.dir / f"background-{self.logs}.log", "wb")
        p = subprocess.Popen(["bash", "-c", cmd], cwd=self.dir, env=self.env, stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        self.groups.append(p)
        return p

    def wait_listening(self, cmd):
        """Waits until every address `cmd` listens on accepts connections."""
        wanted = [int(p) for p in re.findall(r"(?:--listen[ =]127\.0\.0\.1:|\s-p\s+|--port[ =])(\d+)", cmd)]
        if re.search(r"(^|\s)aep-relay(\s|$)", cmd) and "--listen" not in cmd:
            wanted.append(self.ports["8787"])
        deadline = time.monotonic() + WAIT
        for port in wanted:
            while not accepts(port):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} {WAIT} s after `{cmd}`")
                if all(p.poll() is not None for p in self.groups[-1:]):
                    raise RuntimeError(f"`{cmd}` exited: {self.tail_log()}")
                time.sleep(0.05)

    def tail_log(self):
        return (self.dir / f"background-{self.logs}.log").read_text(errors="replace")[-600:]

    def run(self, script):
        """Runs `script` in bash in the page's directory: (status, output)."""
        self.logs += 1
        log_path = self.dir / f"command-{self.logs}.log"
        with open(log_path, "wb") as log:
            p = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + script], cwd=self.dir,
                                 env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            self.groups.append(p)
            try:
                status = p.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                status = f"timeout after {TIMEOUT} s"
        return status, log_path.read_text(errors="replace")

    def starts_default_relay(self, text):
        """Whether the page needs the relay of 127.0.0.1:8787 started for it: none of its
        background `aep-relay` commands listens there itself."""
        for cmd in re.findall(r"^(?:\$ )?(aep-relay [^\n]*?)&\s*(?:#.*)?$", text, re.M):
            if "--listen" not in cmd or "--listen 127.0.0.1:8787" in cmd:
                return False
        return True

    def close(self):
        for p in self.groups:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for p in self.groups:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Report:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def ok(self, what):
        self.passed += 1
        print(f"PASS {what}", flush=True)

    def fail(self, what, why):
        self.failed += 1
        print(f"FAIL {what}\n  {why.rstrip()}".replace("\n", "\n  "), flush=True)

    def skip(self, what, why):
        self.skipped += 1
        print(f"SKIP {what}: {why}", flush=True)


def run_page(path, args, report):
    page = Page(path, args)
    text = path.read_text()
    started = False
    try:
        for line, info, body in blocks(path):
            words = info.split(None, 1)
            lang = words[0] if words else ""
            rest = words[1] if len(words) > 1 else ""
            where = f"{page.name}:{line}"
            if lang == "rust" and rest.startswith("file="):
                want = (ROOT / rest[5:].strip()).read_text()
                if body == want:
                    report.ok(f"{where} is {rest[5:].strip()}")
                else:
                    report.fail(where, f"the block differs from {rest[5:].strip()}")
                continue
            if lang not in ("sh", "console"):
                continue
            if rest.startswith("not-run"):
                reason = rest[len("not-run"):].lstrip(":").strip()
                if not reason:
                    report.fail(where, "`not-run` needs a reason: ```sh not-run: WHY")
                else:
                    report.skip(where, reason)
                continue
            if rest:
                report.fail(where, f"unknown info string {info!r}")
                continue
            if not started:
                started = True
                if page.starts_default_relay(text):
                    page.spawn("exec aep-relay")
                    try:
                        page.wait_listening("aep-relay")
                    except RuntimeError as e:
                        report.fail(f"{page.name}: the page's relay", str(e))
                        return
            if lang == "sh":
                run_sh(page, where, body, report)
            else:
                run_console(page, where, body, report)
    finally:
        page.close()


def split_background(script):
    """The script's lines, with `&`-ended commands separated out: [(background, cmd)]."""
    out, current = [], []
    for line in script.rstrip("\n").split("\n"):
        current.append(line)
        if line.endswith("\\"):
            continue
        cmd = "\n".join(current)
        current = []
        bare = re.sub(r"\s+#.*$", "", cmd).rstrip()
        if bare.endswith("&") and not bare.endswith("&&"):
            out.append((True, bare[:-1].rstrip()))
        else:
            out.append((False, cmd))
    return out


def run_sh(page, where, body, report):
    script = page.sub(body)
    pending = []
    try:
        for background, cmd in split_background(script):
            if background:
                if pending:
                    status, output = page.run("\n".join(pending))
                    pending = []
                    if status != 0:
                        return report.fail(where, f"exited {status}:\n{output[-1500:]}")
                page.spawn(cmd)
                page.wait_listening(cmd)
            else:
                pending.append(cmd)
        if pending:
            status, output = page.run("\n".join(pending))
            if status != 0:
                return report.fail(where, f"exited {status}:\n{output[-1500:]}")
        report.ok(where)
    except RuntimeError as e:
        report.fail(where, str(e))


def run_console(page, where, body, report):
    try:
        steps = transcript(body)
    except ValueError as e:
        return report.fail(where, str(e))
    for cmd, expect in steps:
        cmd, expect = page.sub(cmd), [page.sub(l) for l in expect]
        first = cmd.split("\n")[0]
        what = f"{where} $ {first[:70]}"
        bare = cmd.rstrip()
        if bare.endswith("&") and not bare.endswith("&&"):
            page.spawn(bare[:-1])
            try:
                page.wait_listening(bare[:-1])
            except RuntimeError as e:
                return report.fail(what, str(e))
            report.ok(what)
            continue
        want_status = 0
        if expect and re.fullmatch(r"\[exit (\d+)\]", expect[-1].strip()):
            want_status = int(expect.pop()[6:-1])
        status, output = page.run(cmd)
        got = trim(output.split("\n"))
        want = trim(expect)
        if status != want_status:
            report.fail(what, f"exited {status}, want {want_status}:\n{output[-1500:]}")
        elif not lines_match(want, got):
            report.fail(what, "output differs.\nwant:\n" + "\n".join(want)
                        + "\ngot:\n" + "\n".join(got))
        else:
            report.ok(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the aep-relay binary")
    ap.add_argument("--venv", required=True, help="a virtual environment with websockets")
    ap.add_argument("--out", required=True, help="scratch directory")
    ap.add_argument("pages", nargs="*", help="markdown files (default: README.md, docs/*.md)")
    args = ap.parse_args()
    pages = [Path(p).resolve() for p in args.pages] or (
        [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")))
    report = Report()
    for p in pages:
        run_page(p, args, report)
    print(f"{report.passed} passed, {report.failed} failed, {report.skipped} skipped")
    sys.exit(1 if report.failed else 0)


if __name__ == "__main__":
    main()
