"""AlterReplicaLogDirs, answered as Kafka answers on a broker with a single log dir: moving
a replica to the dir it is in already succeeds and does nothing; any other path is
LOG_DIR_NOT_FOUND; a partition this node does not lead is not hosted here
(NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import ALTER
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.server.handlers.describe_log_dirs import log_dir
from mink.protocol.messages import build, nested, response_schema


def _error(node, path: str, name: str, index: int) -> ErrorCode:
    topic = node.view.topics.get(name)
    if topic is None or not 0 <= index < len(topic.partitions):
        return ErrorCode.unknown_topic_or_partition
    if topic.partitions[index].leader != node.node_id:
        return ErrorCode.not_leader_or_follower
    if path != log_dir(node):
        return ErrorCode.log_dir_not_found
    return ErrorCode.none


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    authorized = node.authorizer.cluster(ctx, ALTER)
    by_topic: dict[str, list] = {}
    partition_schema = nested(schema, "AlterReplicaLogDirPartitionResult")
    for directory in request.dirs:
        for topic in directory.topics:
            for index in topic.partitions:
                by_topic.setdefault(topic.name, []).append(build(
                    partition_schema, partition_index=index,
                    error_code=_error(node, directory.path, topic.name, index)
                    if authorized else ErrorCode.cluster_authorization_failed))
    topic_schema = nested(schema, "AlterReplicaLogDirTopicResult")
    return build(schema, throttle_time=NO_THROTTLE, results=tuple(
        build(topic_schema, topic_name=name, partitions=tuple(parts))
        for name, parts in by_topic.items()))
