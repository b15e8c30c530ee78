"""Transactions in PostgreSQL: the coordinator's state per transactional id (one fenced
compare-and-set per change), the verification of transactional batches (KIP-890), pending
markers, transactional offsets and the aborted-transaction index. The SQL and the order of a
commit are in `sql/0012_transactions.sql`.

Writes carry a `Fence` (the coordinating partition of `__transaction_state`, or for offsets
the group's partition of `__consumer_offsets`, at its leader epoch) as the groups' do.
"""

from __future__ import annotations

import uuid

import msgspec

from mink.storage.controlplane.api import MetadataError
from mink.storage.controlplane.groups import Fence
from mink.storage.controlplane.postgres import IDEMPOTENT, READ, MetadataStore
from mink.storage.pgtext import from_pg, to_pg

__all__ = ["TxnRecord", "TxnDescription", "PendingMarker", "TransactionStore", "NotTransactionCoordinator",
           "WriteConflict"]


class NotTransactionCoordinator(MetadataError):
    """Refused: the writer does not lead the coordinating partition at the epoch it gave."""


class WriteConflict(MetadataError):
    """The transaction's state changed since it was read (compare-and-set refused)."""


class TxnRecord(msgspec.Struct):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str
    version: int
    partitions: list[tuple[uuid.UUID, int]] = []
    pending_markers: int = 0


class TxnDescription(msgspec.Struct):
    """What DescribeTransactions answers of one transactional id."""
    transactional_id: str
    coordinator_partition: int
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str
    start_ms: int  # when its transaction started (ms since the epoch), -1 when none
    partitions: list[tuple[str, int]] = []  # (topic, partition) in or completing it


class PendingMarker(msgspec.Struct, frozen=True):
    topic_id: uuid.UUID
    partition: int
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


SQL_READ = """
SELECT t.producer_id, t.producer_epoch, t.timeout_ms, t.state, t.version,
       coalesce((SELECT array_agg(p.topic_id ORDER BY p.topic_id, p.partition)
                   FROM transaction_partitions AS p
                  WHERE p.transactional_id = t.transactional_id), '{}'),
       coalesce((SELECT array_agg(p.partition ORDER BY p.topic_id, p.partition)
                   FROM transaction_partitions AS p
                  WHERE p.transactional_id = t.transactional_id), '{}'),
       (SELECT count(*) FROM txn_markers AS m WHERE m.transactional_id = t.transactional_id)
  FROM transactions AS t WHERE t.transactional_id = %s"""
SQL_WRITE = """
SELECT mink_txn_write(%s::uuid, %s::int, %s::int, %s::int, %s::bigint, %s::text, %s::bigint,
                      %s::bigint, %s::int, %s::int, %s::text, %s::uuid[], %s::int[])"""
SQL_VERIFY = """
SELECT p.topic_id, p.partition
  FROM transactions AS t JOIN transaction_partitions AS p USING (transactional_id)
 WHERE t.producer_id = %s AND t.producer_epoch = %s AND t.state = 'Ongoing'
   AND (p.topic_id, p.partition) IN (SELECT * FROM unnest(%s::uuid[], %s::int[]))"""
SQL_TIMED_OUT = """
SELECT transactional_id FROM transactions
 WHERE coordinator_partition = ANY (%s::int[]) AND state = 'Ongoing'
   AND started_at + timeout_ms * interval '1 millisecond' < now()
 ORDER BY started_at LIMIT 100"""
SQL_EXPIRE = """
DELETE FROM transactions AS t
 WHERE t.coordinator_partition = ANY (%s::int[])
   AND t.state IN ('Empty', 'CompleteCommit', 'CompleteAbort')
   AND t.updated_at < now() - %s::bigint * interval '1 millisecond'
   AND NOT EXISTS (SELECT 1 FROM txn_markers AS m WHERE m.transactional_id = t.transactional_id)
   AND NOT EXISTS (SELECT 1 FROM txn_offsets AS o WHERE o.transactional_id = t.transactional_id)
RETURNING t.transactional_id"""
SQL_PENDING_MARKERS = """
SELECT m.topic_id, m.partition, m.producer_id, m.producer_epoch, m.commit, m.coordinator_epoch
  FROM txn_markers AS m
  JOIN partitions AS p ON p.topic_id = m.topic_id AND p.partition = m.partition
 WHERE p.leader_node = %s
 ORDER BY m.created_at LIMIT 1000"""
SQL_ABORTED = """
SELECT producer_id, first_offset, last_offset FROM aborted_transactions
 WHERE topic_id = %s AND partition = %s AND last_offset >= %s
 ORDER BY first_offset"""
SQL_TXN_OFFSET_COMMIT = """
SELECT mink_txn_offset_commit(%s::uuid, %s::int, %s::int, %s::int, %s::bigint, %s::text,
                              %s::bigint, %s::int, %s::text, %s::text[], %s::int[],
                              %s::bigint[], %s::int[], %s::text[])"""
SQL_GROUP_MARKER = """
SELECT mink_txn_group_marker(%s::uuid, %s::int, %s::int, %s::int, %s::bigint,
                             %s::bigint)::text"""
SQL_PENDING_OFFSETS = """
SELECT group_id, topic, partition FROM txn_offsets
 WHERE coordinator_partition = %s"""

SQL_DESCRIBE = """
SELECT t.transactional_id, t.coordinator_partition, t.producer_id, t.producer_epoch,
       t.timeout_ms, t.state,
       CASE WHEN t.state = 'Empty' OR t.started_at IS NULL THEN -1
            ELSE (extract(epoch FROM t.started_at) * 1000)::bigint END,
       coalesce((SELECT array_agg(x.name ORDER BY x.name, x.partition) FROM (
           SELECT tp.name, p.partition FROM transaction_partitions AS p
             JOIN topics AS tp USING (topic_id) WHERE p.transactional_id = t.transactional_id
           UNION
           SELECT tp.name, m.partition FROM txn_markers AS m
             JOIN topics AS tp USING (topic_id) WHERE m.transactional_id = t.transactional_id
       ) AS x), '{}'),
       coalesce((SELECT array_agg(x.partition ORDER BY x.name, x.partition) FROM (
           SELECT tp.name, p.partition FROM transaction_partitions AS p
             JOIN topics AS tp USING (topic_id) WHERE p.transactional_id = t.transactional_id
           UNION
           SELECT tp.name, m.partition FROM txn_markers AS m
             JOIN topics AS tp USING (topic_id) WHERE m.transactional_id = t.transactional_id
       ) AS x), '{}')
  FROM transactions AS t WHERE t.transactional_id = ANY (%s::text[])"""
SQL_LIST = """
SELECT transactional_id, producer_id, state FROM transactions
 WHERE coordinator_partition = ANY (%s::int[])
   AND (cardinality(%s::text[]) = 0 OR state = ANY (%s::text[]))
   AND (cardinality(%s::bigint[]) = 0 OR producer_id = ANY (%s::bigint[]))
   AND (%s::bigint < 0 OR started_at IS NULL
        OR started_at < now() - %s::bigint * interval '1 millisecond')
 ORDER BY transactional_id"""

_done_decoder = msgspec.json.Decoder(list[tuple[str, str, int, int, int, str | None, bool]])


class TransactionStore:
    """The transaction coordinator's narrow interface to PostgreSQL."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata

    async def read(self, transactional_id: str) -> TxnRecord | None:
        row = await self.metadata.fetch_one(READ, SQL_READ, (to_pg(transactional_id),))
        if row is None:
            return None
        pid, epoch, timeout_ms, state, version, topics, partitions, markers = row
        return TxnRecord(transactional_id, pid, epoch, timeout_ms, state, version,
                         list(zip(topics, partitions, strict=True)), markers)

    async def write(self, fence: Fence, transactional_id: str, expected_version: int,
                    producer_id: int, producer_epoch: int, timeout_ms: int, state: str,
                    add: list[tuple[uuid.UUID, int]] = ()) -> None:
        """Compare-and-set the state (expected_version -1: no row yet). Raises
        NotTransactionCoordinator or WriteConflict."""
        row = await self.metadata.fetch_one(IDEMPOTENT, SQL_WRITE, (
            *fence.params(), to_pg(transactional_id), expected_version, producer_id,
            producer_epoch, timeout_ms, state, [t for t, _ in add], [p for _, p in add]))
        outcome = row[0] if row else None
        if outcome == "not_coordinator":
            raise NotTransactionCoordinator(
                f"not the leader of __transaction_state-{fence.partition} at leader epoch "
                f"{fence.leader_epoch}")
        if outcome != "ok":
            raise WriteConflict(f"transaction {transactional_id!r} changed meanwhile")

    async def verify(self, producer_id: int, producer_epoch: int,
                     partitions: list[tuple[uuid.UUID, int]]) -> set[tuple[uuid.UUID, int]]:
        """The given partitions that the ongoing transaction of (producer id, epoch) lists."""
        rows = await self.metadata.fetch_all(READ, SQL_VERIFY, (
            producer_id, producer_epoch, [t for t, _ in partitions], [p for _, p in partitions]))
        return {(t, p) for t, p in rows}

    async def describe(self, transactional_ids: list[str]) -> dict[str, TxnDescription]:
        """DescribeTransactions: the stored state of each id that has one."""
        rows = await self.metadata.fetch_all(READ, SQL_DESCRIBE, (
            [to_pg(t) for t in transactional_ids],))
        out = {}
        for txn_id, partition, pid, epoch, timeout_ms, state, start_ms, topics, parts in rows:
            out[from_pg(txn_id)] = TxnDescription(
                from_pg(txn_id), partition, pid, epoch, timeout_ms, state, start_ms,
                [(from_pg(t), p) for t, p in zip(topics, parts, strict=True)])
        return out

    async def list(self, coordinator_partitions: list[int], states: list[str],
                   producer_ids: list[int], min_duration_ms: int = -1
                   ) -> list[tuple[str, int, str]]:
        """ListTransactions: (transactional id, producer id, state) of the ids coordinated
        by these partitions, filtered as Kafka filters (empty filter: all; a duration
        >= 0: only those whose transaction started longer ago than that)."""
        rows = await self.metadata.fetch_all(READ, SQL_LIST, (
            coordinator_partitions, states, states, producer_ids, producer_ids,
            min_duration_ms, min_duration_ms))
        return [(from_pg(t), pid, state) for t, pid, state in rows]

    async def timed_out(self, coordinator_partitions: list[int]) -> list[str]:
        rows = await self.metadata.fetch_all(READ, SQL_TIMED_OUT, (coordinator_partitions,))
        return [from_pg(r[0]) for r in rows]

    async def expire(self, coordinator_partitions: list[int], expiration_ms: int) -> list[str]:
        """Remove the ids of these partitions idle longer than `expiration_ms` with nothing
        under way (no open or deciding transaction, no marker or offsets pending): Kafka's
        transactional.id.expiration.ms. One statement: an id written meanwhile (its
        updated_at moves) is not matched, whoever coordinates it now."""
        rows = await self.metadata.fetch_all(IDEMPOTENT, SQL_EXPIRE, (
            coordinator_partitions, expiration_ms))
        return [from_pg(r[0]) for r in rows]

    async def pending_markers(self, node_id: int) -> list[PendingMarker]:
        """Markers due in partitions this node leads."""
        rows = await self.metadata.fetch_all(READ, SQL_PENDING_MARKERS, (node_id,))
        return [PendingMarker(*r) for r in rows]

    async def aborted(self, topic_id: uuid.UUID, partition: int,
                      from_offset: int) -> list[tuple[int, int, int]]:
        """(producer id, first offset, marker offset) of aborts ending at or after
        `from_offset`."""
        return [tuple(r) for r in await self.metadata.fetch_all(
            READ, SQL_ABORTED, (topic_id, partition, from_offset))]

    async def txn_offset_commit(self, fence: Fence, transactional_id: str, producer_id: int,
                                producer_epoch: int, group_id: str,
                                offsets: list[tuple[str, int, int, int, str | None]]) -> str:
        """'ok' or the Kafka error's name (see mink_txn_offset_commit)."""
        latest = {(o[0], o[1]): o for o in offsets}
        rows = list(latest.values())
        row = await self.metadata.fetch_one(IDEMPOTENT, SQL_TXN_OFFSET_COMMIT, (
            *fence.params(), to_pg(transactional_id), producer_id, producer_epoch,
            to_pg(group_id), [to_pg(o[0]) for o in rows], [o[1] for o in rows],
            [o[2] for o in rows], [o[3] for o in rows], [to_pg(o[4]) for o in rows]))
        return row[0] if row else "not_coordinator"

    async def group_marker(self, fence: Fence, producer_id: int
                           ) -> list[tuple[str, str, int, int, int, str | None, bool]]:
        """Take a marker of a group's partition: the decided offsets of the producer
        (group, topic, partition, offset, leader epoch, metadata, committed)."""
        row = await self.metadata.fetch_one(IDEMPOTENT, SQL_GROUP_MARKER, (
            *fence.params(), producer_id))
        if row is None or row[0] is None:
            raise NotTransactionCoordinator(
                f"not the leader of __consumer_offsets-{fence.partition}")
        return [(from_pg(g), from_pg(t), p, o, e, from_pg(m), c)
                for g, t, p, o, e, m, c in _done_decoder.decode(row[0])]

    async def pending_offsets(self, coordinator_partition: int) -> list[tuple[str, str, int]]:
        """(group, topic, partition) with transactional offsets not yet applied."""
        rows = await self.metadata.fetch_all(READ, SQL_PENDING_OFFSETS,
                                             (coordinator_partition,))
        return [(from_pg(g), from_pg(t), p) for g, t, p in rows]
