"""The cluster at a glance, for the console: every partition's high watermark and every
consumer group with its members and committed offsets, two plain reads (no locks)."""

from __future__ import annotations

import msgspec

from mink.storage.controlplane.groups import StoredMember
from mink.storage.controlplane.postgres import READ, MetadataStore
from mink.storage.pgtext import from_pg

SQL_HIGH_WATERMARKS_ALL = """
SELECT t.name, p.partition, p.committed_end, p.log_start_offset
  FROM partitions AS p JOIN topics AS t ON t.topic_id = p.topic_id AND t.deleted_at IS NULL"""
SQL_GROUPS = """
SELECT g.group_id, g.protocol_type, g.generation, g.members::text,
       coalesce((SELECT json_agg(json_build_array(o.topic, o.partition, o.committed_offset)
                                 ORDER BY o.topic, o.partition)
                   FROM group_offsets AS o WHERE o.group_id = g.group_id), '[]')::text
  FROM consumer_groups AS g ORDER BY g.group_id"""


class GroupOverview(msgspec.Struct):
    group_id: str
    protocol_type: str | None
    generation: int
    members: list[StoredMember]
    offsets: list[tuple[str, int, int]]  # (topic, partition, committed offset)


_members = msgspec.json.Decoder(list[StoredMember])
_offsets = msgspec.json.Decoder(list[tuple[str, int, int]])


async def high_watermarks_all(store: MetadataStore) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (high watermark, log start) of every partition."""
    rows = await store.fetch_all(READ, SQL_HIGH_WATERMARKS_ALL)
    return {(name, partition): (end, start) for name, partition, end, start in rows}


async def groups(store: MetadataStore) -> list[GroupOverview]:
    out = []
    for group_id, protocol_type, generation, members, offsets in await store.fetch_all(
            READ, SQL_GROUPS):
        out.append(GroupOverview(from_pg(group_id), protocol_type, generation,
                                 _members.decode(members),
                                 [(from_pg(t), p, o) for t, p, o in _offsets.decode(offsets)]))
    return out
