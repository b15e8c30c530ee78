"""Consumer lag reads: the high watermarks (committed ends) of many partitions in one read,
what a group coordinator measures its groups' lag against for partitions it does not lead;
and every group's committed offsets with their partitions' high watermarks, for
`mink cluster status`."""

from __future__ import annotations

from mink.storage.controlplane.postgres import READ, MetadataStore

SQL_GROUP_LAG = """
SELECT o.group_id, o.topic, o.partition, o.committed_offset, p.committed_end
  FROM group_offsets AS o
  JOIN topics AS t ON t.name = o.topic AND t.deleted_at IS NULL
  JOIN partitions AS p ON p.topic_id = t.topic_id AND p.partition = o.partition
 ORDER BY o.group_id, o.topic, o.partition"""
SQL_HIGH_WATERMARKS = """
SELECT t.name, p.partition, p.committed_end
  FROM unnest(%s::text[], %s::int[]) AS w(name, partition)
  JOIN topics AS t ON t.name = w.name AND t.deleted_at IS NULL
  JOIN partitions AS p ON p.topic_id = t.topic_id AND p.partition = w.partition"""


async def high_watermarks(store: MetadataStore,
                          partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """(topic name, partition) -> committed end; unknown partitions are left out."""
    if not partitions:
        return {}
    rows = await store.fetch_all(READ, SQL_HIGH_WATERMARKS,
                            ([t for t, _ in partitions], [p for _, p in partitions]))
    return {(name, partition): end for name, partition, end in rows}


async def group_lag(store: MetadataStore) -> list[tuple[str, str, int, int, int]]:
    """(group, topic, partition, committed offset, high watermark) of every committed offset
    of a partition that exists, as PostgreSQL has them (what a new coordinator would load)."""
    return [tuple(r) for r in await store.fetch_all(READ, SQL_GROUP_LAG)]
