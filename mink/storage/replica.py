"""A read-only view of a partition another node leads: what a non-leader serves consumer
Fetches from (issue 25, "fetch through any node").

Committed data is all in the object store and described by index rows in PostgreSQL, so a
node that does not lead a partition can read it as the leader reads what left its tail
cache: `PartitionLog.read` with an empty tail, through `ReadCaches.read_cold` (the node's
block cache, stream object readers and kept index rows, all bounded). The bytes are those
of the WAL and stream objects, the very batches the leader returns.

The committed end (high watermark) and log start are the leader's committed ones as
PostgreSQL has them (`partitions.committed_end`, `log_start_offset`): they are only as fresh
as the last time they were read (`learned`), which the broker's poller does (see
mink/broker/server/replica_reads.py). The last stable offset too: the first offset of the
oldest ongoing transaction, which the WAL commit records in each producer's state with the
data (sql/0012), read in the same snapshot as the ends; so read_committed consumers are
served from a view as well, their aborted transactions from PostgreSQL's index
(mink/broker/transactions/read_committed.py reads it again when the view's end moved)."""

from __future__ import annotations

import uuid

from mink.storage.log import NotLeader, PartitionLog, ReadCaches


class _NoWal:
    """A view never appends: its WAL refuses."""

    def add(self, *args, **kwargs) -> None:  # pragma: no cover - append refuses first
        raise NotLeader("a replica view is read-only")


class ReplicaView(PartitionLog):
    def __init__(self, topic_id: uuid.UUID, partition: int, leader_epoch: int,
                 committed_end: int, log_start_offset: int, caches: ReadCaches,
                 now: float, first_unstable: int | None = None) -> None:
        super().__init__(topic_id, partition, leader_epoch, committed_end, log_start_offset,
                         _NoWal(), caches)
        self.learned_at = now  # when the ends were last read from PostgreSQL
        self.used_at = now     # when a fetch last read through this view
        self.first_unstable = first_unstable  # of the oldest ongoing transaction, or None

    def append(self, *args, **kwargs):
        raise NotLeader("this node does not lead the partition")

    @property
    def last_stable_offset(self) -> int:
        first = self.first_unstable
        return self.committed_end if first is None else min(first, self.committed_end)

    def learned(self, committed_end: int, log_start_offset: int, leader_epoch: int,
                now: float, first_unstable: int | None = None) -> None:
        """The ends PostgreSQL has now: a longer log wakes the fetches waiting on it. Ends
        only move forward (a read of an older snapshot never takes a view back); the first
        unstable offset is taken with an end at least as new as the view's."""
        self.learned_at = now
        if committed_end >= self.committed_end:
            self.first_unstable = first_unstable
        self.leader_epoch = max(self.leader_epoch, leader_epoch)
        if log_start_offset > self.log_start_offset:
            self.log_start_offset = log_start_offset
        if committed_end > self.committed_end:
            self.committed_end = self.next_offset = committed_end
            self._wake()
