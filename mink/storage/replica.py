"""A read-only view of a partition another node leads: what a non-leader serves consumer
Fetches from (issue 25, "fetch through any node").

Committed data is all in the object store and described by index rows in PostgreSQL, so a
node that does not lead a partition can read it as the leader reads what left its tail
cache: `PartitionLog.read` with an empty tail, through `ReadCaches.read_cold` (the node's
block, footer and stream-row caches, bounded in bytes). The bytes are those of the WAL and
stream objects, the very batches the leader returns.

The committed end (high watermark) and log start are the leader's committed ones as
PostgreSQL has them (`partitions.committed_end`, `log_start_offset`): they are only as fresh
as the last time they were read (`learned`), which the broker's poller does (see
mink/broker/server/replica_reads.py). The last stable offset is not known here (the open
transactions live in the leader's memory): `last_stable_offset` is -1, Kafka's "unknown",
and read_committed fetches are not served from a view."""

from __future__ import annotations

import uuid

from mink.storage.log import NotLeader, PartitionLog, ReadCaches

UNKNOWN_OFFSET = -1


class _NoWal:
    """A view never appends: its WAL refuses."""

    def add(self, *args, **kwargs) -> None:  # pragma: no cover - append refuses first
        raise NotLeader("a replica view is read-only")


class ReplicaView(PartitionLog):
    def __init__(self, topic_id: uuid.UUID, partition: int, leader_epoch: int,
                 committed_end: int, log_start_offset: int, caches: ReadCaches,
                 now: float) -> None:
        super().__init__(topic_id, partition, leader_epoch, committed_end, log_start_offset,
                         _NoWal(), caches)
        self.learned_at = now  # when the ends were last read from PostgreSQL
        self.used_at = now     # when a fetch last read through this view

    def append(self, *args, **kwargs):
        raise NotLeader("this node does not lead the partition")

    @property
    def last_stable_offset(self) -> int:
        return UNKNOWN_OFFSET

    def learned(self, committed_end: int, log_start_offset: int, leader_epoch: int,
                now: float) -> None:
        """The ends PostgreSQL has now: a longer log wakes the fetches waiting on it. Ends
        only move forward (a read of an older snapshot never takes a view back)."""
        self.learned_at = now
        self.leader_epoch = max(self.leader_epoch, leader_epoch)
        if log_start_offset > self.log_start_offset:
            self.log_start_offset = log_start_offset
        if committed_end > self.committed_end:
            self.committed_end = self.next_offset = committed_end
            self._wake()
