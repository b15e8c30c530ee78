"""`mink acls`: list, add and remove ACLs through any running node, with DescribeAcls,
CreateAcls and DeleteAcls (APIs 29-31), as `kafka-acls.sh --list|--add|--remove` does
against Kafka (its flag names, fewer of them).

    mink acls list [--topic T | --group G | --cluster | --transactional-id ID]
                   [--resource-pattern-type any|match|literal|prefixed] [--principal P]
    mink acls add (--allow-principal P | --deny-principal P)... --operation OP...
                  (--topic T | --group G | --cluster | --transactional-id ID)
                  [--resource-pattern-type literal|prefixed] [--host H]
    mink acls remove [the same flags, each one narrowing what is removed]

The node must have its authorizer on (`authorizer_enabled`), and the user of
`--command-config` needs ALTER (add, remove) or DESCRIBE (list) on the cluster.
"""

from __future__ import annotations

import argparse
import sys

from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from mink.broker.security.acls import (
    CLUSTER_NAME,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from mink.broker.security.operations import AclOperation
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

OPERATIONS = [op.name for op in AclOperation if op not in (AclOperation.UNKNOWN,
                                                           AclOperation.ANY)]

# -- request bodies (also used by the tests) ---------------------------------------------------


def creation_body(schema, bindings: list[tuple[int, str, int, str, str, int, int]]):
    """bindings: (resource type, name, pattern type, principal, host, operation,
    permission)."""
    creation = nested(schema, "AclCreation")
    return build(schema, creations=tuple(
        creation(resource_type=i8(t), resource_name=n, resource_pattern_type=i8(p),
                 principal=who, host=host, operation=i8(op), permission_type=i8(perm))
        for t, n, p, who, host, op, perm in bindings))


def _filter_fields(f: tuple) -> dict:
    t, n, p, who, host, op, perm = f
    return dict(resource_type_filter=i8(t), resource_name_filter=n, pattern_type_filter=i8(p),
                principal_filter=who, host_filter=host, operation=i8(op),
                permission_type=i8(perm))


def describe_body(schema, f: tuple):
    return build(schema, **_filter_fields(f))


def deletion_body(schema, filters: list[tuple]):
    entry = nested(schema, "DeleteAclsFilter")
    return build(schema, filters=tuple(entry(**_filter_fields(f)) for f in filters))


# -- the commands ------------------------------------------------------------------------------

def _resource(args, *, required: bool) -> tuple[int, str | None]:
    if args.topic is not None:
        return ResourceType.TOPIC, args.topic
    if args.group is not None:
        return ResourceType.GROUP, args.group
    if args.cluster:
        return ResourceType.CLUSTER, CLUSTER_NAME
    if args.transactional_id is not None:
        return ResourceType.TRANSACTIONAL_ID, args.transactional_id
    if required:
        raise CliError("name a resource: --topic, --group, --cluster or --transactional-id")
    return ResourceType.ANY, None


def _pattern(args, default: PatternType) -> int:
    if args.resource_pattern_type is None:
        return default
    return PatternType[args.resource_pattern_type.upper()]


def _principals(args) -> list[tuple[str | None, int]]:
    """(principal, permission) pairs of --allow-principal and --deny-principal."""
    return ([(p, AclPermissionType.ALLOW) for p in args.allow_principal or ()]
            + [(p, AclPermissionType.DENY) for p in args.deny_principal or ()])


def _operations(args) -> list[int]:
    return [AclOperation[op.upper()] for op in args.operation or ()]


def _line(resource_type, name, pattern, principal, host, operation, permission) -> str:
    return (f"{ResourceType(resource_type).name}:{PatternType(pattern).name}:{name} "
            f"{principal} from {host} {AclPermissionType(permission).name} "
            f"{AclOperation(operation).name}")


def list_acls(conn: BlockingKafkaClient, args: argparse.Namespace) -> int:
    resource_type, name = _resource(args, required=False)
    pattern = _pattern(args, PatternType.ANY if name is None else PatternType.LITERAL)
    response = conn.request(ApiKey.DESCRIBE_ACLS, lambda schema: describe_body(schema, (
        resource_type, name, pattern, args.principal, None, AclOperation.ANY,
        AclPermissionType.ANY)))
    if response.error_code != ErrorCode.none:
        raise CliError(f"cannot list ACLs: "
                       f"{_failure(response.error_code, response.error_message)}")
    lines = sorted(_line(r.resource_type, r.resource_name, r.pattern_type, a.principal,
                         a.host, a.operation, a.permission_type)
                   for r in response.resources for a in r.acls)
    print("\n".join(lines) if lines else "No ACLs.")
    return 0


def add(conn: BlockingKafkaClient, args: argparse.Namespace) -> int:
    resource_type, name = _resource(args, required=True)
    pattern = _pattern(args, PatternType.LITERAL)
    principals, operations = _principals(args), _operations(args)
    if not principals or not operations:
        raise CliError("give --allow-principal or --deny-principal, and --operation")
    bindings = [(resource_type, name, pattern, who, args.host or "*", op, perm)
                for who, perm in principals for op in operations]
    response = conn.request(ApiKey.CREATE_ACLS,
                            lambda schema: creation_body(schema, bindings))
    failed = 0
    for binding, result in zip(bindings, response.results):
        if result.error_code != ErrorCode.none:
            failed += 1
            print(f"mink acls: cannot add {_line(*binding)}: "
                  f"{_failure(result.error_code, result.error_message)}", file=sys.stderr)
        else:
            print(f"Added {_line(*binding)}")
    return 1 if failed else 0


def remove(conn: BlockingKafkaClient, args: argparse.Namespace) -> int:
    resource_type, name = _resource(args, required=False)
    pattern = _pattern(args, PatternType.ANY if name is None else PatternType.LITERAL)
    principals = _principals(args) or [(None, AclPermissionType.ANY)]
    operations = _operations(args) or [AclOperation.ANY]
    filters = [(resource_type, name, pattern, who, args.host, op, perm)
               for who, perm in principals for op in operations]
    response = conn.request(ApiKey.DELETE_ACLS, lambda schema: deletion_body(schema, filters))
    failed = removed = 0
    for result in response.filter_results:
        if result.error_code != ErrorCode.none:
            failed += 1
            print(f"mink acls: cannot remove: "
                  f"{_failure(result.error_code, result.error_message)}", file=sys.stderr)
            continue
        for a in result.matching_acls:
            removed += 1
            print("Removed " + _line(a.resource_type, a.resource_name, a.pattern_type,
                                     a.principal, a.host, a.operation, a.permission_type))
    if not failed and not removed:
        print("No ACLs matched.")
    return 1 if failed else 0


COMMANDS = {"list": list_acls, "add": add, "remove": remove}


def add_parser(commands) -> argparse.ArgumentParser:
    acls = commands.add_parser("acls", help="list, add or remove ACLs through a node")
    actions = acls.add_subparsers(dest="acls_command", required=True)

    def flags(parser: argparse.ArgumentParser, patterns: list[str]) -> None:
        resource = parser.add_mutually_exclusive_group()
        resource.add_argument("--topic", metavar="NAME")
        resource.add_argument("--group", metavar="NAME")
        resource.add_argument("--cluster", action="store_true")
        resource.add_argument("--transactional-id", metavar="ID")
        parser.add_argument("--resource-pattern-type", choices=patterns,
                            help="how the resource name matches (default literal; any "
                                 "when listing or removing without a resource)")
        parser.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP,
                            metavar="HOST:PORT",
                            help=f"any node of the cluster (default {DEFAULT_BOOTSTRAP})")
        parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                            help="how long to wait for the node (default 30)")
        security_flag(parser)

    def binding_flags(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--allow-principal", action="append", metavar="TYPE:NAME")
        parser.add_argument("--deny-principal", action="append", metavar="TYPE:NAME")
        parser.add_argument("--operation", action="append", metavar="OP",
                            type=str.upper, choices=OPERATIONS,
                            help="one of " + ", ".join(OPERATIONS))
        parser.add_argument("--host", metavar="ADDRESS",
                            help="the client address the ACL applies to (default *)")

    listing = actions.add_parser("list", help="the ACLs (of a resource, of a principal)")
    flags(listing, ["any", "match", "literal", "prefixed"])
    listing.add_argument("--principal", metavar="TYPE:NAME")
    adding = actions.add_parser("add", help="add ACLs: each principal gets each operation")
    flags(adding, ["literal", "prefixed"])
    binding_flags(adding)
    removing = actions.add_parser("remove", help="remove the ACLs the flags match")
    flags(removing, ["any", "match", "literal", "prefixed"])
    binding_flags(removing)
    return acls


def run(args: argparse.Namespace) -> int:
    return run_admin_command(args, "acls", COMMANDS[args.acls_command])
