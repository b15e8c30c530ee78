"""ListOffsets: earliest (-2), latest (-1), max timestamp (-3, v7+), earliest local (-4, v8+),
latest tiered (-5, v9+) or the first offset at or after a timestamp.

Mink has no local tier: every batch is in the object store from its acknowledgement on, so
it answers the KIP-405 specs as a Kafka broker without remote storage does (UnifiedLog:
earliest local = the log start, latest tiered = offset -1). v10's timeout (KIP-1075) bounds
a wait on remote storage that Mink never does.

A consumer's ListOffsets (replica id -1) of a partition another node leads is answered from
this node's replica view of it (issue 25, fetch through any node), its ends read from
PostgreSQL for the request: the leader's committed high watermark and log start, and the
timestamp lookups through the same index, and read_committed's latest the view's last
stable offset (read with the ends, mink/storage/replica.py)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.server.handlers.partitions import (
    check_leader_epoch,
    locate,
    locate_for_reading,
)
from mink.broker.security.authorizer import DESCRIBE
from mink.protocol.messages import build, nested, response_schema
from mink.storage.controlplane import MetadataUnavailable

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(2, ctx.header.api_version)
    partition_schema = nested(schema, "ListOffsetsPartitionResponse")
    topics = []
    for topic in request.topics:
        partitions = []
        allowed = node.authorizer.topic(ctx, DESCRIBE, topic.name)
        for p in topic.partitions:
            error, offset, timestamp, epoch = await _list_offset(
                node, topic.name, p, getattr(request, "isolation_level", 0),
                request.replica_id < 0) if allowed \
                else (ErrorCode.topic_authorization_failed, -1, -1, -1)
            partitions.append(build(
                partition_schema, partition_index=p.partition_index, error_code=error,
                timestamp=timestamp, offset=offset, leader_epoch=epoch))
        topics.append(build(nested(schema, "ListOffsetsTopicResponse"), name=topic.name,
                            partitions=tuple(partitions)))
    return build(schema, throttle_time=NO_THROTTLE, topics=tuple(topics))


async def _list_offset(node, name: str, p,
                       isolation_level: int = 0,
                       consumer: bool = True) -> tuple[ErrorCode, int, int, int]:
    opening = ErrorCode.leader_not_available
    located = (await locate_for_reading(node, name, p.partition_index, still_opening=opening)
               if consumer else locate(node, name, p.partition_index, still_opening=opening))
    log = located.log
    if log is None:
        return located.error, -1, -1, -1
    error = check_leader_epoch(getattr(p, "current_leader_epoch", -1), log)
    if error:
        return error, -1, -1, -1
    if p.timestamp == LATEST:  # read_committed (isolation level 1): the last stable offset
        latest = log.last_stable_offset if isolation_level == 1 else log.high_watermark
        return ErrorCode.none, latest, -1, log.leader_epoch
    if p.timestamp == LATEST_TIERED:
        return ErrorCode.none, -1, -1, -1
    if p.timestamp in (EARLIEST, EARLIEST_LOCAL):
        return ErrorCode.none, log.log_start_offset, -1, log.leader_epoch
    try:
        if p.timestamp == MAX_TIMESTAMP:
            found = await log.max_timestamp_offset()
        else:
            found = await log.offset_for_timestamp(p.timestamp)
    except MetadataUnavailable:
        return ErrorCode.kafka_storage_error, -1, -1, -1
    if found is None:
        return ErrorCode.none, -1, -1, -1
    offset, timestamp, epoch = found
    return ErrorCode.none, offset, timestamp, epoch
