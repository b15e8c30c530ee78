"""`mink get TOPIC KEY`: the latest value of a key of a compacted topic, from the KV tablet
of its partition's leader, through that node's admin listener (/kv/..., http.py).

Prints the value (raw bytes) and exits 0; exits 1 when the key is not found (deleted or
never written), 2 when the tablet stayed loading past --timeout, the node is unreachable
or a password would cross the network in cleartext (below),
3 when the node asked could not reach the partition's leader (any node forwards a lookup
to the leader's admin listener; its id is printed), 4 when the credentials are refused
(401) or the user may not read the topic (403).

On a node with the authorizer on or a SASL listener a lookup needs a SCRAM user (HTTP
Basic; READ on the topic): `--user`, and the password from `--password`, else the
`MINK_PASSWORD` environment variable, else the terminal (never echoed).

`--admin https://HOST:PORT` speaks TLS to a node whose `admin_listener` is https://, the
node's certificate checked against `--ca-file` (else the system's CAs) and its host name. A
password is never sent over plain HTTP to another host: `--user` with an http:// (or
scheme-less) address is refused (exit 2) unless the host is a loopback address, where
nothing crosses the network."""

from __future__ import annotations

import argparse
import base64
import getpass
import ipaddress
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote

from mink.broker.config import split_admin_url


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "get", help="the latest value of a key of a compacted topic (KV tablet lookup)")
    parser.add_argument("topic")
    parser.add_argument("key", help="the key, as UTF-8 text")
    parser.add_argument("--admin", required=True, metavar="[https://]HOST:PORT",
                        help="any node's admin listener (forwarded to the leader)")
    parser.add_argument("--ca-file", metavar="PEM",
                        help="the CA an https:// admin listener's certificate is checked "
                             "against (default: the system's CAs)")
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="how long to retry while the tablet is loading (s)")
    parser.add_argument("--user", help="a SCRAM user, when the node needs credentials")
    parser.add_argument("--password", help="the user's password (else $MINK_PASSWORD, else "
                                           "asked on the terminal)")
    return parser


PASSWORD_ENV = "MINK_PASSWORD"


def _password(args: argparse.Namespace) -> str | None:
    if not args.user:
        return None
    if args.password is not None:
        return args.password
    if os.environ.get(PASSWORD_ENV) is not None:
        return os.environ[PASSWORD_ENV]
    if sys.stdin.isatty():
        return getpass.getpass(f"password for {args.user}: ")
    return sys.stdin.readline().rstrip("\n")


def _loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may be anywhere
        return False


def check_cleartext(admin: str, user: str | None) -> None:
    """ValueError when a password for `user` would cross the network in cleartext."""
    scheme, address = split_admin_url(admin)
    if user and scheme == "http" and not _loopback(address):
        raise ValueError(f"refusing to send the password of {user} over plain HTTP; use "
                         f"https://{address} (the node's admin_listener = \"https://...\"), "
                         f"with --ca-file")


def lookup(admin: str, topic: str, partition: int, key: bytes,
           timeout: float = 30.0, user: str | None = None,
           password: str | None = None, ca_file: str | None = None) -> tuple[int, dict]:
    """(HTTP status, JSON body) of the lookup, retried while the tablet loads (503). A body
    that is not JSON (a 401 or 403) comes as {"error": its text}. ValueError, before
    anything is sent, for a password that would cross the network in cleartext."""
    check_cleartext(admin, user)
    scheme, address = split_admin_url(admin)
    url = (f"{scheme}://{address}/kv/{quote(topic, safe='')}/{partition}/"
           f"{quote(key, safe='')}")
    headers = {}
    if user:
        login = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        headers["Authorization"] = f"Basic {login}"
    context = ssl.create_default_context(cafile=ca_file) if scheme == "https" else None
    deadline = time.monotonic() + timeout
    while True:
        try:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=timeout,
                                        context=context) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raw = exc.read() or b"{}"
            try:
                body = json.loads(raw)
            except ValueError:
                body = {"error": raw.decode("utf-8", "replace").strip()}
            if exc.code != 503 or time.monotonic() >= deadline:
                return exc.code, body
        time.sleep(0.2)


def run(args: argparse.Namespace) -> int:
    try:
        check_cleartext(args.admin, args.user)  # before the password is asked for
        status, body = lookup(args.admin, args.topic, args.partition,
                              args.key.encode("utf-8"), args.timeout, args.user,
                              _password(args), args.ca_file)
    except (OSError, ValueError) as exc:
        print(f"mink get: {args.admin}: {exc}", file=sys.stderr)
        return 2
    if status == 200:
        sys.stdout.buffer.write(base64.b64decode(body["value_base64"]))
        sys.stdout.buffer.write(b"\n")
        return 0
    if status in (401, 403):
        print(f"mink get: {status} {body.get('error', body)}", file=sys.stderr)
        return 4
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
