"""The Kafka APIs Mink serves and the version ranges it advertises.

Only what is implemented is listed: a client must never be offered an API that then fails.
The broker's handler table and this table are checked against each other at start-up.
"""

from __future__ import annotations

import enum


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_QUORUM = 55
    ENVELOPE = 58
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    LIST_CONFIG_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75


# api key -> (min version, max version) advertised in ApiVersions.
ADVERTISED: dict[int, tuple[int, int]] = {
    # Produce v0-2 is advertised but refused: librdkafka up to 2.11 (Debian's kcat among
    # them) enables compression only when v0 is inside the range. kio has no v0-2 schema,
    # so such a request closes the connection (clients never pick it when v3+ is offered).
    ApiKey.PRODUCE: (0, 11),
    # Fetch v13+ names topics by id (KIP-516); v18's only addition is a follower's field.
    ApiKey.FETCH: (4, 18),
    ApiKey.LIST_OFFSETS: (1, 10),
    ApiKey.METADATA: (0, 13),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),
    ApiKey.INIT_PRODUCER_ID: (0, 4),
    ApiKey.CREATE_TOPICS: (2, 7),
    ApiKey.DELETE_TOPICS: (1, 6),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.DESCRIBE_CLUSTER: (0, 2),
    ApiKey.DESCRIBE_QUORUM: (0, 2),
    ApiKey.LIST_CONFIG_RESOURCES: (0, 1),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: (0, 0),
    # Replica management, mapped onto one replica per partition (its leader)
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 1),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.ELECT_LEADERS: (0, 2),
    ApiKey.DESCRIBE_LOG_DIRS: (1, 4),
    ApiKey.ALTER_REPLICA_LOG_DIRS: (1, 2),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.JOIN_GROUP: (0, 7),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 4),
    ApiKey.OFFSET_COMMIT: (2, 9),
    ApiKey.OFFSET_FETCH: (1, 9),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 6),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.OFFSET_DELETE: (0, 0),
    # KIP-848 consumer groups (v1: the client names its member, KIP-1082, and may subscribe
    # by regular expression)
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 1),
    # Client quotas (KIP-546), user and client-id entities
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ApiKey.ALTER_CLIENT_QUOTAS: (0, 1),
    # SASL (KIP-43, KIP-152, KIP-368). SaslHandshake v0 (raw tokens after it, no Kafka
    # framing) is advertised but refused, as Produce v0-2 above: librdkafka up to 2.11
    # (Debian's kcat) wants v0 in the range before it uses SASL; clients pick v1.
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    # ACLs (KIP-290 prefixed patterns from v1; v0 is gone from Kafka 4, KIP-896)
    ApiKey.DESCRIBE_ACLS: (1, 3),
    ApiKey.CREATE_ACLS: (1, 3),
    ApiKey.DELETE_ACLS: (1, 3),
    # SCRAM credentials (KIP-554)
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    # Transactions as transaction.version 1 (no KIP-890 part 2: EndTxn v5, Produce v12,
    # AddOffsetsToTxn v4 and TxnOffsetCommit v4+ are not offered).
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 5),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 3),
    ApiKey.END_TXN: (0, 4),
    ApiKey.TXN_OFFSET_COMMIT: (0, 3),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
}


# Feature flags in ApiVersions v3+ (KIP-584): name -> (min, max) level this broker supports.
# Only what is implemented: KIP-848 consumer groups (group.version 1), no KIP-890 part 2
# transactions (transaction.version 0). Mink is not KRaft, so it has no metadata.version or
# kraft.version.
SUPPORTED_FEATURES: dict[str, tuple[int, int]] = {
    "group.version": (0, 1),
    "transaction.version": (0, 0),
}
# name -> finalized level (Kafka lists no feature finalized at 0).
FINALIZED_FEATURES: dict[str, int] = {"group.version": 1}


# Served only on the inter-broker listener and never advertised: Envelope (KIP-590), which
# carries a request one node forwards to another. Kafka's brokers do not advertise it either
# (it lives on the controller listener, `"listeners": ["controller"]`), so a client never
# sees it; a node knows its peers speak v0, the only version.
PRIVILEGED: dict[int, tuple[int, int]] = {ApiKey.ENVELOPE: (0, 0)}

# The APIs that may arrive inside an Envelope: the coordinator actions a node forwards
# (Kafka's `forwardable` flag). Never Envelope itself: an Envelope inside an Envelope is
# refused.
FORWARDABLE: frozenset[int] = frozenset({
    ApiKey.PRODUCE,  # partitions of a Produce another node leads (produce forwarding)
    ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS,
    ApiKey.ELECT_LEADERS, ApiKey.ALTER_PARTITION_REASSIGNMENTS,
    # requests of a group or transactional id another node coordinates (coordinator
    # forwarding)
    ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP,
    ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.OFFSET_DELETE, ApiKey.DESCRIBE_GROUPS,
    ApiKey.DELETE_GROUPS, ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.CONSUMER_GROUP_DESCRIBE,
    ApiKey.TXN_OFFSET_COMMIT, ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN,
    ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN, ApiKey.DESCRIBE_TRANSACTIONS,
})


def privileged(api_key: int, api_version: int) -> bool:
    span = PRIVILEGED.get(api_key)
    return span is not None and span[0] <= api_version <= span[1]


def advertised(api_key: int, api_version: int) -> bool:
    span = ADVERTISED.get(api_key)
    return span is not None and span[0] <= api_version <= span[1]
