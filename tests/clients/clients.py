#!/usr/bin/env python3
"""End-to-end tests of aep-relay with the clients people already use.

Each check starts the real `aep-relay` binary on 127.0.0.1 and drives it with an
unmodified client:

- browser-eventsource-https: the same page over HTTPS (a test certificate Chromium
  trusts by its key), resuming across a SIGTERM and restart.
- browser-eventsource-hostile: the same page against sessions holding LF, CR, NUL, %,
  non-ASCII and 1 KiB: one message per Event, exact lastEventId, exact resume.
- browser-eventsource: a page in headless Chromium, served from another origin, whose
  EventSource consumes /stream with ?access_token= and a filter across two relay drops
  (SIGTERM, then SIGKILL, each followed by a restart on the same port with --history),
  resuming with Last-Event-ID; what it received is read back and compared byte-for-byte.
- python-websockets-consumer / -emitter: the `websockets` package on /socket, as a
  consumer with two subscriptions (replay, filters, single delivery) and as an emitter
  whose Events arrive on SSE byte-identical.
- python-websockets-deflate: `websockets` with compression on and off on one relay
  (permessage-deflate, RFC 7692): the same Events byte-identical, live and replayed; a
  compressing emitter's Events arrive intact.
- python-websockets-wss: `websockets` over WSS, compression on and off: the same Events
  byte-identical, replayed and live.
- browser-websocket-deflate: Chromium's WebSocket negotiates permessage-deflate and
  receives byte-identical Events, replayed and live.
- curl-readme: the curl commands of README.md (and the docs pages that read what it
  posts), run as the pages show them.
- status-page: GET /?access_token= in headless Chromium: the numbers, the session table
  and the live tail update when Events are posted; screenshots before and after.

Chromium is driven over the DevTools protocol (--remote-debugging-port) with the same
`websockets` client. Every wait is bounded; every process started is stopped on exit.
Prints one PASS/FAIL line per check, then `N passed, N failed`; exits 1 on any failure.

Usage: clients.py --bin target/debug/aep-relay [--out DIR] [--only NAME,...]
Run through tests/clients/run.sh, which installs what this needs.
"""

import asyncio
import base64
import http.server
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from websockets.asyncio.client import connect as ws_connect_async
from websockets.sync.client import connect as ws_connect

from harness import (Failure, Nats, arguments, check, configure, http as http_bytes, log, run_all,
                     spawn, start_relay, stop, wait_until)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WAIT = 15.0  # the bound of any single wait, seconds

ARGS = None


# ---------------------------------------------------------------- processes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Relay:
    """The aep-relay binary on 127.0.0.1:`port` (0: ephemeral)."""

    def __init__(self, name, *args, port=0):
        self.log = Path(ARGS.out) / f"relay-{name}.log"
        self.proc, self.addr = start_relay(ARGS.bin, port, args, self.log, f"relay {name}")
        self.base = f"http://{self.addr}"

    @property
    def port(self):
        return int(self.addr.rsplit(":", 1)[1])

    def stop(self, sig=signal.SIGTERM):
        return stop(self.proc, sig)

    def post(self, lines, token=None, content_type=None):
        """POSTs Events (a list of str) to /events; returns (status, JSON body)."""
        if content_type is None:
            content_type = "application/json" if len(lines) == 1 else "application/x-ndjson"
        body = "\n".join(lines).encode() + (b"\n" if len(lines) > 1 else b"")
        return http_request("POST", self.base + "/events", body, token=token,
                            headers={"AEP-Version": "0.1", "Content-Type": content_type})

    def post_ok(self, lines, token=None):
        status, doc = self.post(lines, token)
        check(status == 202 and doc == {"accepted": len(lines)},
              f"POST /events answered {status} {doc}")

    def status(self, token=None):
        status, doc = http_request("GET", self.base + "/status", token=token)
        check(status == 200, f"GET /status answered {status} {doc}")
        return doc


def http_request(method, url, body=None, token=None, headers=None):
    """One request; (status, the body as JSON, as text when it is not, None when empty)."""
    status, data = http_bytes(method, url, body, token, headers)
    try:
        return status, json.loads(data) if data else None
    except ValueError:
        return status, data.decode(errors="replace")


class Sse:
    """A minimal SSE client on a raw socket: every message with its exact data bytes."""

    def __init__(self, base, query):
        host, port = urllib.parse.urlsplit(base).netloc.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=WAIT)
        self.sock.sendall(f"GET /stream?{query} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                          "Accept: text/event-stream\r\n\r\n".encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        check(head.startswith(b"HTTP/1.1 200 "), f"GET /stream answered {head[:200]!r}")

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise Failure("the SSE stream ended early")
        self.buf += chunk

    def next(self):
        """The next message that has data: {event, id, data (bytes)}."""
        deadline = time.monotonic() + WAIT
        while True:
            while b"\n\n" not in self.buf:
                if time.monotonic() > deadline:
                    raise Failure("no SSE message in time")
                self._fill()
            block, self.buf = self.buf.split(b"\n\n", 1)
            msg = {}
            for line in block.split(b"\n"):
                if line.startswith(b":") or not line:
                    continue
                field, _, value = line.partition(b":")
                value = value[1:] if value.startswith(b" ") else value
                if field == b"data":
                    msg["data"] = msg["data"] + b"\n" + value if "data" in msg else value
                else:
                    msg[field.decode()] = value.decode()
            if "data" in msg:
                return msg

    def close(self):
        self.sock.close()


# ---------------------------------------------------------------- Events


NOTE = 'naïve ✓ 𝄞 \\u00e9 \\/ \\"quoted\\"'


def ev(session, seq, typ, agent="clients", epoch=0, time_="2026-07-03T10:15:04.221Z",
       severity=None, pad=0):
    """A valid sequenced Event as exact text. Its data holds non-ASCII characters,
    escapes and spaces that any re-serialization would change; `severity` adds that
    attribute, `pad` that many bytes of data."""
    return ('{"aep":"0.1","id":"%s-%d-%d","type":"%s","time":"%s",'
            '"source":"aep://127.0.0.1/agent/%s/session/%s","agent":"%s","session":"%s",'
            '"seq":%d,"epoch":%d,%s"data":{"note":"%s", "n": %d%s}}'
            % (session, epoch, seq, typ, time_, agent, session, agent, session, seq, epoch,
               '"severity":"%s",' % severity if severity else "", NOTE, seq,
               ', "pad":"%s"' % ("x" * pad) if pad else ""))


def now_rfc3339(offset_ms=0):
    """The current time as an Event's `time` (UTC, milliseconds)."""
    t = time.time() + offset_ms / 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % (int(t * 1000) % 1000)


def tokens_file(lines):
    path = Path(ARGS.out) / f"tokens-{len(os.listdir(ARGS.out))}.txt"
    path.write_text("".join(f"{t} {s}\n" for t, s in lines))
    return str(path)


# ---------------------------------------------------------------- Chromium over CDP


class Browser:
    """Headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, name, extra_args=()):
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=ARGS.out)
        cmd = [ARGS.chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
               "--disable-quic", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--disable-extensions",
               "--hide-scrollbars", "--window-size=1280,1000", *extra_args,
               f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "about:blank"]
        self.proc = spawn(cmd, Path(ARGS.out) / f"chromium-{name}.log")
        port_file = Path(self.profile) / "DevToolsActivePort"

        def port():
            if self.proc.poll() is not None:
                raise Failure(f"chromium exited at start-up (see chromium-{name}.log)")
            return port_file.exists() and port_file.read_text().split("\n")[0].strip()

        self.port = wait_until(port, "chromium's DevTools port", timeout=30)

        def page():
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list",
                                        timeout=5) as r:
                targets = json.load(r)
            return next((t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page"),
                        None)

        self._ws = ws_connect(wait_until(page, "chromium's page target"), max_size=None,
                              open_timeout=WAIT)
        self.ws = self._ws.__enter__()
        self.next_id = 0
        self.events = []  # DevTools events received while waiting for answers

    def call(self, method, params=None, timeout=WAIT):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failure(f"no answer to {method} within {timeout:.0f}s")
            msg = json.loads(self.ws.recv(timeout=left))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise Failure(f"{method}: {msg['error']}")
                return msg["result"]
            if "method" in msg:
                self.events.append(msg)

    def sent_headers(self, path):
        """The headers of every request the page sent whose URL path is `path`, as
        Chromium put them on the wire (needs Network.enable before the requests)."""
        urls = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in self.events
                if e["method"] == "Network.requestWillBeSent"}
        return [{k.lower(): v for k, v in e["params"]["headers"].items()} for e in self.events
                if e["method"] == "Network.requestWillBeSentExtraInfo"
                and urllib.parse.urlsplit(urls.get(e["params"]["requestId"], "")).path == path]

    def console_problems(self):
        """Console errors and uncaught exceptions (needs Runtime.enable, Log.enable)."""
        return [e["params"] for e in self.events
                if e["method"] == "Runtime.exceptionThrown"
                or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
                or (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")]

    def eval(self, expr):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise Failure(f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def goto(self, url):
        self.call("Page.navigate", {"url": url})
        wait_until(lambda: self.eval("document.readyState === 'complete' && location.href")
                   == url, f"the page {url} to load")

    def viewport(self, width, height):
        """Lays the page out as in a window of `width` x `height` CSS pixels at scale 1
        (what a screenshot without `selector` then shows)."""
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                          "deviceScaleFactor": 1,
                                                          "mobile": False})

    def screenshot(self, path, selector=None):
        params = {"format": "png"}
        if selector:
            r = self.eval("(() => { const r = document.querySelector(%s)"
                          ".getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })()"
                          % json.dumps(selector))
            params["clip"] = {"x": r[0], "y": r[1], "width": r[2], "height": r[3], "scale": 1}
        data = base64.b64decode(self.call("Page.captureScreenshot", params)["data"])
        Path(path).write_bytes(data)
        return data

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass
        stop(self.proc)


class PageServer:
    """Serves tests/clients/ on its own 127.0.0.1 port: an origin other than the relay's."""

    def __init__(self):
        class Quiet(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(HERE), **kw)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------- checks


def test_browser_eventsource():
    """EventSource in Chromium, cross-origin, ?access_token=, a filter, and Last-Event-ID
    resume across a graceful shutdown and a kill, each followed by a restart on the same
    port with --history; the Events posted while the page was cut off arrive after it
    reconnects, none twice, byte-for-byte."""
    history = tempfile.mkdtemp(prefix="history-", dir=ARGS.out)
    pages = PageServer()
    browser = None
    relays = []
    try:
        tokens = tokens_file([("page-watch-7f3a", "watch"), ("poster-emit-91c2", "emit")])
        port = free_port()
        args = ["--tokens-file", tokens, "--history", history, "--cors-origin", pages.origin]

        def start(name, on_port=port):
            r = Relay(name, *args, port=on_port)
            relays.append(r)
            return r

        def post(relay, lines):
            relay.post_ok(lines, token="poster-emit-91c2")

        relay = start("es-1")
        flt = '{"session":["es-a"],"type":["tool.*","run.finished"]}'
        types = ["tool.started", "tool.completed", "run.started", "run.finished"]
        frag = urllib.parse.urlencode({"relay": relay.base, "token": "page-watch-7f3a",
                                       "filter": flt, "types": ",".join(types)})
        browser = Browser("eventsource")
        browser.call("Network.enable")  # to read the Last-Event-ID headers sent
        browser.goto(f"{pages.origin}/eventsource.html#{frag}")
        wait_until(lambda: browser.eval("window.aep.opens") >= 1, "the EventSource to open")

        expected = []  # the Events the page must receive, in order
        seq = [0]

        def batch(relay, kinds):
            """Posts one Event per kind in session es-a (plus a non-matching session);
            returns the ones the filter selects."""
            lines, want = [], []
            for k in kinds:
                seq[0] += 1
                e = ev("es-a", seq[0], k)
                lines.append(e)
                lines.append(ev("es-b", seq[0], k))  # filtered out by session
                if k.startswith("tool.") or k == "run.finished":
                    want.append(e)
            post(relay, lines)
            return want

        def received():
            return browser.eval("window.aep.received")

        def wait_received(n, what):
            wait_until(lambda: len(received()) >= n, f"{what}: {n} Events on the page")

        # Live, before any drop.
        expected += batch(relay, ["tool.started", "run.started", "tool.completed"])
        wait_received(len(expected), "live delivery")

        # Drop 1: a graceful shutdown (SIGTERM ends the stream with `: shutting-down`).
        resumed_from = [received()[-1]["id"]]
        check(relay.stop(signal.SIGTERM) == 0, "the relay exits 0 on SIGTERM")
        wait_until(lambda: browser.eval("window.aep.errors") >= 1,
                   "the page to see the stream end")
        # While the page is cut off, Events are posted to the same history by a relay
        # on another port, which the page cannot reach. Its URL has no `from`, so these
        # reach it only by resuming from its Last-Event-ID.
        side = start("es-side-1", on_port=0)
        missed = batch(side, ["tool.started", "run.finished", "run.started"])
        expected += missed
        check(side.stop() == 0, "the side relay exits 0")
        relay = start("es-2")
        wait_received(len(expected), "resume after a graceful restart")
        check(browser.eval("window.aep.opens") >= 2, "the page reconnected")
        expected += batch(relay, ["tool.completed"])
        wait_received(len(expected), "live delivery after the restart")

        # Drop 2: the relay is killed (the connection is cut without a word).
        resumed_from.append(received()[-1]["id"])
        relay.stop(signal.SIGKILL)
        side = start("es-side-2", on_port=0)
        missed += batch(side, ["tool.started", "tool.completed"])
        expected += missed[-2:]
        side.stop()
        relay = start("es-3")
        wait_received(len(expected), "resume after a kill and restart")
        expected += batch(relay, ["run.finished"])
        wait_received(len(expected), "live delivery after the second restart")

        time.sleep(0.5)  # anything extra (a duplicate) would have arrived by now
        browser.screenshot(Path(ARGS.out) / "eventsource.png")
        got = received()
        state = browser.eval("window.aep")
        log(f"page: {len(got)} Events, {state['opens']} opens, {state['errors']} errors")
        check(state["unnamed"] == [], f"no unnamed messages: {state['unnamed']}")
        ids = [g["id"] for g in got]
        check(len(set(ids)) == len(ids), f"no duplicate: {ids}")
        check(len(got) == len(expected),
              f"received {len(got)} Events, expected {len(expected)}: {ids}")
        for g, e in zip(got, expected):
            doc = json.loads(e)
            check(g["data"].encode("utf-8") == e.encode("utf-8"),
                  f"byte-for-byte: got {g['data']!r}, posted {e!r}")
            check(g["type"] == doc["type"], f"event name {g['type']} for {doc['type']}")
            check(g["id"] == f"es-a:0:{doc['seq']}", f"lastEventId {g['id']}")
            check(g["origin"] == relay.base, f"origin {g['origin']}")
        sent = [h.get("last-event-id") for h in browser.sent_headers("/stream")]
        check(sent and sent[0] is None, f"the first request has no Last-Event-ID: {sent}")
        check(all(i in sent for i in resumed_from),
              f"the reconnects sent Last-Event-ID {resumed_from}: {sent}")
        log(f"{len(expected)} Events byte-identical in order, {len(missed)} of them posted "
            f"while the page was cut off; Last-Event-ID sent: {[i for i in sent if i]}")
    finally:
        if browser:
            browser.close()
        for r in relays:
            r.stop(signal.SIGKILL)
        pages.close()


def test_certificate():
    """A test certificate for 127.0.0.1 and localhost (ECDSA P-256, CA:FALSE, which rustls
    requires of a server certificate), made with openssl in a scratch directory:
    `(dir, cert, key, an ssl context trusting exactly it)`."""
    import ssl
    tmp = Path(tempfile.mkdtemp(prefix="tls-", dir=ARGS.out))
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-addext", "basicConstraints=critical,CA:FALSE",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return tmp, cert, key, ssl.create_default_context(cafile=str(cert))


def test_browser_eventsource_https():
    """EventSource in Chromium over HTTPS: the relay serves TLS with a test
    certificate (ECDSA P-256, made here with openssl) that Chromium trusts by its public
    key hash (--ignore-certificate-errors-spki-list, that one key only); a page from
    another (plain http) origin consumes /stream cross-origin, then resumes with
    Last-Event-ID across a SIGTERM and a restart on the same port with --history, none
    twice, byte-for-byte."""
    tmp, cert, key, trust = test_certificate()
    spki = subprocess.run(
        "openssl x509 -in cert.pem -pubkey -noout | openssl pkey -pubin -outform der"
        " | openssl dgst -sha256 -binary | base64", shell=True, cwd=tmp, check=True,
        capture_output=True, text=True).stdout.strip()
    history = tempfile.mkdtemp(prefix="history-", dir=ARGS.out)
    pages = PageServer()
    browser = None
    relays = []
    try:
        tokens = tokens_file([("page-watch-7f3a", "watch"), ("poster-emit-91c2", "emit")])
        port = free_port()
        args = ["--tls-cert", str(cert), "--tls-key", str(key), "--history", history,
                "--tokens-file", tokens, "--cors-origin", pages.origin]

        def start(name):
            r = Relay(name, *args, port=port)
            r.base = f"https://127.0.0.1:{r.port}"
            relays.append(r)
            return r

        seq = [0]

        def post(relay, kinds):
            lines = []
            for k in kinds:
                seq[0] += 1
                lines.append(ev("tls-a", seq[0], k))
            body = ("\n".join(lines) + "\n").encode()
            req = urllib.request.Request(relay.base + "/events", data=body, method="POST",
                                         headers={"AEP-Version": "0.1",
                                                  "Content-Type": "application/x-ndjson",
                                                  "Authorization": "Bearer poster-emit-91c2"})
            with urllib.request.urlopen(req, timeout=WAIT, context=trust) as r:
                check(r.status == 202, f"POST /events over HTTPS answered {r.status}")
            return lines

        relay = start("es-tls-1")
        types = ["tool.started", "tool.completed"]
        frag = urllib.parse.urlencode({"relay": relay.base, "token": "page-watch-7f3a",
                                       "filter": '{"session":["tls-a"]}',
                                       "types": ",".join(types)})
        browser = Browser("eventsource-https",
                          extra_args=[f"--ignore-certificate-errors-spki-list={spki}"])
        browser.call("Network.enable")
        browser.goto(f"{pages.origin}/eventsource.html#{frag}")
        wait_until(lambda: browser.eval("window.aep.opens") >= 1,
                   "the EventSource to open over HTTPS")

        def received():
            return browser.eval("window.aep.received")

        expected = post(relay, ["tool.started", "tool.completed", "tool.started"])
        wait_until(lambda: len(received()) >= len(expected), "live delivery over HTTPS")
        resumed_from = received()[-1]["id"]
        check(relay.stop(signal.SIGTERM) == 0, "the relay exits 0 on SIGTERM")
        wait_until(lambda: browser.eval("window.aep.errors") >= 1,
                   "the page to see the stream end")
        relay = start("es-tls-2")
        expected += post(relay, ["tool.completed", "tool.started"])
        wait_until(lambda: len(received()) >= len(expected),
                   "resume over HTTPS after a graceful restart")
        # A sentinel: the stream is in order, so a duplicate would come before it.
        expected += post(relay, ["tool.completed"])
        wait_until(lambda: received()[-1]["data"] == expected[-1], "the sentinel")
        got = received()
        ids = [g["id"] for g in got]
        check(len(got) == len(expected) and len(set(ids)) == len(ids),
              f"received {ids}, expected {len(expected)} Events once each")
        for g, e in zip(got, expected):
            check(g["data"].encode("utf-8") == e.encode("utf-8"),
                  f"byte-for-byte: got {g['data']!r}, posted {e!r}")
            check(g["origin"] == relay.base, f"origin {g['origin']}")
        sent = [h.get("last-event-id") for h in browser.sent_headers("/stream")]
        check(resumed_from in sent, f"the reconnect sent Last-Event-ID {resumed_from}: {sent}")
        log(f"{len(expected)} Events over HTTPS byte-identical in order; "
            f"Last-Event-ID sent: {[i for i in sent if i]}")
    finally:
        if browser:
            browser.close()
        for r in relays:
            r.stop(signal.SIGKILL)
        pages.close()


# Hostile sessions and the session part of the `id:` the relay writes for
# each: `%`, C0 controls, DEL, non-ASCII bytes and a leading space become %XX.
HOSTILE_SESSIONS = [
    ('s1\ndata: {"fake":true}\n\nid: x', 's1%0Adata: {"fake":true}%0A%0Aid: x'),
    ("a:b:0:1", "a:b:0:1"),
    ("50%", "50%25"),
    ("%0A", "%250A"),
    ("back\\slash", "back\\slash"),
    ("cr\rx", "cr%0Dx"),
    ("lf\nx", "lf%0Ax"),
    ("nul\0x", "nul%00x"),
    ("séance 会话 𝄞", "s%C3%A9ance %E4%BC%9A%E8%AF%9D %F0%9D%84%9E"),
    (" lead", "%20lead"),
    ("k" * 1024, "k" * 1024),
    ("\r\n%:é" * 171, "%0D%0A%25:%C3%A9" * 171),
]


def hostile_ev(n, session, seq):
    """A sequenced Event in `session` as exact JSON text (control characters escaped)."""
    return json.dumps({"aep": "0.1", "id": f"h{n}-{seq}", "type": "tool.completed",
                       "time": "2026-07-03T10:15:04.221Z",
                       "source": "aep://127.0.0.1/agent/clients/session/h",
                       "agent": "clients", "session": session, "seq": seq},
                      ensure_ascii=False, separators=(",", ":"))


def test_browser_eventsource_hostile_sessions():
    """EventSource in Chromium against sessions holding LF, CR, NUL, %, :, \\, non-ASCII,
    a leading space, 1 KiB: one message per Event (no phantom message from an injected
    `data:`), lastEventId the escaped id, and the Last-Event-ID resume after a restart
    delivers exactly the Events of that session posted meanwhile."""
    pages = PageServer()
    browser = None
    relays = []
    try:
        tokens = tokens_file([("page-watch-h", "watch"), ("poster-emit-h", "emit")])
        browser = Browser("eventsource-hostile")
        browser.call("Network.enable")
        total = 0
        per_page = 4  # one EventSource each, within Chromium's 6 connections per host
        for first in range(0, len(HOSTILE_SESSIONS), per_page):
            cases = list(enumerate(HOSTILE_SESSIONS))[first:first + per_page]
            history = tempfile.mkdtemp(prefix="history-", dir=ARGS.out)
            args = ["--tokens-file", tokens, "--history", history,
                    "--cors-origin", pages.origin]
            port = free_port()

            def start(name, on_port=port):
                r = Relay(name, *args, port=on_port)
                relays.append(r)
                return r

            def post(relay, seqs):
                relay.post_ok([hostile_ev(n, s, q) for n, (s, _) in cases for q in seqs],
                              token="poster-emit-h")

            relay = start(f"hostile-{first}")
            filters = [json.dumps({"session": s}) for _, (s, _) in cases]
            frag = urllib.parse.urlencode({"relay": relay.base, "token": "page-watch-h",
                                           "filters": json.dumps(filters),
                                           "types": "tool.completed"})
            browser.events.clear()
            # A query of its own per round: a fresh document (a fragment change alone
            # would keep the previous round's EventSources).
            browser.goto(f"{pages.origin}/eventsource.html?round={first}#{frag}")
            wait_until(lambda: browser.eval("window.aep.opens") >= len(cases),
                       "every EventSource to open")

            def received():
                return browser.eval("window.aep.received")

            post(relay, [1, 2])
            wait_until(lambda: len(received()) >= 2 * len(cases), "the live Events")
            check(relay.stop(signal.SIGTERM) == 0, "the relay exits 0 on SIGTERM")
            side = start(f"hostile-side-{first}", on_port=0)
            post(side, [3, 4])
            check(side.stop() == 0, "the side relay exits 0")
            relay = start(f"hostile-{first}-again")
            wait_until(lambda: len(received()) >= 4 * len(cases),
                       "the Events posted while the pages were cut off, by Last-Event-ID")
            post(relay, [5])
            wait_until(lambda: len(received()) >= 5 * len(cases), "live after the restart")
            # A barrier, not a pause: seq 6 follows everything the relay sent before it on
            # each stream, so once every page has it, any duplicate or phantom is in too.
            post(relay, [6])
            wait_until(lambda: sum(1 for g in received() if '"seq":6' in g["data"])
                       >= len(cases), "the barrier Event on every stream")

            state = browser.eval("window.aep")
            check(state["unnamed"] == [], f"no unnamed (phantom) messages: {state['unnamed']}")
            got = state["received"]
            check(len(got) == 6 * len(cases), f"{len(got)} messages for {6 * len(cases)} "
                  f"Events: {[(g['stream'], g['data'][:80]) for g in got]}")
            for k, (n, (session, escaped)) in enumerate(cases):
                mine = [g for g in got if g["stream"] == k]
                want = [hostile_ev(n, session, q) for q in range(1, 7)]
                check([g["data"] for g in mine] == want,
                      f"session {session[:40]!r}: got {[g['data'][:120] for g in mine]}")
                ids = [g["id"] for g in mine]
                check(ids == [f"{escaped}:0:{q}" for q in range(1, 7)],
                      f"session {session[:40]!r}: lastEventId {[i[:80] for i in ids]}")
            # This round's sessions only: the previous round's pages, cut off when their
            # relay stopped, may reconnect (after the `retry:` the relay sent them)
            # before this round's page replaces them.
            mine = {e for _, (_, e) in cases}
            sent = {h.get("last-event-id") for h in browser.sent_headers("/stream")} - {None}
            sent = {i for i in sent if i.rsplit(":", 2)[0] in mine}
            want_sent = {f"{e}:0:2" for e in mine}
            check(sent == want_sent, f"Last-Event-ID sent {sorted(i[:60] for i in sent)}, "
                  f"expected {sorted(i[:60] for i in want_sent)}")
            total += len(cases)
            relay.stop()
        log(f"{total} hostile sessions: one message per Event, exact ids, exact resume")
    finally:
        if browser:
            browser.close()
        for r in relays:
            r.stop(signal.SIGKILL)
        pages.close()


class WssClient:
    """`websockets`' asyncio client behind the blocking calls the checks use (`send`,
    `recv(timeout=)`, `response`, `protocol`), on an event loop of its own.

    Over TLS the sync client is not used: it reads the socket in a thread while the
    opening thread writes the upgrade request, and Python's `ssl` does not support one
    SSL object used from two threads at once. Under load (measured here: 4 of 6
    clients within 300 connections, the request never reached the socket while the
    relay had sent its handshake and session tickets) the request is lost and the
    client waits until the relay's idle timeout. The asyncio client is one thread."""

    def __init__(self, url, **kwargs):
        self._loop = asyncio.new_event_loop()
        try:
            self._ws = self._loop.run_until_complete(ws_connect_async(url, **kwargs))
        except BaseException:
            self._loop.close()
            raise
        self.response, self.protocol = self._ws.response, self._ws.protocol

    def send(self, text):
        self._loop.run_until_complete(self._ws.send(text))

    def recv(self, timeout=None):
        return self._loop.run_until_complete(asyncio.wait_for(self._ws.recv(), timeout))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self._loop.run_until_complete(self._ws.close())
        finally:
            self._loop.close()


def ws_hello(ws, role, agent=None):
    hello = {"type": "hello", "versions": ["0.1"], "role": role}
    if agent:
        hello["identity"] = {"agent": agent, "instance": "clients/1"}
    ws.send(json.dumps(hello))
    answer = json.loads(ws.recv(timeout=WAIT))
    check(answer.get("type") == "hello" and answer.get("versions") == ["0.1"],
          f"hello answered {answer}")
    return answer


def ws_frames(ws, until, what):
    """Receives text frames until `until(frame_text)`; returns them (pings dropped)."""
    out = []
    deadline = time.monotonic() + WAIT
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Failure(f"timed out waiting for {what}; got {out}")
        try:
            text = ws.recv(timeout=left)
        except TimeoutError:
            raise Failure(f"timed out waiting for {what}; got {out}")
        check(isinstance(text, str), f"a text frame: {text!r}")
        if json.loads(text).get("type") == "ping":
            continue
        out.append(text)
        if until(text):
            return out


def is_event(text):
    return "." in json.loads(text).get("type", "")


def test_python_websockets_consumer():
    """`websockets` as a consumer: two subscriptions with replay from positions, filters,
    one delivery of an Event matching both, unsubscribe."""
    tokens = tokens_file([("dash-watch-1", "watch"), ("agent-emit-1", "emit")])
    relay = Relay("ws-consumer", "--tokens-file", tokens)
    try:
        history = [ev("ws-a", i, t) for i, t in
                   enumerate(["session.started", "tool.started", "tool.completed",
                              "run.started", "tool.started"])]
        history += [ev("ws-b", i, "run.started") for i in range(3)]
        relay.post_ok(history, token="agent-emit-1")
        url = f"ws://{relay.addr}/socket?access_token=dash-watch-1"
        with ws_connect(url, open_timeout=WAIT, max_size=None) as ws:
            ws_hello(ws, "consumer")
            # s1: tool.* after ws-a:0:1 replays ws-a seq 2 and 4.
            ws.send(json.dumps({"type": "subscribe", "id": "s1", "filter": {"type": ["tool.*"]},
                                "from": [{"session": "ws-a", "epoch": 0, "seq": 1}]}))
            want1 = [history[2], history[4]]
            got = ws_frames(ws, lambda t: t == want1[-1], "the replay of s1")
            check(json.loads(got[0]) == {"type": "subscribed", "id": "s1"}, f"s1: {got[0]}")
            check(got[1:] == want1, f"s1 replays tool.* after seq 1: {got[1:]}")
            # s2: session ws-b after ws-b:0:0 replays seq 1 and 2.
            ws.send(json.dumps({"type": "subscribe", "id": "s2",
                                "filter": {"session": ["ws-b"]},
                                "from": [{"session": "ws-b", "seq": 0}]}))
            want2 = history[6:8]
            got = ws_frames(ws, lambda t: t == want2[-1], "the replay of s2")
            check(json.loads(got[0]) == {"type": "subscribed", "id": "s2"}, f"s2: {got[0]}")
            check(got[1:] == want2, f"s2 replays ws-b after seq 0: {got[1:]}")
            # Live: one Event matching both subscriptions, one each, one neither, a fence.
            both = ev("ws-b", 3, "tool.started")
            only1 = ev("ws-c", 1, "tool.completed")
            only2 = ev("ws-b", 4, "run.finished")
            neither = ev("ws-c", 2, "run.started")
            fence = ev("ws-c", 3, "tool.started")
            relay.post_ok([both, only1, only2, neither, fence], token="agent-emit-1")
            got = ws_frames(ws, lambda t: t == fence, "the live Events")
            check(got == [both, only1, only2, fence],
                  f"live: each matching Event once, byte-identical, in order: {got}")
            check(got.count(both) == 1, "the Event matching both subscriptions came once")
            # After unsubscribing s1, tool Events of other sessions stop.
            ws.send(json.dumps({"type": "unsubscribe", "id": "s1"}))
            got = ws_frames(ws, lambda t: json.loads(t).get("type") == "unsubscribed",
                            "unsubscribed")
            check(json.loads(got[-1]).get("id") == "s1", f"unsubscribed: {got}")
            fence2 = ev("ws-b", 5, "run.finished")
            relay.post_ok([ev("ws-c", 4, "tool.started"), fence2], token="agent-emit-1")
            got = ws_frames(ws, lambda t: t == fence2, "the fence after unsubscribe")
            check(got == [fence2], f"only s2 delivers after unsubscribe: {got}")
        log("replay 2 + 2, live 4 of 5 (one matching both, delivered once), unsubscribe")
    finally:
        relay.stop()


def test_python_websockets_emitter():
    """`websockets` as an emitter (Authorization header): its Events arrive on SSE
    byte-identical with their ids; an invalid one is answered with an error frame."""
    tokens = tokens_file([("dash-watch-2", "watch"), ("agent-emit-2", "emit")])
    relay = Relay("ws-emitter", "--tokens-file", tokens)
    sse = None
    try:
        flt = urllib.parse.quote('{"agent":["py-emitter"]}')
        sse = Sse(relay.base, f"access_token=dash-watch-2&filter={flt}")
        sent = [ev("ws-e", i, t, agent="py-emitter") for i, t in
                enumerate(["session.started", "tool.started", "tool.completed", "run.finished"])]
        with ws_connect(f"ws://{relay.addr}/socket", open_timeout=WAIT,
                        additional_headers={"Authorization": "Bearer agent-emit-2"}) as ws:
            ws_hello(ws, "emitter", agent="py-emitter")
            for e in sent[:2]:
                ws.send(e)
            bad = '{"aep":"0.1","id":"bad-1","type":"tool.started","agent":"py-emitter"}'
            ws.send(bad)
            got = ws_frames(ws, lambda t: True, "the refusal of an invalid Event")
            err = json.loads(got[0])
            check(err.get("type") == "error" and err.get("id") == "bad-1"
                  and err.get("code") == "invalid-event", f"invalid Event answered {err}")
            for e in sent[2:]:
                ws.send(e)
            for e in sent:
                m = sse.next()
                doc = json.loads(e)
                check(m["data"] == e.encode(), f"SSE data byte-identical: {m['data']!r}")
                check(m.get("event") == doc["type"] and m.get("id") == f"ws-e:0:{doc['seq']}",
                      f"SSE event/id: {m}")
        status = relay.status(token="dash-watch-2")
        check(status["ingested"] == len(sent), f"ingested {status['ingested']}")
        log(f"{len(sent)} Events over WebSocket arrived on SSE byte-identical; "
            "the invalid one got an error frame")
    finally:
        if sse:
            sse.close()
        relay.stop()


def deflate_corpus():
    """Events for the compression checks: the golden corpus's sequenced Events that are
    fanned out (commands are routed, AEP-0004 §4) when ../shared is there, and generated
    Events of several sizes (around the compression threshold and past 16 KiB)."""
    lines = []
    golden = ROOT.parent / "shared" / "aep-fixtures" / "golden" / "golden.jsonl"
    if golden.exists():
        lines = [l for l in golden.read_text().splitlines()
                 if l.strip() and '"type":"control.' not in l]
    lines += [ev("z-gen", i + 1, "tool.completed", pad=p)
              for i, p in enumerate([0, 100, 600, 3000, 20000])]
    return lines


def test_python_websockets_deflate():
    """`websockets` with compression on (its default offer, `permessage-deflate;
    client_max_window_bits`) and off, side by side on one relay: the first negotiates
    the extension with server_no_context_takeover (RFC 7692 §7.1.1.1), both receive the
    same Events byte-identical (after inflation), live and replayed with `from`; and a
    compressing emitter (context takeover on its side) sends Events that arrive intact."""
    relay = Relay("ws-deflate")
    try:
        lines = deflate_corpus()
        replayed = [l for l in lines if '"session":"z-gen"' in l]
        relay.post_ok(replayed[:2])
        url = f"ws://{relay.addr}/socket"
        with ws_connect(url, open_timeout=WAIT, max_size=None) as zws, \
                ws_connect(url, open_timeout=WAIT, max_size=None, compression=None) as pws:
            answer = zws.response.headers.get("Sec-WebSocket-Extensions", "")
            check(answer.startswith("permessage-deflate; server_no_context_takeover"),
                  f"the compressing client was answered {answer!r}")
            exts = zws.protocol.extensions
            check(len(exts) == 1 and exts[0].name == "permessage-deflate"
                  and exts[0].remote_no_context_takeover,
                  f"websockets agreed {exts}")
            check("Sec-WebSocket-Extensions" not in pws.response.headers
                  and pws.protocol.extensions == [],
                  f"the plain client got {pws.response.headers}")
            for ws in (zws, pws):
                ws_hello(ws, "consumer")
                ws.send(json.dumps({"type": "subscribe", "id": "live"}))
                ws_frames(ws, lambda t: json.loads(t).get("type") == "subscribed", "subscribed")
            relay.post_ok(lines)
            for name, ws in (("compressed", zws), ("plain", pws)):
                got = ws_frames(ws, lambda t: t == lines[-1], f"the live Events ({name})")
                check(got == lines, f"{name}: live Events byte-identical, in order "
                      f"({len(got)} of {len(lines)})")
            for name, ws in (("compressed", zws), ("plain", pws)):
                ws.send(json.dumps({"type": "subscribe", "id": "again", "from": "all",
                                    "filter": {"session": ["z-gen"]}}))
                got = ws_frames(ws, lambda t: t == replayed[-1], f"the replay ({name})")
                check(json.loads(got[0]) == {"type": "subscribed", "id": "again"}, got[0])
                check(got[1:] == replayed, f"{name}: replayed Events byte-identical "
                      f"({len(got) - 1} of {len(replayed)})")
        # A compressing emitter: websockets keeps its context across messages unless
        # told otherwise, so the relay inflates with one window per connection.
        sse = Sse(relay.base, "filter=" + urllib.parse.quote('{"agent":["py-zip"]}'))
        try:
            sent = [ev("z-emit", i, "tool.completed", agent="py-zip", pad=200 * i)
                    for i in range(6)]
            with ws_connect(url, open_timeout=WAIT) as ws:
                check(ws.protocol.extensions != [], "the emitter negotiated compression")
                ws_hello(ws, "emitter", agent="py-zip")
                for e in sent:
                    ws.send(e)
                for e in sent:
                    m = sse.next()
                    check(m["data"] == e.encode(), f"SSE data byte-identical: {m['data']!r}")
        finally:
            sse.close()
        log(f"{len(lines)} live and {len(replayed)} replayed Events byte-identical with "
            "and without permessage-deflate; a compressing emitter's "
            f"{len(sent)} Events arrived intact")
    finally:
        relay.stop()


def test_python_websockets_wss():
    """`websockets` over WSS, with compression on and off, side by side on one relay
    serving TLS (a test certificate it is told to trust): both receive the same Events
    byte-identical, replayed with `from` and live; the compressing one agreed
    permessage-deflate with server_no_context_takeover (RFC 7692 §7.1.1.1)."""
    _, cert, key, trust = test_certificate()
    relay = Relay("ws-wss", "--tls-cert", str(cert), "--tls-key", str(key))
    relay.base = f"https://127.0.0.1:{relay.port}"

    def post(lines):
        req = urllib.request.Request(relay.base + "/events",
                                     data=("\n".join(lines) + "\n").encode(), method="POST",
                                     headers={"AEP-Version": "0.1",
                                              "Content-Type": "application/x-ndjson"})
        with urllib.request.urlopen(req, timeout=WAIT, context=trust) as r:
            check(r.status == 202, f"POST /events over HTTPS answered {r.status}")

    try:
        lines = deflate_corpus()
        # Held: the generated Events (one session, every one replayed); live: all.
        held = [l for l in lines if '"session":"z-gen"' in l]
        live = lines
        post(held)
        url = f"wss://127.0.0.1:{relay.port}/socket"
        with WssClient(url, ssl=trust, open_timeout=WAIT, max_size=None) as zws, \
                WssClient(url, ssl=trust, open_timeout=WAIT, max_size=None,
                          compression=None) as pws:
            answer = zws.response.headers.get("Sec-WebSocket-Extensions", "")
            check(answer.startswith("permessage-deflate; server_no_context_takeover"),
                  f"the compressing client was answered {answer!r} over WSS")
            check(pws.protocol.extensions == [], "the plain client compresses nothing")
            for name, ws in (("compressed", zws), ("plain", pws)):
                ws_hello(ws, "consumer")
                ws.send(json.dumps({"type": "subscribe", "id": "all", "from": "all",
                                    "filter": {"session": ["z-gen"]}}))
                got = ws_frames(ws, lambda t: t == held[-1], f"the replay over WSS ({name})")
                check(got[1:] == held, f"{name}: replayed Events byte-identical over WSS "
                      f"({len(got) - 1} of {len(held)})")
            for ws in (zws, pws):
                ws.send(json.dumps({"type": "subscribe", "id": "live"}))
                ws_frames(ws, lambda t: json.loads(t).get("type") == "subscribed", "subscribed")
            post(live)
            for name, ws in (("compressed", zws), ("plain", pws)):
                got = ws_frames(ws, lambda t: t == live[-1], f"the live Events over WSS ({name})")
                check(got == live, f"{name}: live Events byte-identical over WSS "
                      f"({len(got)} of {len(live)})")
        log(f"{len(held)} replayed and {len(live)} live Events byte-identical over WSS, "
            "with and without permessage-deflate")
    finally:
        relay.stop()


BROWSER_WS_JS = r"""
(async () => {
  const ws = new WebSocket(%(url)s);
  window.got = [];
  window.sock = ws;
  await new Promise((ok, fail) => { ws.onopen = ok; ws.onerror = fail; });
  ws.onmessage = (m) => {
    if (JSON.parse(m.data).type !== "ping") window.got.push(m.data);
  };
  ws.send(JSON.stringify({type: "hello", versions: ["0.1"], role: "consumer"}));
  ws.send(JSON.stringify({type: "subscribe", id: "b", from: "all"}));
  return ws.extensions;
})()
"""


def test_browser_websocket_deflate():
    """Chromium's WebSocket offers permessage-deflate; the relay's answer is agreed
    (WebSocket.extensions), and the Events it receives (replayed with `from: "all"`, then
    live) are byte-identical to those posted, after Chromium inflated them."""
    relay = Relay("ws-browser")
    browser = None
    try:
        lines = deflate_corpus()
        history = [l for l in lines if '"session":"z-gen"' in l]
        relay.post_ok(history)
        browser = Browser("websocket")
        ext = browser.eval(BROWSER_WS_JS % {"url": json.dumps(f"ws://{relay.addr}/socket")})
        check(ext.startswith("permessage-deflate") and "server_no_context_takeover" in ext,
              f"Chromium agreed {ext!r}")
        wait_until(lambda: browser.eval("window.got.length") >= 2 + len(history),
                   "the replay in Chromium")
        got = browser.eval("window.got")
        check(json.loads(got[0]).get("type") == "hello", got[0])
        check(json.loads(got[1]) == {"type": "subscribed", "id": "b"}, got[1])
        check(got[2:] == history, f"replayed in Chromium byte-identical: {got[2:]}")
        live = [l for l in lines if l not in history]
        relay.post_ok(live)
        wait_until(lambda: browser.eval("window.got.length") >= 2 + len(lines),
                   "the live Events in Chromium")
        got = browser.eval("window.got")[2 + len(history):]
        check(got == live, f"live in Chromium byte-identical ({len(got)} of {len(live)})")
        log(f"Chromium agreed {ext!r}; {len(history)} replayed and {len(live)} live "
            "Events byte-identical")
    finally:
        if browser:
            browser.close()
        relay.stop()


def console_commands(text):
    """The `$ ` commands of a page's ```console blocks, continuation lines joined."""
    cmds = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        cmd = None
        for line in block.split("\n"):
            if cmd is not None and cmd.rstrip().endswith(("\\", "|")):
                cmd += "\n" + line
            elif line.startswith("$ "):
                if cmd is not None:
                    cmds.append(cmd)
                cmd = line[2:]
        if cmd is not None:
            cmds.append(cmd)
    return cmds


def page_commands(rel):
    """A page's curl commands: its transcripts (```console) and inline `curl ...` spans."""
    text = (ROOT / rel).read_text()
    cmds = [c for c in console_commands(text) if c.startswith("curl")]
    cmds += re.findall(r"`(curl [^`]+)`", text)
    return text, cmds


def one(cmds, pred, what):
    found = [c for c in cmds if pred(c)]
    check(len(found) == 1, f"the docs show exactly one {what}: found {len(found)}")
    return found[0]


def test_curl_readme():
    """The curl commands of README.md, and those of docs/consuming.md and docs/emitting.md
    that read what the README posted, as the pages show them, with only the address
    replaced by the test relay's. (tests/docs/run.sh runs every command of every page;
    this check follows one live stream through them.)"""
    text, cmds = page_commands("README.md")
    _, consuming = page_commands("docs/consuming.md")
    _, emitting = page_commands("docs/emitting.md")
    readme_base = "http://127.0.0.1:8787"
    relay = Relay("curl")
    stream_proc = None
    try:
        def run(cmd, timeout=WAIT):
            cmd = cmd.replace(readme_base, relay.base)
            r = subprocess.run(["bash", "-c", "set -o pipefail\n" + cmd], cwd=ROOT,
                               capture_output=True, timeout=timeout)
            check(r.returncode == 0, f"{cmd!r} exited {r.returncode}: {r.stderr[-500:]!r}")
            return r.stdout

        stream_cmd = one(cmds, lambda c: c.startswith("curl -N ") and "-G" not in c,
                         "live stream command")
        post_cmd = one(cmds, lambda c: "application/json" in c and "-d " in c,
                       "single-Event POST")
        batch_cmd = one(cmds, lambda c: "x-ndjson" in c, "batch POST")
        filtered_cmd = one(consuming, lambda c: c.startswith("curl -s -G ") and "capture=" in c,
                           "filtered stream")
        history_cmd = one(consuming, lambda c: c.startswith("curl -s -G ") and "live=0" in c
                          and '"session"' in c and "capture=" not in c,
                          "session history (live=0 and a session filter)")
        discovery_cmd = one(emitting, lambda c: c.rstrip().endswith("/events") and "-X" not in c,
                            "discovery command")

        out = Path(ARGS.out) / "curl-stream.txt"
        with open(out, "wb") as f:
            stream_proc = spawn(["bash", "-c", stream_cmd.replace(readme_base, relay.base)],
                                Path(ARGS.out) / "curl-stream.err", stdout=f)
        wait_until(lambda: relay.status()["connections"]["sse"] == 1, "curl -N to connect")

        answer = run(post_cmd)
        check(json.loads(answer) == {"accepted": 1}, f"POST answered {answer!r}")
        posted = shlex.split(post_cmd.replace("\\\n", " "))
        payload = posted[posted.index("-d") + 1].encode()
        shown = re.search(r"```text\n(event: .*?\nid: .*?\n)data: ", text, re.S).group(1)
        first = shown.encode() + b"data: " + payload + b"\n\n"
        wait_until(lambda: first in out.read_bytes(), "the posted Event on curl -N")
        # The opening comment, the `retry:` a live stream starts with (jittered), then
        # the Event exactly as the README shows it.
        opening = rb": aep-relay stream open\n\nretry: \d+\n\n"
        check(re.fullmatch(opening + re.escape(first), out.read_bytes()) is not None,
              f"the stream shows the Event exactly as the README does: {out.read_bytes()!r}")
        log("curl -N shows the posted Event as the README says, data byte-identical")

        sample = re.search(r"@(examples/\S+\.ndjson)", batch_cmd).group(1)
        lines = [l for l in (ROOT / sample).read_bytes().split(b"\n") if l]
        answer = run(batch_cmd)
        check(json.loads(answer) == {"accepted": len(lines)}, f"batch answered {answer!r}")

        def datas():
            return [l[6:] for l in out.read_bytes().split(b"\n") if l.startswith(b"data: ")]
        wait_until(lambda: len(datas()) == 1 + len(lines), "the batch on curl -N")
        check(datas() == [payload] + lines, "the batch arrives in order, byte-identical")
        log(f"the batch command: {len(lines)} Events of {sample} accepted and streamed")

        # The filtered replay (live=0) must end by itself; what it prints matches.
        shown = run(filtered_cmd)
        check(shown.startswith(b": aep-relay stream open\n\n"), f"filtered: {shown[:200]!r}")
        check(shown.endswith(b": replay-complete\n\n"), f"filtered: {shown[-200:]!r}")
        # The same shape from the start of the session shows what the filter selects.
        position = json.loads(re.search(r"from=(\[.*?\])'", filtered_cmd).group(1))[0]
        from_start = re.sub(r'("seq":)\d+', r"\g<1>0", filtered_cmd)
        msgs = [json.loads(l[6:]) for l in run(from_start).split(b"\n")
                if l.startswith(b"data: ")]
        rank = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]

        def selected(m):
            return (re.match(r"(attention|error)\.", m["type"]) and m.get("seq", -1) > 0
                    and rank.index(m.get("severity", "info")) >= 2
                    and m.get("session") == position["session"])
        held = [json.loads(payload)] + [json.loads(l) for l in lines]
        want = [m["id"] for m in held if selected(m)]
        check(len(want) > 0 and [m["id"] for m in msgs] == want,
              f"the filter selects {want}: {msgs}")
        log(f"the filtered replay ends by itself; {len(msgs)} Events from seq 0, all matching")

        # A session's history: every held Event of the session, then `: replay-complete`.
        session = json.loads(re.search(r"filter=(\{.*?\})'", history_cmd).group(1))["session"]
        shown = run(history_cmd)
        msgs = [json.loads(l[6:]) for l in shown.split(b"\n") if l.startswith(b"data: ")]
        want = [m["id"] for m in held if m.get("session") == session]
        check(len(want) > 0 and sorted(m["id"] for m in msgs) == sorted(want),
              f"the session's history is every held Event of {session} {want}: {msgs}")
        check(shown.endswith(b": replay-complete\n\n"), f"history: {shown[-200:]!r}")
        log(f"the session-history command shows its {len(msgs)} held Events, then replay-complete")

        doc = json.loads(run(discovery_cmd))
        check(doc.get("endpoints", {}).get("stream") == "/stream", f"discovery: {doc}")
        log("the discovery command answers the discovery document")
    finally:
        if stream_proc:
            stop(stream_proc)
        relay.stop()


# The status page's testable state (see the comment at the top of src/status.html).
SPARKS_JS = ("(() => Object.fromEntries([...document.querySelectorAll('.spark')].map((b) =>"
             " [b.id.slice(6), {points: +(b.dataset.points || 0), nonzero: +(b.dataset.nonzero"
             " || 0), max: +(b.dataset.max || 0), d: b.querySelector('.line').getAttribute('d')"
             " || ''}])))()")
TAIL_JS = ("[...document.querySelectorAll('#tail .ev')].map((d) =>"
           " [...d.querySelector('.line').children].map((c) => c.textContent))")
TAIL_RAW_JS = "[...document.querySelectorAll('#tail .ev')].map((d) => d.raw)"
ROWS_JS = ("[...document.querySelectorAll('#session_rows tr')]"
           ".map((tr) => [...tr.cells].map((td) => td.textContent))")
RELAYS_JS = ("[...document.querySelectorAll('#relay_rows tr')].map((tr) =>"
             " [tr.dataset.relay, ...[...tr.cells].slice(1).map((td) => td.textContent)])")
NUMBERS_JS = ("(() => Object.fromEntries(['sessions','subscriptions','connections',"
              "'ingested','ingest_rate','deliveries','delivery_rate','dropped','refused']"
              ".map((k) => [k, document.getElementById(k).textContent])))()")
SCREEN = (1000, 800)  # the README's screenshots


def tail_line(e):
    """The line the page's tail shows for Event text `e`: time of day, type, session,
    seq, severity."""
    doc = json.loads(e)
    return [doc["time"][11:23], doc["type"], doc["session"], str(doc["seq"]),
            doc.get("severity", "info")]


def session_row(e, events, earliest, latest):
    doc = json.loads(e)
    return [doc["session"], doc["agent"], doc["source"], str(events), earliest, latest]


def wait_sparks(browser, pred, what):
    """Waits until the sparklines' state satisfies `pred`; returns it."""
    got = []

    def ok():
        got[:] = [browser.eval(SPARKS_JS)]
        return pred(got[0]) and got[0]
    try:
        return wait_until(ok, what, interval=0.2)
    except Failure as e:
        raise Failure(f"{e}; the sparklines: "
                      f"{ {k: {**v, 'd': v['d'][-60:]} for k, v in (got or [{}])[0].items()} }")


def open_raw(browser, index):
    """Clicks the tail's line `index` (negative: from the end); returns its raw view."""
    browser.eval("(() => { const l = [...document.querySelectorAll('#tail .ev .line')];"
                 " l[(%d + l.length) %% l.length].click(); })()" % index)
    return browser.eval("(() => { const l = [...document.querySelectorAll('#tail .ev')];"
                        " const r = l[(%d + l.length) %% l.length].querySelector('.raw');"
                        " return r && r.textContent; })()" % index)


class SlowConsumer:
    """An SSE consumer that never reads, behind a small receive window: the relay's
    queue toward it fills and it drops info Events for it (AEP-0003 §8.4)."""

    def __init__(self, relay, query):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        self.sock.settimeout(WAIT)
        self.sock.connect(("127.0.0.1", relay.port))
        self.sock.sendall(f"GET /stream?{query} HTTP/1.1\r\nHost: {relay.addr}\r\n"
                          "Accept: text/event-stream\r\n\r\n".encode())

    def close(self):
        self.sock.close()


def test_status_page():
    """GET /?access_token= in headless Chromium: the counters, the sparklines (ingest,
    deliveries, connections, drops, refusals), the sessions table with agent and source,
    and the live tail (one line per Event, its raw JSON on a click) follow the traffic;
    the filter typed into the page applies; screenshots before and after."""
    tokens = tokens_file([("ops-watch-22de", "watch"), ("agent-emit-3", "emit")])
    # A small output bound, so that a consumer that does not read drops soon.
    relay = Relay("status", "--tokens-file", tokens, "--max-output", "65536")
    browser = Browser("status")
    slow = None
    idle = []
    out = Path(ARGS.out)
    try:
        page_url = f"{relay.base}/?access_token=ops-watch-22de"
        status, _ = http_request("GET", page_url)
        check(status == 200, f"GET / answered {status} (a build without `status-page`?)")
        browser.call("Runtime.enable")
        browser.call("Log.enable")
        browser.call("Network.enable")
        browser.viewport(*SCREEN)
        browser.goto(page_url)
        wait_until(lambda: browser.eval(NUMBERS_JS)["ingested"] == "0"
                   and browser.eval("document.getElementById('subscriptions').textContent")
                   == "1", "the page's first numbers (its own tail subscribed)")
        before = browser.eval(NUMBERS_JS)
        check(browser.eval("document.getElementById('err').textContent") == "",
              "the page shows no error")
        check(before["refused"] == "0", "loading the page caused no refusal (no favicon 404)")
        check(browser.eval("document.getElementById('cluster_panel').hidden") is True,
              "a single relay shows no cluster panel")
        sp_before = wait_sparks(browser, lambda s: all(v["points"] >= 3 for v in s.values()),
                                "three samples in every sparkline")
        for name in ["ingest", "deliveries", "drops", "refusals"]:
            check(sp_before[name]["nonzero"] == 0, f"{name} is flat before any traffic: "
                                                   f"{sp_before[name]}")
        check(sp_before["connections"]["nonzero"] >= 1, "the page's own connections show")
        shot_before = browser.screenshot(out / "status-before.png")
        cards_before = browser.screenshot(out / "status-cards-before.png", ".cards")
        sparks_before = browser.screenshot(out / "status-sparks-before.png", ".sparks")
        log(f"before: {before}")

        # Drops: a consumer of its own session that never reads, and that session posted
        # in batches (each smaller than the output bound, so the page keeps up) until the
        # relay drops for it.
        slow = SlowConsumer(relay, "access_token=ops-watch-22de&filter="
                            + urllib.parse.quote('{"session":["st-flood"]}'))
        # Connections: three more that send nothing (the relay keeps them for the
        # request timeout, 30 s), so the line rises clear of the page's own.
        idle = [socket.create_connection(("127.0.0.1", relay.port), timeout=WAIT)
                for _ in range(3)]
        wait_until(lambda: relay.status(token="ops-watch-22de")["subscriptions"] == 2,
                   "the slow consumer to subscribe")
        flood = [0]

        def flood_batch():
            batch = [ev("st-flood", flood[0] + i, "tool.completed", time_=now_rfc3339(),
                        pad=900) for i in range(16)]
            flood[0] += len(batch)
            relay.post_ok(batch, token="agent-emit-3")
            return relay.status(token="ops-watch-22de")["dropped"] > 0
        wait_until(flood_batch, "the relay to drop for the slow consumer", interval=0.02)
        log(f"{flood[0]} Events of about 1 KB for the slow consumer made it drop")

        t = now_rfc3339
        posted = [ev("st-a", i, typ, time_=t(i * 150)) for i, typ in
                  enumerate(["session.started", "run.started", "tool.started"])]
        posted += [ev("st-b", 7, "run.started", agent="planner", time_=t(600)),
                   ev("st-b", 8, "run.finished", agent="planner", time_=t(800),
                      severity="warning")]
        relay.post_ok(posted, token="agent-emit-3")
        status, _ = relay.post(['{"aep":"0.1","id":"x","type":"tool.started"}'],
                               token="agent-emit-3")
        check(status == 400, f"an invalid Event is refused: {status}")
        ingested = flood[0] + len(posted)
        rates = []

        def updated():
            n = browser.eval(NUMBERS_JS)
            rates.append(n["ingest_rate"])
            return (n["ingested"] == str(ingested) and n["sessions"] == "3"
                    and n["refused"] == "1" and n)
        wait_until(updated, "the numbers to update", interval=0.1)
        check(any(r not in ("–", "0") for r in rates), f"an ingest rate was shown: {rates}")
        rows = browser.eval(ROWS_JS)
        want = [session_row(posted[4], 2, "0:7", "0:8"), session_row(posted[2], 3, "0:0", "0:2")]
        flood_row = session_row(ev("st-flood", 0, "x"), flood[0], "0:0", f"0:{flood[0] - 1}")
        # (The flood's earliest and count depend on how many it took: the replay buffer
        # keeps the newest.)
        check(len(rows) == 3 and rows[:2] == want and rows[2][:3] == flood_row[:3]
              and rows[2][5] == flood_row[5], f"the sessions table, most recent first: {rows}")
        wait_until(lambda: browser.eval(TAIL_JS)[-5:] == [tail_line(e) for e in posted],
                   "the live tail's last five lines")
        check(browser.eval(TAIL_RAW_JS)[-5:] == posted, "the tail holds the Events as sent")
        check(open_raw(browser, -2) == posted[-2], "a click on a line shows its raw JSON")
        check(open_raw(browser, -2) is None, "a second click closes it")
        check(open_raw(browser, -1) == posted[-1], "another line's raw JSON")
        wait_until(lambda: int(browser.eval(NUMBERS_JS)["deliveries"]) >= 5,
                   "deliveries counted")

        # The sparklines moved: a sample of the traffic is in every ring.
        moved = ["ingest", "deliveries", "drops", "refusals"]
        sp_after = wait_sparks(
            browser, lambda s: all(s[n]["nonzero"] >= 1 for n in moved)
            and s["connections"]["max"] >= sp_before["connections"]["max"] + 3,
            "the sparklines of ingest, deliveries, drops and refusals to leave 0, and "
            "connections to rise by 3")
        for name in sp_after:
            check(sp_after[name]["d"] != sp_before[name]["d"], f"the {name} line moved")
        after = browser.eval(NUMBERS_JS)
        log(f"after: {after}")
        log("sparklines: " + ", ".join(f"{k} {v['nonzero']}/{v['points']} nonzero, max "
                                       f"{v['max']:g}" for k, v in sp_after.items()))
        shot_after = browser.screenshot(out / "status-after.png")
        cards_after = browser.screenshot(out / "status-cards-after.png", ".cards")
        check(shot_before != shot_after and cards_before != cards_after,
              "the screenshots differ in the counter area")
        check(browser.screenshot(out / "status-sparks-after.png", ".sparks") != sparks_before,
              "the sparklines' area differs")
        slow.close()
        slow = None
        for c in idle:
            c.close()
        idle = []

        # A filter typed into the page: only matching Events reach the tail.
        browser.eval("(() => { const f = document.getElementById('filter');"
                     " f.focus(); f.select(); })()")
        browser.call("Input.insertText", {"text": '{"type":["run.*"]}'})
        browser.eval("document.querySelector('#tail_form button').click()")
        wait_until(lambda: browser.eval(TAIL_RAW_JS) == [], "the tail to restart")

        def new_tail_open():
            browser.eval("1")  # collects the DevTools events that came meanwhile
            return any(e["method"] == "Network.responseReceived" and "run.*" in
                       urllib.parse.unquote_plus(e["params"]["response"]["url"])
                       for e in browser.events)
        wait_until(new_tail_open, "the page's stream with the typed filter to open")
        wait_until(lambda: relay.status(token="ops-watch-22de")["subscriptions"] == 1,
                   "the old tail and the slow consumer to be released")
        more = [ev("st-c", 1, "tool.started"), ev("st-c", 2, "run.finished")]
        relay.post_ok(more, token="agent-emit-3")
        wait_until(lambda: browser.eval(TAIL_RAW_JS) == [more[1]], "the filtered tail")
        wait_until(lambda: browser.eval(NUMBERS_JS)["ingested"] == str(ingested + 2),
                   "the counters again")
        browser.screenshot(out / "status-filtered.png")
        problems = browser.console_problems()
        check(problems == [], f"no console errors (CSP, scripts): {problems}")
        log("the typed filter {\"type\":[\"run.*\"]} shows only run.finished")
    finally:
        if slow:
            slow.close()
        for c in idle:
            c.close()
        browser.close()
        relay.stop()


def test_status_page_cluster():
    """Two relays clustered through a real nats-server: one relay's page lists both in
    its relays panel (state, lag, outbox), tails the Events posted to either, and its
    sparklines move; screenshots before and after."""
    nats = Nats()
    relays = []
    browser = None
    out = Path(ARGS.out)
    try:
        for rid in ["r1", "r2"]:
            relays.append(Relay(f"cluster-{rid}", "--cluster", nats.url, "--relay-id", rid))
        r1, r2 = relays

        def known(relay):
            c = relay.status()["cluster"]
            return c and sorted((r["relay"], r["state"]) for r in c["relays"])
        both = [("r1", "connected"), ("r2", "connected")]
        for r in relays:
            wait_until(lambda: known(r) == both, f"{r.addr} to know both relays connected")
        browser = Browser("status-cluster")
        browser.call("Runtime.enable")
        browser.call("Log.enable")
        browser.viewport(*SCREEN)
        browser.goto(f"{r1.base}/")
        wait_until(lambda: sorted((r[0], r[1]) for r in browser.eval(RELAYS_JS)) == both,
                   "the relays panel of r1's page to show r1 and r2, connected")
        check(browser.eval("document.getElementById('cluster_panel').hidden") is False,
              "the cluster panel shows")
        panel = browser.eval(RELAYS_JS)
        check(panel[0][0] == "r1" and "(this page)" in browser.eval(
            "document.querySelector('#relay_rows tr').cells[0].textContent"),
              f"r1, the page's own relay, comes first and says so: {panel}")
        check(all(re.fullmatch(r"\d+", v) for row in panel for v in row[2:]),
              f"lag, outbox and applied are numbers: {panel}")
        check("relay r1" in browser.eval("document.getElementById('whoami').textContent"),
              "the heading names the relay")
        sp_before = wait_sparks(browser, lambda s: all(v["points"] >= 3 for v in s.values()),
                                "three samples in every sparkline")
        for name in ["ingest", "deliveries", "refusals"]:
            check(sp_before[name]["nonzero"] == 0, f"{name} is flat before any traffic: "
                                                   f"{sp_before[name]}")
        shot_before = browser.screenshot(out / "status-cluster-before.png")
        log(f"r1's page lists {panel}")

        # Traffic on both relays: r1's page shows what either ingested.
        t = now_rfc3339
        at_r2 = [ev("cl-east", i, typ, agent="worker-east", time_=t(i * 200)) for i, typ in
                 enumerate(["session.started", "run.started", "tool.started"])]
        at_r1 = [ev("cl-west", i, typ, agent="worker-west", time_=t(700 + i * 200))
                 for i, typ in enumerate(["session.started", "run.started"])]
        at_r1.append(ev("cl-west", 2, "run.finished", agent="worker-west", time_=t(1200),
                        severity="notice"))
        r2.post_ok(at_r2)
        r1.post_ok(at_r1)
        status, _ = r1.post(['{"aep":"0.1","id":"x","type":"tool.started"}'])
        check(status == 400, f"an invalid Event is refused: {status}")
        wait_until(lambda: sorted(browser.eval(TAIL_RAW_JS)) == sorted(at_r2 + at_r1),
                   "r1's tail to show the Events posted to r1 and to r2")
        lines = browser.eval(TAIL_JS)
        check(sorted(lines) == sorted(tail_line(e) for e in at_r2 + at_r1),
              f"one readable line per Event: {lines}")
        wait_until(lambda: sorted(r[0] for r in browser.eval(ROWS_JS)) == ["cl-east", "cl-west"],
                   "r1's sessions table to hold both relays' sessions")
        rows = {r[0]: r for r in browser.eval(ROWS_JS)}
        check(rows["cl-east"][1:4] == ["worker-east", json.loads(at_r2[0])["source"], "3"],
              f"the session posted to r2, on r1's page: {rows['cl-east']}")
        check(open_raw(browser, -1) == browser.eval(TAIL_RAW_JS)[-1],
              "a click on a line shows its raw JSON")
        moved = ["ingest", "deliveries", "refusals"]
        sp_after = wait_sparks(browser, lambda s: all(s[n]["nonzero"] >= 1 for n in moved),
                               "the sparklines of ingest, deliveries and refusals to leave 0")
        for name in moved:
            check(sp_after[name]["d"] != sp_before[name]["d"], f"the {name} line moved")
        # The applied counts follow the stream: wait for both relays to report them again.
        # They count stream messages: one per POST here, each POST's Events sharing a
        # session.
        wait_until(lambda: sorted((r[0], r[1]) for r in browser.eval(RELAYS_JS)) == both
                   and all(int(r[4]) >= 2 for r in browser.eval(RELAYS_JS)),
                   "both relays to report the 2 stream messages applied")
        panel = browser.eval(RELAYS_JS)
        log(f"after: r1's page lists {panel}")
        log("sparklines: " + ", ".join(f"{k} {v['nonzero']}/{v['points']} nonzero, max "
                                       f"{v['max']:g}" for k, v in sp_after.items()))
        shot_after = browser.screenshot(out / "status-cluster-after.png")
        check(shot_before != shot_after, "the screenshots differ")
        problems = browser.console_problems()
        check(problems == [], f"no console errors (CSP, scripts): {problems}")
    finally:
        if browser:
            browser.close()
        for r in reversed(relays):
            r.stop()
        nats.stop()


TESTS = {
    "browser-eventsource": test_browser_eventsource,
    "browser-eventsource-hostile": test_browser_eventsource_hostile_sessions,
    "browser-eventsource-https": test_browser_eventsource_https,
    "python-websockets-consumer": test_python_websockets_consumer,
    "python-websockets-emitter": test_python_websockets_emitter,
    "python-websockets-deflate": test_python_websockets_deflate,
    "python-websockets-wss": test_python_websockets_wss,
    "browser-websocket-deflate": test_browser_websocket_deflate,
    "curl-readme": test_curl_readme,
    "status-page": test_status_page,
    "status-page-cluster": test_status_page_cluster,
}


def main():
    global ARGS
    ap = arguments(__doc__, "logs and screenshots (default: a temp dir)")
    ap.add_argument("--chromium", default="chromium")
    ARGS = ap.parse_args()
    ARGS.out = configure(ARGS.out, "aep-clients-", wait=WAIT, interval=0.05, stop_wait=10.0)
    only = [n for n in ARGS.only.split(",") if n]
    return run_all(((name, fn) for name, fn in TESTS.items() if not only or name in only),
                   f"logs and screenshots: {ARGS.out}")


if __name__ == "__main__":
    sys.exit(main())
