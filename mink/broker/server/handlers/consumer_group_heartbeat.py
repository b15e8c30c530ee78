"""ConsumerGroupHeartbeat (KIP-848): joins, leaves and keeps a member of a consumer group,
and carries its assignment (`mink/broker/groups/consumer_coordinator.py`)."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode

from mink.broker.groups.consumer_coordinator import HeartbeatResult
from mink.broker.security.authorizer import DESCRIBE, READ
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.server.handlers.join_group import client_host
from mink.protocol.messages import build, nested, response_schema


def _ms(value) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    return int(value)


async def handle(node, ctx, request):
    ctx.applied()
    version = ctx.header.api_version
    schema = response_schema(ctx.header.api_key, version)
    # READ on the group, DESCRIBE on every subscribed topic (Kafka's order)
    authorizer = node.authorizer
    refused = None
    if not authorizer.group(ctx, READ, request.group_id):
        refused = ErrorCode.group_authorization_failed
    elif request.subscribed_topic_names and len(authorizer.topics(
            ctx, DESCRIBE, request.subscribed_topic_names)) < len(
            set(request.subscribed_topic_names)):
        refused = ErrorCode.topic_authorization_failed
    if refused is not None:
        return build(schema, throttle_time=NO_THROTTLE, error_code=refused,
                     error_message=None, member_id=request.member_id,
                     member_epoch=request.member_epoch,
                     heartbeat_interval=datetime.timedelta(0), assignment=None)
    owned = (None if request.topic_partitions is None
             else [(tp.topic_id, list(tp.partitions)) for tp in request.topic_partitions])
    result = node.groups.consumer.heartbeat(
        group_id=request.group_id, member_id=request.member_id,
        member_epoch=request.member_epoch, instance_id=request.instance_id,
        rack_id=request.rack_id, rebalance_timeout_ms=_ms(request.rebalance_timeout),
        subscribed_topic_names=(None if request.subscribed_topic_names is None
                                else list(request.subscribed_topic_names)),
        subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
        server_assignor=request.server_assignor, owned=owned,
        client_id=ctx.header.client_id or "", client_host=client_host(ctx), version=version)
    if result.written is not None:
        # answered once the group's new state is in PostgreSQL, as Kafka answers once its
        # records are committed
        error = await result.written.wait()
        if error:
            result = HeartbeatResult(ErrorCode.coordinator_not_available
                                     if error == ErrorCode.request_timed_out else error)
    schema = response_schema(ctx.header.api_key, version)
    assignment = None
    if result.assignment is not None:
        tp_schema = nested(schema, "TopicPartitions")
        assignment = build(nested(schema, "Assignment"), topic_partitions=tuple(
            build(tp_schema, topic_id=topic_id, partitions=tuple(partitions))
            for topic_id, partitions in result.assignment))
    return build(schema, throttle_time=NO_THROTTLE, error_code=result.error,
                 error_message=result.message, member_id=result.member_id,
                 member_epoch=result.member_epoch,
                 heartbeat_interval=datetime.timedelta(
                     milliseconds=result.heartbeat_interval_ms),
                 assignment=assignment)
