"""Dynamic broker configs (Kafka's KIP-226): what AlterConfigs and IncrementalAlterConfigs
set on a BROKER resource, stored in PostgreSQL (`sql/0032_broker_configs.sql`).

Two levels, as in Kafka: the cluster-wide default (resource name '') and one broker's own
(its node id), the broker's own first. Every node reads them all again whenever its view
version moves (`refresh`, called by the sync task as quotas and ACLs are), so a change
reaches every node with its change-log row and NOTIFY, within a sync.

What Mink acts on: the broker synonyms of topic settings (Kafka's `log.retention.ms` for
`retention.ms`, `log.cleanup.policy` for `cleanup.policy`, ..., `TOPIC_SETTINGS`'
`broker_synonym`) are the defaults of every topic that has no value of its own, on the nodes
they apply to (a broker's own: the partitions it leads, as a Kafka broker's log configs
apply to the logs it hosts). The sync folds them into the view's topics
(`TopicInfo.config`), so every reader of a topic's settings sees them without a lookup.

What it refuses, as Kafka refuses its read-only configs ("Cannot update these configs
dynamically"): the settings Mink reads from the node's configuration (`STATIC_ONLY`). Any
other name is stored and described as set, as Kafka keeps custom broker configs; Mink does
not act on it (`sasl.kerberos.*`, `background.threads`, ...: it has no such thing).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from mink.broker.topics.config import TOPIC_SETTINGS, InvalidConfig
from mink.storage import controlplane as md
from mink.storage.controlplane.broker_configs import (
    BrokerConfigChanged,
    alter_broker_config,
    broker_configs,
)

log = logging.getLogger(__name__)

DEFAULT_RESOURCE = ""  # the cluster-wide default, Kafka's <default> broker entity

# Kafka's DescribeConfigsResponse.ConfigSource of the two dynamic levels.
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3

# Broker settings Mink reads from the node's configuration (MINK_*, the TOML file, flags) or
# that are fixed by its design: read-only, as Kafka's static-only configs are.
STATIC_ONLY = frozenset({
    "advertised.listeners", "auto.create.topics.enable", "broker.id", "broker.rack",
    "default.replication.factor", "delete.topic.enable", "file.delete.delay.ms", "listeners",
    "log.retention.check.interval.ms", "max.incremental.fetch.session.cache.slots",
    "min.incremental.fetch.session.eviction.ms", "min.insync.replicas", "node.id",
    "num.partitions", "offsets.retention.check.interval.ms", "offsets.retention.minutes",
    "offsets.topic.replication.factor", "producer.id.expiration.ms", "socket.request.max.bytes",
    # Kafka's other units of log.retention.ms: Mink takes the milliseconds only
    "log.retention.hours", "log.retention.minutes",
})

# Broker synonym -> the topic setting it is the default of.
TOPIC_DEFAULTS: dict[str, str] = {
    s.broker_synonym: key for key, s in TOPIC_SETTINGS.items() if s.broker_synonym}

_ATTEMPTS = 5


class ListOpRefused(InvalidConfig):
    """An incremental operation the config cannot take (Kafka's INVALID_CONFIG)."""


def resource_error(name: str) -> str | None:
    """Why a BROKER resource name is not one: '' (the cluster default) or a node id."""
    if name == DEFAULT_RESOURCE or (name.isdigit() and name.isascii()):
        return None
    return f"Broker id must be an integer or empty, but it is: {name}"


def validate_broker_config(config: dict[str, str | None]) -> dict[str, str]:
    """The stored form of a resource's dynamic configs: values of topic defaults checked as
    the topic setting checks them; names Mink cannot change at run time refused. A null
    value is dropped (AlterConfigs: the name goes back to its default)."""
    static = sorted(name for name in config if name in STATIC_ONLY)
    if static:
        raise InvalidConfig(
            f"Cannot update these configs dynamically: {', '.join(static)} (Mink reads them "
            f"from the node's configuration: MINK_* or the TOML file)")
    out: dict[str, str] = {}
    for name, value in config.items():
        if value is None:
            continue
        topic_key = TOPIC_DEFAULTS.get(name)
        if topic_key is not None:
            try:
                TOPIC_SETTINGS[topic_key].parse(value)
            except InvalidConfig as exc:
                raise InvalidConfig(f"Invalid value {value} for configuration {name}: "
                                    f"{exc}") from None
        out[name] = str(value)
    return out


def altered_broker_config(current: dict[str, str],
                          changes: list[tuple[str | None, str, str | None]]) -> dict[str, str]:
    """IncrementalAlterConfigs on a resource's stored configs: (op, name, value) with op SET,
    DELETE, APPEND or SUBTRACT. APPEND and SUBTRACT only on list settings, starting from
    Kafka's default when the resource stores none (as Kafka's ConfigAdminManager)."""
    out: dict[str, str | None] = dict(current)
    for op, name, value in changes:
        if op == "SET":
            out[name] = value
        elif op == "DELETE":
            out.pop(name, None)
        elif op in ("APPEND", "SUBTRACT"):
            setting = TOPIC_SETTINGS.get(TOPIC_DEFAULTS.get(name, ""))
            if setting is None or setting.type != "LIST":
                raise ListOpRefused(f"Config value {op.lower()} is not allowed for config "
                                    f"key: {name}")
            old = out.get(name)
            items = [v for v in (setting.default if old is None else old).split(",") if v]
            given = [v.strip() for v in (value or "").split(",") if v.strip()]
            if op == "APPEND":
                items += [v for v in given if v not in items]
            else:
                items = [v for v in items if v not in given]
            out[name] = ",".join(items)
        else:
            raise ListOpRefused(f"unknown config operation for {name!r}")
    return validate_broker_config(out)


class BrokerConfigs:
    """The dynamic broker configs every node holds: all of them, read when the view moves,
    and what they make of this node's topic defaults."""

    def __init__(self, node) -> None:
        self.node = node
        self.loaded_version = -1
        self.stored: dict[str, dict[str, str]] = {}
        # topic setting -> its default from the dynamic configs that apply to this node
        self.topic_defaults: dict[str, str] = {}

    def layers(self) -> list[tuple[dict[str, str], int]]:
        """This node's dynamic configs, strongest first: (configs, ConfigSource)."""
        return [(self.stored.get(str(self.node.node_id), {}), DYNAMIC_BROKER_CONFIG),
                (self.stored.get(DEFAULT_RESOURCE, {}), DYNAMIC_DEFAULT_BROKER_CONFIG)]

    async def refresh(self, view_version: int) -> bool:
        """Read every resource's configs again if the view moved since the last read.
        True when this node's topic defaults changed (the view's topics need them)."""
        if view_version == self.loaded_version:
            return False
        stored = await broker_configs(self.node.metadata)
        changed = self.apply(stored)
        self.loaded_version = view_version
        return changed

    def apply(self, stored: dict[str, dict[str, str]]) -> bool:
        if stored != self.stored:
            log.info("dynamic broker configs: %s", stored)
        self.stored = stored
        defaults: dict[str, str] = {}
        for configs, _ in reversed(self.layers()):  # the broker's own last: it wins
            for name, value in configs.items():
                topic_key = TOPIC_DEFAULTS.get(name)
                if topic_key is not None:
                    defaults[topic_key] = value
        changed = defaults != self.topic_defaults
        self.topic_defaults = defaults
        return changed

    async def change(self, resource: str,
                     compute: Callable[[dict[str, str]], dict[str, str]],
                     validate_only: bool) -> tuple[ErrorCode, str | None]:
        """Apply `compute` (stored configs -> new configs; raises InvalidConfig) to one
        resource with a compare-and-set. Returns the error code and message to answer."""
        problem = resource_error(resource)
        if problem:
            return ErrorCode.invalid_request, problem
        node = self.node
        try:
            for _ in range(_ATTEMPTS):
                current = (await broker_configs(node.metadata)).get(resource, {})
                try:
                    new = compute(current)
                except ListOpRefused as exc:
                    return ErrorCode.invalid_config, str(exc)
                except InvalidConfig as exc:
                    # Kafka answers a broker config it cannot apply with INVALID_REQUEST
                    # (ConfigAdminManager.validateBrokerConfigChange, KAFKA-13609)
                    return ErrorCode.invalid_request, str(exc)
                if validate_only:
                    return ErrorCode.none, None
                try:
                    await alter_broker_config(node.metadata, resource, current, new)
                except BrokerConfigChanged:
                    continue
                log.info("broker %s configs changed to %s", resource or "(default)", new)
                try:
                    await node.sync.refresh_view()  # this node at once; the others by NOTIFY
                except md.MetadataUnavailable as exc:  # stored; the sync loop catches up
                    log.warning("view refresh after a broker config change failed: %s", exc)
                return ErrorCode.none, None
            return ErrorCode.request_timed_out, "the broker's configs kept changing; retry"
        except md.MetadataUnavailable as exc:
            return ErrorCode.request_timed_out, f"the metadata store is unavailable: {exc}"
