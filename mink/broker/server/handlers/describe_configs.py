"""DescribeConfigs: a topic's settings (its own values, else the defaults) and this broker's.

Topic settings are the ones Mink honours (topic_config.TOPIC_SETTINGS). Broker settings come
from the node's configuration file, environment or flags, under the dynamic broker configs
(`mink/broker/dynamic_configs.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from mink.broker.dynamic_configs import (
    DEFAULT_RESOURCE,
    DYNAMIC_DEFAULT_BROKER_CONFIG,
    GROUP,
    GROUP_CONFIG,
    GROUP_DOCS,
    GROUP_SETTINGS,
    STATIC_ONLY,
    TOPIC_DEFAULTS,
    group_default,
    is_sensitive,
)
from mink.broker.config import Config
from mink.broker.security.authorizer import DESCRIBE_CONFIGS
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.topics.config import IGNORED_KAFKA_SETTINGS, TOPIC_SETTINGS, broker_default
from mink.protocol.messages import build, nested, response_schema
from mink.protocol.topics import topic_name_error

# Kafka's ConfigResource.Type.
TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8

# Kafka's DescribeConfigsResponse.ConfigSource.
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# Kafka's DescribeConfigsResponse.ConfigType.
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "SHORT": 4, "LONG": 5, "DOUBLE": 6,
                "LIST": 7, "CLASS": 8, "PASSWORD": 9}


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: int
    read_only: bool
    type: str
    doc: str
    synonyms: tuple[tuple[str, str | None, int], ...]  # (name, value, source), strongest first


def topic_config_entries(config: dict[str, str], broker_config: Config | None = None,
                         dynamic: Sequence[tuple[dict[str, str], int]] = ()
                         ) -> list[ConfigEntry]:
    """Every topic setting, sorted by name: the topic's own value (dynamic topic config),
    else the broker's dynamic configs (`dynamic`: (configs, source), strongest first), else
    the cluster default from the node's configuration (static broker config, where it
    differs from Kafka's default), else the default. Synonyms strongest first, as Kafka."""
    entries = []
    for name in sorted(TOPIC_SETTINGS):
        setting = TOPIC_SETTINGS[name]
        broker_name = setting.broker_synonym or name
        synonyms: list[tuple[str, str | None, int]] = []
        own = config.get(name)
        if own is not None:
            synonyms.append((name, str(own), DYNAMIC_TOPIC_CONFIG))
        synonyms += [(broker_name, layer[broker_name], source)
                     for layer, source in dynamic if broker_name in layer]
        static = broker_default(name, broker_config)
        if static is not None and static != setting.default:
            synonyms.append((broker_name, static, STATIC_BROKER_CONFIG))
        synonyms.append((broker_name, setting.default, DEFAULT_CONFIG))
        _, value, source = synonyms[0]
        entries.append(ConfigEntry(name, value, source, False, setting.type, setting.doc,
                                   tuple(synonyms)))
    # Kafka settings Mink stores without acting on them (segment.bytes, ...): reported as
    # the topic's own, so that what was set is what is described.
    for name in sorted(set(config) - set(TOPIC_SETTINGS)):
        value = str(config[name])
        why = IGNORED_KAFKA_SETTINGS.get(name, "not a setting Mink knows")
        entries.append(ConfigEntry(name, value, DYNAMIC_TOPIC_CONFIG, False, "STRING",
                                   f"Stored for Kafka tools; Mink does not act on it: {why}.",
                                   ((name, value, DYNAMIC_TOPIC_CONFIG),)))
    return sorted(entries, key=lambda e: e.name)


_DEFAULTS = Config()


def _listeners(config: Config) -> str:
    bound, _ = config.kafka_listeners()
    return ",".join(f"{b.name}://{b.host}:{b.port}" for b in bound)


def broker_config_entries(node) -> list[ConfigEntry]:
    """This node's settings under their Kafka names, sorted by name: its dynamic configs
    (its own, then the cluster default) over its static ones, as Kafka reports them. Those
    Mink reads from its configuration are read-only; a dynamic config Mink has no setting
    of is reported as set (a Kafka custom config)."""
    entries = {e.name: e for e in _static_broker_entries(node)}
    layers = node.dynamic_configs.layers()
    for name in sorted({name for layer, _ in layers for name in layer}):
        dynamic = tuple((name, layer[name], source) for layer, source in layers
                        if name in layer)
        base = entries.get(name)
        if base is None:
            topic_key = TOPIC_DEFAULTS.get(name)
            type_ = TOPIC_SETTINGS[topic_key].type if topic_key else "STRING"
            doc = (f"default {topic_key} of topics" if topic_key else
                   "stored for Kafka tools; Mink has no such setting and does not act on it")
            entries[name] = ConfigEntry(name, dynamic[0][1], dynamic[0][2], False, type_, doc,
                                        dynamic)
        else:
            entries[name] = ConfigEntry(name, dynamic[0][1], dynamic[0][2], False, base.type,
                                        base.doc, dynamic + base.synonyms)
    return sorted(entries.values(), key=lambda e: e.name)


def default_broker_config_entries(node) -> list[ConfigEntry]:
    """The cluster-wide dynamic configs (resource name ''), as Kafka describes them."""
    configs = node.dynamic_configs.broker(DEFAULT_RESOURCE)
    return [ConfigEntry(name, value, DYNAMIC_DEFAULT_BROKER_CONFIG, False, "STRING", "",
                        ((name, value, DYNAMIC_DEFAULT_BROKER_CONFIG),))
            for name, value in sorted(configs.items())]


def group_config_entries(node, group_id: str) -> list[ConfigEntry]:
    """A group's configs: its own (group config), else the node's (default config), as
    Kafka describes a group whether it exists or not."""
    own = node.dynamic_configs.group(group_id)
    entries = []
    for name in sorted(GROUP_SETTINGS):
        default = str(group_default(node.config, name))
        synonyms = ((name, own[name], GROUP_CONFIG),) if name in own else ()
        synonyms += ((name, default, DEFAULT_CONFIG),)
        entries.append(ConfigEntry(name, synonyms[0][1], synonyms[0][2], False, "INT",
                                   GROUP_DOCS[name], synonyms))
    return entries


def _static_broker_entries(node) -> list[ConfigEntry]:
    """This node's settings from its configuration under their Kafka names."""
    config: Config = node.config
    host, port = node.advertised

    def from_config(name: str, field: str, type_: str, doc: str) -> ConfigEntry:
        value = getattr(config, field)
        source = DEFAULT_CONFIG if value == getattr(_DEFAULTS, field) else STATIC_BROKER_CONFIG
        return _broker_entry(name, _text(value), source, type_, doc)

    def fixed(name: str, value: str | None, type_: str, doc: str,
              source: int = DEFAULT_CONFIG) -> ConfigEntry:
        return _broker_entry(name, value, source, type_, doc)

    node_id = str(config.node_id)
    entries = [
        fixed("broker.id", node_id, "INT", "this node's id", STATIC_BROKER_CONFIG),
        fixed("node.id", node_id, "INT", "this node's id", STATIC_BROKER_CONFIG),
        fixed("listeners", _listeners(config), "LIST",
              "the addresses this node listens on", STATIC_BROKER_CONFIG),
        fixed("advertised.listeners",
              ",".join(f"{name}://{h}:{p}" for name, _, h, p in node.endpoints)
              or f"PLAINTEXT://{host}:{port}", "LIST",
              "the addresses clients are told to connect to", STATIC_BROKER_CONFIG),
        from_config("broker.rack", "rack", "STRING", "this node's rack"),
        from_config("auto.create.topics.enable", "auto_create_topics_enable", "BOOLEAN",
                    "create unknown topics on Metadata and Produce requests"),
        from_config("num.partitions", "num_partitions", "INT",
                    "partitions of a topic created without a partition count"),
        fixed("default.replication.factor", "1", "SHORT",
              "one copy per partition: durability comes from the object store"),
        fixed("min.insync.replicas", "1", "INT",
              "one copy per partition: durability comes from the object store"),
        fixed("offsets.topic.replication.factor", "1", "SHORT",
              "one copy per partition: durability comes from the object store"),
        from_config("message.max.bytes", "message_max_bytes", "INT",
                    "the largest record batch accepted"),
        from_config("socket.request.max.bytes", "socket_request_max_bytes", "INT",
                    "the largest request accepted"),
        from_config("log.retention.ms", "log_retention_ms", "LONG", "how long data is kept"),
        from_config("log.retention.bytes", "log_retention_bytes", "LONG",
                    "how many bytes a partition keeps; -1: all"),
        from_config("log.retention.check.interval.ms", "log_retention_check_interval_ms",
                    "LONG", "how often retention runs"),
        from_config("file.delete.delay.ms", "file_delete_delay_ms", "LONG",
                    "how long data no index row uses is kept for readers that found it"),
        from_config("producer.id.expiration.ms", "producer_id_expiration_ms", "INT",
                    "how long an idle producer's state is kept"),
        from_config("offsets.retention.minutes", "offsets_retention_minutes", "INT",
                    "committed offsets expire this long after their group became empty"),
        from_config("offsets.retention.check.interval.ms",
                    "offsets_retention_check_interval_ms", "LONG",
                    "how often expired committed offsets are removed"),
        from_config("max.incremental.fetch.session.cache.slots",
                    "max_incremental_fetch_session_cache_slots", "INT",
                    "incremental fetch sessions (KIP-227) this node keeps"),
        from_config("min.incremental.fetch.session.eviction.ms",
                    "min_incremental_fetch_session_eviction_ms", "INT",
                    "how long a fetch session is idle before a new one may evict it"),
        fixed("delete.topic.enable", "true", "BOOLEAN", "topics can be deleted"),
        fixed("compression.type", "producer", "STRING",
              "default compression.type of topics: batches stored as the producer sent them"),
    ]
    for name in ("cleanup.policy", "message.timestamp.type"):
        setting = TOPIC_SETTINGS[name]
        if setting.broker_synonym:
            entries.append(fixed(setting.broker_synonym, setting.default, setting.type,
                                 f"default {name} of topics"))
    return entries


def _broker_entry(name: str, value: str | None, source: int, type_: str,
                  doc: str) -> ConfigEntry:
    return ConfigEntry(name, value, source, name in STATIC_ONLY, type_, doc,
                       ((name, value, source),))


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # offsets.retention.minutes is an INT to Kafka's tools
    return str(value)


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    version = ctx.header.api_version
    result_schema = nested(schema, "DescribeConfigsResult")
    entry_schema = nested(schema, "DescribeConfigsResourceResult")
    synonym_schema = nested(schema, "DescribeConfigsSynonym")
    include_synonyms = bool(request.include_synonyms)
    include_docs = bool(getattr(request, "include_documentation", False)) and version >= 3

    def encode(entry: ConfigEntry):
        hidden = is_sensitive(entry.name)  # as Kafka: a password's value is never sent
        synonyms = tuple(synonym_schema(name=n, value=None if hidden else v, source=s)
                         for n, v, s in entry.synonyms) if include_synonyms else ()
        return build(entry_schema, name=entry.name, value=None if hidden else entry.value,
                     read_only=entry.read_only, config_source=entry.source,
                     is_sensitive=hidden, synonyms=synonyms,
                     config_type=CONFIG_TYPES.get("PASSWORD" if hidden else entry.type, 0),
                     documentation=entry.doc if include_docs else None)

    results = []
    for resource in request.resources:
        refused = node.authorizer.config_refusal(ctx, DESCRIBE_CONFIGS,
                                                 resource.resource_type,
                                                 resource.resource_name)
        error, message, entries = (*refused, []) if refused else _describe(node, resource)
        keys = resource.configuration_keys
        if keys:  # null or empty: every key, as Kafka does
            wanted = set(keys)
            entries = [e for e in entries if e.name in wanted]
        results.append(build(
            result_schema, error_code=error, error_message=message,
            resource_type=resource.resource_type, resource_name=resource.resource_name,
            configs=tuple(encode(e) for e in entries)))
    return build(schema, throttle_time=NO_THROTTLE, results=tuple(results))


def _describe(node, resource) -> tuple[ErrorCode, str | None, list[ConfigEntry]]:
    name = resource.resource_name
    if resource.resource_type == TOPIC:
        problem = topic_name_error(name)
        if problem:
            return ErrorCode.invalid_topic_exception, problem, []
        topic = node.view.topics.get(name)
        if topic is None:
            return (ErrorCode.unknown_topic_or_partition,
                    f"Topic '{name}' does not exist.", [])
        return ErrorCode.none, None, topic_config_entries(topic.own, node.config,
                                                          node.dynamic_configs.layers())
    if resource.resource_type == BROKER:
        if name == DEFAULT_RESOURCE:
            return ErrorCode.none, None, default_broker_config_entries(node)
        if name != str(node.node_id):
            if not name.lstrip("-").isdigit():
                return (ErrorCode.invalid_request,
                        f"Broker id must be an integer, but it is: {name}", [])
            return (ErrorCode.invalid_request,
                    f"Unexpected broker id, expected {node.node_id} or empty string, "
                    f"but received {name}", [])
        return ErrorCode.none, None, broker_config_entries(node)
    if resource.resource_type == GROUP:
        if not name:
            return ErrorCode.invalid_request, "Group id must not be empty", []
        return ErrorCode.none, None, group_config_entries(node, name)
    if resource.resource_type == BROKER_LOGGER:
        return ErrorCode.invalid_request, "broker loggers are not described by Mink", []
    return (ErrorCode.invalid_request,
            f"Unsupported resource type: {resource.resource_type}", [])

