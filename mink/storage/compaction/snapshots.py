"""KV tablet snapshots in the object store, referenced from PostgreSQL under the leader epoch
(sql/0021_kv_snapshots.sql): `kv/<topic id>/<partition>/<leader epoch>-<offset>-<random>`."""

from __future__ import annotations

import secrets
import uuid

from mink.storage.compaction.tablet import KVTablet
from mink.storage.controlplane import MetadataStore
from mink.storage.controlplane.postgres import IDEMPOTENT, READ

KV_PREFIX = "kv/"
SQL_LATEST = """
SELECT log_offset, object_key FROM kv_snapshots WHERE topic_id = %s AND partition = %s"""
SQL_PUT = """
SELECT mink_put_kv_snapshot(%s::uuid, %s::int, %s::int, %s::int, %s::bigint, %s::bigint,
                            %s::text)"""


async def restore_latest(metadata: MetadataStore, objects, topic_id: uuid.UUID,
                         partition: int) -> KVTablet | None:
    """The newest snapshot of the partition's tablet, decoded; None when there is none."""
    row = await metadata.fetch_one(READ, SQL_LATEST, (topic_id, partition))
    if row is None:
        return None
    return KVTablet.restore(await objects.get(row[1]))


async def write_snapshot(metadata: MetadataStore, objects, topic_id: uuid.UUID,
                         partition: int, leader_epoch: int, node_id: int, node_epoch: int,
                         tablet: KVTablet) -> str:
    """Upload the tablet and reference it, fenced by the leader epoch: 'stored',
    'not_leader' or 'older' (then the upload is queued for deletion)."""
    offset = tablet.snapshot_offset()
    key = (f"{KV_PREFIX}{topic_id}/{partition}/{leader_epoch}-{offset:020d}-"
           f"{secrets.token_hex(4)}")
    await objects.create(key, tablet.snapshot())
    row = await metadata.fetch_one(IDEMPOTENT, SQL_PUT, (
        topic_id, partition, leader_epoch, node_id, node_epoch, offset, key))
    assert row is not None
    return row[0]


__all__ = ["KV_PREFIX", "restore_latest", "write_snapshot"]
