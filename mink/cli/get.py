"""`mink get TOPIC KEY`: the latest value of a key of a compacted topic, from the KV tablet
of its partition's leader, through that node's admin listener (/kv/..., http.py).

Prints the value (raw bytes) and exits 0; exits 1 when the key is not found (deleted or
never written), 2 when the tablet stayed loading past --timeout or the node is unreachable,
3 when the node asked could not reach the partition's leader (any node forwards a lookup
to the leader's admin listener; its id is printed)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "get", help="the latest value of a key of a compacted topic (KV tablet lookup)")
    parser.add_argument("topic")
    parser.add_argument("key", help="the key, as UTF-8 text")
    parser.add_argument("--admin", required=True, metavar="HOST:PORT",
                        help="any node's admin listener (forwarded to the leader)")
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="how long to retry while the tablet is loading (s)")
    return parser


def lookup(admin: str, topic: str, partition: int, key: bytes,
           timeout: float = 30.0) -> tuple[int, dict]:
    """(HTTP status, JSON body) of the lookup, retried while the tablet loads (503)."""
    url = (f"http://{admin}/kv/{quote(topic, safe='')}/{partition}/"
           f"{quote(key, safe='')}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
            if exc.code != 503 or time.monotonic() >= deadline:
                return exc.code, body
        time.sleep(0.2)


def run(args: argparse.Namespace) -> int:
    try:
        status, body = lookup(args.admin, args.topic, args.partition,
                              args.key.encode("utf-8"), args.timeout)
    except (OSError, ValueError) as exc:
        print(f"mink get: {args.admin}: {exc}", file=sys.stderr)
        return 2
    if status == 200:
        import base64

        sys.stdout.buffer.write(base64.b64decode(body["value_base64"]))
        sys.stdout.buffer.write(b"\n")
        return 0
    if status == 404:
        print(f"mink get: {args.key!r} not found in {args.topic}-{args.partition}",
              file=sys.stderr)
        return 1
    if status == 421:
        print(f"mink get: node does not lead {args.topic}-{args.partition}; its leader is "
              f"node {body.get('leader')}", file=sys.stderr)
        return 3
    print(f"mink get: {status} {body}", file=sys.stderr)
    return 2
