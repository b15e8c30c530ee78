"""`mink topics`: create, list, describe and delete topics through any running node.

It speaks the Kafka protocol (so it works against any node of a cluster, or any Kafka
broker, and needs no PostgreSQL access): a small blocking client, requests encoded and
responses decoded with kio at the highest version both sides know.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import uuid

from kio.schema.errors import ErrorCode

from mink.broker.config import ConfigError, split_host_port
from mink.protocol.apis import ApiKey
from mink.client import BlockingKafkaClient, ClientSecurity, KafkaClientError
from mink.protocol.messages import build, nested

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
CLIENT_ID = "mink-topics"
ZERO_UUID = uuid.UUID(int=0)
DYNAMIC_TOPIC_CONFIG = 1
TOPIC_RESOURCE = 2
SOURCE_NAMES = {1: "topic", 2: "broker (dynamic)", 3: "cluster default (dynamic)",
                4: "broker", 5: "default"}


class CliError(Exception):
    """Printed as `mink topics: <message>`; the command exits with status 1."""


# -- the client --------------------------------------------------------------------------------

def command_config(path: str | None) -> ClientSecurity | None:
    """--command-config FILE: client properties (key=value lines, librdkafka's names:
    security.protocol, sasl.mechanism, sasl.username, sasl.password, ssl.ca.location,
    ssl.certificate.location, ssl.key.location), as Kafka's tools take them."""
    if path is None:
        return None
    props: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith(("#", "!")):
                    key, sep, value = line.partition("=")
                    if not sep:
                        raise CliError(f"--command-config {path}: not key=value: {line!r}")
                    props[key.strip()] = value.strip()
    except OSError as exc:
        raise CliError(f"--command-config: {exc}") from None
    return ClientSecurity.from_properties(props)


def security_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--command-config", metavar="FILE",
                        help="client properties for a secured listener (security.protocol, "
                             "sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, "
                             "ssl.certificate.location, ssl.key.location)")


def connect(bootstrap: str, timeout: float,
            security: ClientSecurity | None = None) -> BlockingKafkaClient:
    try:
        host, port = split_host_port(bootstrap)
    except ConfigError as exc:
        raise CliError(f"--bootstrap-server: {exc}") from None
    try:
        return BlockingKafkaClient(f"{host}:{port}", timeout, client_id=CLIENT_ID,
                                   security=security)
    except KafkaClientError as exc:
        hint = " (is a node running there? see --bootstrap-server)" if "cannot reach" in str(
            exc) else ""
        raise CliError(f"{exc}{hint}") from None


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"error {code}"


def _failure(code: int, message: str | None) -> str:
    return f"{_error_name(code)}: {message}" if message else _error_name(code)


# -- the commands ------------------------------------------------------------------------------

def create(conn: BlockingKafkaClient, args: argparse.Namespace) -> int:
    configs = _parse_configs(args.config or [])

    def body(schema):
        topic_schema = nested(schema, "CreatableTopic")
        config_schema = nested(schema, "CreatableTopicConfig")
        return build(schema, topics=(build(
            topic_schema, name=args.name,
            num_partitions=args.partitions if args.partitions is not None else -1,
            replication_factor=(args.replication_factor
                                if args.replication_factor is not None else -1),
            assignments=(),
            configs=tuple(config_schema(name=k, value=v) for k, v in configs.items())),),
            timeout=datetime.timedelta(seconds=args.timeout), validate_only=False)

    result = conn.request(ApiKey.CREATE_TOPICS, body).topics[0]
    if result.error_code == ErrorCode.topic_already_exists and args.if_not_exists:
        print(f"Topic {args.name} already exists.")
        return 0
    if result.error_code != ErrorCode.none:
        raise CliError(f"cannot create topic {args.name!r}: "
                       f"{_failure(result.error_code, result.error_message)}")
    partitions = getattr(result, "num_partitions", -1)
    if partitions is None or partitions < 0:
        partitions = args.partitions
    count = f" with {partitions} partition{'s' if partitions != 1 else ''}" if partitions else ""
    print(f"Created topic {args.name}{count}.")
    return 0


def delete(conn: BlockingKafkaClient, args: argparse.Namespace) -> int:
    def body(schema):
        state = getattr(sys.modules[schema.__module__], "DeleteTopicState", None)
        topics = (build(state, name=args.name, topic_id=ZERO_UUID),) if state else ()
        return build(schema, topics=topics, topic_names=(args.name,),
                     timeout=datetime.timedelta(seconds=args.timeout))

    result = conn.request(ApiKey.DELETE_TOPICS, body).responses[0]
    if result.error_code == ErrorCode.unknown_topic_or_partition and args.if_exists:
        print(f"Topic {args.name} does not exist.")
        return 0
    if result.error_code == ErrorCode.unknown_topic_or_partition:
        raise CliError(f"topic {args.name!r} does not exist")
    if result.error_code != ErrorCode.none:
        raise CliError(f"cannot delete topic {args.name!r}: "
                       f"{_failure(result.error_code, getattr(result, 'error_message', None))}")
    print(f"Deleted topic {args.name}.")
    return 0


def list_topics(conn: BlockingKafkaClient, args: argparse.Namespace) -> int:
    topics = [t for t in _metadata(conn, None).topics if t.error_code == ErrorCode.none]
    topics.sort(key=lambda t: t.name)
    if not topics:
        print("No topics.")
        return 0
    _print_table(["TOPIC", "PARTITIONS"],
                 [[t.name, str(len(t.partitions))] for t in topics])
    return 0


def describe(conn: BlockingKafkaClient, args: argparse.Namespace) -> int:
    metadata = _metadata(conn, args.names or None)
    topics = sorted(metadata.topics, key=lambda t: t.name)
    for topic in topics:
        if topic.error_code == ErrorCode.unknown_topic_or_partition:
            raise CliError(f"topic {topic.name!r} does not exist")
        if topic.error_code not in (ErrorCode.none, ErrorCode.leader_not_available):
            raise CliError(f"cannot describe topic {topic.name!r}: "
                           f"{_failure(topic.error_code, None)}")
    if not topics:
        print("No topics.")
        return 0
    configs = _describe_configs(conn, [t.name for t in topics])
    for n, topic in enumerate(topics):
        if n:
            print()
        topic_id = getattr(topic, "topic_id", None)
        id_text = f"id {topic_id}, " if topic_id not in (None, ZERO_UUID) else ""
        count = len(topic.partitions)
        print(f"Topic: {topic.name}  ({id_text}{count} partition{'s' if count != 1 else ''}, "
              f"replication factor "
              f"{max((len(p.replica_nodes) for p in topic.partitions), default=0)})")
        entries = configs.get(topic.name, [])
        if args.all_configs:
            print("Configs:")
            _print_table(["CONFIG", "VALUE", "SOURCE"],
                         [[e.name, _text(e.value), SOURCE_NAMES.get(e.config_source, "?")]
                          for e in entries], indent="  ")
        else:
            own = [f"{e.name}={_text(e.value)}" for e in entries
                   if e.config_source == DYNAMIC_TOPIC_CONFIG]
            print(f"Configs: {', '.join(own) if own else '(all defaults)'}")
        rows = []
        for p in sorted(topic.partitions, key=lambda p: p.partition_index):
            leader = str(p.leader_id) if p.leader_id >= 0 else "none"
            epoch = getattr(p, "leader_epoch", -1)
            rows.append([str(p.partition_index), leader, str(epoch) if epoch >= 0 else "-",
                         ",".join(map(str, p.replica_nodes)) or "-",
                         ",".join(map(str, p.isr_nodes)) or "-"])
        _print_table(["PARTITION", "LEADER", "LEADER EPOCH", "REPLICAS", "ISR"], rows,
                     indent="  ")
    return 0


def _metadata(conn: BlockingKafkaClient, names: list[str] | None):
    def body(schema):
        topic_schema = getattr(sys.modules[schema.__module__], "MetadataRequestTopic")
        topics = None if names is None else tuple(
            build(topic_schema, name=n, topic_id=ZERO_UUID) for n in names)
        return build(schema, topics=topics, allow_auto_topic_creation=False,
                     include_cluster_authorized_operations=False,
                     include_topic_authorized_operations=False)

    return conn.request(ApiKey.METADATA, body)


def _describe_configs(conn: BlockingKafkaClient, names: list[str]) -> dict[str, list]:
    def body(schema):
        resource_schema = nested(schema, "DescribeConfigsResource")
        return build(schema, resources=tuple(
            build(resource_schema, resource_type=TOPIC_RESOURCE, resource_name=n,
                  configuration_keys=None) for n in names),
            include_synonyms=False, include_documentation=False)

    out = {}
    for result in conn.request(ApiKey.DESCRIBE_CONFIGS, body).results:
        if result.error_code != ErrorCode.none:
            raise CliError(f"cannot describe the configs of {result.resource_name!r}: "
                           f"{_failure(result.error_code, result.error_message)}")
        out[result.resource_name] = sorted(result.configs, key=lambda e: e.name)
    return out


def _parse_configs(pairs: list[str]) -> dict[str, str]:
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--config expects KEY=VALUE, got {pair!r}")
        configs[key.strip()] = value.strip()
    return configs


def _text(value: str | None) -> str:
    return "null" if value is None else value


def _print_table(header: list[str], rows: list[list[str]], indent: str = "") -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


# -- argument parsing --------------------------------------------------------------------------

COMMANDS = {"create": create, "delete": delete, "list": list_topics, "describe": describe}


def add_parser(commands) -> argparse.ArgumentParser:
    """Add `topics` and its subcommands to the `mink` command's subparsers."""
    topics = commands.add_parser(
        "topics", help="create, list, describe or delete topics through a running node")
    actions = topics.add_subparsers(dest="topics_command", required=True)

    def connection_flags(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP,
                            metavar="HOST:PORT",
                            help=f"any node of the cluster (default {DEFAULT_BOOTSTRAP})")
        parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                            help="how long to wait for the node (default 30)")
        security_flag(parser)

    create_parser = actions.add_parser("create", help="create a topic")
    create_parser.add_argument("name")
    create_parser.add_argument("--partitions", type=int, metavar="N",
                               help="number of partitions (default: the node's num.partitions)")
    create_parser.add_argument("--replication-factor", type=int, metavar="N",
                               help="accepted for compatibility; Mink keeps one copy (1)")
    create_parser.add_argument("--config", action="append", metavar="KEY=VALUE",
                               help="a topic config, e.g. retention.ms=86400000; repeatable")
    create_parser.add_argument("--if-not-exists", action="store_true",
                               help="succeed if the topic exists already")
    connection_flags(create_parser)

    list_parser = actions.add_parser("list", help="list the topics")
    connection_flags(list_parser)

    describe_parser = actions.add_parser("describe", help="partitions, leaders and configs")
    describe_parser.add_argument("names", nargs="*", metavar="NAME",
                                 help="topics to describe (default: all)")
    describe_parser.add_argument("--all-configs", action="store_true",
                                 help="list every config with its source, not only overrides")
    connection_flags(describe_parser)

    delete_parser = actions.add_parser("delete", help="delete a topic and its data")
    delete_parser.add_argument("name")
    delete_parser.add_argument("--if-exists", action="store_true",
                               help="succeed if the topic does not exist")
    connection_flags(delete_parser)
    return topics


def run_admin_command(args: argparse.Namespace, name: str, command) -> int:
    """`command(conn, args)` over a connection to --bootstrap-server; a refusal or an
    unreachable cluster is one line on stderr and exit status 1."""
    try:
        with connect(args.bootstrap_server, args.timeout,
                     command_config(args.command_config)) as conn:
            return command(conn, args)
    except (CliError, KafkaClientError) as exc:
        print(f"mink {name}: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    return run_admin_command(args, "topics", COMMANDS[args.topics_command])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mink")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["topics", *(argv or sys.argv[1:])]))


if __name__ == "__main__":
    sys.exit(main())
