"""DescribeTopicPartitions (API 75, KIP-966): topics and their partitions, paged by a cursor.

Newer admin clients describe topics with it instead of Metadata. The answer is Metadata's:
replicas = ISR = [leader]; there are no eligible leader replicas beyond the leader (ELR
empty). Topics come sorted by name, as Kafka's handler sorts them; at most
`response_partition_limit` partitions per answer, and `next_cursor` names where the next
request starts."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.cluster.view import ClusterView
from mink.broker.security.operations import TOPIC_OPERATIONS
from mink.broker.security.authorizer import DESCRIBE
from mink.broker.security.operations import OMITTED
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.server.handlers.topic_ids import ZERO_UUID
from mink.protocol.messages import build, nested, response_schema
from mink.protocol.topics import INTERNAL_TOPICS, topic_name_error


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    view: ClusterView = node.view
    # An empty list asks for every topic.
    names = sorted({t.name for t in request.topics}) if request.topics else sorted(view.topics)
    authorizer = node.authorizer
    if not request.topics:
        names = sorted(authorizer.topics(ctx, DESCRIBE, names))
    cursor = request.cursor
    if cursor is not None:
        names = [n for n in names if n >= cursor.topic_name]
    budget = max(int(request.response_partition_limit), 1)
    topics, next_cursor = [], None
    for name in names:
        topic = view.topics.get(name)
        if not authorizer.topic(ctx, DESCRIBE, name):
            topics.append(build(nested(schema, "DescribeTopicPartitionsResponseTopic"),
                                error_code=ErrorCode.topic_authorization_failed, name=name,
                                topic_id=ZERO_UUID, is_internal=False, partitions=(),
                                topic_authorized_operations=OMITTED))
            continue
        if topic is None:
            error = (ErrorCode.invalid_topic_exception if topic_name_error(name) else
                     ErrorCode.unknown_topic_or_partition)
            topics.append(build(nested(schema, "DescribeTopicPartitionsResponseTopic"),
                                error_code=error, name=name, topic_id=ZERO_UUID,
                                is_internal=False, partitions=(),
                                topic_authorized_operations=TOPIC_OPERATIONS))
            continue
        first = cursor.partition_index if cursor is not None and name == cursor.topic_name \
            else 0
        partitions = []
        for p in topic.partitions[first:]:
            if budget == 0:
                next_cursor = build(nested(schema, "Cursor"), topic_name=name,
                                    partition_index=p.index)
                break
            budget -= 1
            partitions.append(_partition(schema, view, p))
        if partitions or next_cursor is None:
            topics.append(build(nested(schema, "DescribeTopicPartitionsResponseTopic"),
                                error_code=ErrorCode.none, name=name,
                                topic_id=topic.topic_id, is_internal=name in INTERNAL_TOPICS,
                                partitions=tuple(partitions),
                                topic_authorized_operations=authorizer.topic_operations(
                                    ctx, name, True)))
        if next_cursor is not None:
            break
    return build(schema, throttle_time=NO_THROTTLE, topics=tuple(topics),
                 next_cursor=next_cursor)


def _partition(schema, view: ClusterView, p):
    if p.leader is not None and p.leader in view.brokers:
        error, leader, replicas = ErrorCode.none, p.leader, (p.leader,)
    else:
        error, leader, replicas = ErrorCode.leader_not_available, -1, ()
    return build(nested(schema, "DescribeTopicPartitionsResponsePartition"), error_code=error,
                 partition_index=p.index, leader_id=leader, leader_epoch=p.leader_epoch,
                 replica_nodes=replicas, isr_nodes=replicas, eligible_leader_replicas=(),
                 last_known_elr=(), offline_replicas=())
