#!/usr/bin/env python3
"""The load of benches/constrained.sh: one scenario against a relay at --addr, stdlib only.

Prints one JSON object: what was posted and admitted, /metrics at the end (every
`aep_*` sample, whatever this relay version offers), the largest total of
`aep_memory_used_bytes` seen while it ran (sampled every 0.25 s), /healthz at the end,
and the scenario's own counts.

  flood    SESSIONS x PER_SESSION Events of about 1 KB (the Event of
           tests/cli/memory_cgroup.rs), BATCH per POST, the sessions taking turns;
           with --notice-every K every K-th Event of a session is a `notice`.
  stalled  --ws WebSocket and --sse SSE consumers subscribe to everything and never
           read while the flood runs; then each is drained to see whether the relay
           ended it, and why (the memory budget's marker, or not).
  deltas   one SSE consumer reading at --rate bytes/s (resuming with Last-Event-ID
           when the relay ends its stream) while --events `debug` Events of --size
           bytes are posted to one session, every --notice-every-th a `notice`.
"""
import argparse
import http.client
import json
import select
import signal
import socket
import sys
import threading
import time

P = argparse.ArgumentParser()
P.add_argument("scenario", choices=["flood", "stalled", "deltas"])
P.add_argument("--addr", default="127.0.0.1:18811")
P.add_argument("--sessions", type=int, default=300)
P.add_argument("--per-session", type=int, default=2000)
P.add_argument("--batch", type=int, default=500)
P.add_argument("--notice-every", type=int, default=0)
P.add_argument("--ws", type=int, default=0)
P.add_argument("--sse", type=int, default=0)
P.add_argument("--events", type=int, default=20000)
P.add_argument("--size", type=int, default=900)
P.add_argument("--rate", type=float, default=1.6e6)
P.add_argument("--idle", type=float, default=5.0)
A = P.parse_args()
# Interrupted, the load ends at once (no report of a half run); the script stops the relay.
signal.signal(signal.SIGINT, signal.SIG_DFL)
HOST, PORT = A.addr.rsplit(":", 1)
PORT = int(PORT)
OUT = {"scenario": A.scenario, "errors": []}


def event(session, seq, ty, severity, pad):
    """The envelope of tests/support/fixtures.rs (AEP-0001 §5) with a `pad`."""
    sev = f',"severity":"{severity}"' if severity else ""
    return (
        f'{{"aep":"0.1","id":"{session}-0-{seq}","type":"{ty}","time":"2026-07-03T10:00:00Z",'
        f'"source":"aep://test/agent/a/session/{session}","agent":"a","session":"{session}",'
        f'"seq":{seq},"epoch":0{sev},"data":{{"pad":"{pad}"}}}}'
    )


def get(path, timeout=10):
    c = http.client.HTTPConnection(HOST, PORT, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


def metrics():
    """Every `aep_*` sample of /metrics: {"name{labels}": value}."""
    _, text = get("/metrics")
    out = {}
    for line in text.splitlines():
        if line.startswith("aep_") and "_bucket{" not in line:
            key, _, val = line.rpartition(" ")
            try:
                out[key] = float(val)
            except ValueError:
                pass
    return out


def used(m):
    return sum(v for k, v in m.items() if k.startswith("aep_memory_used_bytes{"))


class Sampler(threading.Thread):
    """The largest `aep_memory_used_bytes` total seen while the load runs."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = 0.0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, used(metrics()))
            except Exception:
                pass
            self.stop.wait(0.25)


class Poster:
    """NDJSON POSTs over one keep-alive connection, counting statuses."""

    def __init__(self):
        self.conn = http.client.HTTPConnection(HOST, PORT, timeout=60)
        self.posts = 0
        self.events = 0
        self.accepted = 0
        self.not_202 = {}

    def post(self, lines):
        body = ("\n".join(lines) + "\n").encode()
        self.conn.request(
            "POST",
            "/events",
            body=body,
            headers={"AEP-Version": "0.1", "Content-Type": "application/x-ndjson"},
        )
        r = self.conn.getresponse()
        text = r.read()
        self.posts += 1
        self.events += len(lines)
        if r.status == 202:
            self.accepted += json.loads(text).get("accepted", 0)
        else:
            k = str(r.status)
            self.not_202[k] = self.not_202.get(k, 0) + 1

    def summary(self):
        return {
            "posts": self.posts,
            "events_posted": self.events,
            "events_accepted": self.accepted,
            "not_202": self.not_202,
        }


def ingested(m):
    return sum(v for k, v in m.items() if k.startswith("aep_events_ingested_total"))


def flood():
    """The flood of tests/cli/memory_cgroup.rs; returns its wall seconds."""
    pad = "x" * 870
    p = Poster()
    t0 = time.monotonic()
    try:
        for rnd in range(A.per_session // A.batch):
            for s in range(A.sessions):
                lines = []
                for seq in range(rnd * A.batch, (rnd + 1) * A.batch):
                    notice = A.notice_every and seq % A.notice_every == A.notice_every - 1
                    lines.append(
                        event(f"c{s}", seq, "tool.completed", "notice" if notice else "", pad)
                    )
                p.post(lines)
    except Exception as e:
        OUT["errors"].append(f"flood: {e!r}")
    secs = time.monotonic() - t0
    OUT["publisher"] = p.summary()
    return secs


def ws_frame(payload):
    """A masked client text frame (RFC 6455 §5.2) with the key 0."""
    n = len(payload)
    head = bytes([0x81])
    if n < 126:
        head += bytes([0x80 | n])
    else:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    return head + b"\0\0\0\0" + payload


def read_until(s, needle, what, limit=10.0):
    s.settimeout(limit)
    got = b""
    while needle not in got:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError(f"{what}: closed after {got[:200]!r}")
        got += chunk
        if b'"type":"error"' in got:
            raise RuntimeError(f"{what}: {got[:300]!r}")
    return got


def open_sse(last_id=None):
    s = socket.create_connection((HOST, PORT))
    extra = f"Last-Event-ID: {last_id}\r\n" if last_id else ""
    s.sendall(f"GET /stream HTTP/1.1\r\nHost: {A.addr}\r\n{extra}\r\n".encode())
    head = read_until(s, b"\r\n\r\n", "sse head")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"sse refused: {head[:200]!r}")
    return s, head[head.index(b"\r\n\r\n") + 4 :]


def open_ws():
    """The upgrade, `hello` and a `subscribe` to everything (AEP-0003 §3.5)."""
    s = socket.create_connection((HOST, PORT))
    s.sendall(
        (
            f"GET /socket HTTP/1.1\r\nHost: {A.addr}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = read_until(s, b"\r\n\r\n", "ws upgrade")
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(f"ws refused: {head[:200]!r}")
    hello = b'{"type":"hello","versions":["0.1"],"role":"consumer","identity":{"agent":"constrained","instance":"constrained/1"}}'
    s.sendall(ws_frame(hello))
    if b'"type":"hello"' not in head:
        read_until(s, b'"type":"hello"', "ws hello")
    s.sendall(ws_frame(b'{"type":"subscribe","id":"all","filter":{}}'))
    read_until(s, b'"subscribed"', "ws subscribe")
    return s


def drain(s, idle=1.0):
    """Reads `s` until it ends or stays silent for `idle` s: (ended, the last 4 KiB)."""
    s.setblocking(False)
    tail = b""
    while True:
        r, _, _ = select.select([s], [], [], idle)
        if not r:
            return False, tail
        try:
            chunk = s.recv(1 << 20)
        except (ConnectionResetError, BrokenPipeError):
            return True, tail
        except BlockingIOError:
            continue
        if not chunk:
            return True, tail
        tail = (tail + chunk)[-4096:]


def stalled():
    socks = []
    try:
        for _ in range(A.ws):
            socks.append(("ws", open_ws()))
        for _ in range(A.sse):
            socks.append(("sse", open_sse()[0]))
    except Exception as e:
        OUT["errors"].append(f"subscribe: {e!r}")
    secs = flood()
    res = {"ws": A.ws, "sse": A.sse, "ended_budget": 0, "ended_other": 0, "open": 0}
    try:
        m = metrics()
    except Exception as e:
        m = {}
        OUT["errors"].append(f"metrics: {e!r}")
    for kind, s in socks:
        ended, tail = drain(s)
        if not ended:
            res["open"] += 1
        elif b"memory budget" in tail or b"memory: the relay" in tail:
            res["ended_budget"] += 1
        else:
            res["ended_other"] += 1
        s.close()
    OUT["consumers"] = res
    return secs, m


def deltas():
    res = {"notices": 0, "notices_posted": 0, "events": 0, "disconnects": 0, "bytes": 0}
    seen = set()
    done = threading.Event()
    state = {"last_id": None}

    def consume():
        try:
            consume_()
        except Exception as e:
            OUT["errors"].append(f"consumer: {e!r}")

    def consume_():
        start = time.monotonic()
        last_data = time.monotonic()
        sock, buf = open_sse()
        ev_id, data = None, []
        while True:
            # The rate: never ahead of --rate bytes/s since the start.
            ahead = res["bytes"] / A.rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
            sock.settimeout(0.5)
            try:
                chunk = sock.recv(16384)
            except socket.timeout:
                chunk = None
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if chunk == b"":
                res["disconnects"] += 1
                sock.close()
                sock, buf = open_sse(state["last_id"])
                continue
            if chunk is None:
                if done.is_set() and (
                    res["notices"] >= res["notices_posted"]
                    or time.monotonic() - last_data > A.idle
                ):
                    break
                continue
            last_data = time.monotonic()
            res["bytes"] += len(chunk)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.startswith(b"id: "):
                    ev_id = line[4:].decode()
                elif line.startswith(b"data: "):
                    data.append(line[6:])
                elif line == b"" and data:
                    if ev_id not in seen:
                        seen.add(ev_id)
                        res["events"] += 1
                        if b'"severity":"notice"' in data[0]:
                            res["notices"] += 1
                    state["last_id"] = ev_id
                    ev_id, data = None, []
        sock.close()
        res["seconds"] = round(time.monotonic() - start, 2)

    t = threading.Thread(target=consume)
    t.start()
    # The consumer's subscription is in place before the first Event: it has read its
    # response head in open_sse; give the relay the request's turn.
    time.sleep(0.2)
    base = len(event("d", 10000, "x.agui.text_message.content", "debug", ""))
    pad = "y" * max(0, A.size - base)
    p = Poster()
    t0 = time.monotonic()
    try:
        for start in range(0, A.events, A.batch):
            lines = []
            for seq in range(start, min(start + A.batch, A.events)):
                notice = seq % A.notice_every == A.notice_every - 1
                res["notices_posted"] += notice
                lines.append(
                    event(
                        "d",
                        seq,
                        "x.agui.text_message.content",
                        "notice" if notice else "debug",
                        pad,
                    )
                )
            p.post(lines)
    except Exception as e:
        OUT["errors"].append(f"publish: {e!r}")
    secs = time.monotonic() - t0
    OUT["publisher"] = p.summary()
    done.set()
    t.join()
    res["event_bytes"] = len(event("d", 10000, "x.agui.text_message.content", "debug", pad))
    OUT["consumer"] = res
    return secs, None


def main():
    sampler = Sampler()
    before = {}
    try:
        before = metrics()
    except Exception as e:
        OUT["errors"].append(f"metrics: {e!r}")
    sampler.start()
    m = None
    if A.scenario == "flood":
        secs = flood()
    elif A.scenario == "stalled":
        secs, m = stalled()
    else:
        secs, m = deltas()
    sampler.stop.set()
    sampler.join()
    OUT["seconds"] = round(secs, 3)
    try:
        OUT["health"] = get("/healthz", timeout=5)[1][:200]
        after = metrics()
        OUT["metrics"] = m or after
        OUT["metrics_end"] = after
        OUT["admitted"] = ingested(after) - ingested(before)
    except Exception as e:
        OUT["health"] = None
        OUT["errors"].append(f"after: {e!r}")
    OUT["peak_counted"] = sampler.peak
    print(json.dumps(OUT))


main()
