"""Topic configuration: the settings Mink honours, their defaults and their validation,
with Kafka's names and Kafka's defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


class InvalidConfig(ValueError):
    pass


def _long(minimum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise InvalidConfig(f"{value!r} is not an integer") from None
        if number < minimum:
            raise InvalidConfig(f"{number} is below the minimum {minimum}")
        return number
    return parse


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in allowed:
            raise InvalidConfig(f"{value!r} is not one of {', '.join(allowed)}")
        return value
    return parse


def _ratio(value: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidConfig(f"{value!r} is not a number") from None
    if not 0.0 <= number <= 1.0:
        raise InvalidConfig(f"{number} is not between 0 and 1")
    return number


def _cleanup_policy(value: str) -> frozenset[str]:
    """The set of policies: {"delete"}, {"compact"}, both (Kafka's LIST, either order), or
    none: as in Kafka (documented from 4.1), an empty list keeps the log whole, neither
    truncated by retention nor compacted."""
    policies = frozenset(p.strip() for p in str(value).split(",") if p.strip())
    if not policies <= {"delete", "compact"}:
        raise InvalidConfig(f"{value!r} is not delete, compact, both or empty")
    return policies


def is_compacted(config: dict[str, str]) -> bool:
    """cleanup.policy contains compact. A substring test on the stored (validated) value,
    cheap enough for the Produce path."""
    return "compact" in config.get("cleanup.policy", "")


def deletes_by_retention(config: dict[str, str]) -> bool:
    """cleanup.policy contains delete: retention.ms / retention.bytes apply (Kafka: a
    compact-only topic is never truncated by time or size)."""
    return "delete" in config.get("cleanup.policy", "delete")


@dataclass(frozen=True)
class Setting:
    default: str
    parse: Callable[[str], Any]
    doc: str
    # Kafka's ConfigDef type, as DescribeConfigs v3+ reports it: BOOLEAN, STRING, INT, LONG, LIST...
    type: str = "STRING"
    # The broker setting that supplies the default in Kafka (DescribeConfigs synonyms).
    broker_synonym: str | None = None


TOPIC_SETTINGS: dict[str, Setting] = {
    "cleanup.policy": Setting("delete", _cleanup_policy,
                              "delete: retention.ms / retention.bytes truncate the log; "
                              "compact: the latest record per key is kept (both: both; "
                              "empty: neither, the log is kept whole)",
                              "LIST", "log.cleanup.policy"),
    # Compaction (docs/compaction.md), Kafka's LogCleaner settings and defaults.
    "delete.retention.ms": Setting("86400000", _long(0),
                                   "how long a tombstone is kept after the first cleaner pass "
                                   "that saw it (KIP-534)", "LONG",
                                   "log.cleaner.delete.retention.ms"),
    "min.compaction.lag.ms": Setting("0", _long(0),
                                     "records younger than this are never compacted", "LONG",
                                     "log.cleaner.min.compaction.lag.ms"),
    "max.compaction.lag.ms": Setting(str(2**63 - 1), _long(1),
                                     "a record older than this makes its partition cleanable "
                                     "whatever its dirty ratio", "LONG",
                                     "log.cleaner.max.compaction.lag.ms"),
    "min.cleanable.dirty.ratio": Setting("0.5", _ratio,
                                         "a partition is cleaned once this share of it is "
                                         "dirty (not compacted yet)", "DOUBLE",
                                         "log.cleaner.min.cleanable.ratio"),
    "retention.ms": Setting("604800000", _long(-1), "how long data is kept; -1: forever",
                            "LONG", "log.retention.ms"),
    "retention.bytes": Setting("-1", _long(-1), "how many bytes a partition keeps; -1: all",
                               "LONG", "log.retention.bytes"),
    "message.timestamp.type": Setting("CreateTime", _choice("CreateTime", "LogAppendTime"),
                                      "which timestamp batches carry", "STRING",
                                      "log.message.timestamp.type"),
    # Kafka's LogValidator: a batch in another codec is rebuilt in the topic's;
    # producer keeps the client's (mink/protocol/recompression.py)
    "compression.type": Setting("producer", _choice("producer", "uncompressed", "gzip",
                                                    "snappy", "lz4", "zstd"),
                                "the codec batches are stored in; producer: as sent",
                                "STRING", "compression.type"),
    "max.message.bytes": Setting("1048588", _long(0), "the largest record batch accepted",
                                 "INT", "message.max.bytes"),
    "message.timestamp.before.max.ms": Setting(
        str(2**63 - 1), _long(0), "how far in the past a CreateTime timestamp may be",
        "LONG", "log.message.timestamp.before.max.ms"),
    "message.timestamp.after.max.ms": Setting(
        str(2**63 - 1), _long(0), "how far in the future a CreateTime timestamp may be",
        "LONG", "log.message.timestamp.after.max.ms"),
}

# Kafka topic settings Mink stores but does not act on: accepted, so that Kafka Streams,
# Connect and tools that set them still create their topics, and described with the reason
# in DescribeConfigs' documentation field (docs/topic-settings.md lists them).
_SEGMENTS = "there are no log segments: data is in WAL and stream objects"
_REPLICAS = "a partition has one replica, its leader; durability comes from the object store"
_DISK = "nothing is written to a local disk"
IGNORED_KAFKA_SETTINGS: dict[str, str] = {
    "compression.gzip.level": "batches are recompressed at the codec's default level",
    "compression.lz4.level": "batches are recompressed at the codec's default level",
    "compression.zstd.level": "batches are recompressed at the codec's default level",
    "file.delete.delay.ms": "the cluster's file_delete_delay_ms applies to every topic",
    "flush.messages": _DISK, "flush.ms": _DISK,
    "follower.replication.throttled.replicas": _REPLICAS,
    "index.interval.bytes": _SEGMENTS,
    "leader.replication.throttled.replicas": _REPLICAS,
    "local.retention.bytes": "there is no local tier: everything is in the object store",
    "local.retention.ms": "there is no local tier: everything is in the object store",
    "message.downconversion.enable": "record batches v2 only; nothing is down-converted",
    "message.format.version": "record batches v2 only",
    "message.timestamp.difference.max.ms": "replaced by message.timestamp.before.max.ms "
                                           "and message.timestamp.after.max.ms (KIP-937)",
    "min.insync.replicas": _REPLICAS,
    "preallocate": _DISK,
    "remote.storage.enable": "every partition is in the object store already",
    "segment.bytes": _SEGMENTS, "segment.index.bytes": _SEGMENTS,
    "segment.jitter.ms": _SEGMENTS, "segment.ms": _SEGMENTS,
    "unclean.leader.election.enable": "the one replica is the leader; a new leader loses "
                                      "nothing acknowledged",
}
ACCEPTED_KAFKA_SETTINGS = frozenset(IGNORED_KAFKA_SETTINGS)


def validate_topic_config(configs: dict[str, str | None]) -> dict[str, str]:
    """The stored form of a CreateTopics config: known keys only, values checked."""
    out: dict[str, str] = {}
    for key, value in configs.items():
        setting = TOPIC_SETTINGS.get(key)
        if setting is None and key not in ACCEPTED_KAFKA_SETTINGS:
            raise InvalidConfig(f"unknown topic config {key!r}")
        if value is None:
            raise InvalidConfig(f"topic config {key!r} has no value")
        if setting is not None:
            setting.parse(value)
        out[key] = str(value)
    return out


def topic_setting(config: dict[str, str], key: str) -> Any:
    setting = TOPIC_SETTINGS[key]
    return setting.parse(config.get(key, setting.default))


# Topic settings whose default is a cluster setting of Mink's configuration (Kafka's
# log.retention.ms, log.retention.bytes and message.max.bytes): topic key -> the Config
# field that holds it.
BROKER_DEFAULTS: dict[str, str] = {
    "retention.ms": "log_retention_ms",
    "retention.bytes": "log_retention_bytes",
    "max.message.bytes": "message_max_bytes",
}


def broker_default(key: str, broker_config) -> str | None:
    """The cluster default of a topic setting from the node's configuration, as text, or
    None when Mink's configuration has no such setting (then Kafka's default applies)."""
    field = BROKER_DEFAULTS.get(key)
    if field is None or broker_config is None:
        return None
    return str(getattr(broker_config, field))


def effective_topic_setting(config: dict[str, str], key: str, broker_config=None) -> Any:
    """A topic's setting as it is enforced: its own value, else the cluster default, else
    Kafka's default. Read at every use, so a changed setting applies without a restart."""
    setting = TOPIC_SETTINGS[key]
    value = config.get(key)
    if value is None:
        value = broker_default(key, broker_config)
    return setting.parse(value if value is not None else setting.default)


def edited_list(stored: str | None, default: str, op: str, value: str | None) -> str:
    """A list config after APPEND or SUBTRACT of `value`'s items (comma-separated), from the
    stored list, else the default. A stored empty list is a value of its own
    (cleanup.policy: keep everything)."""
    items = [i for i in (default if stored is None else stored).split(",") if i]
    given = [i.strip() for i in (value or "").split(",") if i.strip()]
    if op == "APPEND":
        return ",".join(items + [i for i in given if i not in items])
    return ",".join(i for i in items if i not in given)


def altered_topic_config(current: dict[str, str],
                         changes: list[tuple[str, str, str | None]]) -> dict[str, str]:
    """IncrementalAlterConfigs on a topic's stored config: (op, key, value) with op SET,
    DELETE (back to the default), APPEND or SUBTRACT (list settings). Validated as at
    creation; InvalidConfig names the bad one."""
    out = dict(current)
    for op, key, value in changes:
        setting = TOPIC_SETTINGS.get(key)
        if setting is None and key not in ACCEPTED_KAFKA_SETTINGS:
            raise InvalidConfig(f"unknown topic config {key!r}")
        if op == "SET":
            out[key] = value  # type: ignore[assignment]
        elif op == "DELETE":
            out.pop(key, None)
        elif op in ("APPEND", "SUBTRACT"):
            if setting is None or setting.type != "LIST":
                raise InvalidConfig(f"{op} is only for list configs, not {key!r}")
            out[key] = edited_list(out.get(key), setting.default, op, value)
        else:
            raise InvalidConfig(f"unknown operation {op!r}")
    return validate_topic_config(out)
