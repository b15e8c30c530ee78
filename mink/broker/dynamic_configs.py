"""Dynamic configs: what AlterConfigs and IncrementalAlterConfigs set on BROKER resources
(Kafka's KIP-226) and GROUP resources (KIP-848's group configs), stored in PostgreSQL
(`sql/0032_dynamic_configs.sql`). Every node reads them all again whenever its view version
moves (`refresh`, called by the sync task as quotas and ACLs are), so a change reaches every
node with its change-log row and NOTIFY, within a sync.

Broker configs have two levels, as in Kafka: the cluster-wide default (resource name '') and
one broker's own (its node id), the broker's own first. What Mink acts on: the broker
synonyms of topic settings (Kafka's `log.retention.ms` for `retention.ms`,
`log.cleanup.policy` for `cleanup.policy`, ...: `TOPIC_SETTINGS`' `broker_synonym`) are the
defaults of every topic without its own value, on the nodes they apply to (a broker's own:
the partitions it leads, as a Kafka broker's log configs apply to the logs it hosts). The
sync folds them, over the node's own configuration of the same (`message_max_bytes`,
`log_retention_*`), into the view's topics (`TopicInfo.config`), so no reader looks them up.
What it refuses, as Kafka refuses its read-only configs ("Cannot update these configs
dynamically", INVALID_REQUEST): the settings Mink reads from the node's configuration
(`STATIC_ONLY`). Any other name is stored and described as set, as Kafka keeps custom broker
configs; Mink does not act on it (`sasl.kerberos.*`, `background.threads`: it has no such
thing).

Group configs: `consumer.session.timeout.ms` and `consumer.heartbeat.interval.ms` of one
consumer group (KIP-848), within the node's bounds as Kafka's GroupConfig checks them; the
group coordinator reads them at every heartbeat (`group_setting`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from mink.broker.topics.config import (
    BROKER_DEFAULTS,
    TOPIC_SETTINGS,
    InvalidConfig,
    broker_default,
    edited_list,
)
from mink.storage import controlplane as md
from mink.storage.controlplane.dynamic_configs import (
    DynamicConfigChanged,
    alter_dynamic_config,
    dynamic_configs,
)

log = logging.getLogger(__name__)

# Kafka's ConfigResource.Type.
BROKER, GROUP = 4, 32
DYNAMIC = (BROKER, GROUP)  # the resource types whose configs live here
DEFAULT_RESOURCE = ""  # the cluster-wide default, Kafka's <default> broker entity

# Kafka's DescribeConfigsResponse.ConfigSource.
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
GROUP_CONFIG = 8

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

# Group config -> (the node's default, its lower bound, its upper bound): Config fields.
GROUP_SETTINGS: dict[str, tuple[str, str, str]] = {
    "consumer.session.timeout.ms": ("group_consumer_session_timeout_ms",
                                    "group_consumer_min_session_timeout_ms",
                                    "group_consumer_max_session_timeout_ms"),
    "consumer.heartbeat.interval.ms": ("group_consumer_heartbeat_interval_ms",
                                       "group_consumer_min_heartbeat_interval_ms",
                                       "group_consumer_max_heartbeat_interval_ms"),
}
GROUP_DOCS = {
    "consumer.session.timeout.ms": "a member not heard from this long is expelled",
    "consumer.heartbeat.interval.ms": "how often members heartbeat",
}

_ATTEMPTS = 5

# Values never shown or logged: Kafka's PASSWORD configs (ssl.*.password, sasl.jaas.config,
# ssl.keystore.key, ...) and anything named like them. Stored as given, as Kafka's are when
# no password encoder secret is set.
_SECRET_WORDS = ("password", "jaas", "secret", "credential", "token")


def is_sensitive(name: str) -> bool:
    lower = name.lower()
    return lower.endswith(".key") or any(word in lower for word in _SECRET_WORDS)


def _names(configs: dict) -> dict:
    """What a log line may say of configs: their names, not their values."""
    return {resource: sorted(values) for resource, values in configs.items()}


def group_default(node_config, name: str) -> int:
    """A group config's value for a group without its own: the node's configuration."""
    return int(getattr(node_config, GROUP_SETTINGS[name][0]))


class Refused(InvalidConfig):
    """A change answered with INVALID_CONFIG (the other broker config problems are answered
    INVALID_REQUEST, as Kafka answers them)."""


def resource_error(resource_type: int, name: str) -> str | None:
    """Why a resource name is not one: a BROKER resource is '' (the cluster default) or a
    node id, a GROUP resource a group id."""
    if resource_type == GROUP:
        return None if name else "Group id must not be empty"
    if name == DEFAULT_RESOURCE or (name.isdigit() and name.isascii()):
        return None
    return f"Broker id must be an integer or empty, but it is: {name}"


def validate_broker_config(config: dict[str, str | None]) -> dict[str, str]:
    """The stored form of a broker resource's dynamic configs: values of topic defaults
    checked as the topic setting checks them; names Mink cannot change at run time refused.
    A null value is dropped (AlterConfigs: the name goes back to its default)."""
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


def validate_group_config(config: dict[str, str | None], node_config) -> dict[str, str]:
    """The stored form of a group's configs: known names only, each within the node's
    bounds, the heartbeat interval below the session timeout (Kafka's GroupConfig)."""
    out: dict[str, str] = {}
    for name, value in config.items():
        fields = GROUP_SETTINGS.get(name)
        if fields is None:
            why = (" (Mink has no share or streams groups)"
                   if name.startswith(("share.", "streams.")) else "")
            raise Refused(f"Unknown group config name: {name}{why}")
        if value is None:
            continue
        try:
            number = int(value)
        except ValueError:
            raise Refused(f"Invalid value {value} for configuration {name}: "
                          f"not an integer") from None
        low, high = (getattr(node_config, f) for f in fields[1:])
        if not low <= number <= high:
            raise Refused(f"Invalid value {value} for configuration {name}: not between "
                          f"{low} and {high}")
        out[name] = str(number)
    heartbeat, session = (int(out.get(name) or group_default(node_config, name))
                          for name in ("consumer.heartbeat.interval.ms",
                                       "consumer.session.timeout.ms"))
    if heartbeat >= session:
        raise Refused("consumer.heartbeat.interval.ms must be less than "
                      "consumer.session.timeout.ms")
    return out


def validator(resource_type: int, node_config) -> Callable[[dict[str, str | None]],
                                                            dict[str, str]]:
    """What checks a resource's new configs and gives their stored form."""
    if resource_type == GROUP:
        return lambda config: validate_group_config(config, node_config)
    return validate_broker_config


def altered_config(current: dict[str, str], changes: list[tuple[str | None, str, str | None]],
                   validate: Callable[[dict[str, str | None]], dict[str, str]],
                   ) -> dict[str, str]:
    """IncrementalAlterConfigs on a resource's stored configs: (op, name, value) with op SET,
    DELETE, APPEND or SUBTRACT, then `validate`. APPEND and SUBTRACT only on list settings
    (the broker synonyms of topic lists), starting from Kafka's default when the resource
    stores none (as Kafka's ConfigAdminManager)."""
    out: dict[str, str | None] = dict(current)
    for op, name, value in changes:
        if op == "SET":
            out[name] = value
        elif op == "DELETE":
            out.pop(name, None)
        elif op in ("APPEND", "SUBTRACT"):
            setting = TOPIC_SETTINGS.get(TOPIC_DEFAULTS.get(name, ""))
            if setting is None or setting.type != "LIST":
                raise Refused(f"Config value {op.lower()} is not allowed for config key: "
                              f"{name}")
            out[name] = edited_list(out.get(name), setting.default, op, value)
        else:
            raise Refused(f"unknown config operation for {name!r}")
    return validate(out)


class DynamicConfigs:
    """The dynamic configs every node holds: all of them, read when the view moves, and
    what they make of this node's topic defaults."""

    def __init__(self, node) -> None:
        self.node = node
        self.loaded_version = -1
        self.stored: dict[tuple[int, str], dict[str, str]] = {}
        # topic setting -> its default on this node: the node's configuration, under the
        # broker configs that apply to it
        self.topic_defaults: dict[str, str] = {}

    def broker(self, name: str) -> dict[str, str]:
        return self.stored.get((BROKER, name), {})

    def group(self, group_id: str) -> dict[str, str]:
        return self.stored.get((GROUP, group_id), {})

    def layers(self) -> list[tuple[dict[str, str], int]]:
        """This node's broker configs, strongest first: (configs, ConfigSource)."""
        return [(self.broker(str(self.node.node_id)), DYNAMIC_BROKER_CONFIG),
                (self.broker(DEFAULT_RESOURCE), DYNAMIC_DEFAULT_BROKER_CONFIG)]

    def group_setting(self, group_id: str, name: str) -> int:
        """A group config in force: the group's own value, else the node's configuration."""
        value = self.group(group_id).get(name)
        return group_default(self.node.config, name) if value is None else int(value)

    async def refresh(self, view_version: int) -> bool:
        """Read every resource's configs again if the view moved since the last read.
        True when this node's topic defaults changed (the view's topics need them)."""
        if view_version == self.loaded_version:
            return False
        stored = await dynamic_configs(self.node.metadata)
        changed = self.apply(stored)
        self.loaded_version = view_version
        return changed

    def apply(self, stored: dict[tuple[int, str], dict[str, str]]) -> bool:
        if stored != self.stored:
            log.info("dynamic configs: %s", _names(stored))
        self.stored = stored
        # the node's configuration first (message_max_bytes, log_retention_*: Kafka's
        # static broker configs), where it differs from Kafka's default
        defaults: dict[str, str] = {}
        for topic_key in BROKER_DEFAULTS:
            static = broker_default(topic_key, self.node.config)
            if static is not None and static != TOPIC_SETTINGS[topic_key].default:
                defaults[topic_key] = static
        for configs, _ in reversed(self.layers()):  # the broker's own last: it wins
            for name, value in configs.items():
                topic_key = TOPIC_DEFAULTS.get(name)
                if topic_key is not None:
                    defaults[topic_key] = value
        changed = defaults != self.topic_defaults
        self.topic_defaults = defaults
        return changed

    async def change(self, resource_type: int, name: str,
                     compute: Callable[[dict[str, str]], dict[str, str]],
                     validate_only: bool) -> tuple[ErrorCode, str | None]:
        """Apply `compute` (stored configs -> new configs; raises InvalidConfig) to one
        resource with a compare-and-set. Returns the error code and message to answer."""
        problem = resource_error(resource_type, name)
        if problem:
            return ErrorCode.invalid_request, problem
        node = self.node
        try:
            for _ in range(_ATTEMPTS):
                current = (await dynamic_configs(node.metadata)).get((resource_type, name), {})
                try:
                    new = compute(current)
                except Refused as exc:
                    return ErrorCode.invalid_config, str(exc)
                except InvalidConfig as exc:
                    # Kafka answers a broker config it cannot apply with INVALID_REQUEST
                    # (ConfigAdminManager.validateBrokerConfigChange, KAFKA-13609)
                    return ErrorCode.invalid_request, str(exc)
                if validate_only:
                    return ErrorCode.none, None
                try:
                    await alter_dynamic_config(node.metadata, resource_type, name, current, new)
                except DynamicConfigChanged:
                    continue
                log.info("%s %s configs changed: now %s", "group" if resource_type == GROUP
                         else "broker", name or "(default)", sorted(new))
                try:
                    await node.sync.refresh_view()  # this node at once; the others by NOTIFY
                except md.MetadataUnavailable as exc:  # stored; the sync loop catches up
                    log.warning("view refresh after a config change failed: %s", exc)
                return ErrorCode.none, None
            return ErrorCode.request_timed_out, "the configs kept changing; retry"
        except md.MetadataUnavailable as exc:
            return ErrorCode.request_timed_out, f"the metadata store is unavailable: {exc}"
