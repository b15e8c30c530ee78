"""DescribeLogDirs' reads: the bytes each partition holds in the object store, from
`partition_stats` (kept by deltas in the transaction that adds or deletes index rows, so it
counts exactly the batches committed and not yet past retention)."""

from __future__ import annotations

import uuid

from mink.storage.controlplane.postgres import READ, MetadataStore

SQL_PARTITION_BYTES = """
SELECT s.topic_id, s.partition, s.indexed_bytes
  FROM partition_stats AS s
 WHERE s.topic_id = ANY(%s::uuid[])"""


async def partition_bytes(store: MetadataStore, topic_ids: list[uuid.UUID]
                          ) -> dict[tuple[uuid.UUID, int], int]:
    """(topic id, partition) -> bytes of its committed batches still indexed."""
    if not topic_ids:
        return {}
    rows = await store.fetch_all(READ, SQL_PARTITION_BYTES, (list(topic_ids),))
    return {(topic_id, partition): size for topic_id, partition, size in rows}
