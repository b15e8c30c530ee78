"""The lifecycle's operations on the metadata store: retention, DeleteRecords, topic config
changes, collection and metadata pruning. Each is one SQL function of
`mink/storage/controlplane/sql/0008_lifecycle.sql` (one statement, one transaction, fenced by
the epoch it carries), run through the metadata store's one-statement primitive
(`MetadataStore.fetch_one` / `fetch_all`: its pool, error mapping and retries).
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from mink.storage import controlplane as md
from mink.storage.controlplane import MetadataStore, StaleEpoch
from mink.storage.controlplane.postgres import IDEMPOTENT, READ, WRITE

LOG_START_CHANNEL = "mink_log_start"

SQL_APPLY_RETENTION = """
SELECT partition, log_start_offset
  FROM mink_apply_retention(%s::uuid, %s::text, %s::int, %s::bigint, %s::bigint, %s::bigint)"""
SQL_DELETE_RECORDS = """
SELECT error, low_watermark
  FROM mink_delete_records(%s::uuid, %s::int, %s::int, %s::int, %s::bigint, %s::bigint)"""
SQL_ALTER_TOPIC_CONFIG = "SELECT mink_alter_topic_config(%s::text, %s::jsonb, %s::jsonb)"
SQL_TOPIC_CONFIG = "SELECT config FROM topics WHERE name = %s AND deleted_at IS NULL"
SQL_QUEUE_UNREFERENCED = "SELECT mink_queue_unreferenced(%s::bigint, %s::int)"
SQL_DUE_DELETIONS = """
SELECT key FROM objects_to_delete ORDER BY queued_at, key LIMIT %s"""
SQL_DELETIONS_DONE = "DELETE FROM objects_to_delete WHERE key = ANY (%s::text[])"
SQL_PRUNE_METADATA = """
SELECT kind, deleted FROM mink_prune_metadata(%s::float8, %s::bigint, %s::bigint, %s::int)"""
SQL_LED_LOG_STARTS = """
SELECT topic_id, partition, log_start_offset FROM partitions
 WHERE leader_node = %s AND log_start_offset > 0"""
SQL_UNDECIDED_KEYS = """
SELECT k FROM unnest(%s::text[]) AS k
 WHERE NOT EXISTS (SELECT 1 FROM wal_objects AS w WHERE w.key = k)"""
SQL_WAL_MARKS = """
SELECT node_epoch, through_seq, complete FROM wal_settled
 WHERE node_id = %s AND node_epoch < %s ORDER BY node_epoch"""
SQL_MARK_WAL_DECIDED = """
INSERT INTO wal_settled AS w (node_id, node_epoch, through_seq) VALUES (%s, %s, %s)
ON CONFLICT (node_id, node_epoch) DO UPDATE
   SET through_seq = greatest(w.through_seq, excluded.through_seq)
RETURNING node_epoch"""
SQL_MARK_WAL_SETTLED = """
WITH marked AS (
    INSERT INTO wal_settled AS w (node_id, node_epoch, complete) VALUES (%(node)s, %(epoch)s, true)
    ON CONFLICT (node_id, node_epoch) DO UPDATE SET complete = true
    RETURNING node_epoch)
DELETE FROM wal_settled WHERE node_id = %(node)s AND node_epoch < %(epoch)s
RETURNING node_epoch"""
SQL_LOG_START = """
SELECT log_start_offset FROM partitions WHERE topic_id = %s AND partition = %s"""

_json = msgspec.json.Encoder()


class DeleteRecordsRefused(md.MetadataError):
    """reason: unknown_partition | not_leader | offset_out_of_range."""

    def __init__(self, reason: str, low_watermark: int):
        super().__init__(reason)
        self.reason = reason
        self.low_watermark = low_watermark


class ConfigChanged(md.MetadataError):
    """The topic's config moved since it was read: read it again and retry."""


async def apply_retention(store: MetadataStore, topic_id: uuid.UUID, scope: str, node_id: int,
                          lease_epoch: int, retention_ms: int,
                          retention_bytes: int) -> dict[int, int]:
    """Retention of one topic under its writer lease: partition -> new log start, for the
    partitions whose log start moved. StaleEpoch('lease_lost') unless node_id holds `scope`
    at `lease_epoch` now. Safe to repeat (log starts only move forward)."""
    rows = await store.fetch_all(IDEMPOTENT, SQL_APPLY_RETENTION, (
        topic_id, scope, node_id, lease_epoch, retention_ms, retention_bytes))
    return {partition: start for partition, start in rows}


async def delete_records(store: MetadataStore, topic_id: uuid.UUID, partition: int,
                         leader_epoch: int, node_id: int, node_epoch: int,
                         offset: int) -> int:
    """DeleteRecords on the partition's leader: the new low watermark (log start). -1 means
    the high watermark. DeleteRecordsRefused otherwise. Safe to repeat."""
    row = await store.fetch_one(IDEMPOTENT, SQL_DELETE_RECORDS, (
        topic_id, partition, leader_epoch, node_id, node_epoch, offset))
    assert row is not None
    error, low_watermark = row
    if error is not None:
        raise DeleteRecordsRefused(error, low_watermark)
    return low_watermark


async def topic_config(store: MetadataStore, name: str) -> dict[str, Any] | None:
    row = await store.fetch_one(READ, SQL_TOPIC_CONFIG, (name,))
    return None if row is None else row[0]


async def alter_topic_config(store: MetadataStore, name: str, expected: dict[str, Any],
                             config: dict[str, Any]) -> None:
    """Replace a topic's config if it still is `expected` (ConfigChanged otherwise;
    UnknownTopic if there is no such live topic). Writes a change-log row."""
    row = await store.fetch_one(WRITE, SQL_ALTER_TOPIC_CONFIG, (
        name, _json.encode(expected).decode(), _json.encode(config).decode()))
    assert row is not None
    if row[0] == "unknown_topic":
        raise md.UnknownTopic(name)
    if row[0] == "changed":
        raise ConfigChanged(name)


async def queue_unreferenced(store: MetadataStore, delay_ms: int, limit: int) -> list[str]:
    """Objects unreferenced for delay_ms (PostgreSQL's clock) go to the deletion queue."""
    return [r[0] for r in await store.fetch_all(IDEMPOTENT, SQL_QUEUE_UNREFERENCED,
                                                (delay_ms, limit))]


async def due_deletions(store: MetadataStore, limit: int) -> list[str]:
    return [r[0] for r in await store.fetch_all(READ, SQL_DUE_DELETIONS, (limit,))]


async def deletions_done(store: MetadataStore, keys: list[str]) -> None:
    await store.fetch_all(IDEMPOTENT, SQL_DELETIONS_DONE + " RETURNING key", (keys,))


async def prune_metadata(store: MetadataStore, *, keep_s: float, change_log_keep: int,
                         producer_expiration_ms: int, limit: int) -> dict[str, int]:
    rows = await store.fetch_all(IDEMPOTENT, SQL_PRUNE_METADATA, (
        keep_s, change_log_keep, producer_expiration_ms, limit))
    return {kind: deleted for kind, deleted in rows}


async def led_log_starts(store: MetadataStore,
                         node_id: int) -> list[tuple[uuid.UUID, int, int]]:
    """(topic id, partition, log start) of the partitions `node_id` leads, where not 0."""
    return [tuple(r) for r in await store.fetch_all(READ, SQL_LED_LOG_STARTS, (node_id,))]


async def undecided_keys(store: MetadataStore, keys: list[str]) -> list[str]:
    """The keys CommitWal (or an abandonment) never decided on; a plain read, no locks."""
    return [r[0] for r in await store.fetch_all(READ, SQL_UNDECIDED_KEYS, (keys,))]


async def wal_marks(store: MetadataStore, node_id: int,
                    below_epoch: int) -> tuple[int, dict[int, int]]:
    """What is known of `node_id`'s WAL objects of epochs below `below_epoch`: the newest
    epoch through which every one is decided (0: none), and of later epochs, the sequence
    number through which each one is (see wal_settled in sql/0009)."""
    complete_through, seqs = 0, {}
    for epoch, seq, complete in await store.fetch_all(READ, SQL_WAL_MARKS, (node_id, below_epoch)):
        if complete:
            complete_through = max(complete_through, epoch)
        seqs[epoch] = seq
    return complete_through, {e: s for e, s in seqs.items() if e > complete_through}


async def mark_wal_decided(store: MetadataStore, node_id: int, node_epoch: int,
                           through_seq: int) -> None:
    """The writer of (node_id, node_epoch): each of its objects up to `through_seq` is
    decided in PostgreSQL (committed, refused or abandoned)."""
    await store.fetch_all(IDEMPOTENT, SQL_MARK_WAL_DECIDED, (node_id, node_epoch, through_seq))


async def mark_wal_settled(store: MetadataStore, node_id: int, through_epoch: int) -> None:
    """Every WAL object of `node_id`'s epochs up to `through_epoch` is decided."""
    await store.fetch_all(IDEMPOTENT, SQL_MARK_WAL_SETTLED, {"node": node_id,
                                                        "epoch": through_epoch})


async def log_start(store: MetadataStore, topic_id: uuid.UUID, partition: int) -> int | None:
    row = await store.fetch_one(READ, SQL_LOG_START, (topic_id, partition))
    return None if row is None else row[0]


__all__ = [
    "LOG_START_CHANNEL", "DeleteRecordsRefused", "ConfigChanged", "StaleEpoch",
    "apply_retention", "delete_records", "topic_config", "alter_topic_config",
    "queue_unreferenced", "due_deletions", "deletions_done", "prune_metadata",
    "led_log_starts", "log_start", "undecided_keys", "wal_marks", "mark_wal_decided",
    "mark_wal_settled",
]
