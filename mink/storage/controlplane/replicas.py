"""The committed ends of partitions read by nodes that do not lead them (replica views,
mink/storage/replica.py): one read for many partitions, what a node's replica poller asks
once per poll interval for the partitions its fetches wait on."""

from __future__ import annotations

import uuid

from mink.storage.controlplane.postgres import READ, MetadataStore

SQL_PARTITION_ENDS = """
SELECT p.topic_id, p.partition, p.committed_end, p.log_start_offset, p.leader_epoch
  FROM unnest(%s::uuid[], %s::int[]) AS w(topic_id, partition)
  JOIN partitions AS p ON p.topic_id = w.topic_id AND p.partition = w.partition"""


async def partition_ends(store: MetadataStore, keys: list[tuple[uuid.UUID, int]]
                         ) -> dict[tuple[uuid.UUID, int], tuple[int, int, int]]:
    """(topic id, partition) -> (committed end, log start, leader epoch), one snapshot;
    unknown partitions are left out."""
    if not keys:
        return {}
    rows = await store.fetch_all(READ, SQL_PARTITION_ENDS,
                                 ([t for t, _ in keys], [p for _, p in keys]))
    return {(topic_id, partition): (end, start, epoch)
            for topic_id, partition, end, start, epoch in rows}
