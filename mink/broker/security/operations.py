"""KIP-430 authorized operations: the bit field DescribeGroups, DescribeCluster, Metadata and
DescribeTopicPartitions return when a client asks for it.

Without an authorizer every principal may do everything: each resource answers every
operation Kafka defines for its type (Kafka's `AclEntry.supportedOperations`), never ALL or
ANY. With one, `Authorizer.*_operations` (authorizer.py) answers the operations allowed.
"""

from __future__ import annotations

import enum


class AclOperation(enum.IntEnum):
    """Kafka's AclOperation codes: bit n of the field means operation n is allowed."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


# "not asked for": Kafka's AUTHORIZED_OPERATIONS_OMITTED
OMITTED = -(2**31)

_TOPIC = (AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE,
          AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
          AclOperation.ALTER_CONFIGS)
_GROUP = (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE)
_CLUSTER = (AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
            AclOperation.DESCRIBE)


# The operations each resource type supports (Kafka's AclEntry.supportedOperations)
TOPIC_SUPPORTED = _TOPIC
GROUP_SUPPORTED = _GROUP
CLUSTER_SUPPORTED = _CLUSTER


def _bits(operations) -> int:
    return sum(1 << op for op in operations)


TOPIC_OPERATIONS = _bits(_TOPIC)
GROUP_OPERATIONS = _bits(_GROUP)
CLUSTER_OPERATIONS = _bits(_CLUSTER)


def topic_operations(asked: bool) -> int:
    return TOPIC_OPERATIONS if asked else OMITTED


def group_operations(asked: bool) -> int:
    return GROUP_OPERATIONS if asked else OMITTED


def cluster_operations(asked: bool) -> int:
    return CLUSTER_OPERATIONS if asked else OMITTED
