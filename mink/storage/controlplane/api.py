"""The control plane's face: the errors of every epoch-checked operation (one hierarchy)
and the structs they take and return. `postgres.MetadataStore` implements the operations on
PostgreSQL; nothing outside `mink.storage.controlplane` needs to know SQL.

Errors: `MetadataError` and subclasses. `MetadataUnavailable` is retriable: PostgreSQL
could not be reached and nothing was written, except for its subclass `OutcomeUnknown`: a
write lost its connection after it was sent and may or may not have been committed (read
the outcome back; every write is keyed so that repeating it is safe).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec

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
    "StreamState",
    "ProducerStateUpdate",
    "WalRange",
    "WalObject",
    "RangeOutcome",
    "CommitOutcome",
    "IndexRow",
    "ProducerState",
    "Change",
]

# ---------------------------------------------------------------------------------------------
# Errors

class MetadataError(Exception):
    """Base of the metadata store's errors."""


class MetadataUnavailable(MetadataError):
    """PostgreSQL cannot be reached now; retriable. Nothing was written."""


class OutcomeUnknown(MetadataUnavailable):
    """The connection was lost (or the operation timed out) after a write was sent: it may or
    may not have been committed. Never guess: read the outcome back."""


class MetadataRejected(MetadataError):
    """PostgreSQL refused the statement with an error of its own (a data exception, a
    constraint): the transaction was rolled back, nothing was written, and sending the same
    statement again fails the same way. Not retriable as it is."""


class StaleEpoch(MetadataError):
    """Refused: an epoch the operation carries is not current. `reason` says which."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class LeaderMoved(MetadataError):
    """OpenStream refused: the node is not the partition's leader at that leader epoch.
    reason: not_leader | stale_leader_epoch | unknown_leader_epoch."""

    def __init__(self, reason: str, leader_node: int | None, leader_epoch: int | None):
        super().__init__(f"{reason} (leader {leader_node} at epoch {leader_epoch})")
        self.reason = reason
        self.leader_node = leader_node
        self.leader_epoch = leader_epoch


class TopicExists(MetadataError):
    pass


class UnknownTopic(MetadataError):
    """Unknown (or deleted) topic or partition."""


class InvalidPartitions(MetadataError):
    pass


class UnknownNode(MetadataError):
    pass


class NodeIdInUse(MetadataError):
    """register_node refused: another process (incarnation) renews this node id right now."""

    def __init__(self, message: str, detail: dict[str, Any]):
        super().__init__(message)
        self.incarnation = detail.get("incarnation")
        self.host = detail.get("host")
        self.port = detail.get("port")
        self.renewed_s_ago = detail.get("renewed_s_ago")


class NodeAlive(MetadataError):
    """fence_node refused: the node is live at the epoch the caller saw."""


# ---------------------------------------------------------------------------------------------
# Structs (results and arguments)

class NodeInfo(msgspec.Struct, frozen=True):
    node_id: int
    epoch: int
    host: str
    port: int
    rack: str | None
    expires_at: datetime | None  # None once the node left
    live: bool = True
    # Its advertised listeners (sql/0019): (name, security protocol, host, port); in the view
    endpoints: list[tuple[str, str, str, int]] = []
    # Draining (sql/0027): None, 'shutdown' (a clean stop) or 'operator' (`mink cluster
    # drain`); a draining node is given no new work and its partitions are moved away.
    draining: str | None = None


class LeaseInfo(msgspec.Struct, frozen=True):
    scope: str
    holder: int | None
    holder_epoch: int | None
    epoch: int                    # lease epoch
    expires_at: datetime | None   # None once released / voided
    live: bool                    # held now (expires_at > now() on PostgreSQL's clock)


class TopicRecord(msgspec.Struct, frozen=True):
    topic_id: uuid.UUID
    name: str
    partitions: int
    config: dict[str, Any]
    created_at: datetime


class PartitionRecord(msgspec.Struct, frozen=True, array_like=True):
    partition: int
    leader_node: int | None
    leader_epoch: int
    stream_state: str               # 'open' | 'closed'
    opened_by_node: int | None      # the last opener (kept after a close)
    opened_by_epoch: int | None     # its node epoch
    open_leader_epoch: int | None   # the leader epoch it opened at


class TopicView(msgspec.Struct, frozen=True):
    topic_id: uuid.UUID
    name: str
    config: dict[str, Any]
    partitions: list[PartitionRecord]


class View(msgspec.Struct, frozen=True):
    """A consistent snapshot (one statement) of the control-plane state."""
    version: int                 # view version: the last change-log row included
    cluster_id: str
    coordinator: int | None      # holder of the live coordinator lease
    nodes: list[NodeInfo]        # live nodes
    topics: list[TopicView]      # live topics, by name


class ViewDelta(msgspec.Struct, frozen=True):
    """What changed since a view version (`view_since`), from one snapshot."""
    version: int
    cluster_id: str
    coordinator: int | None
    nodes: list[NodeInfo]        # live nodes, always (liveness changes with time alone)
    # True: `changed` names every topic the change log names since the version and `topics`
    # holds those still live; False: `topics` is every live topic (a whole view).
    complete: bool
    changed: list[uuid.UUID] | None
    topics: list[TopicView]


class StreamState(msgspec.Struct, frozen=True):
    topic_id: uuid.UUID
    partition: int
    leader_node: int | None
    leader_epoch: int
    stream_state: str
    opened_by_node: int | None
    opened_by_epoch: int | None
    open_leader_epoch: int | None
    log_start_offset: int
    committed_end: int           # high watermark = log end offset
    max_timestamp: int = -1      # the largest batch max timestamp committed (-1: none)


class ProducerStateUpdate(msgspec.Struct):
    producer_id: int
    producer_epoch: int
    state: bytes                 # opaque here


class WalRange(msgspec.Struct):
    """The batches of one partition in one WAL object (adjacent batches merged)."""
    topic_id: uuid.UUID
    partition: int
    leader_epoch: int
    base_offset: int
    last_offset: int
    byte_start: int
    byte_end: int
    max_timestamp: int
    batch_count: int
    producer_states: list[ProducerStateUpdate] = []


class WalObject(msgspec.Struct):
    key: str
    size: int
    ranges: list[WalRange]


class RangeOutcome(msgspec.Struct, frozen=True, array_like=True):
    accepted: bool
    reason: str | None           # None when accepted
    committed_end: int | None    # the partition's committed end after this range was decided


class CommitOutcome(msgspec.Struct, frozen=True):
    key: str
    committed: bool              # at least one range accepted
    ranges: list[RangeOutcome]   # one per WalObject.ranges, same order
    repeated: bool = False       # the stored outcome of an earlier call with this key
    reason: str | None = None    # whole object refused: stale_node_epoch | abandoned


class IndexRow(msgspec.Struct, frozen=True):
    base_offset: int
    last_offset: int
    object_key: str
    byte_start: int
    byte_end: int
    max_timestamp: int
    batch_count: int


class ProducerState(msgspec.Struct, frozen=True):
    producer_id: int
    producer_epoch: int
    state: bytes
    updated_at: datetime


class Change(msgspec.Struct, frozen=True):
    version: int
    kind: str   # node_registered node_left node_fenced topic_created topic_deleted
                # partitions_created leader_changed
    body: dict[str, Any]
    at: datetime
