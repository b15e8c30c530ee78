"""DescribeProducers (KIP-664): the active producers of partitions this node leads, from
the partition's committed producer state (what PostgreSQL holds for it)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import READ
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema
from mink.storage.producer_state import NO_OFFSET


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    topic_schema = nested(schema, "TopicResponse")
    partition_schema = nested(schema, "PartitionResponse")
    producer_schema = nested(schema, "ProducerState")
    topics = []
    for topic_request in request.topics:
        topic = node.view.topics.get(topic_request.name)
        partitions = []
        for index in topic_request.partition_indexes:
            error, message, producers = ErrorCode.none, None, ()
            if not node.authorizer.topic(ctx, READ, topic_request.name):
                error = ErrorCode.topic_authorization_failed
            elif topic is None or not 0 <= index < len(topic.partitions):
                error = ErrorCode.unknown_topic_or_partition
            else:
                partition_log = node.leader_log(topic, index)
                if partition_log is None:
                    error = ErrorCode.not_leader_or_follower
                    message = f"node {node.node_id} does not lead {topic.name}-{index}"
                else:
                    producers = tuple(
                        build(producer_schema, producer_id=e.producer_id,
                              producer_epoch=e.epoch, last_sequence=e.last_seq,
                              last_timestamp=e.last_update_ms or -1, coordinator_epoch=-1,
                              current_txn_start_offset=(
                                  e.txn_first_offset if e.txn_first_offset != NO_OFFSET
                                  else -1))
                        for e in partition_log.producers.committed.values())
            partitions.append(build(partition_schema, partition_index=index,
                                    error_code=error, error_message=message,
                                    active_producers=producers))
        topics.append(build(topic_schema, name=topic_request.name,
                            partitions=tuple(partitions)))
    return build(schema, throttle_time=NO_THROTTLE, topics=tuple(topics))
