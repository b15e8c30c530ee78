"""Offsets in transactions (KIP-447): OffsetFetch with require_stable answers
UNSTABLE_OFFSET_COMMIT for a partition whose offset some transaction has sent and whose marker
the group coordinator has not taken yet (the pending rows of `txn_offsets` in PostgreSQL, so
that a coordinator that just took over the group answers alike)."""

from __future__ import annotations

import dataclasses

import trio
from kio.schema.errors import ErrorCode

from mink.storage import controlplane as md

WAIT_S = 5.0


async def unstable_offsets(node, group_id: str, entries: list) -> list:
    try:
        with trio.fail_after(WAIT_S):
            pending = await node.transactions.store.pending_offsets(
                node.groups.partition_for(group_id))
    except (trio.TooSlowError, md.MetadataError):
        return [dataclasses.replace(e, error=ErrorCode.coordinator_not_available)
                for e in entries]
    unstable = {(t, p) for g, t, p in pending if g == group_id}
    if not unstable:
        return entries
    return [dataclasses.replace(e, offset=-1, error=ErrorCode.unstable_offset_commit)
            if (e.topic, e.partition) in unstable else e for e in entries]
