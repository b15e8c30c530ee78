"""OffsetForLeaderEpoch (KIP-101, KIP-320): for a leader epoch a client last saw, the largest
epoch not above it and where that epoch's log ends, so the client can tell whether its
position is still on the log after a leader change.

It is all in PostgreSQL (the leader_epochs table): a consumer's request (replica id -1) of a
partition another node leads is answered from this node's replica view of it too (issue 25,
fetch through any node), the current leader epoch checked against PostgreSQL's."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.server.handlers.partitions import check_leader_epoch, locate, locate_for_reading
from mink.broker.security.authorizer import DESCRIBE
from mink.protocol.messages import build, nested, response_schema
from mink.storage.controlplane import MetadataUnavailable, UnknownTopic


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(23, ctx.header.api_version)
    result_schema = nested(schema, "EpochEndOffset")
    topics = []
    for topic in request.topics:
        partitions = []
        allowed = node.authorizer.topic(ctx, DESCRIBE, topic.topic)
        for p in topic.partitions:
            error, epoch, end_offset = await _end_offset(
                node, topic.topic, p, getattr(request, "replica_id", -1) < 0) if allowed \
                else (ErrorCode.topic_authorization_failed, -1, -1)
            partitions.append(build(result_schema, error_code=error, partition=p.partition,
                                    leader_epoch=epoch, end_offset=end_offset))
        topics.append(build(nested(schema, "OffsetForLeaderTopicResult"), topic=topic.topic,
                            partitions=tuple(partitions)))
    return build(schema, throttle_time=NO_THROTTLE, topics=tuple(topics))


async def _end_offset(node, name: str, p, consumer: bool = True
                      ) -> tuple[ErrorCode, int, int]:
    located = (await locate_for_reading(node, name, p.partition) if consumer
               else locate(node, name, p.partition))
    if located.log is None:
        return located.error, -1, -1
    error = check_leader_epoch(p.current_leader_epoch, located.log)
    if error:
        return error, -1, -1
    try:
        epoch, end_offset = await node.metadata.leader_epoch_end(
            located.topic.topic_id, p.partition, p.leader_epoch)
    except UnknownTopic:
        return ErrorCode.unknown_topic_or_partition, -1, -1
    except MetadataUnavailable:
        return ErrorCode.kafka_storage_error, -1, -1
    return ErrorCode.none, epoch, end_offset
