#!/usr/bin/env python3
"""Regenerates the committed seed corpora under fuzz/corpus/<target>/ and the
dictionaries under fuzz/dict/ from the project's fixtures (../shared/aep-fixtures,
beside the project root) plus a few hand-written edge cases.

Seeds are the project's own test inputs: golden Events one per file, the invalid-Event,
attr-match and downlevel conformance cases. Run from anywhere:

    python3 fuzz/scripts/make_seeds.py

Needs ../shared only when regenerating; the fuzz targets and CI use the committed files.
"""
import json
import os
import re
import sys

FUZZ = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(FUZZ)
FIX = os.path.join(os.path.dirname(ROOT), "shared", "aep-fixtures")
if not os.path.isdir(FIX):
    sys.exit(f"fixtures not found at {FIX}: run beside ../shared")


def slug(s):
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")[:60]


def compact(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def write(target, name, data):
    d = os.path.join(FUZZ, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# Start over, except the minimized inputs of past findings (*-regression).
for t in ["envelope", "filter", "downlevel", "http", "floor", "sse_query", "ws", "conn_script"]:
    d = os.path.join(FUZZ, "corpus", t)
    for f in os.listdir(d) if os.path.isdir(d) else []:
        if not f.endswith("-regression"):
            os.remove(os.path.join(d, f))

golden = [l for l in open(os.path.join(FIX, "golden", "golden.jsonl"), encoding="utf-8").read().split("\n") if l.strip()]
invalid = json.load(open(os.path.join(FIX, "invalid", "cases.json")))["cases"]
attr = json.load(open(os.path.join(FIX, "attr-match", "cases.json")))
down = json.load(open(os.path.join(FIX, "downlevel", "cases.json")))["cases"]

# envelope: golden Events, invalid-Event cases, and edges of the JSON grammar.
for i, line in enumerate(golden):
    t = json.loads(line)["type"]
    write("envelope", f"golden-{i:02}-{slug(t)}", line)
for c in invalid:
    # Multi-Event cases (stream rules) contribute each Event.
    for k, ev in enumerate(c["events"] if "events" in c else [c["event"]]):
        write("envelope", f"invalid-{slug(c['name'])}-{k}", ev if isinstance(ev, str) else compact(ev))
edges = {
    "escapes-and-surrogates": r'{"id":"a\"b\\c\/d\u00e9\n\ud83d\ude00","typ\u0065":"tool.x","acme":"\u0000"}',
    "lone-surrogate-in-data": r'{"data":{"k":"\ud800"}}',
    "integers-at-the-edges": '{"seq":18446744073709551615,"epoch":0,"a1":-9223372036854775808,"a2":18446744073709551616}',
    "floats-at-the-edges": '{"data":{"a":1e308,"b":1.7976931348623157e308,"c":1e-400,"d":-0,"e":0.1e1}}',
    "duplicate-by-escape": r'{"type":"a.b","typ\u0065":"a.c"}',
    "nesting-127": '{"data":{"k":' + "[" * 125 + "0" + "]" * 125 + "}}",
    "whitespace-around": ' \t\r\n{"id":"x"}\n ',
}
for name, s in edges.items():
    write("envelope", f"edge-{name}", s)

# filter: "filter\nevent" pairs from the attr-match corpus; invalid filters alone.
for c in attr["match"]:
    write("filter", f"match-{slug(c['name'])}", compact(c["filter"]) + "\n" + compact(c["event"]))
for c in attr["invalid"]:
    f = c["filter"]
    write("filter", f"invalid-{slug(c['name'])}", f if isinstance(f, str) else compact(f))
spec_examples = [
    {"type": ["attention.*", "error.*"], "severity": {"gte": "notice"}},
    {"session": "s_8f2c"},
    {"agent": ["claude-code", "codex"], "type": "tool.denied"},
]
for i, f in enumerate(spec_examples):
    write("filter", f"spec-6-3-example-{i}", "\n".join([compact(f)] + golden[i * 8:i * 8 + 4]))

# downlevel: golden Events and the downlevel cases' Events.
for i, line in enumerate(golden):
    write("downlevel", f"golden-{i:02}-{slug(json.loads(line)['type'])}", line)
for c in down:
    write("downlevel", f"case-{slug(c['name'])}", compact(c["event"]))

# http: [flags, write limit, n, n chunk lengths..., payload] (see fuzz_targets/http.rs).
def http_seed(name, payload, flags=0, limit=0, splits=()):
    write("http", name, bytes([flags, limit, len(splits), *splits]) + payload.encode())
    # floor: the same requests, whole (fuzz_targets/floor.rs).
    write("floor", name, payload)

ev = golden[3]
post = lambda body, ct="application/json", extra="": (
    f"POST /events HTTP/1.1\r\nHost: r\r\nAEP-Version: 0.1\r\nContent-Type: {ct}\r\n{extra}"
    f"Content-Length: {len(body.encode())}\r\n\r\n{body}")
http_seed("post-one-event", post(ev))
http_seed("post-one-event-byte-by-byte", post(ev), splits=(1,))
http_seed("post-batch", post("\n".join(golden[:3]) + "\n", "application/x-ndjson"), splits=(17, 3, 200))
chunks = "".join(f"{len(p.encode()):x}\r\n{p}\r\n" for p in [ev[:40], ev[40:]]) + "0\r\n\r\n"
http_seed("post-chunked", "POST /events HTTP/1.1\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks, splits=(5, 0))
http_seed("post-expect-continue", post(ev, extra="Expect: 100-continue\r\n"))
http_seed("post-without-version", "POST /events HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}GET /events HTTP/1.1\r\n\r\n")
http_seed("pipelined-discovery-unread", "GET /events HTTP/1.1\r\n\r\n" * 4, flags=0x31, limit=0)
http_seed("stream-filtered", "GET /stream?filter=%7B%22type%22%3A%5B%22attention.*%22%5D%7D&capture=metadata&from=all&live=0 HTTP/1.1\r\n\r\n")
http_seed("stream-last-event-id", "GET /stream HTTP/1.1\r\nLast-Event-ID: s_8f2c:0:1\r\n\r\n", flags=0x04, splits=(9, 0, 0))
http_seed("stream-from-all-to-a-stalled-reader", "GET /stream?from=all HTTP/1.1\r\n\r\n", flags=0x01, limit=0)
# Live Events of a new session (conn_script below sends them behind a stalled replay).
live = lambda q: compact({"aep": "0.1", "id": f"l{q}", "type": "tool.completed", "time": "2026-07-03T10:00:00Z",
                          "source": "aep://h/agent/a/session/live", "agent": "a", "session": "live", "seq": q,
                          "severity": "info", "data": {"pad": "z" * 200}})
http_seed("live-events", "".join(post(live(q)) for q in range(4)))
hidden = "GET /nope HTTP/1.1\r\n\r\n"
http_seed("get-with-a-body-hiding-a-request", f"GET /events HTTP/1.1\r\nContent-Length: {len(hidden)}\r\n\r\n{hidden}")
http_seed("not-found-close", "GET /nope HTTP/1.0\r\n\r\n")
http_seed("method-not-allowed-body", "PUT /stream HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /events HTTP/1.1\r\nConnection: close\r\n\r\n")

# sse_query: query string, then optionally "\n" and a Last-Event-ID value.
queries = {
    "readme-example": "filter=%7B%22type%22%3A%5B%22attention.*%22%2C%22error.*%22%5D%2C%22severity%22%3A%7B%22gte%22%3A%22notice%22%7D%7D&capture=metadata&from=%5B%7B%22session%22%3A%22s_8f2c%22%2C%22epoch%22%3A0%2C%22seq%22%3A100%7D%5D&live=0",
    "from-all": "from=all",
    "last-event-id": "live=1\ns_8f2c:0:100",
    "last-event-id-colon-session": "\na:b:3:17",
    "from-wins-over-last-event-id": 'from=[{"session":"s","seq":3}]\nt:0:1',
    "capture-only": "capture=none",
}
for name, q in queries.items():
    write("sse_query", name, q)

# ws: [flags, write limit, n, n chunk lengths..., payload] (see fuzz_targets/ws.rs);
# framed mode: one client frame per line, an optional leading opcode byte below 0x20.
def ws_seed(name, lines, flags=0, limit=0, splits=()):
    payload = b"\n".join(l.encode() if isinstance(l, str) else l for l in lines)
    write("ws", name, bytes([flags, limit, len(splits), *splits]) + payload)

hello = compact({"type": "hello", "versions": ["0.1"], "role": "both", "identity": {"agent": "claude-code"}})
consumer = compact({"type": "hello", "versions": ["0.1"], "role": "consumer"})
sub = lambda i, **kw: compact({"type": "subscribe", "id": i, **kw})
ws_seed("hello-subscribe-emit", [hello, sub("s1", filter={"type": ["tool.*"]}), golden[3]])
ws_seed("hello-subscribe-replay-all-stalled", [consumer, sub("s1", **{"from": "all"})], flags=0x04, limit=64)
# Emits to its own subscription while that one is stalled (conn_script below does it
# behind a replay of the filled store).
ws_seed("emit-to-its-own-stalled-subscription", [sub("s1", **{"from": "all"})] + [live(q) for q in range(4)], flags=0x06)
ws_seed("subscribe-from-positions-capture", [consumer, sub("s1", filter={"session": "s_8f2c"}, capture="none", **{"from": [{"session": "s_8f2c", "epoch": 0, "seq": 1}]})])
ws_seed("roster-ping-unsubscribe", [hello, compact({"type": "roster", "id": "r1"}), compact({"type": "ping", "t": 1}), sub("s1"), compact({"type": "unsubscribe", "id": "s1"})])
ws_seed("command-routing", [hello] + [l for l in golden if '"type":"control.' in l][:2])
ws_seed("first-frame-not-hello", [golden[0]])
ws_seed("fragmented-text-and-ping", [hello, b"\x11" + sub("s1").encode()[:10], b"\x09ping", b"\x00" + sub("s1").encode()[10:]])
ws_seed("binary-frame-refused", [hello, b"\x02\x00\x01"])
ws_seed("close-with-reason", [hello, b"\x08\x03\xe8bye"], splits=(3, 1))
# permessage-deflate (flag 0x08, RFC 7692): compressed messages (0x1D lines) from a
# compressing emitter, and Events fanned out compressed to its own subscription.
z = lambda l: b"\x1D" + (l.encode() if isinstance(l, str) else l)
ws_seed("deflate-hello-subscribe-emit-compressed", [z(hello), z(sub("s1", **{"from": "all"})), z(golden[3]), golden[4], z(compact({"type": "ping", "t": 1}))], flags=0x08)
ws_seed("deflate-offer-declined-rsv1-refused", [hello, z(golden[3])])
raw = bytes([0x81, 0x85, 1, 2, 3, 4]) + bytes(b ^ k for b, k in zip(b"hello", [1, 2, 3, 4, 1]))
write("ws", "raw-masked-text", bytes([0x01, 0, 0]) + raw)
write("ws", "raw-unmasked-text", bytes([0x01, 0, 0, 0x81, 0x05]) + b"hello")

# conn_script: a sequence of operations (see fuzz_targets/conn_script.rs for the opcodes).
HTTP, WS, SSE = 0, 1, 2
READS = 255  # a peer that reads everything
def c_open(slot, kind, limit=READS): return bytes([0, slot, kind, limit])
def c_send(slot, data):
    data = data.encode() if isinstance(data, str) else data
    assert len(data) < 256
    return bytes([1, slot, len(data)]) + data
def c_sends(slot, data):
    """`data` in as many `send` operations as it takes (each at most 255 bytes)."""
    data = data.encode() if isinstance(data, str) else data
    return b"".join(c_send(slot, data[i:i + 255]) for i in range(0, len(data), 255))
def c_eof(slot): return bytes([2, slot])
def c_reset(slot): return bytes([3, slot])
def c_take(slot, n=0): return bytes([4, slot, n])
def c_advance(tenths): return bytes([5, tenths])  # tenths of a second; 0 = past every timeout
def c_ingest(session, k): return bytes([6, session, k - 1])
C_SHUTDOWN, C_PREFILL = bytes([7]), bytes([8])
def c_request(slot, which): return bytes([9, slot, which])  # healthz, events, post, status, stream, metrics
def conn_seed(name, *ops): write("conn_script", name, b"".join(ops))

ws_hello = HTTP + 1 | 0x10  # a WebSocket with its hello sent
conn_seed("sse-heartbeats-then-eof", c_open(0, SSE), c_advance(45), c_take(0), c_advance(45), c_take(0), c_eof(0))
conn_seed("request-timeout-408-then-linger", c_open(0, HTTP), c_send(0, "GET /healthz HTTP/1.1\r\n"), c_advance(31), c_take(0), c_advance(25))
conn_seed("keep-alive-idle-close", c_open(0, HTTP), c_request(0, 0), c_take(0), c_advance(51), c_take(0))
conn_seed("too-many-connections", *[c_open(i, HTTP) for i in range(6)], c_request(0, 1), c_take(0))
conn_seed("half-closed-peer-that-never-reads", c_open(0, HTTP, 0), *[c_request(0, 1)] * 8, c_eof(0), c_advance(0))
conn_seed("stalled-replay-with-live-backlog", C_PREFILL, c_open(0, SSE, 0), c_open(1, SSE), *[c_ingest(i % 4, 4) for i in range(12)], c_take(0, 8), c_take(1), c_advance(10), c_take(0))
conn_seed("ws-subscribe-from-all-stalled", C_PREFILL, c_open(0, ws_hello, 4), c_send(0, '{"type":"subscribe","id":"a","from":"all"}'), c_ingest(0, 4), c_ingest(1, 4), c_advance(50), c_advance(15), c_take(0))
conn_seed("ws-emitter-and-sse-consumer", c_open(0, ws_hello), c_open(1, SSE | 1 << 2), c_send(0, compact({"aep": "0.1", "id": "w1", "type": "tool.started", "time": "2026-07-03T10:00:00Z", "source": "aep://h/agent/a/session/w", "agent": "a", "session": "w", "seq": 1})), c_take(1), c_take(0), c_reset(0), c_take(1))
conn_seed("ws-ping-and-idle-close", c_open(0, ws_hello), c_advance(41), c_take(0), c_send(0, b"\x0apong"), c_advance(61), c_take(0))
conn_seed("shutdown-with-streams-open", c_open(0, SSE), c_open(1, ws_hello), c_open(2, HTTP), c_send(2, "GET /events HTTP/1.1\r\n"), C_SHUTDOWN, c_take(0), c_take(1), c_open(3, HTTP), c_advance(20), c_take(2), c_advance(20))
conn_seed("shutdown-deadline-with-a-stalled-reader", C_PREFILL, c_open(0, SSE, 0), C_SHUTDOWN, c_advance(35), c_take(0))
conn_seed("pipelined-post-and-partial-reads", c_open(0, HTTP, 2), c_request(0, 2), c_request(0, 2), c_request(0, 3), c_take(0, 1), c_take(0, 3), c_request(0, 5), c_take(0), c_eof(0), c_take(0))
conn_seed("reset-while-paused-then-reuse-slot", c_open(0, HTTP, 0), *[c_request(0, 1)] * 6, c_reset(0), c_open(0, SSE | 2 << 2), c_ingest(2, 3), c_take(0), c_eof(0))
# The scenes `http` and `ws` leave out to stay cheap (a full store, a subscriber that
# never reads), here among the other connections.
small = lambda q: compact({"aep": "0.1", "id": f"m{q}", "type": "tool.completed", "time": "2026-07-03T10:00:00Z",
                           "source": "aep://h/agent/a/session/live", "agent": "a", "session": "live", "seq": q,
                           "severity": "info", "data": {"pad": "z" * 40}})
conn_seed("replay-all-to-a-stalled-reader", C_PREFILL, c_open(0, HTTP, 0), c_request(0, 4), c_advance(10), c_take(0, 4), c_eof(0))
conn_seed("live-posts-behind-a-stalled-replay", C_PREFILL, c_open(0, SSE, 0), c_open(1, HTTP), *[c_sends(1, post(live(q))) for q in range(4)], c_take(1), c_take(0, 8), c_advance(10), c_take(0))
conn_seed("ws-emit-behind-its-own-stalled-replay", C_PREFILL, c_open(0, ws_hello, 0), c_send(0, sub("s1", **{"from": "all"})), *[c_send(0, small(q)) for q in range(4)], c_take(0, 4), c_advance(50), c_take(0))
conn_seed("ws-subscribe-from-positions-over-a-full-store", C_PREFILL, c_open(0, ws_hello), c_send(0, sub("s1", filter={"session": "p1"}, **{"from": [{"session": "p1", "epoch": 0, "seq": 0}]})), c_take(0))

# Dictionaries (libFuzzer format: one quoted token per line).
def esc(s):
    out = ""
    for b in s.encode():
        c = chr(b)
        if c in '"\\':
            out += "\\" + c
        elif 0x20 <= b < 0x7F:
            out += c
        else:
            out += f"\\x{b:02x}"
    return f'"{out}"'

core = ["aep", "id", "type", "subject", "time", "source", "agent", "session", "run", "step",
        "seq", "epoch", "cause", "traceparent", "severity", "capture", "data"]
types = sorted({json.loads(l)["type"] for l in golden} | {"x.acme.tool.x", "agent.heartbeat", "control.pause"})
json_tokens = ["{", "}", "[", "]", ":", ",", '"', "\\\"", "\\\\", "\\/", "\\n", "\\u0000", "\\u00e9",
               "\\ud83d\\ude00", "\\ud800", "\\udc00", "true", "false", "null", "-0", "0.0", "1e2", "1E+2",
               "1e400", "-1e400", "1e-400", "18446744073709551615", "18446744073709551616",
               "-9223372036854775808", "-9223372036854775809", " ", "\t", "\r\n", "\xef\xbb\xbf"]
json_tokens += [f'"{n}":' for n in core]
json_tokens += [f'"{t}"' for t in types]
json_tokens += ['"debug"', '"info"', '"notice"', '"warning"', '"error"', '"critical"',
                '"none"', '"metadata"', '"redacted"', '"full"', '"0.1"', '"gte"', '"lte"',
                '".*"', '"attention.*"', '"acmeregion":', '"2026-07-03T10:15:04.221Z"',
                '"prompt":', '"kind":', '"options":', '"label":', '"values":', '"answer":',
                '"fields":', '"choices":', '"error":', '"message":', '"tool":']
http_tokens = ["POST /events HTTP/1.1\r\n", "GET /stream", "GET /events HTTP/1.1\r\n",
               "GET /.well-known/aep HTTP/1.1\r\n", " HTTP/1.0\r\n", " HTTP/1.1\r\n", "\r\n", "\r\n\r\n",
               "Host: r\r\n", "Content-Length: ", "Content-Length: 0\r\n", "Transfer-Encoding: chunked\r\n",
               "AEP-Version: 0.1\r\n", "AEP-Version: 1.0\r\n", "Content-Type: application/json\r\n",
               "Content-Type: application/x-ndjson\r\n", "Expect: 100-continue\r\n",
               "Connection: close\r\n", "Connection: keep-alive\r\n", "Last-Event-ID: ", "0\r\n\r\n",
               "ffffffff\r\n", ";ext=1", "?filter=", "&capture=", "&from=all", "&live=0", "%7B", "%22",
               "GET / HTTP/1.1\r\n", "GET /status HTTP/1.1\r\n", "GET /metrics HTTP/1.1\r\n",
               "GET /healthz HTTP/1.1\r\n", "GET /socket HTTP/1.1\r\n", "OPTIONS /stream HTTP/1.1\r\n",
               "Upgrade: websocket\r\n", "Connection: Upgrade\r\n", "Sec-WebSocket-Version: 13\r\n",
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", "Origin: http://x\r\n",
               "Authorization: Bearer ", "Accept: text/event-stream\r\n"]
query_tokens = ["filter=", "capture=", "from=", "live=", "&", "=", "%", "+", "%7B%7D", "%22", "all",
                '[{"session":"s","epoch":0,"seq":1}]', '"session":', '"seq":', '"epoch":', "\n", ":0:"]
os.makedirs(os.path.join(FUZZ, "dict"), exist_ok=True)
ws_tokens = ['"hello"', '"subscribe"', '"unsubscribe"', '"roster"', '"ping"', '"pong"', '"closing"',
             '"versions":["0.1"]', '"role":"both"', '"role":"emitter"', '"role":"consumer"',
             '"identity":{"agent":"a"}', '"capabilities":', '"control":{"accepts":["control.cancel"]}',
             '"filter":', '"from":"all"', '"from":[{"session":"s","epoch":0,"seq":1}]', '"capture":"none"',
             '"sub":', "\x81", "\x01", "\x11", "\x00", "\x08", "\x09", "\x02", "\x88\x80", "\x81\xfe"]
for name, toks in [("json", json_tokens), ("http", http_tokens + json_tokens), ("query", query_tokens + json_tokens), ("ws", ws_tokens + json_tokens)]:
    with open(os.path.join(FUZZ, "dict", f"{name}.dict"), "w") as f:
        f.write(f"# {name}.dict: generated by fuzz/scripts/make_seeds.py\n")
        seen = set()
        for t in toks:
            if t not in seen:
                seen.add(t)
                f.write(esc(t) + "\n")
print("seeds and dictionaries written")
