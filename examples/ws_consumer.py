"""A WebSocket consumer of aep-relay with the `websockets` package (pip install websockets):
hello, one subscription, then each Event printed as one line, exactly as it was emitted.

    python3 examples/ws_consumer.py ws://127.0.0.1:8787/socket \\
        --filter '{"type":"tool.*"}' --from all --count 3

--filter is an attr-match filter (AEP-0003 §6), --from `all` or a JSON array of
positions ([{"session":"s","epoch":0,"seq":3}]) to replay before live Events, --capture a
ceiling, --count stops after that many Events (default: run until interrupted), --token a
bearer token (a relay with AEP_TOKEN). docs/consuming.md describes every frame.
"""

import argparse
import json

from websockets.sync.client import connect


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url", help="the relay's /socket, ws:// or wss://")
    ap.add_argument("--filter", default="{}", help="attr-match filter (JSON)")
    ap.add_argument("--from", dest="from_", help="`all` or a JSON array of positions")
    ap.add_argument("--capture", help="capture ceiling: none, metadata, redacted, full")
    ap.add_argument("--count", type=int, help="stop after this many Events")
    ap.add_argument("--token", help="bearer token")
    args = ap.parse_args()

    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    with connect(args.url, additional_headers=headers) as ws:
        # The first frame each way is `hello` (AEP-0003 §4).
        ws.send(json.dumps({"type": "hello", "versions": ["0.1"], "role": "consumer"}))
        hello = json.loads(ws.recv())
        if hello.get("type") != "hello":
            raise SystemExit(f"refused: {hello}")

        sub = {"type": "subscribe", "id": "s1", "filter": json.loads(args.filter)}
        if args.from_:
            sub["from"] = args.from_ if args.from_ == "all" else json.loads(args.from_)
        if args.capture:
            sub["capture"] = args.capture
        ws.send(json.dumps(sub))

        printed = 0
        while args.count is None or printed < args.count:
            text = ws.recv()
            frame = json.loads(text)
            kind = frame.get("type", "")
            if "." in kind:  # an Event (a type with a dot): its bytes as the emitter sent them
                print(text, flush=True)
                printed += 1
            elif kind == "ping":
                ws.send(json.dumps({"type": "pong", "t": frame.get("t")}))
            elif kind == "error":
                raise SystemExit(f"error: {text}")
            # subscribed, replay-exhausted, closing: nothing to print here


if __name__ == "__main__":
    main()
