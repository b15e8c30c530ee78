"""OffsetCommit: answered once the offsets are in PostgreSQL."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import READ
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema
from mink.storage.controlplane.groups import StoredOffset


async def handle(node, ctx, request):
    # Null metadata is stored as "", as Kafka does (OffsetAndMetadata.NoMetadata).
    offsets = [StoredOffset(t.name, p.partition_index, p.committed_offset,
                            getattr(p, "committed_leader_epoch", -1), p.committed_metadata or "")
               for t in request.topics for p in t.partitions]
    # READ on the group, then on each topic (Kafka's order)
    authorizer = node.authorizer
    refused: dict[tuple[str, int], ErrorCode] = {}
    if not authorizer.group(ctx, READ, request.group_id):
        refused = {(o.topic, o.partition): ErrorCode.group_authorization_failed
                   for o in offsets}
    else:
        allowed = authorizer.topics(ctx, READ, {o.topic for o in offsets})
        refused = {(o.topic, o.partition): ErrorCode.topic_authorization_failed
                   for o in offsets if o.topic not in allowed}
    if refused:
        offsets = [o for o in offsets if (o.topic, o.partition) not in refused]
    # Applied only once durable: a later request on this connection (another commit, an
    # OffsetFetch) sees it, as Kafka's one-request-at-a-time connections do.
    errors = await node.groups.commit_offsets(
        request.group_id, request.member_id, getattr(request, "group_instance_id", None),
        request.generation_id_or_member_epoch, offsets, api_version=ctx.header.api_version
    ) if offsets or not refused else {}
    errors = {**errors, **refused}
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    topic_schema = nested(schema, "OffsetCommitResponseTopic")
    partition_schema = nested(schema, "OffsetCommitResponsePartition")
    return build(schema, throttle_time=NO_THROTTLE, topics=tuple(
        build(topic_schema, name=t.name, partitions=tuple(
            build(partition_schema, partition_index=p.partition_index,
                  error_code=errors[(t.name, p.partition_index)])
            for p in t.partitions))
        for t in request.topics))
