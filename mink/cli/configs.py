"""`mink configs`: describe and alter the dynamic configs of a topic, a broker, the cluster
default of brokers, or a consumer group through any running node, with DescribeConfigs and
IncrementalAlterConfigs, as `kafka-configs --entity-type topics|brokers|groups` does against
Kafka.

    mink configs describe (--topic NAME | --broker ID | --broker-default | --group ID) [--all]
    mink configs alter (--topic NAME | --broker ID | --broker-default | --group ID) \
        [--add-config log.retention.ms=3600000,log.cleanup.policy=[delete,compact]] \
        [--delete-config K,...] [--validate-only]

A list value goes in square brackets, as with kafka-configs.
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

# Kafka's ConfigResource.Type and DescribeConfigsResponse.ConfigSource.
TOPIC, BROKER, GROUP = 2, 4, 32
SOURCES = {1: "topic", 2: "broker", 3: "cluster default", 4: "node configuration",
           5: "default", 8: "group"}
DEFAULT_SOURCE = 5
SET, DELETE = 0, 1


# -- request bodies (also used by the tests) ---------------------------------------------------

def describe_body(schema, resource_type: int, name: str):
    return build(schema, include_synonyms=False, include_documentation=False, resources=(
        nested(schema, "DescribeConfigsResource")(
            resource_type=resource_type, resource_name=name, configuration_keys=None),))


def alter_body(schema, resource_type: int, name: str,
               ops: list[tuple[str, int, str | None]], validate_only: bool = False):
    """ops: (name, operation, value); operation SET (0) or DELETE (1)."""
    config = nested(schema, "AlterableConfig")
    return build(schema, validate_only=validate_only, resources=(
        nested(schema, "AlterConfigsResource")(
            resource_type=resource_type, resource_name=name, configs=tuple(
                config(name=n, config_operation=op, value=v) for n, op, v in ops)),))


def parse_add_config(text: str) -> list[tuple[str, str]]:
    """'a=1,b=[x,y]' -> [('a', '1'), ('b', 'x,y')]: commas inside brackets belong to a list
    value, as kafka-configs reads them."""
    pairs, item, depth = [], "", 0
    for char in text + ",":
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            if item.strip():
                key, sep, value = item.strip().partition("=")
                if not sep or not key.strip():
                    raise CliError(f"--add-config: expected KEY=VALUE, got {item.strip()!r}")
                value = value.strip()
                if value.startswith("[") and value.endswith("]"):
                    value = value[1:-1]
                pairs.append((key.strip(), value))
            item = ""
        else:
            item += char
    if depth:
        raise CliError("--add-config: unbalanced brackets")
    return pairs


# -- the commands ------------------------------------------------------------------------------

def _resource(args: argparse.Namespace) -> tuple[int, str, str]:
    """(resource type, name, label) of the entity named on the command line."""
    if args.topic is not None:
        return TOPIC, args.topic, f"topic {args.topic}"
    if args.broker is not None:
        return BROKER, str(args.broker), f"broker {args.broker}"
    if args.broker_default:
        return BROKER, "", "the cluster default of brokers"
    if args.group is not None:
        return GROUP, args.group, f"group {args.group}"
    raise CliError("name an entity: --topic, --broker, --broker-default or --group")


def describe(conn: BlockingKafkaClient, args: argparse.Namespace) -> int:
    resource_type, name, label = _resource(args)
    response = conn.request(ApiKey.DESCRIBE_CONFIGS,
                            lambda schema: describe_body(schema, resource_type, name))
    (result,) = response.results
    if result.error_code != ErrorCode.none:
        raise CliError(f"cannot describe {label}: "
                       f"{_failure(result.error_code, result.error_message)}")
    shown = [c for c in result.configs
             if args.all or c.config_source != DEFAULT_SOURCE]
    if not shown:
        print(f"No configs of {label} differ from their defaults.")
    for config in shown:
        value = "" if config.value is None else config.value
        source = SOURCES.get(config.config_source, "?")
        extra = ", read-only" if config.read_only else ""
        print(f"{config.name}={value} ({source}{extra})")
    return 0


def alter(conn: BlockingKafkaClient, args: argparse.Namespace) -> int:
    resource_type, name, label = _resource(args)
    ops: list[tuple[str, int, str | None]] = [
        (k, SET, v) for k, v in parse_add_config(args.add_config or "")]
    ops += [(k.strip(), DELETE, None) for k in (args.delete_config or "").split(",")
            if k.strip()]
    if not ops:
        raise CliError("nothing to change: give --add-config and/or --delete-config")
    response = conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS,
                            lambda schema: alter_body(schema, resource_type, name, ops,
                                                      args.validate_only))
    (result,) = response.responses
    if result.error_code != ErrorCode.none:
        raise CliError(f"cannot alter {label}: "
                       f"{_failure(result.error_code, result.error_message)}")
    print(f"{'Validated' if args.validate_only else 'Altered'} the configs of {label}.")
    return 0


COMMANDS = {"describe": describe, "alter": alter}


def add_parser(commands) -> argparse.ArgumentParser:
    configs = commands.add_parser(
        "configs", help="describe or alter the configs of a topic, a broker, the brokers' "
                        "cluster default or a group through a node")
    actions = configs.add_subparsers(dest="configs_command", required=True)

    def flags(parser: argparse.ArgumentParser) -> None:
        entity = parser.add_mutually_exclusive_group(required=True)
        entity.add_argument("--topic", metavar="NAME", help="a topic")
        entity.add_argument("--broker", type=int, metavar="ID", help="one broker (node id)")
        entity.add_argument("--broker-default", action="store_true",
                            help="the cluster-wide default of every broker")
        entity.add_argument("--group", metavar="ID", help="a consumer group")
        parser.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP,
                            metavar="HOST:PORT",
                            help=f"any node of the cluster (default {DEFAULT_BOOTSTRAP})")
        parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                            help="how long to wait for the node (default 30)")
        security_flag(parser)

    describe_parser = actions.add_parser(
        "describe", help="the configs that differ from their defaults (--all: every one)")
    flags(describe_parser)
    describe_parser.add_argument("--all", action="store_true",
                                 help="every config, defaults included")
    alter_parser = actions.add_parser("alter", help="set or remove configs")
    flags(alter_parser)
    alter_parser.add_argument("--add-config", metavar="K=V,...",
                              help="configs to set; a list value in brackets: K=[a,b]")
    alter_parser.add_argument("--delete-config", metavar="K,...",
                              help="configs to remove (back to their defaults)")
    alter_parser.add_argument("--validate-only", action="store_true",
                              help="check the change without making it")
    return configs


def run(args: argparse.Namespace) -> int:
    return run_admin_command(args, "configs", COMMANDS[args.configs_command])
