"""High watermarks (committed ends) of many partitions in one read: what consumer lag is
measured against for partitions this node does not lead."""

from __future__ import annotations

from mink.storage.controlplane.postgres import READ, MetadataStore

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
    rows = await store._all(READ, SQL_HIGH_WATERMARKS,
                            ([t for t, _ in partitions], [p for _, p in partitions]))
    return {(name, partition): end for name, partition, end in rows}
