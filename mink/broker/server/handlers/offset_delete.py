"""OffsetDelete: committed offsets of partitions the group does not consume."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import DELETE, READ
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema


async def handle(node, ctx, request):
    wanted = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    # DELETE on the group, READ on each topic
    authorizer = node.authorizer
    if not authorizer.group(ctx, DELETE, request.group_id):
        error, results = ErrorCode.group_authorization_failed, {}
    else:
        allowed = authorizer.topics(ctx, READ, {name for name, _ in wanted})
        error, results = await node.groups.delete_offsets(
            request.group_id, [w for w in wanted if w[0] in allowed])
        results = {**results, **{w: ErrorCode.topic_authorization_failed
                                 for w in wanted if w[0] not in allowed}}
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    topic_schema = nested(schema, "OffsetDeleteResponseTopic")
    partition_schema = nested(schema, "OffsetDeleteResponsePartition")
    topics = () if error else tuple(
        build(topic_schema, name=t.name, partitions=tuple(
            build(partition_schema, partition_index=p.partition_index,
                  error_code=results[(t.name, p.partition_index)])
            for p in t.partitions))
        for t in request.topics)
    return build(schema, throttle_time=NO_THROTTLE, error_code=error, topics=topics)
