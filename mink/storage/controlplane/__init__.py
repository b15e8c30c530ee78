"""The control plane: Mink's metadata, leases and epochs in PostgreSQL, behind a narrow
interface of epoch-checked operations (in the spirit of Inkless' control plane).

- `api`: the errors (one hierarchy) and the structs of the operations;
- `postgres`: `MetadataStore`, the operations on PostgreSQL (each one statement or one
  transaction that checks the epochs it carries; the fenced writes are SQL functions in
  `sql/0002_operations.sql`, read top to bottom there);
- `groups`: group state and committed offsets, fenced by the group partition's leader epoch;
- `listener`: the change-log wake-ups (LISTEN/NOTIFY);
- `migrate` and `sql/`: the numbered schema migrations applied at start-up.
"""

from mink.storage.controlplane.api import (
    MetadataError,
    MetadataUnavailable,
    OutcomeUnknown,
    MetadataRejected,
    StaleEpoch,
    LeaderMoved,
    TopicExists,
    UnknownTopic,
    InvalidPartitions,
    UnknownNode,
    NodeIdInUse,
    NodeAlive,
    NodeInfo,
    LeaseInfo,
    TopicRecord,
    PartitionRecord,
    TopicView,
    View,
    ViewDelta,
    StreamState,
    ProducerStateUpdate,
    WalRange,
    WalObject,
    RangeOutcome,
    CommitOutcome,
    IndexRow,
    ProducerState,
    Change,
)
from mink.storage.controlplane.listener import Listener
from mink.storage.controlplane.postgres import MetadataStore

__all__ = [
    "MetadataError",
    "MetadataUnavailable",
    "OutcomeUnknown",
    "MetadataRejected",
    "StaleEpoch",
    "LeaderMoved",
    "TopicExists",
    "UnknownTopic",
    "InvalidPartitions",
    "UnknownNode",
    "NodeIdInUse",
    "NodeAlive",
    "NodeInfo",
    "LeaseInfo",
    "TopicRecord",
    "PartitionRecord",
    "TopicView",
    "View",
    "ViewDelta",
    "StreamState",
    "ProducerStateUpdate",
    "WalRange",
    "WalObject",
    "RangeOutcome",
    "CommitOutcome",
    "IndexRow",
    "ProducerState",
    "Change",
    "Listener",
    "MetadataStore",
]
