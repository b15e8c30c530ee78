"""DeleteRecords: move partitions' log start (low watermark) forward, answered by each
partition's leader and fenced by its leader epoch. Offset -1 means the high watermark; an
offset above it is OFFSET_OUT_OF_RANGE. The data below is collected later
(`mink/storage/lifecycle/`)."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import DELETE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.server.handlers.partitions import locate
from mink.protocol.messages import build, nested, response_schema
from mink.storage import controlplane as md
from mink.storage.lifecycle.store import DeleteRecordsRefused, delete_records

log = logging.getLogger(__name__)

_REFUSALS = {
    "unknown_partition": ErrorCode.unknown_topic_or_partition,
    "not_leader": ErrorCode.not_leader_or_follower,
    "offset_out_of_range": ErrorCode.offset_out_of_range,
}


async def handle(node, ctx, request):
    # applied when it ends: a ListOffsets sent right behind it on the connection (as
    # librdkafka's admin client does) sees the new log start, as in Kafka
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    partition_schema = nested(schema, "DeleteRecordsPartitionResult")
    topics = []
    for topic in request.topics:
        partitions = []
        allowed = node.authorizer.topic(ctx, DELETE, topic.name)
        for p in topic.partitions:
            error, low_watermark = await _delete(
                node, topic.name, p.partition_index, p.offset) if allowed \
                else (ErrorCode.topic_authorization_failed, -1)
            partitions.append(partition_schema(partition_index=p.partition_index,
                                               low_watermark=low_watermark, error_code=error))
        topics.append(nested(schema, "DeleteRecordsTopicResult")(
            name=topic.name, partitions=tuple(partitions)))
    return build(schema, throttle_time=NO_THROTTLE, topics=tuple(topics))


async def _delete(node, name: str, index: int, offset: int) -> tuple[ErrorCode, int]:
    located = locate(node, name, index)
    partition_log = located.log
    if partition_log is None:
        return located.error, -1
    try:
        low_watermark = await delete_records(
            node.metadata, partition_log.topic_id, index, partition_log.leader_epoch,
            node.node_id, node.membership.node_epoch, offset)
    except DeleteRecordsRefused as exc:
        return _REFUSALS.get(exc.reason, ErrorCode.unknown_server_error), -1
    except md.MetadataUnavailable as exc:
        log.warning("DeleteRecords on %s-%d failed: %s", name, index, exc)
        return ErrorCode.request_timed_out, -1
    partition_log.advance_log_start(low_watermark)
    return ErrorCode.none, low_watermark
