#!/usr/bin/env python3
"""The official AEP Python SDK as a real client of aep-relay.

`agenteventprotocol-sdk==0.1.0.dev1` (import `aep_sdk`), installed from PyPI by
tests/clients/sdk.sh, drives real `aep-relay` binaries on 127.0.0.1 exactly as its README
shows, over every public surface:

- emit-http-readback: `Emitter` / `SessionEmitter` with `http_sink` (an agent-scoped
  Event, extensions, `redeliver()`), read back byte-identical through
  `GET /stream?from=all&live=0` (exact body: opening comment, one message per held Event
  with its `id:`, `: replay-complete`); a live sync `subscribe` sees each Event once.
- jsonl-ingest-file: `jsonl_sink` appending to the relay's `--ingest-file`; read back
  byte-identical to the file's lines.
- subscribe-filter-capture: sync `subscribe` with an attr-match filter and a `metadata`
  capture ceiling (a `full` Event arrives down-leveled), `positions()`.
- subscribe-slow-consumer: a sync `subscribe` whose `on_event` stops is disconnected by
  the relay (`--max-output 65536`; `notice` Events of ~8 KB, built with
  `aep_sdk.testing.MemorySink` and posted 16 to a batch), counted once in
  `aep_backpressure_disconnects_total`, and resumes with no gap and no duplicate.
- subscribe-restart-history: a sync `subscribe` across a relay restart with
  `--history DIR` (resumes by itself), then a new `subscribe(from_=positions())` after
  another restart replays from the history.
- from-all: `from_="all"` on the sync surface (then live) and on `aio` (`live=False`).
- aio-subscribe: `aio.subscribe` live (filter, capture, `positions()`, `close()`) and
  `live=False` (filter by session, no `from`: every owning stream of the name, then the
  iteration ends by itself at `: replay-complete`; with a capture ceiling; with a `from`
  naming the same session; with a session the relay does not hold).
- position-budget: 300 sessions (built with `aep_sdk.testing.ScriptedSource`) resumed
  from 300 positions: the SDK drains the positions beyond its `from` budget through
  `live=0` chunks, sync and aio; every Event exactly once.
- control-sync / control-aio: `ControlClient` (sync, then `aio.ControlClient`) against a
  target built from `open_duplex` + `Emitter` + `ControlTarget`: accepted,
  target-behalf and relay-behalf `unsupported`, timeout with retries reusing the id, a
  lost ack recovered by a retry (`ControlTarget` re-emits it through `redeliver()`),
  `no-route`, `ambiguous`, `unauthorized` (scoped tokens), a 401 without a token,
  `roster()`; the session's history holds exactly the delivered commands and acks.
- project-state: `project_state` over the Events read back (runs, pending attention,
  two emitters sharing a session name, a redelivery) and `StateProjection` over the live
  subscription: the exact expected state, no violations.

With `--topology cluster` every check runs against two relays clustered through a real
nats-server (JetStream): Events are emitted at r1 and consumed at r2, the control
targets claim at r1 and the sender sends at r2 (one `ambiguous` claimant on each), and
the restarted relay is r2.

Every wait is bounded; every process started is stopped on exit. Prints one PASS/FAIL
line per check, then `N passed, N failed`; exits 1 on any failure.

Usage: sdk.py --bin target/debug/aep-relay [--out DIR] [--only NAME,...]
              [--topology single,cluster]
Run through tests/clients/sdk.sh, which creates the virtual environment this needs.
"""

import asyncio
import json
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import aep_sdk
from aep_sdk import (ControlClient, ControlTarget, Emitter, NackError, StateProjection,
                     TransportError, aio, http_sink, jsonl_sink, open_duplex, project_state,
                     subscribe)
from aep_sdk.testing import MemorySink, ScriptedSource

from harness import (Failure, Nats, arguments, check, configure, http, log, run_all,
                     start_relay, stop, wait_until)

SDK_VERSION = "0.1.0.dev1"
WAIT = 20.0  # the bound of any single wait, seconds
OPEN = "aep-relay stream open"  # the relay's first SSE comment
COMPLETE = "replay-complete"  # the comment that ends every live=0 stream

# Scoped tokens of the control checks (--tokens-file).
OPS = "ops-sdk-7f3a"  # emit, watch, control: the operator sending commands
AGENT = "agent-sdk-91c2"  # emit, watch: the control targets
VIEWER = "viewer-sdk-22de"  # watch only

ARGS = None
TOPOLOGY = None  # "single" or "cluster" while the checks of one topology run
NATS = None
SUBS = []  # every sync subscription opened, closed after its check


def equal(got, want, what):
    if got != want:
        raise Failure(f"{what}:\n    got  {got!r}\n    want {want!r}")


def bounded(coro, what, timeout=WAIT):
    """`coro` bounded by `timeout` (for the SDK's own unbounded waits)."""
    async def run():
        try:
            return await asyncio.wait_for(coro, timeout)
        except asyncio.TimeoutError:
            raise Failure(f"timed out after {timeout:.0f}s waiting for {what}") from None
    return run()


async def in_thread(fn, *args, **kw):
    """Runs the blocking `fn` on a daemon thread of its own and awaits it (a blocked SDK
    call cannot hold up the event loop's shutdown the way the default executor would)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def run():
        try:
            r = fn(*args, **kw)
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(r))
        except BaseException as e:  # handed to the awaiting coroutine
            err = e
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_exception(err))
    threading.Thread(target=run, daemon=True).start()
    return await fut


# ---------------------------------------------------------------- processes


class Relay:
    """The aep-relay binary on 127.0.0.1 (an ephemeral port, kept across restarts).
    `token` is what the harness itself presents to /metrics, /status and /readyz."""

    def __init__(self, name, args, token=None, clustered=False):
        self.name, self.args, self.token, self.clustered = name, list(args), token, clustered
        self.port = 0
        self.starts = 0
        self.start()

    def start(self):
        self.starts += 1
        self.log = Path(ARGS.out) / f"relay-{self.name}-{self.starts}.log"
        self.proc, self.addr = start_relay(ARGS.bin, self.port, self.args, self.log,
                                           f"relay {self.name}")
        self.port = int(self.addr.rsplit(":", 1)[1])
        self.base = f"http://{self.addr}"
        if self.clustered:
            wait_until(lambda: http("GET", self.base + "/readyz", token=self.token)[0] == 200,
                       f"relay {self.name} to be ready (/readyz)")

    def stop(self):
        rc = stop(self.proc)
        check(rc == 0, f"relay {self.name} exited {rc} on SIGTERM (see {self.log})")

    def restart(self):
        """SIGTERM (a graceful stop, exit 0), then the same binary, arguments and port."""
        self.stop()
        self.start()

    def metrics(self):
        status, body = http("GET", self.base + "/metrics", token=self.token)
        check(status == 200, f"GET /metrics answered {status}")
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def metric(self, name):
        return self.metrics().get(name, 0.0)

    def wait_held(self, n, what):
        """Until the replay store holds exactly `n` Events (the `aep_buffered_events`
        gauge); clustered, that is when this relay applied what another one ingested."""
        wait_until(lambda: self.metric("aep_buffered_events") == n,
                   f"relay {self.name} to hold {n} Events ({what})")

    def status(self):
        status, body = http("GET", self.base + "/status", token=self.token)
        check(status == 200, f"GET /status answered {status}")
        return json.loads(body)


class Deploy:
    """The relays of one check. Single: one relay, `a` and `b` are the same. Cluster: r1
    (`a`: emitters, control targets, --ingest-file) and r2 (`b`: subscribers, the control
    sender, the relay restarted) joined through NATS in a stream of the check's own."""

    count = 0

    def __init__(self, name, both=(), a_only=(), b_only=(), token=None):
        Deploy.count += 1
        self.relays = []
        try:
            if TOPOLOGY == "single":
                self.a = self.b = Relay(name, [*both, *a_only, *b_only], token)
                self.relays = [self.a]
                return
            common = ["--cluster", NATS.url, "--cluster-stream", f"SDK{Deploy.count}",
                      "--cluster-prefix", f"sdk{Deploy.count}", *both]
            self.a = Relay(f"{name}-r1", [*common, "--relay-id", "r1", *a_only], token, True)
            self.relays.append(self.a)
            self.b = Relay(f"{name}-r2", [*common, "--relay-id", "r2", *b_only], token, True)
            self.relays.append(self.b)
            both_up = [("r1", "connected"), ("r2", "connected")]
            for r in self.relays:
                wait_until(lambda: sorted((x["relay"], x["state"]) for x in
                                          r.status()["cluster"]["relays"]) == both_up,
                           f"{r.name} to see both relays connected")
        except BaseException:
            self.close()
            raise

    def close(self):
        for r in reversed(self.relays):
            if r.proc.poll() is None:
                stop(r.proc)


def tokens_file():
    path = Path(tempfile.mkstemp(prefix="tokens-", suffix=".txt", dir=ARGS.out)[1])
    path.write_text(f"{OPS} emit,watch,control\n{AGENT} emit,watch\n{VIEWER} watch\n")
    return str(path)


# ---------------------------------------------------------------- wire helpers


def wire(ev):
    """The bytes `http_sink` POSTs for `ev` (and so what the relay must give back)."""
    return json.dumps(ev).encode()


def sse_message(ev, data=None):
    """The SSE message the relay sends for a held sequenced Event (sessions here need
    no `id:` escaping)."""
    return b"event: %s\nid: %s:%d:%d\ndata: %s" % (
        ev["type"].encode(), ev["session"].encode(), ev.get("epoch", 0), ev["seq"],
        data if data is not None else wire(ev))


def read_stream(base, query, token=None):
    """GET /stream?`query` for a stream that ends by itself (live=0): its whole body."""
    req = urllib.request.Request(f"{base}/stream?{query}",
                                 headers={"Accept": "text/event-stream"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    deadline = time.monotonic() + WAIT
    body = b""
    with urllib.request.urlopen(req, timeout=WAIT) as r:
        check(r.status == 200, f"GET /stream?{query} answered {r.status}")
        while True:
            check(time.monotonic() < deadline, f"GET /stream?{query} did not end in time")
            chunk = r.read1(65536)
            if not chunk:
                return body
            body += chunk


def blocks(body):
    """An SSE body as its blocks (messages and comments), each without the blank line."""
    check(body.endswith(b"\n\n"), f"the stream ends with a blank line: {body[-200:]!r}")
    return body[:-2].split(b"\n\n")


def message_data(block):
    return next(line[6:] for line in block.split(b"\n") if line.startswith(b"data: "))


def by_session(msgs):
    """Message blocks grouped by their `id:` session, in order."""
    out = {}
    for m in msgs:
        sid = re.search(rb"^id: (.*):\d+:\d+$", m, re.M).group(1).decode()
        out.setdefault(sid, []).append(m)
    return out


def readback(relay, query="from=all&live=0", token=None):
    """The held Events of `relay` as the relay sends them: the message blocks between
    the opening comment and `: replay-complete` (both asserted, and nothing else)."""
    b = blocks(read_stream(relay.base, query, token))
    equal(b[0], b": " + OPEN.encode(), "the stream's first block")
    equal(b[-1], b": " + COMPLETE.encode(), "the live=0 stream's last block")
    inner = b[1:-1]
    stray = [x for x in inner if x.startswith(b":")]
    check(not stray, f"no other comment in the replay: {stray}")
    return inner


def post(relay, evs):
    """POSTs Events the SDK built (`MemorySink`) as one batch, each line the bytes
    `http_sink` would send."""
    body = b"".join(wire(x) + b"\n" for x in evs)
    status, answer = http("POST", relay.base + "/events", body,
                          headers={"AEP-Version": "0.1", "Content-Type": "application/x-ndjson"})
    equal((status, json.loads(answer)), (202, {"accepted": len(evs)}), "the batch POST")


def strip(ev, *keys, **changes):
    """`ev` down-leveled by hand: `keys` removed from its data, attributes changed."""
    out = dict(ev, **changes)
    if "data" in ev:
        out["data"] = {k: v for k, v in ev["data"].items() if k not in keys}
    return out


class Collector:
    """The callbacks of a sync `subscribe`: Events, comments and errors as they come;
    `gate` (when cleared) holds the SDK's reading thread inside `on_event`."""

    def __init__(self):
        self.events, self.comments, self.errors = [], [], []
        self.gate = threading.Event()
        self.gate.set()
        self.blocked = threading.Event()

    def on_event(self, ev):
        self.events.append(ev)
        if not self.gate.is_set():
            self.blocked.set()
            self.gate.wait(WAIT * 2)
            self.blocked.clear()

    def on_comment(self, c):
        self.comments.append(c)

    def on_error(self, e):
        self.errors.append(e)

    def opened(self, n=1):
        return self.comments.count(OPEN) >= n

    def wait_events(self, n, what):
        wait_until(lambda: len(self.events) >= n, f"{n} Events at the subscriber ({what}); "
                   f"got {len(self.events)}")


def sync_subscribe(relay, col, opens=1, **kw):
    """`aep_sdk.subscribe` with `col`'s callbacks and a short reconnect schedule; returns
    once the stream is open (the relay's opening comment came)."""
    kw.setdefault("backoff_initial_ms", 100)
    kw.setdefault("backoff_max_ms", 400)
    sub = subscribe(relay.base, col.on_event, on_comment=col.on_comment,
                    on_error=col.on_error, **kw)
    SUBS.append(sub)
    wait_until(lambda: col.opened(opens), "the subscription's stream to open")
    return sub


def sink_for(relay, errors, token=None):
    """`http_sink` reporting failures: without `on_error` it drops them silently."""
    return http_sink(relay.base, token=token, on_error=errors.append)


async def aio_collect(sub, what, timeout=WAIT):
    """Iterates an `AsyncSubscription` to its end (bounded)."""
    async def run():
        return [ev async for ev in sub]
    return await bounded(run(), f"{what} to end by itself", timeout)


async def aio_take(sub, n, what):
    out = []
    for _ in range(n):
        out.append(await bounded(sub.__anext__(), f"{what}: Event {len(out) + 1} of {n}"))
    return out


# ---------------------------------------------------------------- the checks


def test_emit_http_readback():
    """Emitter / SessionEmitter over http_sink (agent-scoped Event, extensions,
    redeliver) read back byte-identical through from=all&live=0; a live sync subscriber
    sees every Event once."""
    d = Deploy("readback")
    try:
        col = Collector()
        sub = sync_subscribe(d.b, col)
        errors = []
        em = Emitter("sdk-check", "host-1", sink_for(d.a, errors), epoch=2)
        s1, s2 = em.session("rb-1"), em.session("rb-2")
        e = [s1.emit("session.started", {"client": {"name": "sdk-check", "version": "1"}})]
        e.append(s1.emit("run.started", {"input": "naïve ✓ 𝄞 \"quoted\""}, run="run-1",
                         severity="notice", extensions={"tenant": "acme", "shard": 7}))
        e.append(s2.emit("session.started"))
        agent_ev = em.emit("agent.heartbeat", {})
        e.append(s1.emit("tool.completed", {"tool": {"name": "Bash"}, "status": "success",
                                            "result": "a full result"}, capture="full",
                         run="run-1"))
        s1.redeliver(e[1])  # the same bytes again: held once, delivered once
        e.append(s2.emit("session.ended", {"reason": "normal"}))
        equal(errors, [], "http_sink failures")
        check(e[3]["capture"] == "full" and agent_ev["capture"] == "metadata",
              "the SDK stamps capture")

        d.b.wait_held(len(e), "the session-scoped Events")
        msgs = readback(d.b)
        equal(len(msgs), len(e), "Events read back (the redelivered one once, the "
                                 "agent-scoped one not held)")
        equal(by_session(msgs), {"rb-1": [sse_message(x) for x in e if x["session"] == "rb-1"],
                                 "rb-2": [sse_message(x) for x in e if x["session"] == "rb-2"]},
              "each session's messages, byte for byte")
        live = e[:3] + [agent_ev] + e[3:]
        col.wait_events(len(live), "every Event live")
        # A last Event through the same path: nothing else is still on its way.
        e.append(s1.emit("session.ended"))
        col.wait_events(len(live) + 1, "the last Event")
        equal(col.events, live + [e[-1]], "what the live subscriber got (redelivery "
                                          "deduplicated by the SDK)")
        equal(sorted(sub.positions(), key=lambda p: p["session"]),
              [{"session": "rb-1", "epoch": 2, "seq": 3},
               {"session": "rb-2", "epoch": 2, "seq": 1}], "positions()")
        log(f"{len(e)} Events read back byte-identical; the live subscriber got "
            f"{len(col.events)} (redelivery collapsed)")
    finally:
        d.close()


def test_jsonl_ingest_file():
    """jsonl_sink appending to the relay's --ingest-file: read back byte-identical to
    the file's lines."""
    path = Path(tempfile.mkstemp(prefix="ingest-", suffix=".jsonl", dir=ARGS.out)[1])
    d = Deploy("jsonl", a_only=["--ingest-file", str(path), "--follow-interval-ms", "50"])
    try:
        em = Emitter("sdk-jsonl", "host-j", jsonl_sink(str(path)))
        s1, s2 = em.session("jl-1"), em.session("jl-2")
        e = [s1.emit("session.started"), s2.emit("session.started"),
             s1.emit("tool.started", {"tool": {"name": "Read"}, "input": "日本語 ✓"}),
             s2.emit("attention.requested", {"kind": "input", "prompt": "continue?"},
                     severity="notice")]
        s1.redeliver(e[2])  # a second line with the same Event
        e.append(s1.emit("session.ended"))
        lines = path.read_bytes().split(b"\n")
        equal(lines[-1], b"", "the file ends with a line break")
        equal(len(lines) - 1, len(e) + 1, "lines jsonl_sink wrote")
        equal([json.loads(x) for x in lines[:-1]], e[:4] + [e[2], e[4]],
              "the file holds the Events, the redelivered one twice")
        d.b.wait_held(len(e), "the file's Events")
        msgs = readback(d.b)
        want = [sse_message(x, json.dumps(x, separators=(",", ":")).encode()) for x in e]
        equal(by_session(msgs), {s: [m for m, x in zip(want, e) if x["session"] == s]
                                 for s in ("jl-1", "jl-2")},
              "each session's messages, byte-identical to the file's lines")
        m = d.a.metrics()
        equal((m['aep_events_ingested_total{binding="jsonl"}'],
               m['aep_events_ingested_total{binding="http"}']), (len(lines) - 1.0, 0.0),
              "Events ingested from the file (each line) and over HTTP (none)")
        log(f"{len(lines) - 1} lines appended by jsonl_sink, {len(e)} Events held, "
            "byte for byte")
    finally:
        d.close()


def test_subscribe_filter_capture():
    """Sync subscribe with an attr-match filter and a metadata capture ceiling; a full
    Event arrives down-leveled; positions()."""
    d = Deploy("filter")
    try:
        col = Collector()
        sub = sync_subscribe(d.b, col, filter={"session": "fc-1",
                                               "type": ["tool.*", "session.*"]},
                             capture="metadata")
        errors = []
        em = Emitter("sdk-filter", "host-f", sink_for(d.a, errors))
        s1, s2 = em.session("fc-1"), em.session("fc-2")
        e = [s1.emit("session.started"),
             s1.emit("run.started", run="r1"),  # filtered out: type
             s1.emit("tool.started", {"tool": {"name": "Bash"}}, run="r1"),
             s1.emit("tool.completed", {"tool": {"name": "Bash"}, "status": "success",
                                        "duration_ms": 12, "result": "secret output"},
                     capture="full", run="r1"),
             s2.emit("tool.started", {"tool": {"name": "Bash"}}),  # filtered out: session
             s1.emit("session.ended", {"reason": "normal"}, capture="none")]
        equal(errors, [], "http_sink failures")
        want = [e[0], e[2], strip(e[3], "result", capture="metadata"), e[5]]
        col.wait_events(len(want), "the matching Events")
        barrier = s1.emit("tool.started", {"tool": {"name": "Grep"}})
        col.wait_events(len(want) + 1, "the last Event")
        equal(col.events, want + [barrier], "the Events delivered (filtered, down-leveled)")
        equal(sub.positions(), [{"session": "fc-1", "epoch": 0, "seq": barrier["seq"]}],
              "positions()")
        equal(col.errors, [], "errors reported to on_error")
        log("filter and capture ceiling applied; positions() " + json.dumps(sub.positions()))
    finally:
        d.close()


def test_subscribe_slow_consumer():
    """A sync subscribe that stops reading is disconnected as a slow consumer
    (--max-output), counted once in aep_backpressure_disconnects_total, and resumes with
    every Event exactly once."""
    d = Deploy("slow", b_only=["--max-output", "65536"])
    try:
        col = Collector()
        sub = sync_subscribe(d.b, col, filter={"session": "slow-1"})
        # Built by the SDK, posted in batches (16 Events meet the consumer at once).
        mem = MemorySink()
        s = Emitter("sdk-slow", "host-s", mem).session("slow-1")
        s.emit("session.started", severity="notice")
        post(d.a, mem.events)
        col.wait_events(1, "the first Event")
        col.gate.clear()  # the SDK's thread now stops in on_event
        s.emit("run.started", severity="notice", run="r1")
        post(d.a, mem.events[1:])
        wait_until(col.blocked.is_set, "the SDK's reader to block in on_event")
        pad = "x" * 8192
        deadline = time.monotonic() + WAIT
        while d.b.metric("aep_backpressure_disconnects_total") < 1:
            check(time.monotonic() < deadline and len(mem.events) < 3000,
                  f"the relay to disconnect the slow consumer ({len(mem.events)} Events sent)")
            n = len(mem.events)
            for _ in range(16):
                s.emit("tool.completed", {"tool": {"name": "Bash"}, "status": "success",
                                          "pad": pad}, severity="notice", run="r1")
            post(d.a, mem.events[n:])
        flood = len(mem.events)
        for _ in range(2):  # more Events that meet the consumer, if it lingers
            n = len(mem.events)
            for _ in range(16):
                s.emit("tool.started", {"tool": {"name": "Bash"}}, severity="warning",
                       run="r1")
            post(d.a, mem.events[n:])
        e = mem.events
        d.b.wait_held(len(e), "every Event")
        equal(d.b.metric("aep_backpressure_disconnects_total"), 1.0,
              "aep_backpressure_disconnects_total after one consumer was disconnected "
              "(consumers, once each)")
        col.gate.set()
        col.wait_events(len(e), "the resumed subscription to catch up")
        post(d.a, [s.emit("session.ended", severity="notice")])
        e = mem.events
        col.wait_events(len(e), "a live Event after the resume")
        equal(len(col.events), len(e), "Events delivered (no duplicate)")
        first = next((i for i, (x, y) in enumerate(zip(col.events, e)) if x != y), None)
        check(col.events == e, "every Event exactly once, in order, after the disconnect "
              f"(first difference at index {first})")
        equal(sub.positions(), [{"session": "slow-1", "epoch": 0, "seq": len(e) - 1}],
              "positions()")
        check(col.comments.count(OPEN) >= 2, f"the SDK reconnected: {col.comments[:6]}")
        equal(d.b.metric("aep_backpressure_disconnects_total"), 1.0,
              "no second disconnect")
        log(f"disconnected after {flood} Events of ~8 KB; resumed to all {len(e)}")
    finally:
        d.close()


def test_subscribe_restart_history():
    """Sync subscribe across a relay restart with --history DIR (it resumes by itself),
    then subscribe(from_=positions()) after another restart replays from the history."""
    hist = tempfile.mkdtemp(prefix="history-", dir=ARGS.out)
    d = Deploy("restart", b_only=["--history", hist])
    try:
        col = Collector()
        sub = sync_subscribe(d.b, col, filter={"session": "rs-1"})
        errors = []
        s = Emitter("sdk-restart", "host-r", sink_for(d.a, errors)).session("rs-1")
        e = [s.emit("session.started"), s.emit("run.started", run="r1"),
             s.emit("tool.started", {"tool": {"name": "Edit"}}, run="r1")]
        col.wait_events(3, "the first Events")
        col.gate.clear()
        e.append(s.emit("tool.completed", {"tool": {"name": "Edit"}, "status": "success"},
                        run="r1"))
        wait_until(col.blocked.is_set, "the SDK's reader to block in on_event")
        # The relay restarts while the subscriber sits on Event 3.
        d.b.stop()
        if d.a is not d.b:  # clustered: Events reach the stream while r2 is down
            e.append(s.emit("tool.started", {"tool": {"name": "Bash"}}, run="r1"))
        d.b.start()
        e.append(s.emit("tool.completed", {"tool": {"name": "Bash"}, "status": "success"},
                        run="r1"))
        col.gate.set()
        col.wait_events(len(e), "the subscription to resume after the restart")
        e.append(s.emit("run.finished", run="r1"))
        col.wait_events(len(e), "a live Event after the resume")
        equal(col.events, e, "every Event once across the restart")
        saved = sub.positions()
        equal(saved, [{"session": "rs-1", "epoch": 0, "seq": e[-1]["seq"]}], "positions()")
        sub.close()

        # Persisted positions, a second restart, a new subscription.
        later = [s.emit("run.started", run="r2"), s.emit("tool.started", run="r2")]
        d.b.wait_held(len(e) + len(later), "the Events after the saved position")
        d.b.stop()
        if d.a is not d.b:
            later.append(s.emit("run.finished", run="r2"))
        d.b.start()
        col2 = Collector()
        sub2 = sync_subscribe(d.b, col2, filter={"session": "rs-1"}, from_=saved)
        col2.wait_events(len(later), "the replay from the saved position")
        last = s.emit("session.ended")
        col2.wait_events(len(later) + 1, "a live Event after the replay")
        equal(col2.events, later + [last], "the new subscription got exactly what followed "
                                           "the saved position (history) and then live")
        equal(sub2.positions(), [{"session": "rs-1", "epoch": 0, "seq": last["seq"]}],
              "positions() of the new subscription")
        equal(errors, [], "http_sink failures")
        log(f"resumed across two restarts: {len(e)} Events live, {len(later)} replayed "
            "from the history")
    finally:
        d.close()


def test_from_all():
    """from_="all": sync (replay of every held session, then live) and aio live=False
    (the replay, then the end)."""
    d = Deploy("fromall")
    try:
        errors = []
        alpha = Emitter("alpha", "host-a", sink_for(d.a, errors))
        beta = Emitter("beta", "host-b", sink_for(d.a, errors))
        a1 = alpha.session("fa-1")
        e = [a1.emit("session.started"),
             alpha.session("fa-2").emit("session.started"),
             alpha.session("fa-shared").emit("session.started"),
             beta.session("fa-shared").emit("session.started"),
             a1.emit("tool.started", {"tool": {"name": "Read"}})]
        alpha.emit("agent.heartbeat")  # agent-scoped: never held, never replayed
        equal(errors, [], "http_sink failures")
        d.b.wait_held(len(e), "the held sessions")

        def key(ev):
            return (ev["source"], ev["session"], ev["seq"])

        col = Collector()
        sub = sync_subscribe(d.b, col, from_="all")
        col.wait_events(len(e), "the replay of every held session")
        live = a1.emit("session.ended")
        col.wait_events(len(e) + 1, "a live Event after the replay")
        equal(sorted(col.events[:len(e)], key=key), sorted(e, key=key),
              "the replayed Events (every session, both streams of fa-shared)")
        equal(col.events[len(e):], [live], "then live")
        equal(sorted(p["session"] for p in sub.positions()),
              ["fa-1", "fa-2", "fa-shared"], "positions() sessions")
        e.append(live)

        async def aio_all():
            comments = []
            asub = await bounded(aio.subscribe(d.b.base, from_="all", live=False,
                                               on_comment=comments.append),
                                 "aio.subscribe")
            got = await aio_collect(asub, "aio.subscribe(from_='all', live=False)")
            return got, comments
        got, comments = asyncio.run(aio_all())
        equal(sorted(got, key=key), sorted(e, key=key), "aio from_='all' live=False")
        equal(comments, [OPEN, COMPLETE], "aio comments")
        log(f"from_='all' replayed {len(e) - 1} Events of 4 streams (sync), {len(got)} (aio)")
    finally:
        d.close()


def test_aio_subscribe():
    """aio.subscribe live (filter, capture, positions(), close()) and live=False: the
    session's held Events of every owning stream, then the end by itself at
    `: replay-complete`; with a capture ceiling, with a from_ naming the session, and for
    a session the relay does not hold."""
    d = Deploy("aio")
    try:
        errors = []
        one = Emitter("sdk-aio", "host-1", sink_for(d.a, errors))
        two = Emitter("sdk-aio-2", "host-2", sink_for(d.a, errors))
        s1, s2 = one.session("as-1"), two.session("as-1")  # two streams of one name
        other = one.session("as-other")

        async def live_part():
            comments = []
            opened = asyncio.Event()

            def on_comment(c):
                comments.append(c)
                if c == OPEN:
                    opened.set()
            sub = await bounded(aio.subscribe(d.b.base, filter={"session": "as-1"},
                                              capture="metadata", on_comment=on_comment),
                                "aio.subscribe")
            # `await aio.subscribe` returns when the request is written; the opening
            # comment says the relay registered the subscription.
            await bounded(opened.wait(), "the aio stream to open")
            e = [s1.emit("session.started"), other.emit("session.started"),
                 s2.emit("session.started"),
                 s1.emit("tool.completed", {"tool": {"name": "Bash"}, "status": "success",
                                            "result": "full text"}, capture="full"),
                 s2.emit("tool.started", {"tool": {"name": "Read"}})]
            got = await aio_take(sub, 4, "aio live")
            equal(got, [e[0], e[2], strip(e[3], "result", capture="metadata"), e[4]],
                  "aio live Events (filtered, down-leveled)")
            equal(sorted(sub.positions(), key=str),
                  sorted([{"session": "as-1", "epoch": 0, "seq": 1}], key=str),
                  "aio positions() (one per bare session name: the last delivered)")
            sub.close()
            rest = await aio_collect(sub, "the aio iteration after close()")
            equal(rest, [], "nothing after close()")
            return e

        e = asyncio.run(live_part())
        e.append(s1.emit("session.ended"))
        equal(errors, [], "http_sink failures")
        d.b.wait_held(len(e), "the Events")
        mine = [x for x in e if x["session"] == "as-1"]

        def per_source(evs):
            out = {}
            for x in evs:
                out.setdefault(x["source"], []).append(x)
            return out

        async def replay_only(**kw):
            comments = []
            sub = await bounded(aio.subscribe(d.b.base, live=False,
                                              on_comment=comments.append, **kw),
                                "aio.subscribe(live=False)")
            return await aio_collect(sub, f"aio live=False {kw}"), comments

        async def replays():
            return [await replay_only(filter={"session": "as-1"}),
                    await replay_only(filter={"session": "as-1"}, capture="metadata"),
                    await replay_only(filter={"session": "as-1"},
                                      from_=[{"session": "as-1", "epoch": 0, "seq": 0}]),
                    await replay_only(filter={"session": "as-none"})]
        (full, c1), (meta, c2), (after, c3), (none, c4) = asyncio.run(replays())
        equal(per_source(full), per_source(mine),
              "live=False by the filter's session: every owning stream, in order")
        equal(len(full), len(mine), "live=False Events, each once")
        equal(per_source(meta), per_source([strip(x, "result", capture="metadata")
                                            if x.get("capture") == "full" else x
                                            for x in mine]),
              "live=False with capture=metadata")
        equal(per_source(after), per_source([x for x in mine if x["seq"] > 0]),
              "live=False with from_ naming the session: after the position, no second "
              "replay")
        equal(none, [], "live=False for a session the relay does not hold")
        for c in (c1, c2, c3, c4):
            equal(c, [OPEN, COMPLETE], "the live=False stream's comments")
        log(f"aio live: 4 Events; live=False: {len(full)} Events of 2 streams, ended at "
            "replay-complete")
    finally:
        d.close()


def test_position_budget():
    """300 sessions resumed from 300 positions: the SDK drains the positions beyond its
    `from` budget through live=0 chunks (sync and aio); every Event exactly once."""
    d = Deploy("budget")
    try:
        src = ScriptedSource(agent="sdk-budget", host="host-b")
        names = [f"pb-{i:03}" for i in range(300)]
        sessions = {n: src.session(n) for n in names}
        for s in sessions.values():
            s.emit("session.started")
            s.emit("tool.started", {"tool": {"name": "Read"}})
        events = src.events
        post(d.a, events)
        d.b.wait_held(600, "300 sessions")
        start = [{"session": n, "epoch": 0, "seq": 0} for n in names]
        want = sorted((x for x in events if x["seq"] == 1), key=lambda x: x["session"])

        col = Collector()
        sub = subscribe(d.b.base, col.on_event, from_=start, on_comment=col.on_comment,
                        on_error=col.on_error, backoff_initial_ms=100, backoff_max_ms=400)
        SUBS.append(sub)
        col.wait_events(300, "the 300 Events after the positions")
        # pb-299's position rides the live request (the newest within the budget), so
        # this Event comes on the live stream whenever it opens.
        last = sessions["pb-299"].emit("session.ended")
        post(d.a, [last])
        col.wait_events(301, "a live Event")
        equal(sorted(col.events[:300], key=lambda x: x["session"]), want,
              "each session's Event after its position, once")
        equal(col.events[300:], [last], "then live")
        drains = col.comments.count(OPEN) - 1  # each request opens with the comment
        check(drains >= 2, f"the SDK drained through live=0 chunks: {col.comments}")
        equal(col.comments, [OPEN, COMPLETE] * drains + [OPEN],
              "each live=0 drain chunk ended with replay-complete")
        pos = sorted(sub.positions(), key=lambda p: p["session"])
        equal(pos, [{"session": n, "epoch": 0, "seq": 2 if n == "pb-299" else 1}
                    for n in names], "positions()")
        equal(col.errors, [], "errors reported to on_error")

        async def aio_budget():
            comments = []
            asub = await bounded(aio.subscribe(d.b.base, from_=start, live=False,
                                               on_comment=comments.append),
                                 "aio.subscribe")
            return await aio_collect(asub, "aio live=False from 300 positions"), comments
        got, comments = asyncio.run(aio_budget())
        equal(sorted(got, key=lambda x: (x["session"], x["seq"])),
              sorted(want + [last], key=lambda x: (x["session"], x["seq"])),
              "aio live=False: each session's Events after its position, once")
        requests = comments.count(OPEN)
        check(requests >= 3, f"aio drained through live=0 chunks: {comments}")
        equal(comments, [OPEN, COMPLETE] * requests,
              "each aio live=0 request ended with replay-complete")
        # The same with a filter naming every session: each drain request names
        # positions, so the relay replays what they name and never adds the filter's
        # other sessions from their start (which would bring Events from before the
        # positions carried by the other requests).
        async def aio_filtered():
            asub = await bounded(aio.subscribe(d.b.base, filter={"session": names},
                                               from_=start, live=False),
                                 "aio.subscribe with a session filter")
            return await aio_collect(asub, "aio live=False, filter and 300 positions")
        got = asyncio.run(aio_filtered())
        equal(sorted(got, key=lambda x: (x["session"], x["seq"])),
              sorted(want + [last], key=lambda x: (x["session"], x["seq"])),
              "aio live=False with a session filter: only what follows each position")
        log(f"sync: {drains} live=0 drain chunks then live; aio: {requests} live=0 requests")
    finally:
        d.close()


class Target:
    """A control target as an SDK user writes one: `open_duplex` (hello as an emitter
    declaring control.accepts), an `Emitter` whose sink is the duplex, a
    `ControlTarget` over its `SessionEmitter`; commands are read on a thread.

    `modes` by command type: "handle" (ControlTarget decides), "silent" (never
    answered), "lossy" (handled, but the first ack is lost on its way out)."""

    def __init__(self, relay, session, agent, instance, accepts, target_accepts,
                 modes=None):
        self.session_name = session
        self.duplex = open_duplex(relay.base, token=AGENT, connect_timeout_ms=int(WAIT * 1000))
        self.control = {"accepts": list(accepts), "ack_window_ms": 10000}
        self.emits = ["session", "control"]
        self.duplex.send_json({"type": "hello", "versions": ["0.1"], "role": "emitter",
                               "identity": {"agent": agent, "instance": instance},
                               "capabilities": {"control": self.control,
                                                "emits": self.emits}})
        reply = self.duplex.recv_json()
        check(reply and reply.get("type") == "hello" and reply.get("versions") == ["0.1"],
              f"the relay's hello: {reply}")
        self.agent, self.instance = agent, instance
        self.modes = modes or {}
        self.received, self.executed, self.sent, self.dropped, self.frames = [], [], [], [], []
        self.lose_next_ack = False
        self.emitter = Emitter(agent, instance.split("/")[0], self._sink)
        self.session = self.emitter.session(session)
        self.target = ControlTarget(self.session, accepts=target_accepts)
        self.started = self.session.emit("session.started")  # claims the session
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _sink(self, ev):
        if self.lose_next_ack and ev["type"] in ("control.accepted", "control.rejected"):
            self.lose_next_ack = False
            self.dropped.append(ev)
            return
        self.sent.append(ev)
        self.duplex.send_json(ev)

    def _read(self):
        while True:
            msg = self.duplex.recv_json()
            if msg is None:
                return
            if "." not in str(msg.get("type")):
                self.frames.append(msg)
                continue
            self.received.append(msg)
            mode = self.modes.get(msg["type"], "handle")
            if mode == "silent":
                continue
            if mode == "lossy" and sum(1 for m in self.received if m["id"] == msg["id"]) == 1:
                self.lose_next_ack = True
            self.target.handle(msg, self.executed.append)

    def roster_entry(self):
        return {"session": self.session_name, "agent": self.agent, "instance": self.instance,
                "control": self.control, "emits": self.emits}

    def close(self):
        self.duplex.close()
        self.thread.join(5)


class SyncControl:
    """The sync `ControlClient`, awaited from the scenario (each call on a thread)."""

    def __init__(self, client):
        self.client = client

    async def send(self, *a, **kw):
        return await in_thread(self.client.send, *a, **kw)

    async def roster(self, **kw):
        return await in_thread(self.client.roster, **kw)

    async def close(self):
        self.client.close()


async def open_control(flavor, relay, token):
    kw = dict(agent="ops-console", host="ops-host", token=token)
    if flavor == "sync":
        c = ControlClient(relay.base, **kw)
        await in_thread(c.connect, connect_timeout_ms=int(WAIT * 1000))
        return SyncControl(c)
    c = aio.ControlClient(relay.base, **kw)
    await c.connect(connect_timeout_ms=int(WAIT * 1000))
    return c


async def nacked(coro, what):
    try:
        r = await bounded(coro, what, timeout=WAIT)
    except NackError as e:
        return e
    raise Failure(f"{what}: answered {r!r}, not a nack")


async def control_scenarios(d, flavor):
    S, DUP = f"ctl-{flavor}", f"ctl-{flavor}-dup"
    all_types = ["control.pause", "control.resume", "control.cancel",
                 "control.attention.respond"]
    t1 = Target(d.a, S, "ctl-target", f"host-t/{flavor}", all_types,
                ["control.pause", "control.attention.respond"],
                {"control.cancel": "silent", "control.attention.respond": "lossy"})
    targets = [t1]
    clients = []
    try:
        targets.append(Target(d.a, DUP, "dup-a", "host-da/1", ["control.pause"],
                              ["control.pause"]))
        targets.append(Target(d.b, DUP, "dup-b", "host-db/1", ["control.pause"],
                              ["control.pause"]))
        ctl = await open_control(flavor, d.b, OPS)
        clients.append(ctl)

        # roster(): every live claim, declarations verbatim (clustered: merged).
        def canon(entries):
            return sorted(json.dumps(x, sort_keys=True) for x in entries)
        want_roster = canon(t.roster_entry() for t in targets)
        deadline = time.monotonic() + WAIT
        while True:
            roster = await bounded(ctl.roster(timeout_ms=5000), "roster()")
            if canon(roster) == want_roster or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        equal(canon(roster), want_roster, "roster() entries")

        # Accepted.
        ack = await bounded(ctl.send("control.pause", S, data={"note": "sdk check"},
                                     ack_window_ms=5000, retries=0), "control.pause")
        equal(len(t1.received), 1, "commands at the target")
        cmd = t1.received[0]
        equal({k: cmd.get(k) for k in ("type", "session", "source", "agent", "data", "seq")},
              {"type": "control.pause", "session": S, "source": "aep://ops-host/agent/ops-console",
               "agent": "ops-console", "data": {"note": "sdk check"}, "seq": None},
              "the command as the target got it")
        # ControlTarget emits the ack, then calls `execute`.
        wait_until(lambda: t1.executed, "the target to execute the command")
        equal(t1.executed, [cmd], "executed once")
        equal(ack, t1.sent[-1], "send() returned the target's control.accepted")
        equal((ack["type"], ack["cause"], ack["session"]), ("control.accepted", cmd["id"], S),
              "the ack")

        # Target-behalf unsupported (ControlTarget does not accept control.resume).
        e = await nacked(ctl.send("control.resume", S, ack_window_ms=5000, retries=0),
                         "control.resume")
        equal((e.reason, e.synthesized), ("unsupported", False), "target-behalf nack")
        equal(t1.sent[-1]["type"], "control.rejected", "the target nacked")
        equal(t1.sent[-1]["data"], {"reason": "unsupported"}, "the nack's data")

        # Relay-behalf unsupported: outside the hello's control.accepts.
        before = len(t1.received)
        e = await nacked(ctl.send("x.acme.control.reboot", S, ack_window_ms=5000, retries=0),
                         "x.acme.control.reboot")
        equal((e.reason, e.synthesized), ("unsupported", False), "relay-behalf nack")

        # Timeout: the target never answers; every retry carries the same id.
        t = time.monotonic()
        e = await nacked(ctl.send("control.cancel", S, ack_window_ms=400, retries=2),
                         "control.cancel")
        elapsed = time.monotonic() - t
        equal((e.reason, e.synthesized), ("timeout", True), "the synthesized timeout")
        check(elapsed >= 1.2, f"three windows of 400 ms passed: {elapsed:.2f}s")
        wait_until(lambda: sum(m["type"] == "control.cancel" for m in t1.received) >= 3,
                   "the three attempts at the target")
        cancels = [m for m in t1.received if m["type"] == "control.cancel"]
        equal(len(cancels), 3, "attempts delivered")
        check(cancels[0] == cancels[1] == cancels[2], "each retry is the same command "
              f"(same id): {[c['id'] for c in cancels]}")

        # A lost ack, recovered: the retry (same id) makes ControlTarget re-emit the
        # recorded ack through SessionEmitter.redeliver(), byte-identical.
        ack = await bounded(ctl.send("control.attention.respond", S, subject="req-1",
                                     cause="req-1", data={"answer": {"option": "allow"}},
                                     ack_window_ms=700, retries=2),
                            "control.attention.respond")
        responds = [m for m in t1.received if m["type"] == "control.attention.respond"]
        equal(len(responds), 2, "attempts delivered (the first ack was lost)")
        check(responds[0] == responds[1], "the retry is the same command")
        equal(len(t1.dropped), 1, "acks lost")
        equal(ack, t1.dropped[0], "the ack send() returned is the lost one, re-emitted")
        wait_until(lambda: len(t1.executed) >= 2, "the target to execute the command")
        equal([c["type"] for c in t1.executed], ["control.pause", "control.attention.respond"],
              "executed once each")
        equal(len(t1.received), before + 3 + 2, "the relay-behalf nacked command never "
                                                "reached the target")

        # no-route and ambiguous: the relay's codes, which the SDK files under `invalid`.
        t = time.monotonic()
        e = await nacked(ctl.send("control.pause", f"ctl-{flavor}-nobody", ack_window_ms=5000,
                                  retries=0), "no-route")
        equal(e.reason, "invalid", "no-route nack reason (the SDK's normalization)")
        check(str(e.detail).startswith("no-route: "), f"no-route detail: {e.detail!r}")
        e = await nacked(ctl.send("control.pause", DUP, ack_window_ms=5000, retries=0),
                         "ambiguous")
        equal(e.reason, "invalid", "ambiguous nack reason (the SDK's normalization)")
        check(str(e.detail).startswith("ambiguous: "), f"ambiguous detail: {e.detail!r}")
        check(time.monotonic() - t < 4, "the relay answered, no ack window ran out")
        equal([t.received for t in targets[1:]], [[], []], "no claimant of DUP got it")

        # unauthorized: a watch-only token, then no token at all (the relay has tokens).
        viewer = await open_control(flavor, d.b, VIEWER)
        clients.append(viewer)
        e = await nacked(viewer.send("control.pause", S, ack_window_ms=5000, retries=0),
                         "unauthorized")
        equal((e.reason, e.synthesized), ("unauthorized", False), "a token without control")
        equal(canon(await bounded(viewer.roster(timeout_ms=5000), "viewer roster()")),
              want_roster, "roster() with a watch-only token")
        try:
            c = await open_control(flavor, d.b, None)
            clients.append(c)
            raise Failure("connect() without a token succeeded")
        except TransportError as e:
            equal((e.kind, e.status), ("http", 401), "connect() without a token")

        # The session's history: the delivered commands and the acks, once each; the
        # refused ones never entered it.
        comments = []
        hsub = await bounded(aio.subscribe(d.b.base, token=OPS, from_="all", live=False,
                                           filter={"session": S},
                                           on_comment=comments.append), "history read")
        history = await aio_collect(hsub, "the session's history")
        want_ids = sorted({m["id"] for m in t1.received} | {x["id"] for x in t1.sent})
        equal(sorted(x["id"] for x in history), want_ids,
              "the session's history: delivered commands and acks, once each")
        for t in targets:
            equal([f for f in t.frames if f.get("type") == "error"], [],
                  f"error frames at target {t.agent}")
        equal(len(t1.received), before + 5, "commands at the target in the end")
        log(f"{flavor}: accepted, unsupported x2, timeout after {elapsed:.1f}s (3 attempts, "
            "one id), lost ack recovered, no-route, ambiguous, unauthorized, 401, roster "
            f"of {len(roster)}")
    finally:
        for c in clients:
            await c.close()
        for t in targets:
            t.close()


def control_check(flavor):
    d = Deploy(f"control-{flavor}", both=["--tokens-file", tokens_file()], token=OPS)
    try:
        asyncio.run(control_scenarios(d, flavor))
    finally:
        d.close()


def test_control_sync():
    """ControlClient (sync) with a ControlTarget over open_duplex: accepted,
    unsupported (target and relay), timeout with retries on one id, a lost ack
    recovered through redeliver(), no-route, ambiguous, unauthorized, 401, roster()."""
    control_check("sync")


def test_control_aio():
    """aio.ControlClient, the same scenarios."""
    control_check("aio")


def test_project_state():
    """project_state over the Events read back (from=all&live=0) and StateProjection
    over the live subscription: the exact expected state, no violations."""
    d = Deploy("project")
    try:
        col = Collector()
        sync_subscribe(d.b, col)
        errors = []
        a = Emitter("ps-agent", "host-1", sink_for(d.a, errors))
        b = Emitter("ps-other", "host-2", sink_for(d.a, errors))
        sa, sb = a.session("ps-1"), b.session("ps-1")
        e = [sa.emit("session.started", {"client": {"name": "ps"}}),
             sa.emit("run.started", run="r1"),
             sb.emit("session.started")]
        req1 = sa.emit("attention.requested", {"kind": "permission", "prompt": "run rm?"},
                       run="r1", severity="notice")
        req2 = sa.emit("attention.requested", {"kind": "input", "prompt": "which file?"},
                       run="r1", severity="notice")
        e += [req1, req2,
              sa.emit("attention.resolved", {"outcome": "answered"}, subject=req1["id"],
                      run="r1"),
              sa.emit("tool.started", {"tool": {"name": "Bash"}}, run="r1"),
              sa.emit("run.finished", run="r1"),
              sb.emit("session.ended", {"reason": "normal"}),
              sa.emit("run.started", run="r2"),
              sa.emit("run.failed", {"error": {"message": "boom"}}, run="r2")]
        a.emit("agent.heartbeat")
        sa.redeliver(e[7])
        equal(errors, [], "http_sink failures")
        by = {x["type"] + x["source"] + str(x.get("run")): x for x in e}
        src_a, src_b = e[0]["source"], e[2]["source"]
        want = {"sessions": [
            {"source": src_a, "session": "ps-1", "agent": "ps-agent",
             "started": e[0]["time"], "ended": None,
             "position": {"epoch": 0, "seq": e[-1]["seq"]},
             "runs": [{"run": "r1", "status": "finished",
                       "started": by["run.started" + src_a + "r1"]["time"],
                       "ended": by["run.finished" + src_a + "r1"]["time"]},
                      {"run": "r2", "status": "failed",
                       "started": by["run.started" + src_a + "r2"]["time"],
                       "ended": by["run.failed" + src_a + "r2"]["time"]}],
             "pending": [{"id": req2["id"], "kind": "input", "since": req2["time"]}]},
            {"source": src_b, "session": "ps-1", "agent": "ps-other",
             "started": e[2]["time"], "ended": by["session.ended" + src_b + "None"]["time"],
             "position": {"epoch": 0, "seq": 1}, "runs": [], "pending": []}],
            "violations": []}
        want["sessions"].sort(key=lambda x: (x["source"], x["session"]))

        d.b.wait_held(len(e), "the Events")
        read = [json.loads(message_data(m)) for m in readback(d.b)]
        equal(len(read), len(e), "Events read back")
        equal(project_state(read), want, "project_state over the read-back")

        col.wait_events(len(e) + 1, "the live Events (and the agent-scoped one)")
        proj = StateProjection()
        for ev in col.events:
            proj.apply(ev)
        equal(proj.state(), want, "StateProjection over the live subscription")
        log(f"2 sessions named ps-1 projected from {len(read)} Events: runs, pending "
            "attention, no violations")
    finally:
        d.close()


def with_nats(fn):
    """The check `fn`, preceded by starting the nats-server of the cluster checks (once)."""
    def run():
        global NATS
        if NATS is None:
            NATS = Nats()
        fn()
    run.__doc__ = fn.__doc__
    return run


TESTS = {
    "emit-http-readback": test_emit_http_readback,
    "jsonl-ingest-file": test_jsonl_ingest_file,
    "subscribe-filter-capture": test_subscribe_filter_capture,
    "subscribe-slow-consumer": test_subscribe_slow_consumer,
    "subscribe-restart-history": test_subscribe_restart_history,
    "from-all": test_from_all,
    "aio-subscribe": test_aio_subscribe,
    "position-budget": test_position_budget,
    "control-sync": test_control_sync,
    "control-aio": test_control_aio,
    "project-state": test_project_state,
}


def main():
    global ARGS
    ap = arguments(__doc__, "logs (default: a temporary directory)")
    ap.add_argument("--topology", default="single,cluster",
                    help="comma-separated: single, cluster (default both)")
    ARGS = ap.parse_args()
    ARGS.bin = str(Path(ARGS.bin).resolve())
    ARGS.out = configure(ARGS.out, "aep-sdk-", wait=WAIT, interval=0.02, stop_wait=15.0)
    equal(aep_sdk.__version__, SDK_VERSION, "the SDK under test")
    only = [n for n in ARGS.only.split(",") if n]

    def checks():
        global TOPOLOGY
        for topology in [t for t in ARGS.topology.split(",") if t]:
            check(topology in ("single", "cluster"), f"unknown topology {topology}")
            TOPOLOGY = topology
            suffix = "" if topology == "single" else "@cluster"
            for name, fn in TESTS.items():
                full = name + suffix
                if only and name not in only and full not in only:
                    continue
                yield full, with_nats(fn) if topology == "cluster" else fn

    def close_subs():
        for sub in SUBS:
            sub.close()
        SUBS.clear()

    return run_all(checks(), f"logs: {ARGS.out}", after=close_subs)


if __name__ == "__main__":
    sys.exit(main())
