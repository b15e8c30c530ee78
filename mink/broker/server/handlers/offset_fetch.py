"""OffsetFetch: a group's committed offsets (every committed one when topics is null)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.groups.coordinator import OffsetEntry
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.transactions.offsets import mark_unstable, unstable_partitions
from mink.protocol.messages import build, nested, response_schema


async def handle(node, ctx, request):
    ctx.applied()
    version = ctx.header.api_version
    requested = (None if request.topics is None else
                 [(t.name, i) for t in request.topics for i in t.partition_indexes])
    stable = getattr(request, "require_stable", False)  # KIP-447
    unstable = await unstable_partitions(node, request.group_id) if stable else set()
    error, entries = node.groups.fetch_offsets(request.group_id, requested)
    if stable and not error:
        entries = mark_unstable(entries, unstable)
    if error and version < 2:
        # no group-level error code before v2: every partition carries it
        entries = [OffsetEntry(topic, index, -1, -1, "", error)
                   for topic, index in requested or []]
        error = ErrorCode.none
    schema = response_schema(ctx.header.api_key, version)
    topic_schema = nested(schema, "OffsetFetchResponseTopic")
    partition_schema = nested(schema, "OffsetFetchResponsePartition")
    by_topic: dict[str, list] = {}
    for e in entries:
        by_topic.setdefault(e.topic, []).append(build(
            partition_schema, partition_index=e.partition, committed_offset=e.offset,
            committed_leader_epoch=e.leader_epoch, metadata=e.metadata, error_code=e.error))
    return build(schema, throttle_time=NO_THROTTLE, error_code=error, topics=tuple(
        build(topic_schema, name=name, partitions=tuple(partitions))
        for name, partitions in by_topic.items()))
