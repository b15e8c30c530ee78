"""`mink quotas`: describe and alter client quotas through any running node, with
DescribeClientQuotas and AlterClientQuotas (KIP-546), as `kafka-configs --entity-type
users|clients` does against Kafka.

    mink quotas describe [--user NAME | --user-default] [--client-id NAME | --client-id-default]
    mink quotas alter (--user NAME | --user-default) and/or (--client-id ...) \
        [--add-config producer_byte_rate=1048576,request_percentage=50] \
        [--delete-config consumer_byte_rate] [--validate-only]
"""

from __future__ import annotations

import argparse

from kio.schema.errors import ErrorCode

from mink.cli.topics import (
    DEFAULT_BOOTSTRAP,
    CliError,
    _failure,
    run_admin_command,
    security_flag,
)
from mink.client import BlockingKafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build, nested

MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


# -- request bodies (also used by the tests) ---------------------------------------------------

def describe_body(schema, components: list[tuple[str, int, str | None]], strict: bool = False):
    component = nested(schema, "ComponentData")
    return build(schema, strict=strict, components=tuple(
        component(entity_type=t, match_type=m, match=n) for t, m, n in components))


def alter_body(schema, entries: list[tuple[list[tuple[str, str | None]],
                                           list[tuple[str, float, bool]]]],
               validate_only: bool = False):
    """entries: ([(entity type, name or None for the default)], [(key, value, remove)])."""
    entry = nested(schema, "EntryData")
    entity = nested(schema, "EntityData")
    op = nested(schema, "OpData")
    return build(schema, validate_only=validate_only, entries=tuple(
        entry(entity=tuple(entity(entity_type=t, entity_name=n) for t, n in parts),
              ops=tuple(op(key=k, value=float(v), remove=r) for k, v, r in ops))
        for parts, ops in entries))


# -- the commands ------------------------------------------------------------------------------

def _entity(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    parts: list[tuple[str, str | None]] = []
    if args.user is not None or args.user_default:
        parts.append(("user", None if args.user_default else args.user))
    if args.client_id is not None or args.client_id_default:
        parts.append(("client-id", None if args.client_id_default else args.client_id))
    return parts


def _label(entity) -> str:
    return " ".join(f"{e.entity_type}={'<default>' if e.entity_name is None else e.entity_name}"
                    for e in entity)


def describe(conn: BlockingKafkaClient, args: argparse.Namespace) -> int:
    components = [(t, MATCH_DEFAULT if n is None else MATCH_EXACT, n)
                  for t, n in _entity(args)]
    response = conn.request(ApiKey.DESCRIBE_CLIENT_QUOTAS,
                            lambda schema: describe_body(schema, components))
    if response.error_code != ErrorCode.none:
        raise CliError(f"cannot describe quotas: "
                       f"{_failure(response.error_code, response.error_message)}")
    entries = response.entries or ()
    if not entries:
        print("No quotas.")
    for entry in entries:
        values = ", ".join(f"{v.key}={_number(v.value)}" for v in entry.values)
        print(f"{_label(entry.entity)}: {values}")
    return 0


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _parse_add(text: str) -> list[tuple[str, float, bool]]:
    ops = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--add-config: expected KEY=VALUE, got {item!r}")
        try:
            ops.append((key.strip(), float(value), False))
        except ValueError:
            raise CliError(f"--add-config: {key.strip()} must be a number, got {value!r}") \
                from None
    return ops


def alter(conn: BlockingKafkaClient, args: argparse.Namespace) -> int:
    parts = _entity(args)
    if not parts:
        raise CliError("name an entity: --user, --user-default, --client-id or "
                       "--client-id-default")
    ops = _parse_add(args.add_config or "")
    ops += [(k.strip(), 0.0, True) for k in (args.delete_config or "").split(",") if k.strip()]
    if not ops:
        raise CliError("nothing to change: give --add-config and/or --delete-config")
    response = conn.request(ApiKey.ALTER_CLIENT_QUOTAS,
                            lambda schema: alter_body(schema, [(parts, ops)],
                                                      args.validate_only))
    for entry in response.entries:
        if entry.error_code != ErrorCode.none:
            raise CliError(f"cannot alter quotas of {_label(entry.entity)}: "
                           f"{_failure(entry.error_code, entry.error_message)}")
        verb = "Validated" if args.validate_only else "Altered"
        print(f"{verb} quotas of {_label(entry.entity)}.")
    return 0


COMMANDS = {"describe": describe, "alter": alter}


def add_parser(commands) -> argparse.ArgumentParser:
    quotas = commands.add_parser(
        "quotas", help="describe or alter client quotas (users, client ids) through a node")
    actions = quotas.add_subparsers(dest="quotas_command", required=True)

    def flags(parser: argparse.ArgumentParser) -> None:
        user = parser.add_mutually_exclusive_group()
        user.add_argument("--user", metavar="NAME", help="a user (principal name)")
        user.add_argument("--user-default", action="store_true", help="the default user")
        client = parser.add_mutually_exclusive_group()
        client.add_argument("--client-id", metavar="ID", help="a client id")
        client.add_argument("--client-id-default", action="store_true",
                            help="the default client id")
        parser.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP,
                            metavar="HOST:PORT",
                            help=f"any node of the cluster (default {DEFAULT_BOOTSTRAP})")
        parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                            help="how long to wait for the node (default 30)")
        security_flag(parser)

    describe_parser = actions.add_parser(
        "describe", help="the quotas of an entity (default: every entity)")
    flags(describe_parser)
    alter_parser = actions.add_parser("alter", help="set or remove quotas of an entity")
    flags(alter_parser)
    alter_parser.add_argument(
        "--add-config", metavar="K=V,...",
        help="producer_byte_rate, consumer_byte_rate (bytes/s), request_percentage (%% of "
             "one event loop), controller_mutation_rate")
    alter_parser.add_argument("--delete-config", metavar="K,...", help="keys to remove")
    alter_parser.add_argument("--validate-only", action="store_true",
                              help="check the change without making it")
    return quotas


def run(args: argparse.Namespace) -> int:
    return run_admin_command(args, "quotas", COMMANDS[args.quotas_command])
