"""Metadata: live brokers, the controller, and each topic's partitions with their leaders.

replicas = ISR = [leader]: data durability comes from the object store, not from replicas.
"""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.cluster.view import ClusterView, TopicInfo
from mink.protocol.messages import build, encode_body, nested, response_schema
from mink.broker.security.operations import OMITTED, cluster_operations, topic_operations
from mink.protocol.topics import INTERNAL_TOPICS, topic_name_error

ZERO_UUID = uuid.UUID(int=0)
NO_AUTHORIZED_OPERATIONS = OMITTED


async def handle(node, ctx, request):
    version = ctx.header.api_version
    requested = request.topics
    every_topic = requested is None or (version == 0 and not requested)
    if not every_topic and request_allows_auto_create(request, version):
        await node.topic_admin.auto_create_topics([t.name for t in requested if t.name])
    ctx.applied()
    view: ClusterView = node.view
    # Encoding is the cost (about 100 ms for 10,000 partitions): one encoding per snapshot,
    # version and question.
    # KIP-430: the operations are there only when asked for (v8+; the cluster's v8-10)
    operations = (bool(getattr(request, "include_topic_authorized_operations", False)),
                  bool(getattr(request, "include_cluster_authorized_operations", False)))
    listener = ctx.listener_name  # brokers are listed with this listener's endpoints
    key = ("metadata", version, operations, listener, None if every_topic else tuple(
        (t.name, getattr(t, "topic_id", None)) for t in requested))
    encoded = view.memo.get(key)
    if encoded is None:
        if len(view.memo) > 256:
            view.memo.clear()
        encoded = view.memo[key] = encode_body(
            _response(view, version, requested, every_topic, operations, listener))
    return encoded


def _response(view: ClusterView, version: int, requested, every_topic: bool,
              operations: tuple[bool, bool] = (False, False), listener: str | None = None):
    schema = response_schema(3, version)
    topic_ops = topic_operations(operations[0])
    if every_topic:
        topics = [_topic(schema, view, topic, topic_ops) for topic in view.topics.values()]
    else:
        topics = [_requested_topic(schema, view, t.name, getattr(t, "topic_id", None),
                                   topic_ops)
                  for t in requested]
    broker_schema = nested(schema, "MetadataResponseBroker")
    return build(
        schema,
        throttle_time=NO_THROTTLE,
        brokers=tuple(
            build(broker_schema, node_id=b.node_id, host=b.endpoint(listener)[0],
                  port=b.endpoint(listener)[1], rack=b.rack)
            # Recently live brokers too (ClusterView.listed_brokers says why); a partition's
            # leader is named only while it is live.
            for b in sorted((view.listed_brokers or view.brokers).values(),
                            key=lambda b: b.node_id)
        ),
        cluster_id=view.cluster_id,
        controller_id=view.controller_id,
        topics=tuple(topics),
        cluster_authorized_operations=cluster_operations(operations[1]),
        error_code=ErrorCode.none,  # v13 (KIP-1102): a top-level error, none here
    )


def request_allows_auto_create(request, version: int) -> bool:
    # Before v4 the request has no flag and Kafka creates topics when the broker allows it.
    return getattr(request, "allow_auto_topic_creation", True) if version >= 4 else True


def _requested_topic(schema, view: ClusterView, name: str | None, topic_id,
                     topic_ops: int = OMITTED):
    topic = None
    if name is not None:
        topic = view.topics.get(name)
    elif topic_id is not None and topic_id != ZERO_UUID:
        topic = view.topic_by_id(topic_id)
    if topic is not None:
        return _topic(schema, view, topic, topic_ops)
    error = ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition
    if name is not None and topic_name_error(name):
        error = ErrorCode.invalid_topic_exception
    return build(nested(schema, "MetadataResponseTopic"), error_code=error, name=name,
                 topic_id=topic_id or ZERO_UUID, partitions=(),
                 topic_authorized_operations=NO_AUTHORIZED_OPERATIONS)


def _topic(schema, view: ClusterView, topic: TopicInfo, topic_ops: int = OMITTED):
    partition_schema = nested(schema, "MetadataResponsePartition")
    partitions = []
    for p in topic.partitions:
        if p.leader is not None and p.leader in view.brokers:
            error, leader, replicas = ErrorCode.none, p.leader, (p.leader,)
        else:
            error, leader, replicas = ErrorCode.leader_not_available, -1, ()
        partitions.append(build(
            partition_schema, error_code=error, partition_index=p.index, leader_id=leader,
            leader_epoch=p.leader_epoch, replica_nodes=replicas, isr_nodes=replicas,
            offline_replicas=()))
    return build(nested(schema, "MetadataResponseTopic"), error_code=ErrorCode.none,
                 name=topic.name, topic_id=topic.topic_id,
                 is_internal=topic.name in INTERNAL_TOPICS, partitions=tuple(partitions),
                 topic_authorized_operations=topic_ops)
