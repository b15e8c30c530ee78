"""The committed ends of partitions read by nodes that do not lead them (replica views,
mink/storage/replica.py): one read for many partitions, what a node's replica poller asks
once per poll interval for the partitions its fetches wait on."""

from __future__ import annotations

import uuid

from mink.storage.controlplane.postgres import READ, MetadataStore

# The first unstable offset: the first offset of the oldest ongoing transaction among the
# partition's producer states, as the WAL commit that wrote them left them (their
# transactional header, mink/storage/producer_state.py: magic 'MKT1', flags, then the
# ongoing transaction's first offset, -1 for none). In the same snapshot as the ends.
SQL_PARTITION_ENDS = """
SELECT p.topic_id, p.partition, p.committed_end, p.log_start_offset, p.leader_epoch,
       (SELECT min(mink_be_int(s.state, 6, 8)) FROM producer_state AS s
         WHERE s.topic_id = p.topic_id AND s.partition = p.partition
           AND length(s.state) >= 17
           AND substring(s.state FROM 1 FOR 4) = '\\x4d4b5431'::bytea
           AND mink_be_int(s.state, 6, 8) >= 0)
  FROM unnest(%s::uuid[], %s::int[]) AS w(topic_id, partition)
  JOIN partitions AS p ON p.topic_id = w.topic_id AND p.partition = w.partition"""


async def partition_ends(store: MetadataStore, keys: list[tuple[uuid.UUID, int]]
                         ) -> dict[tuple[uuid.UUID, int], tuple[int, int, int, int | None]]:
    """(topic id, partition) -> (committed end, log start, leader epoch, first unstable
    offset or None), one snapshot; unknown partitions are left out."""
    if not keys:
        return {}
    rows = await store.fetch_all(READ, SQL_PARTITION_ENDS,
                                 ([t for t, _ in keys], [p for _, p in keys]))
    return {(topic_id, partition): (end, start, epoch, unstable)
            for topic_id, partition, end, start, epoch, unstable in rows}
