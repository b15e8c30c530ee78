"""OffsetFetch: a group's committed offsets (every committed one when topics is null).

v8+ (KIP-709) asks for several groups in one request, each answered with its own error.
v9's member id and epoch (KIP-848) are checked only for consumer groups (UNKNOWN_MEMBER_ID,
STALE_MEMBER_EPOCH): a classic group ignores them, as Kafka's does. With `require_stable` (KIP-447)
a partition whose offset a transaction has pending answers UNSTABLE_OFFSET_COMMIT."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.groups.coordinator import OffsetEntry
from mink.broker.security.authorizer import DESCRIBE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.transactions.offsets import mark_unstable, unstable_partitions
from mink.protocol.messages import build, nested, response_schema


def _requested(topics) -> list[tuple[str, int]] | None:
    return None if topics is None else [(t.name, i) for t in topics
                                         for i in t.partition_indexes]


async def _fetch(node, group_id: str, requested, stable: bool, member_id=None,
                 member_epoch: int = -1):
    unstable = await unstable_partitions(node, group_id) if stable else set()
    error, entries = node.groups.fetch_offsets(group_id, requested, member_id, member_epoch)
    if stable and not error:
        entries = mark_unstable(entries, unstable)
    return error, entries


async def _authorized_fetch(node, ctx, group_id: str, requested, stable: bool,
                            member_id=None, member_epoch: int = -1):
    """DESCRIBE on the group; topics the principal may not describe are
    TOPIC_AUTHORIZATION_FAILED when asked for by name, left out when all are asked for."""
    authorizer = node.authorizer
    if not authorizer.group(ctx, DESCRIBE, group_id):
        return ErrorCode.group_authorization_failed, []
    error, entries = await _fetch(node, group_id, requested, stable, member_id, member_epoch)
    if not authorizer.enabled:
        return error, entries
    allowed = authorizer.topics(ctx, DESCRIBE, {e.topic for e in entries})
    if requested is None:
        return error, [e for e in entries if e.topic in allowed]
    return error, [e if e.topic in allowed else OffsetEntry(
        e.topic, e.partition, -1, -1, "", ErrorCode.topic_authorization_failed)
        for e in entries]


async def handle(node, ctx, request):
    ctx.applied()
    version = ctx.header.api_version
    schema = response_schema(ctx.header.api_key, version)
    stable = getattr(request, "require_stable", False)
    if version >= 8:
        group_schema = nested(schema, "OffsetFetchResponseGroup")
        groups = []
        for group in request.groups:
            error, entries = await _authorized_fetch(node, ctx, group.group_id, _requested(group.topics),
                                          stable, getattr(group, "member_id", None),
                                          getattr(group, "member_epoch", -1))
            groups.append(build(group_schema, group_id=group.group_id, error_code=error,
                                topics=_topics(schema, "OffsetFetchResponseTopics",
                                               "OffsetFetchResponsePartitions", entries)))
        return build(schema, throttle_time=NO_THROTTLE, groups=tuple(groups))
    requested = _requested(request.topics)
    error, entries = await _authorized_fetch(node, ctx, request.group_id, requested, stable)
    if error and version < 2:
        # no group-level error code before v2: every partition carries it
        entries = [OffsetEntry(topic, index, -1, -1, "", error)
                   for topic, index in requested or []]
        error = ErrorCode.none
    return build(schema, throttle_time=NO_THROTTLE, error_code=error, topics=_topics(
        schema, "OffsetFetchResponseTopic", "OffsetFetchResponsePartition", entries))


def _topics(schema, topic_name: str, partition_name: str, entries) -> tuple:
    topic_schema = nested(schema, topic_name)
    partition_schema = nested(schema, partition_name)
    by_topic: dict[str, list] = {}
    for e in entries:
        by_topic.setdefault(e.topic, []).append(build(
            partition_schema, partition_index=e.partition, committed_offset=e.offset,
            committed_leader_epoch=e.leader_epoch, metadata=e.metadata, error_code=e.error))
    return tuple(build(topic_schema, name=name, partitions=tuple(partitions))
                 for name, partitions in by_topic.items())
