"""Consumer groups in PostgreSQL: group state and committed offsets, fenced by the leader
epoch of the group's partition of `__consumer_offsets`.

Every write carries a `Fence` (that partition, its leader epoch, the writing node and its
node epoch) and is refused with `NotGroupCoordinator` unless the node is that partition's leader at
that leader epoch (checked in the same statement; see `sql/0003_groups.sql`). Each
operation is one statement, one round trip, run through the MetadataStore's pool.

Client strings are stored exactly, whatever characters they hold: the text columns through
`pgtext` (PostgreSQL text cannot hold NUL), the members as `json` (which, unlike jsonb, keeps
\u0000), byte fields base64 inside it (see `migrations/0007_exact_fields.sql`).

Errors besides NotGroupCoordinator are the MetadataStore's: MetadataUnavailable (nothing written)
and OutcomeUnknown (a write may or may not have happened; every write here may be repeated).
"""

from __future__ import annotations

import uuid

import msgspec

from mink.storage.controlplane.api import MetadataError
from mink.storage.controlplane.postgres import IDEMPOTENT, READ, MetadataStore
from mink.storage.pgtext import from_pg, to_pg

__all__ = ["Fence", "StoredMember", "StoredOffset", "StoredGroup", "GroupStore",
           "NotGroupCoordinator", "OffsetsExpiry", "StoredConsumerGroup"]


class NotGroupCoordinator(MetadataError):
    """Refused: the writer does not lead the group's partition at the leader epoch it gave."""


class Fence(msgspec.Struct, frozen=True):
    topic_id: uuid.UUID   # of __consumer_offsets
    partition: int        # the group's partition of it
    leader_epoch: int
    node_id: int
    node_epoch: int

    def params(self) -> tuple:
        return (self.topic_id, self.partition, self.leader_epoch, self.node_id,
                self.node_epoch)


class StoredMember(msgspec.Struct):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""


class StoredOffset(msgspec.Struct, array_like=True):
    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None
    commit_timestamp: int = -1  # ms since the epoch, PostgreSQL's clock


class StoredGroup(msgspec.Struct):
    group_id: str
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation: int = 0
    leader: str | None = None
    members: list[StoredMember] = []
    offsets: list[StoredOffset] = []


class OffsetsExpiry(msgspec.Struct):
    """What an expiry round did to one group (see mink_expire_group_offsets, 0009)."""
    coordinator: bool
    stale: bool = False            # the stored state still has members: write Empty again
    expired: int = 0
    kept: list[tuple[str, int]] = []
    group_deleted: bool = False


class StoredConsumerGroup(msgspec.Struct):
    """A KIP-848 consumer group's state (sql/0017): `state` is the coordinator's own json
    document (mink/broker/groups/consumer_group.py), stored and loaded as it is."""
    group_id: str
    group_epoch: int
    state: str


_members_encoder = msgspec.json.Encoder()
_expiry_decoder = msgspec.json.Decoder(OffsetsExpiry)
_groups_decoder = msgspec.json.Decoder(list[StoredGroup])

SQL_LOAD_PARTITION = """
SELECT coalesce(json_agg(json_build_object(
           'group_id', g.group_id, 'protocol_type', g.protocol_type,
           'protocol_name', g.protocol_name, 'generation', g.generation, 'leader', g.leader,
           'members', g.members,
           'offsets', coalesce((
               SELECT json_agg(json_build_array(
                          o.topic, o.partition, o.committed_offset, o.leader_epoch, o.metadata,
                          (extract(epoch FROM o.committed_at) * 1000)::bigint)
                          ORDER BY o.topic, o.partition)
                 FROM group_offsets AS o WHERE o.group_id = g.group_id), '[]'))
           ORDER BY g.group_id), '[]')::text
  FROM consumer_groups AS g WHERE g.coordinator_partition = %s"""
SQL_STORE_GROUP = """
SELECT mink_store_group(%s::uuid, %s::int, %s::int, %s::int, %s::bigint, %s::text, %s::text,
                        %s::text, %s::int, %s::text, %s::json)"""
SQL_COMMIT_OFFSETS = """
SELECT mink_commit_offsets(%s::uuid, %s::int, %s::int, %s::int, %s::bigint, %s::text,
                           %s::text[], %s::int[], %s::bigint[], %s::int[], %s::text[])"""
SQL_DELETE_GROUPS = """
SELECT mink_delete_groups(%s::uuid, %s::int, %s::int, %s::int, %s::bigint, %s::text[])"""
SQL_DELETE_OFFSETS = """
SELECT mink_delete_offsets(%s::uuid, %s::int, %s::int, %s::int, %s::bigint, %s::text,
                           %s::text[], %s::int[])"""
SQL_EXPIRE_OFFSETS = """
SELECT mink_expire_group_offsets(%s::uuid, %s::int, %s::int, %s::int, %s::bigint, %s::text,
                                 %s::text, %s::text[], %s::bigint)::text"""


SQL_LOAD_CONSUMER_GROUPS = """
SELECT group_id, group_epoch, state::text FROM kip848_groups
 WHERE coordinator_partition = %s ORDER BY group_id"""
SQL_STORE_CONSUMER_GROUP = """
SELECT mink_store_consumer_group(%s::uuid, %s::int, %s::int, %s::int, %s::bigint, %s::text,
                                 %s::int, %s::json)"""
SQL_DROP_CONSUMER_GROUP = """
SELECT mink_drop_consumer_group(%s::uuid, %s::int, %s::int, %s::int, %s::bigint, %s::text)"""


class GroupStore:
    """The group coordinator's narrow interface to PostgreSQL."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata

    async def load(self, partition: int) -> list[StoredGroup]:
        """Every group of a partition of __consumer_offsets, with its committed offsets."""
        row = await self.metadata.fetch_one(READ, SQL_LOAD_PARTITION, (partition,))
        return [_from_pg(g) for g in _groups_decoder.decode(row[0])] if row else []

    async def load_consumer_groups(self, partition: int) -> list[StoredConsumerGroup]:
        """The KIP-848 consumer groups of a partition of __consumer_offsets (their offsets
        come with `load`)."""
        rows = await self.metadata.fetch_all(READ, SQL_LOAD_CONSUMER_GROUPS, (partition,))
        return [StoredConsumerGroup(from_pg(r[0]), r[1], r[2]) for r in rows]

    async def store_consumer_group(self, fence: Fence, group: StoredConsumerGroup) -> None:
        await self._fenced(SQL_STORE_CONSUMER_GROUP, (
            *fence.params(), to_pg(group.group_id), group.group_epoch, group.state))

    async def drop_consumer_group(self, fence: Fence, group_id: str) -> None:
        await self._fenced(SQL_DROP_CONSUMER_GROUP, (*fence.params(), to_pg(group_id)))

    async def store_group(self, fence: Fence, group: StoredGroup) -> None:
        """The state of a completed generation (its offsets are not touched)."""
        await self._fenced(SQL_STORE_GROUP, (
            *fence.params(), to_pg(group.group_id), to_pg(group.protocol_type),
            to_pg(group.protocol_name), group.generation, to_pg(group.leader),
            _members_encoder.encode(group.members).decode()))

    async def commit_offsets(self, fence: Fence, group_id: str,
                             offsets: list[StoredOffset]) -> None:
        """Upsert committed offsets; a (topic, partition) given twice keeps the last."""
        latest = {(o.topic, o.partition): o for o in offsets}
        rows = list(latest.values())
        await self._fenced(SQL_COMMIT_OFFSETS, (
            *fence.params(), to_pg(group_id), [to_pg(o.topic) for o in rows],
            [o.partition for o in rows], [o.offset for o in rows],
            [o.leader_epoch for o in rows], [to_pg(o.metadata) for o in rows]))

    async def delete_groups(self, fence: Fence, group_ids: list[str]) -> None:
        await self._fenced(SQL_DELETE_GROUPS, (*fence.params(),
                                                [to_pg(g) for g in group_ids]))

    async def delete_offsets(self, fence: Fence, group_id: str,
                             partitions: list[tuple[str, int]]) -> None:
        await self._fenced(SQL_DELETE_OFFSETS, (
            *fence.params(), to_pg(group_id), [to_pg(t) for t, _ in partitions],
            [p for _, p in partitions]))

    async def expire_offsets(self, fence: Fence, group_id: str, mode: str,
                             kept_topics: list[str], retention_ms: int) -> OffsetsExpiry:
        """KIP-211 expiry of one group's offsets; `mode` is 'empty', 'simple' or
        'subscribed' (then `kept_topics` are the topics its members subscribe to)."""
        row = await self.metadata.fetch_one(IDEMPOTENT, SQL_EXPIRE_OFFSETS, (
            *fence.params(), to_pg(group_id), mode, [to_pg(t) for t in kept_topics],
            retention_ms))
        result = _expiry_decoder.decode(row[0]) if row else OffsetsExpiry(False)
        if not result.coordinator:
            raise NotGroupCoordinator(f"not the leader of __consumer_offsets-{fence.partition} "
                                      f"at leader epoch {fence.leader_epoch}")
        result.kept = [(from_pg(t), p) for t, p in result.kept]
        return result

    async def _fenced(self, sql: str, params: tuple) -> None:
        row = await self.metadata.fetch_one(IDEMPOTENT, sql, params)
        if row is None or not row[0]:
            raise NotGroupCoordinator(f"not the leader of __consumer_offsets-{params[1]} at leader "
                                 f"epoch {params[2]} (node {params[3]} epoch {params[4]})")


def _from_pg(group: StoredGroup) -> StoredGroup:
    """The text columns back to the client's strings (members come verbatim from json)."""
    group.group_id = from_pg(group.group_id)
    group.protocol_type = from_pg(group.protocol_type)
    group.protocol_name = from_pg(group.protocol_name)
    group.leader = from_pg(group.leader)
    for offset in group.offsets:
        offset.topic = from_pg(offset.topic)
        offset.metadata = from_pg(offset.metadata)
    return group
