"""Node configuration: one msgspec struct, read from defaults, a TOML file, MINK_* environment
variables and command-line flags, each overriding the one before."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    node_id: int = 1
    listener: str = "127.0.0.1:9092"
    # What clients are told to connect to; the listener when unset.
    advertised_listener: str | None = None
    rack: str | None = None
    # Required by `mink serve`; `mink dev` starts an embedded PostgreSQL and fills it in.
    postgres_url: str | None = None
    object_store: str = "memory://"
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None

    # Cluster timing (seconds).
    lease_ttl: float = 30.0
    coordinator_tick: float = 5.0
    # Seed 001: the most partition leases (per-partition background work) one node holds.
    max_partitions: int = 10_000

    # WAL: a buffer is flushed at wal_max_bytes, or wal_max_delay_ms after its first batch.
    # On file:// a flush starts as soon as no other flush is running; on S3 the delay bounds
    # the PUT rate (None picks by store: 0 for file:// and memory://, 50 ms for s3://).
    wal_max_bytes: int = 8 * 1024 * 1024
    wal_max_delay_ms: float | None = None
    # Uploads in flight at once; None: 1 for file:// and memory://, 4 for s3://.
    wal_max_concurrent_uploads: int | None = None
    commit_timeout: float = 10.0

    # Kafka broker settings, with Kafka's names turned into identifiers.
    socket_request_max_bytes: int = 100 * 1024 * 1024
    auto_create_topics_enable: bool = True
    num_partitions: int = 1
    message_max_bytes: int = 1048588
    # Cluster defaults of topics' retention.ms and retention.bytes (-1: unlimited), inherited
    # by every topic that does not set its own.
    log_retention_ms: int = 7 * 24 * 3600 * 1000
    log_retention_bytes: int = -1
    # The storage lifecycle: how often retention runs under each writer lease (Kafka's
    # log.retention.check.interval.ms), how long an object no index row uses any more is
    # kept for readers that resolved it before (file.delete.delay.ms, PostgreSQL's clock),
    # how long an idle producer's state is kept (producer.id.expiration.ms).
    log_retention_check_interval_ms: int = 300_000
    file_delete_delay_ms: int = 60_000
    producer_id_expiration_ms: int = 86_400_000
    # Tiering (seed 000's tiering worker, on the coordinator lease holder): a committed WAL
    # object is rewritten into per-partition stream objects of about tiering_stream_object_bytes
    # within tiering_delay_ms (-1: never); an upload begun and not swapped after
    # tiering_upload_timeout_ms is deleted; tiering_concurrency stream objects at once.
    tiering_delay_ms: int = 60_000
    tiering_stream_object_bytes: int = 32 * 1024 * 1024
    tiering_upload_timeout_ms: int = 600_000
    tiering_concurrency: int = 4
    # Compaction of cleanup.policy=compact topics under their writer leases (Kafka's
    # log.cleaner.backoff.ms: how often the cleaner looks for a partition to clean; -1: never).
    log_cleaner_backoff_ms: int = 15_000
    # KV tablets of compacted partitions on their leaders: a snapshot to the object store
    # every kv_snapshot_records records or kv_snapshot_interval_ms (with something new).
    kv_snapshot_records: int = 100_000
    kv_snapshot_interval_ms: int = 60_000
    # Decompress and walk every record of a produced batch (Kafka's LogValidator) before it is
    # acknowledged. False checks the header and CRC only: for benchmarks that measure the cost,
    # never for a node serving clients (a corrupt batch would stall its consumers).
    produce_validate_records: bool = True
    # Group coordination: offsets.topic.num.partitions, group.initial.rebalance.delay.ms,
    # group.min.session.timeout.ms, group.max.session.timeout.ms.
    offsets_topic_num_partitions: int = 50
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    # KIP-848 consumer groups: group.consumer.heartbeat.interval.ms and
    # group.consumer.session.timeout.ms (set by the broker, not the client), and
    # group.consumer.assignors (comma-separated, the first is the default).
    group_consumer_heartbeat_interval_ms: int = 5000
    group_consumer_session_timeout_ms: int = 45000
    group_consumer_assignors: str = "uniform,range"
    # Committed offsets expire (KIP-211) offsets.retention.minutes after their group became
    # Empty (by commit time for groups no member ever joined), checked every
    # offsets.retention.check.interval.ms by each group's coordinator. Minutes as a float,
    # so that tests can shorten it below a minute.
    offsets_retention_minutes: float = 10080
    offsets_retention_check_interval_ms: int = 600_000
    # Transactions: transaction.state.log.num.partitions (the internal topic is created when
    # the first transactional id is looked up), transaction.max.timeout.ms, and how often a
    # coordinator aborts transactions open past their timeout
    # (transaction.abort.timed.out.transaction.cleanup.interval.ms).
    transaction_state_num_partitions: int = 50
    transaction_max_timeout_ms: int = 900_000
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    # transactional.id.expiration.ms: an id with no transaction under way whose state was
    # last written this long ago is removed (its next InitProducerId starts afresh), checked
    # every transaction.remove.expired.transaction.cleanup.interval.ms. Kafka's defaults.
    transactional_id_expiration_ms: int = 604_800_000
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3_600_000

    # Incremental fetch sessions (KIP-227): max.incremental.fetch.session.cache.slots (0 turns
    # sessions off) and min.incremental.fetch.session.eviction.ms, Kafka's names and defaults.
    max_incremental_fetch_session_cache_slots: int = 1000
    min_incremental_fetch_session_eviction_ms: int = 120_000

    # Client quotas (mink/broker/quotas/): rates are measured over quota.window.num windows
    # of quota.window.size.seconds, Kafka's names and defaults.
    quota_window_num: int = 11
    quota_window_size_seconds: float = 1.0

    # The admin HTTP listener (HOST:PORT): /metrics, /healthz, /readyz. Off unless set; with it
    # off no metric is kept either.
    admin_listener: str | None = None
    # How often a group coordinator recomputes its groups' consumer lag for /metrics (the
    # high watermarks of partitions led elsewhere are one PostgreSQL read per refresh).
    consumer_lag_refresh_ms: int = 5000

    log_level: str = "INFO"
    # "text" (one readable line per record) or "json" (one JSON object per line).
    log_format: str = "text"

    def listener_address(self) -> tuple[str, int]:
        return split_host_port(self.listener)

    def advertised_address(self) -> tuple[str, int]:
        return split_host_port(self.advertised_listener or self.listener)

    def admin_address(self) -> tuple[str, int] | None:
        return split_host_port(self.admin_listener) if self.admin_listener else None

    def effective_wal_max_delay_ms(self) -> float:
        if self.wal_max_delay_ms is not None:
            return self.wal_max_delay_ms
        return 50.0 if self.object_store.startswith("s3://") else 0.0


class ConfigError(Exception):
    pass


def split_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


ENV_PREFIX = "MINK_"
LOG_FORMATS = ("text", "json")


def load_config(
    file: str | Path | None = None,
    env: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Config:
    """Defaults < TOML file < MINK_* environment variables < overrides (command-line flags)."""
    values: dict[str, Any] = {}
    if file is not None:
        try:
            values.update(msgspec.toml.decode(Path(file).read_bytes()))
        except (OSError, msgspec.DecodeError) as exc:
            raise ConfigError(f"cannot read config file {file}: {exc}") from None
    env = os.environ if env is None else env
    fields = set(Config.__struct_fields__)
    for key, raw in env.items():
        if key.startswith(ENV_PREFIX):
            name = key[len(ENV_PREFIX) :].lower()
            if name in fields:
                values[name] = raw
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        # strict=False lets environment strings become ints, floats and booleans.
        config = msgspec.convert(values, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
    config.listener_address()
    config.advertised_address()
    config.admin_address()
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}, "
                          f"not {config.log_format!r}")
    return config
