"""Node configuration: one msgspec struct, read from defaults, a TOML file, MINK_* environment
variables and command-line flags, each overriding the one before."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from mink.broker.security.listeners import (
    DEFAULT_PROTOCOL_MAP,
    KafkaListener,
    ListenerError,
    SecurityProtocol,
    advertise,
    check_advertised,
    parse_listeners,
    parse_protocol_map,
)


REPLICA_SELECTORS = ("rack", "leader")


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    node_id: int = 1
    listener: str = "127.0.0.1:9092"
    # What clients are told to connect to; the listener when unset.
    advertised_listener: str | None = None
    rack: str | None = None
    # Kafka's listener model (mink/broker/security/listeners.py): NAME://HOST:PORT entries,
    # comma-separated. When `listeners` is set it replaces `listener` (which stays the
    # single PLAINTEXT listener otherwise). inter_broker_listener_name: the listener written
    # as the node's address (what forwarding between nodes connects to); the first listener
    # when unset.
    listeners: str | None = None
    advertised_listeners: str | None = None
    listener_security_protocol_map: str = DEFAULT_PROTOCOL_MAP
    inter_broker_listener_name: str | None = None
    # How a node logs in to the others' inter-broker listener when it uses SASL (a SCRAM
    # user like any other; Kafka's sasl.mechanism.inter.broker.protocol and its JAAS entry).
    # Over TLS the node checks their certificates against ssl_ca_file and shows its own.
    inter_broker_sasl_mechanism: str = "SCRAM-SHA-512"
    inter_broker_sasl_username: str | None = None
    inter_broker_sasl_password: str | None = None
    # TLS (SSL and SASL_SSL listeners): PEM files. ssl_client_auth: none, requested or
    # required (Kafka's ssl.client.auth); a client certificate's subject DN becomes the
    # principal through ssl_principal_mapping_rules (Kafka's syntax: DEFAULT, RULE:...).
    ssl_cert_file: str | None = None
    ssl_key_file: str | None = None
    ssl_key_password: str | None = None
    ssl_ca_file: str | None = None
    ssl_client_auth: str = "none"
    ssl_principal_mapping_rules: str = "DEFAULT"
    # SASL (SASL_PLAINTEXT and SASL_SSL listeners): the mechanisms offered; credentials are
    # SCRAM credentials in PostgreSQL (`mink users`, AlterUserScramCredentials).
    sasl_enabled_mechanisms: str = "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"
    # KIP-368: a SASL session lasts at most this long, then the connection must
    # re-authenticate or is closed (0: sessions do not expire).
    connections_max_reauth_ms: int = 0
    # KIP-306: a failed authentication is answered (and its connection closed) this late.
    connection_failed_authentication_delay_ms: int = 100
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
    # Controlled shutdown (SIGTERM, SIGINT): the longest a stopping node waits for its
    # partitions to be open on other nodes before it leaves anyway; 0 leaves at once.
    controlled_shutdown_timeout_ms: int = 10_000

    # WAL: a buffer is flushed at wal_max_bytes, or wal_max_delay_ms after its first batch.
    # On file:// a flush starts as soon as no other flush is running; on S3 the delay bounds
    # the PUT rate (None picks by store: 0 for file:// and memory://, 50 ms for s3://).
    wal_max_bytes: int = 8 * 1024 * 1024
    wal_max_delay_ms: float | None = None
    # Uploads in flight at once; None: 2 for file://, 4 for s3://, 1 for memory://. One
    # beyond the first starts only when wal_concurrent_upload_min_bytes wait in the buffer
    # (None: 1 MiB on file://, where fsyncs queue in the file system's journal; 0 elsewhere).
    wal_max_concurrent_uploads: int | None = None
    wal_concurrent_upload_min_bytes: int | None = None
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
    # tiering_upload_timeout_ms is deleted. A round's reads are paced to take
    # tiering_round_spread of the round interval (tiering_delay_ms / 4), its stream objects
    # written one after another, so its work is spread thin beside the leader's commits; 0:
    # as fast as they go, tiering_concurrency stream objects at once.
    tiering_delay_ms: int = 60_000
    tiering_stream_object_bytes: int = 32 * 1024 * 1024
    tiering_upload_timeout_ms: int = 600_000
    tiering_concurrency: int = 4
    tiering_round_spread: float = 0.5
    # Compaction of cleanup.policy=compact topics under their writer leases (Kafka's
    # log.cleaner.backoff.ms: how often the cleaner looks for a partition to clean; -1: never).
    log_cleaner_backoff_ms: int = 15_000
    # The size of a pass's offset map (Kafka's log.cleaner.dedupe.buffer.size): about 27 bytes
    # a key; a dirty section with more keys is cleaned up to where the map filled, the rest
    # at the next pass. A pass writes objects of at most tiering_stream_object_bytes.
    log_cleaner_dedupe_buffer_size: int = 128 * 1024 * 1024
    # KV tablets of compacted partitions on their leaders: a snapshot to the object store
    # every kv_snapshot_records records or kv_snapshot_interval_ms (with something new).
    kv_snapshot_records: int = 100_000
    kv_snapshot_interval_ms: int = 60_000
    # Decompress and walk every record of a produced batch (Kafka's LogValidator) before it is
    # acknowledged. False checks the header and CRC only: for benchmarks that measure the cost,
    # never for a node serving clients (a corrupt batch would stall its consumers).
    produce_validate_records: bool = True
    # Forward the partitions of a Produce that another node leads to that leader (inside an
    # Envelope, as the client's principal) instead of answering NOT_LEADER_OR_FOLLOWER.
    produce_forwarding: bool = True
    # Fetch through any node (issue 25, mink/broker/server/replica_reads.py): a node serves
    # consumers' Fetches of partitions it does not lead from the index and
    # the object store. replica_fetch_poll_ms: how often it reads the committed ends of the
    # partitions long-polling Fetches wait on (one batched query per interval per node, only
    # while some Fetch waits; the latency a commit takes to reach such a Fetch is at most
    # this, plus the query). replica_view_idle_ms: a partition's view is dropped after this
    # long without a Fetch.
    replica_fetch_poll_ms: int = 100
    replica_view_idle_ms: int = 60_000
    # KIP-392 (Kafka's replica.selector.class): "rack" answers a consumer's Fetch that sends
    # its client.rack with preferred_read_replica = a live node in that rack when the leader
    # is not in it (Kafka's RackAwareReplicaSelector); "leader" never does (Kafka's default).
    # On by default: every node holds every committed byte, so zone-local reads cost
    # nothing in replication, and a node without a rack (or a client without one) is never
    # redirected.
    replica_selector: str = "rack"
    # Forward a group or transaction-coordinator request (JoinGroup, OffsetCommit, EndTxn,
    # ...) reaching a node that does not coordinate its group / transactional id to the node
    # that does, instead of answering NOT_COORDINATOR (clients behind a load balancer).
    coordinator_forwarding: bool = True
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
    # The bounds of a group's own consumer.session.timeout.ms and
    # consumer.heartbeat.interval.ms (IncrementalAlterConfigs on a GROUP), Kafka's defaults.
    group_consumer_min_session_timeout_ms: int = 45000
    group_consumer_max_session_timeout_ms: int = 60000
    group_consumer_min_heartbeat_interval_ms: int = 5000
    group_consumer_max_heartbeat_interval_ms: int = 15000
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

    # The authorizer (mink/broker/security/authorizer.py; Kafka's authorizer.class.name): off,
    # everyone may do everything and the ACL APIs answer SECURITY_DISABLED. super_users is
    # Kafka's super.users (`User:admin;User:other`); allow_everyone_if_no_acl_found Kafka's
    # allow.everyone.if.no.acl.found.
    authorizer_enabled: bool = False
    super_users: str = ""
    allow_everyone_if_no_acl_found: bool = False

    # The admin HTTP listener ([https://]HOST:PORT): /metrics, /healthz, /readyz, /console,
    # key lookups. Off unless set; with it off no metric is kept either. https:// serves TLS
    # with ssl_cert_file / ssl_key_file (the Kafka listeners' certificate); the nodes forward
    # lookups to each other's admin listener over the same scheme, checking the peer's
    # certificate against ssl_ca_file (else the system's CAs).
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

    def kafka_listeners(self) -> tuple[list[KafkaListener], list[KafkaListener] | None]:
        """(what to bind, what to advertise or None for the bound addresses)."""
        try:
            protocols = parse_protocol_map(self.listener_security_protocol_map)
            if self.listeners is None:
                host, port = self.listener_address()
                bound = [KafkaListener("PLAINTEXT", SecurityProtocol.PLAINTEXT, host, port)]
                if self.advertised_listeners is None:
                    # the single listener of old: advertised as it is, 0.0.0.0 included
                    adv_host, adv_port = self.advertised_address()
                    return bound, [KafkaListener("PLAINTEXT", SecurityProtocol.PLAINTEXT,
                                            adv_host, adv_port)]
            else:
                bound = parse_listeners(self.listeners, protocols)
            advertised = None
            if self.advertised_listeners is not None:
                advertised = parse_listeners(self.advertised_listeners, protocols,
                                             "advertised_listeners")
                advertise(bound, advertised, "localhost")
                check_advertised(advertised)
        except ListenerError as exc:
            raise ConfigError(str(exc)) from None
        return bound, advertised

    def inter_broker_listener(self) -> str:
        bound, _ = self.kafka_listeners()
        name = (self.inter_broker_listener_name or bound[0].name).upper()
        if name not in {b.name for b in bound}:
            raise ConfigError(f"inter_broker_listener_name {name} is not one of the listeners")
        return name

    def admin_address(self) -> tuple[str, int] | None:
        if not self.admin_listener:
            return None
        _, sep, rest = self.admin_listener.partition("://")
        return split_host_port(rest if sep else self.admin_listener)

    def admin_scheme(self) -> str | None:
        """"https" or "http" (no scheme given) of the admin listener; None when it is off."""
        if not self.admin_listener:
            return None
        try:
            return split_admin_url(self.admin_listener)[0]
        except ValueError:
            raise ConfigError(f"admin_listener is http://HOST:PORT or https://HOST:PORT, got "
                              f"{self.admin_listener!r}") from None

    def effective_wal_max_delay_ms(self) -> float:
        if self.wal_max_delay_ms is not None:
            return self.wal_max_delay_ms
        return 50.0 if self.object_store.startswith("s3://") else 0.0

    def effective_wal_max_concurrent_uploads(self) -> int:
        if self.wal_max_concurrent_uploads is not None:
            return self.wal_max_concurrent_uploads
        if self.object_store.startswith("s3://"):
            return 4
        return 2 if self.object_store.startswith("file://") else 1

    def effective_wal_concurrent_upload_min_bytes(self) -> int:
        if self.wal_concurrent_upload_min_bytes is not None:
            return self.wal_concurrent_upload_min_bytes
        return 1024 * 1024 if self.object_store.startswith("file://") else 0


class ConfigError(Exception):
    pass


def split_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


ENV_PREFIX = "MINK_"
LOG_FORMATS = ("text", "json")


MIN_DEDUPE_BUFFER_SIZE = 1 << 20  # log_cleaner_dedupe_buffer_size's floor (Kafka's)


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
    check_security(config)
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}, "
                          f"not {config.log_format!r}")
    if not 0 <= config.tiering_round_spread <= 1:
        raise ConfigError(f"tiering_round_spread must be within [0, 1], got "
                          f"{config.tiering_round_spread}")
    if config.log_cleaner_dedupe_buffer_size < MIN_DEDUPE_BUFFER_SIZE:
        # Kafka's floor too: a map of fewer keys makes a pass of little use
        raise ConfigError(f"log_cleaner_dedupe_buffer_size must be at least "
                          f"{MIN_DEDUPE_BUFFER_SIZE} (1 MiB), not "
                          f"{config.log_cleaner_dedupe_buffer_size}")
    if config.replica_selector not in REPLICA_SELECTORS:
        raise ConfigError(f"replica_selector must be one of {', '.join(REPLICA_SELECTORS)}, "
                          f"not {config.replica_selector!r}")
    if config.replica_fetch_poll_ms <= 0:
        raise ConfigError(f"replica_fetch_poll_ms must be positive, got "
                          f"{config.replica_fetch_poll_ms}")
    return config


SSL_CLIENT_AUTH = ("none", "requested", "required")
ADMIN_SCHEMES = ("http", "https")


def split_admin_url(url: str) -> tuple[str, str]:
    """(scheme, HOST:PORT) of an admin listener's address; no scheme is http. ValueError
    for another scheme."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "http", url
    if scheme.lower() not in ADMIN_SCHEMES:
        raise ValueError(f"expected http:// or https://, got {url!r}")
    return scheme.lower(), rest


def check_security(config: Config) -> None:
    """Refuse settings a node could not serve with, before it starts."""
    bound, _ = config.kafka_listeners()
    name = config.inter_broker_listener()
    inter = next(b for b in bound if b.name == name)
    if inter.protocol.sasl and not (config.inter_broker_sasl_username
                                    and config.inter_broker_sasl_password):
        raise ConfigError(
            f"the inter-broker listener {name} is {inter.protocol.value}: set "
            "inter_broker_sasl_username and inter_broker_sasl_password (a SCRAM user) for "
            "the nodes to log in to each other")
    if config.ssl_client_auth not in SSL_CLIENT_AUTH:
        raise ConfigError(f"ssl_client_auth must be one of {', '.join(SSL_CLIENT_AUTH)}")
    if any(b.protocol.tls for b in bound) and not (config.ssl_cert_file and config.ssl_key_file):
        raise ConfigError("an SSL or SASL_SSL listener needs ssl_cert_file and ssl_key_file")
    if config.admin_scheme() == "https" and not (config.ssl_cert_file and config.ssl_key_file):
        raise ConfigError("an https:// admin_listener needs ssl_cert_file and ssl_key_file")
    if config.ssl_client_auth != "none" and not config.ssl_ca_file:
        raise ConfigError("ssl_client_auth needs ssl_ca_file (the CA client certificates "
                          "are checked against)")
    from mink.broker.security.sasl import enabled_mechanisms
    from mink.broker.security.ssl_principal import PrincipalMapper

    try:
        if config.inter_broker_sasl_mechanism.upper() not in enabled_mechanisms(
                config.sasl_enabled_mechanisms):
            raise ValueError(f"inter_broker_sasl_mechanism {config.inter_broker_sasl_mechanism}"
                             " is not in sasl_enabled_mechanisms")
        PrincipalMapper(config.ssl_principal_mapping_rules)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
