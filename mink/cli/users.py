"""`mink users`: SCRAM users (KIP-554) written straight into the PostgreSQL every node
shares, so the first user of a cluster whose listeners all require SASL can be made before
any client can connect (Kafka's `kafka-storage format --add-scram` plays that part). Admin
clients manage users through a node as well (AlterUserScramCredentials,
DescribeUserScramCredentials).

    mink users add NAME [--password-file FILE] [--mechanism SCRAM-SHA-512] [--iterations 8192]
    mink users delete NAME [--mechanism SCRAM-SHA-512]
    mink users list [--json]

Without --password-file the password is read from the terminal (or one line of stdin). PLAIN
logins are checked against the same credentials.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys

import trio
import trio_asyncio

from mink.broker.config import load_config
from mink.protocol.scram import MECHANISMS, new_credential
from mink.storage.controlplane import MetadataStore, MetadataUnavailable
from mink.storage.controlplane.security import (
    delete_credential,
    described_credentials,
    upsert_credential,
)

BOTH = "both"


def add_parser(commands) -> None:
    users = commands.add_parser("users", help="SCRAM users (SASL PLAIN and SCRAM logins)")
    actions = users.add_subparsers(dest="users_command", required=True)
    for name, help_text in (("add", "create a user or change its password"),
                            ("delete", "remove a user's credentials"),
                            ("list", "users and their mechanisms")):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("--postgres-url", metavar="URL")
        action.add_argument("--config", metavar="FILE")
        if name != "list":
            action.add_argument("name")
            action.add_argument("--mechanism", default=BOTH,
                                choices=[*MECHANISMS, BOTH],
                                help="SCRAM-SHA-256, SCRAM-SHA-512 or both (the default)")
        if name == "add":
            action.add_argument("--password-file", metavar="FILE",
                                help="read the password from this file's first line")
            action.add_argument("--iterations", type=int, default=8192)
        if name == "list":
            action.add_argument("--json", action="store_true")


def _password(args: argparse.Namespace) -> str:
    if args.password_file:
        with open(args.password_file, encoding="utf-8") as f:
            return f.readline().rstrip("\r\n")
    if sys.stdin.isatty():
        first = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != first:
            raise SystemExit("mink users: the passwords differ")
        return first
    return sys.stdin.readline().rstrip("\r\n")


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, overrides={"postgres_url": args.postgres_url})
    if not config.postgres_url:
        print("mink users: --postgres-url (or MINK_POSTGRES_URL) is required", file=sys.stderr)
        return 2
    rows = []
    if args.users_command == "add":
        mechanism = MECHANISMS.get(args.mechanism)
        lowest = 4096
        if not (lowest <= args.iterations <= 16384):
            print("mink users: --iterations must be between 4096 and 16384", file=sys.stderr)
            return 2
        password = _password(args)
        if not password:
            print("mink users: an empty password is not accepted", file=sys.stderr)
            return 2
        for m in ([mechanism] if mechanism else MECHANISMS.values()):
            c = new_credential(m, password, args.iterations)  # PBKDF2, before trio starts
            rows.append((args.name, m.name, c.salt, c.stored_key, c.server_key, c.iterations))
    try:
        return trio.run(_run, args, config.postgres_url, rows)
    except MetadataUnavailable as exc:
        print(f"mink users: PostgreSQL unavailable: {exc}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace, url: str, rows: list) -> int:
    async with trio_asyncio.open_loop():
        store = await MetadataStore.open(url, migrate=False)
        try:
            if args.users_command == "add":
                for row in rows:
                    await upsert_credential(store, row)
                print(f"user {args.name}: {', '.join(r[1] for r in rows)}")
                return 0
            if args.users_command == "delete":
                names = [args.mechanism] if args.mechanism != BOTH else list(MECHANISMS)
                deleted = [n for n in names if await delete_credential(store, args.name, n)]
                if not deleted:
                    print(f"mink users: {args.name} has no such credential", file=sys.stderr)
                    return 1
                print(f"user {args.name}: removed {', '.join(deleted)}")
                return 0
            users: dict[str, list] = {}
            for user, mechanism, iterations in await described_credentials(store):
                users.setdefault(user, []).append({"mechanism": mechanism,
                                                   "iterations": iterations})
            if args.json:
                print(json.dumps(users, indent=2))
            else:
                for user, infos in users.items():
                    print(user, " ".join(f"{i['mechanism']}({i['iterations']})" for i in infos))
            return 0
        finally:
            await store.aclose()
