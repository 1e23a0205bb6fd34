#!/usr/bin/env python3
"""Renders the markdown report of one `benches/compare.sh` run from its directory.

Usage: benches/compare_report.py RESULTS_DIR

Reads settings.env and every NAME.TARGET.RUN.json / .meta that compare.sh left there.
A run is valid when aep-load exited 0 (no Event lost, no publish error, no subscriber
closed by the server), the server was still alive and its log shows no slow-consumer
close. Invalid runs are counted in the "invalid runs" column and left out of every
median and ratio (a round in which a peer's run is invalid gives no ratio). Figures are medians over the valid rounds with the spread (min-max);
a ratio relay / better peer is computed within each round (both from that round), then
its median and spread are given.
"""

import json
import os
import re
import statistics
import sys
from collections import defaultdict

RELAY = ("relay-ws", "relay-sse")
RELAY_TLS = ("relay-wss", "relay-https")
# The plaintext relay row each TLS relay row is divided by (same round).
PLAIN_OF = {"relay-wss": "relay-ws", "relay-https": "relay-sse"}
NAMES = {
    "relay-ws": "relay, WS",
    "relay-sse": "relay, SSE",
    "relay-wss": "relay, WSS",
    "relay-https": "relay, HTTPS SSE",
    "redis-tls": "Redis-TLS",
    "nats-tls": "NATS-TLS",
    "redis": "Redis",
    "nats": "NATS",
    "mqtt": "Mosquitto",
    "ceiling": "ceiling: forwarder, same window",
    "ceiling-open": "ceiling: forwarder, no window",
}
CEILINGS = ("ceiling", "ceiling-open")


def settings(d):
    out = {}
    with open(os.path.join(d, "settings.env")) as f:
        for line in f:
            m = re.match(r'(\w+)=(.*)', line.strip())
            if m:
                out[m.group(1)] = m.group(2).strip('"')
    return out


def load_runs(d):
    """{scenario: {target: {round: run}}}; run = (json dict or None, meta dict)."""
    runs = defaultdict(lambda: defaultdict(dict))
    for f in os.listdir(d):
        m = re.match(r"(.+)\.([a-z-]+)\.(\d+)\.json$", f)
        if not m:
            continue
        name, target, rnd = m.group(1), m.group(2), int(m.group(3))
        data = None
        with open(os.path.join(d, f)) as fh:
            text = fh.read().strip()
        if text:
            try:
                data = json.loads(text.splitlines()[-1])
            except ValueError:
                data = None
        meta = {}
        mf = os.path.join(d, f[: -len(".json")] + ".meta")
        if os.path.exists(mf):
            with open(mf) as fh:
                for kv in fh.read().split():
                    k, _, v = kv.partition("=")
                    meta[k] = v
        err = os.path.join(d, f[: -len(".json")] + ".err")
        if os.path.exists(err):
            with open(err) as fh:
                meta["err"] = fh.read().strip()
        runs[name][target][rnd] = (data, meta)
    return runs


def valid(run):
    data, meta = run
    return (
        data is not None
        and meta.get("rc", "0") == "0"
        and meta.get("alive", "1") == "1"
        and meta.get("logged_drops", "0") == "0"
        and data.get("loss", 1) == 0
        and data.get("dropped_subscribers", 0) == 0
    )


def num(v):
    return v if isinstance(v, (int, float)) and v == v else None  # drops NaN / null


def si(v, digits=2):
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.{digits}f} M"
    if a >= 1e4:
        return f"{v / 1e3:.{max(digits - 1, 0)}f} k"
    if a >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}g}"


def fixed(fmt):
    return lambda v: "-" if v is None else format(v, fmt)


def spread(values, fmt=si):
    """'median (min-max)' of the values, or '-'."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt(med)
    return f"{fmt(med)} ({fmt(min(values))}–{fmt(max(values))})"


def ratio_fmt(v):
    return "-" if v is None else f"{v:.2f}x"


class Scenario:
    def __init__(self, runs, targets):
        self.runs = runs  # {target: {round: run}}
        self.targets = [t for t in targets if t in runs]
        self.rounds = sorted({r for t in runs.values() for r in t})

    def value(self, target, rnd, key):
        run = self.runs.get(target, {}).get(rnd)
        if run is None or not valid(run):
            return None
        return num(run[0].get(key))

    def values(self, target, key):
        return [self.value(target, r, key) for r in self.rounds]

    def peers(self):
        return [
            t for t in self.targets if t not in RELAY + RELAY_TLS and t not in CEILINGS
        ]

    def best_peer(self, rnd, key, higher):
        """The better peer's figure in round `rnd`; None unless every peer's run of that
        round is valid (a ratio against fewer peers would flatter the relay)."""
        vals = [self.value(p, rnd, key) for p in self.peers()]
        if not vals or any(v is None for v in vals):
            return None
        return max(vals) if higher else min(vals)

    def ratios(self, target, key, higher=True):
        """Per round: target / better peer of that round."""
        out = []
        for r in self.rounds:
            v, b = self.value(target, r, key), self.best_peer(r, key, higher)
            out.append(v / b if v is not None and b else None)
        return out

    def of(self, target, other, key):
        out = []
        for r in self.rounds:
            v, b = self.value(target, r, key), self.value(other, r, key)
            out.append(v / b if v is not None and b else None)
        return out

    def invalid(self, target):
        bad = []
        for r in self.rounds:
            run = self.runs.get(target, {}).get(r)
            if run is None:
                continue
            if not valid(run):
                data, meta = run
                why = []
                if data is None:
                    why.append("no result")
                else:
                    if data.get("loss"):
                        why.append(f"lost {data['loss']} deliveries")
                    if data.get("dropped_subscribers"):
                        why.append(f"{data['dropped_subscribers']} subscribers dropped")
                    if data.get("publish_errors"):
                        why.append(f"{data['publish_errors']} publish errors")
                if meta.get("alive") == "0":
                    why.append("server died")
                if meta.get("logged_drops", "0") != "0":
                    why.append(f"server logged {meta['logged_drops']} slow-consumer closes")
                if not why:
                    why.append(f"exit {meta.get('rc')}: {meta.get('err', '')[:80]}")
                bad.append(f"#{r}: " + ", ".join(why))
        total = len(self.runs.get(target, {}))
        if not bad:
            return f"0/{total}"
        return f"**{len(bad)}/{total}** ({'; '.join(bad)})"


def first(sc, key):
    for t in sc.targets:
        for r in sc.rounds:
            run = sc.runs[t].get(r)
            if run and run[0] and key in run[0]:
                return run[0][key]
    return None


def fanout_table(sc, n, st):
    events = first(sc, "events")
    print()
    print(
        f"### Fan-out: {n} subscribers, {events} Events × {st['SIZE']} B, "
        f"batch {st['BATCH']}, window {st['WINDOW']}"
    )
    print()
    print(
        "| server | deliveries/s | vs better peer | of open-loop ceiling | deliveries per server CPU-s "
        "| vs better peer | write syscalls per delivery | server core busy | load core busy "
        "| peak RSS MiB | run s | invalid runs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for t in sc.targets:
        print(
            "| "
            + " | ".join(
                [
                    NAMES.get(t, t),
                    spread(sc.values(t, "deliveries_per_s")),
                    spread(sc.ratios(t, "deliveries_per_s"), ratio_fmt),
                    spread(sc.of(t, "ceiling-open", "deliveries_per_s"), ratio_fmt),
                    spread(sc.values(t, "deliveries_per_server_cpu_s")),
                    spread(sc.ratios(t, "deliveries_per_server_cpu_s"), ratio_fmt),
                    spread(sc.values(t, "write_syscalls_per_delivery"), fixed(".4f")),
                    spread(sc.values(t, "server_busy"), fixed(".2f")),
                    spread(sc.values(t, "client_busy"), fixed(".2f")),
                    spread(sc.values(t, "server_peak_rss_mib"), fixed(".1f")),
                    spread(sc.values(t, "seconds"), fixed(".2f")),
                    sc.invalid(t),
                ]
            )
            + " |"
        )


def tls_table(sc, n, st):
    events = first(sc, "events")
    print()
    print(
        f"### Fan-out over TLS: {n} subscribers, {events} Events × {st['SIZE']} B, "
        f"batch {st['BATCH']}, window {st['WINDOW']}"
    )
    print()
    print(
        "| server | TLS | deliveries/s | vs better TLS peer | deliveries per server CPU-s "
        "| vs better TLS peer | TLS ÷ plaintext, per server CPU-s | server core busy "
        "| load CPU-s | load core busy | peak RSS MiB | vs Redis-TLS RSS | run s | invalid runs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for t in sc.targets:
        tls = first(Scenario({t: sc.runs[t]}, [t]), "tls") or "plaintext"
        plain = PLAIN_OF.get(t)
        print(
            "| "
            + " | ".join(
                [
                    NAMES.get(t, t),
                    f"`{tls}`" if tls != "plaintext" else tls,
                    spread(sc.values(t, "deliveries_per_s")),
                    spread(sc.ratios(t, "deliveries_per_s"), ratio_fmt),
                    spread(sc.values(t, "deliveries_per_server_cpu_s")),
                    spread(sc.ratios(t, "deliveries_per_server_cpu_s"), ratio_fmt),
                    spread(sc.of(t, plain, "deliveries_per_server_cpu_s"), ratio_fmt)
                    if plain
                    else "-",
                    spread(sc.values(t, "server_busy"), fixed(".2f")),
                    spread(sc.values(t, "client_cpu_s"), fixed(".2f")),
                    spread(sc.values(t, "client_busy"), fixed(".2f")),
                    spread(sc.values(t, "server_peak_rss_mib"), fixed(".1f")),
                    spread(sc.of(t, "redis-tls", "server_peak_rss_mib"), ratio_fmt),
                    spread(sc.values(t, "seconds"), fixed(".2f")),
                    sc.invalid(t),
                ]
            )
            + " |"
        )


def latency_table(sc, rate, st):
    events = first(sc, "events")
    print()
    print(
        f"### Latency: {st['LAT_SUBS']} subscribers, {rate} Events/s, {events} Events × "
        f"{st['SIZE']} B, batch 1, no window"
    )
    print()
    print(
        "| server | p50 µs | p99 µs | p99 vs better peer (lower is better) | max µs "
        "| Events/s reached | server CPU s | invalid runs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    f1 = fixed(".0f")
    for t in sc.targets:
        print(
            "| "
            + " | ".join(
                [
                    NAMES.get(t, t),
                    spread(sc.values(t, "p50_us"), f1),
                    spread(sc.values(t, "p99_us"), f1),
                    spread(sc.ratios(t, "p99_us", higher=False), ratio_fmt),
                    spread(sc.values(t, "max_us"), f1),
                    spread(sc.values(t, "events_per_s"), f1),
                    spread(sc.values(t, "server_cpu_s"), fixed(".2f")),
                    sc.invalid(t),
                ]
            )
            + " |"
        )


def ingest_table(sc, st):
    print()
    print(f"### Ingest, no subscriber: {first(sc, 'events')} Events × {st['SIZE']} B, batch 1000")
    print()
    print("| server | Events/s | vs better peer | Events per server CPU-s | invalid runs |")
    print("|---|---|---|---|---|")
    for t in sc.targets:
        print(
            f"| {NAMES.get(t, t)} | {spread(sc.values(t, 'events_per_s'))} "
            f"| {spread(sc.ratios(t, 'events_per_s'), ratio_fmt)} "
            f"| {spread(sc.values(t, 'events_per_server_cpu_s'))} | {sc.invalid(t)} |"
        )


def pipe_table(sc, arg, st):
    """Admission and forwarding to one subscriber with a pipelining publisher: per server
    CPU-second against Redis and against NATS, ratios per round."""
    batch, _, size = arg.partition("-")
    print()
    print(
        f"### Ingest with one subscriber, pipelined: {first(sc, 'events')} Events × {size} B, "
        f"batch {batch}, window {st.get('PIPE_WINDOW')}"
    )
    print()
    print(
        "| server | Events/s | Events per server CPU-s | per CPU-s vs Redis | per CPU-s vs NATS "
        "| load core busy | invalid runs |"
    )
    print("|---|---|---|---|---|---|---|")
    key = "events_per_server_cpu_s"
    for t in sc.targets:
        vs = []
        for peer in ("redis", "nats"):
            vs.append(spread(sc.of(t, peer, key), ratio_fmt) if peer in sc.targets and t != peer else "-")
        print(
            f"| {NAMES.get(t, t)} | {spread(sc.values(t, 'events_per_s'))} "
            f"| {spread(sc.values(t, key))} | {vs[0]} | {vs[1]} "
            f"| {spread(sc.values(t, 'client_busy'), fixed('.2f'))} | {sc.invalid(t)} |"
        )


def idle_table(sc, n):
    print()
    print(f"### Idle: {n} subscribers connected and subscribed, nothing published")
    print()
    print("| server | server RSS MiB | bytes per subscriber | connect s |")
    print("|---|---|---|---|")
    for t in sc.targets:
        run = sc.runs[t].get(1)
        if not run or not run[0]:
            print(f"| {NAMES.get(t, t)} | failed | | |")
            continue
        d = run[0]
        print(
            f"| {NAMES.get(t, t)} | {d.get('server_rss_mib')} | "
            f"{d.get('server_bytes_per_subscriber')} | {d.get('connect_s')} |"
        )


def summary(fan, lat, st):
    """Relay vs the better peer on each headline figure (ratios only, no verdict)."""
    rows = []
    for n, sc in fan:
        for t in (x for x in RELAY if x in sc.targets):
            rows.append(
                (
                    f"{NAMES[t]}, deliveries/s, {n} subscribers",
                    spread(sc.ratios(t, "deliveries_per_s"), ratio_fmt),
                )
            )
            rows.append(
                (
                    f"{NAMES[t]}, deliveries per server CPU-s, {n} subscribers",
                    spread(sc.ratios(t, "deliveries_per_server_cpu_s"), ratio_fmt),
                )
            )
    for rate, sc in lat:
        for t in (x for x in RELAY if x in sc.targets):
            rows.append(
                (
                    f"{NAMES[t]}, p99 at {rate} Events/s (lower is better)",
                    spread(sc.ratios(t, "p99_us", higher=False), ratio_fmt),
                )
            )
    for n, sc in fan:
        if str(n) != str(max(int(x) for x, _ in fan)) or "redis" not in sc.targets:
            continue
        for t in (x for x in RELAY if x in sc.targets):
            rows.append(
                (
                    f"{NAMES[t]}, peak RSS at {n} subscribers vs Redis (lower is better)",
                    spread(sc.of(t, "redis", "server_peak_rss_mib"), ratio_fmt),
                )
            )
    if not rows:
        return
    print()
    print("### Relay vs the better peer (median of the per-round ratios, min–max)")
    print()
    print("| figure | ratio |")
    print("|---|---|")
    for a, b in rows:
        print(f"| {a} | {b} |")


def main():
    d = sys.argv[1]
    st = settings(d)
    runs = load_runs(d)
    targets = st["TARGETS"].split() + list(CEILINGS)
    versions = ", ".join(
        f"{name} {st[k]}"
        for name, k in (("Redis", "REDIS_VERSION"), ("NATS", "NATS_VERSION"), ("Mosquitto", "MOSQUITTO_VERSION"))
        if st.get(k) and name.lower() in st["TARGETS"].replace("mqtt", "mosquitto")
    )
    print(
        f"## `benches/compare.sh` at {st.get('COMMIT')}, {st.get('DATE')}: "
        f"{st.get('REPEAT')} interleaved round(s)"
    )
    print()
    print(
        f"{st.get('CORES')} cores ({st.get('CPU')}), Linux {st.get('KERNEL')}; {versions}. "
        f"Server on CPU {st['SERVER_CPU']}, load on CPU {st['LOAD_CPU']}; load average "
        f"{st.get('LOAD_START')} at the start, {st.get('LOAD_END')} at the end; "
        f"{int(st.get('ELAPSED_S', 0)) // 60} min {int(st.get('ELAPSED_S', 0)) % 60} s in all."
    )
    loads = [float(st.get(k, "0").split()[0] or 0) for k in ("LOAD_START", "LOAD_END")]
    if max(loads) > 2.5:
        print()
        print(
            f"**The machine was busy** (1-min load average up to {max(loads):.1f} on "
            f"{st.get('CORES')} cores, the benchmark itself accounting for about 2): other "
            "processes took CPU from the server and the load tool, as the core-busy "
            "columns below show. Compare within a round, not with other runs."
        )
    print()
    print(
        "Figures are medians over the valid rounds (min–max in brackets). \"vs better peer\" "
        "divides by the better of the peers (" + ", ".join(
            NAMES[t] for t in st["TARGETS"].split() if t not in RELAY and t in NAMES
        ) + ") in the same round, then takes the median of those ratios. Deliveries/s is "
        "subscribers × Events ÷ the time from the first publish to the last delivery. "
        "\"Server/load core busy\" is CPU seconds ÷ that time (1.00: the core was saturated). "
        "The ceiling rows are `aep-load --serve` on the server core, a forwarder that writes "
        "each chunk it reads to every subscriber (non-blocking, one chunk in flight) and does "
        "no other work, under the same window and with none (TCP flow control only): the most this "
        "load tool absorbs here. A server near the open-loop ceiling is limited by the load "
        "tool, not by itself; both cores well below 1.00 busy means other processes had them. "
        "Write syscalls are `write`, `writev`, `sendmsg` and "
        "`sendto` counted by `perf stat` on their tracepoints during the fan-out only "
        "(tracing costs each syscall a little, for every server alike). A run that lost an "
        "Event or a subscriber is invalid and left out."
    )
    fan, lat, tls = [], [], []
    for name in sorted(runs, key=lambda k: (k.split(".")[0], int(k.split(".")[1]) if k.split(".")[1].isdigit() else 0)):
        kind, _, arg = name.partition(".")
        sc = Scenario(runs[name], targets)
        if kind == "fanout":
            fan.append((arg, sc))
        elif kind == "latency":
            lat.append((arg, sc))
        elif kind == "tls":
            tls.append((arg, Scenario(runs[name], st.get("TLS_TARGETS", "").split())))
    fan.sort(key=lambda x: int(x[0]))
    lat.sort(key=lambda x: int(x[0]))
    for n, sc in fan:
        fanout_table(sc, n, st)
    for rate, sc in lat:
        latency_table(sc, rate, st)
    tls.sort(key=lambda x: int(x[0]))
    for n, sc in tls:
        tls_table(sc, n, st)
    for name in runs:
        kind, _, arg = name.partition(".")
        if kind == "ingest":
            ingest_table(Scenario(runs[name], targets), st)
        elif kind == "idle":
            idle_table(Scenario(runs[name], targets), arg)
    pipes = [name for name in runs if name.startswith("pipe.")]
    pipes.sort(key=lambda k: (int(k.split(".")[1].split("-")[1]), -int(k.split(".")[1].split("-")[0])))
    for name in pipes:
        pipe_table(Scenario(runs[name], targets), name.split(".", 1)[1], st)
    summary(fan, lat, st)


if __name__ == "__main__":
    main()
