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


ALL = None  # every partition of the group is unstable


async def unstable_partitions(node, group_id: str) -> set[tuple[str, int]] | None:
    """The (topic, partition)s of the group whose offsets are not stable now; ALL (None)
    while a marker of the group's partition is being applied. Call it before reading the
    cache, with no await in between: a marker applied meanwhile is then seen either here or
    in the cache."""
    partition = node.groups.partition_for(group_id)
    try:
        with trio.fail_after(WAIT_S):
            pending = await node.transactions.store.pending_offsets(partition)
    except (trio.TooSlowError, md.MetadataError):
        return ALL
    if node.markers.group_markers_in_flight.get(partition):
        return ALL  # its offsets may have left the pending rows without being cached yet
    return {(t, p) for g, t, p in pending if g == group_id}


def mark_unstable(entries: list, unstable: set[tuple[str, int]] | None) -> list:
    if unstable is not None and not unstable:
        return entries
    return [dataclasses.replace(e, offset=-1, error=ErrorCode.unstable_offset_commit)
            if unstable is None or (e.topic, e.partition) in unstable else e
            for e in entries]
