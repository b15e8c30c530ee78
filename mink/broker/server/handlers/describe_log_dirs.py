"""DescribeLogDirs, mapped to what it means here: each node has one virtual log dir, the
object store seen from that node; it holds the partitions the node leads (their one
replica), each sized by the bytes of its committed batches still indexed in PostgreSQL
(`partition_stats`). Nothing is on a local disk, so the volume's total and usable bytes
are unknown (-1)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import DESCRIBE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema
from mink.storage.controlplane import MetadataUnavailable
from mink.storage.controlplane.log_dirs import partition_bytes

UNKNOWN_VOLUME_BYTES = -1


def log_dir(node) -> str:
    """The one log dir of a node (AlterReplicaLogDirs accepts only this path)."""
    return f"/mink/object-store/node-{node.node_id}"


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    if not node.authorizer.cluster(ctx, DESCRIBE):
        return build(schema, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.cluster_authorization_failed, results=())
    view = node.view
    if request.topics is None:
        wanted = {(name, p.index) for name, t in view.topics.items() for p in t.partitions}
    else:
        wanted = {(t.topic, i) for t in request.topics for i in t.partitions}
    led = sorted((name, index) for name, index in wanted
                 if name in view.topics and 0 <= index < len(view.topics[name].partitions)
                 and view.topics[name].partitions[index].leader == node.node_id)
    result_schema = nested(schema, "DescribeLogDirsResult")
    try:
        sizes = await partition_bytes(node.metadata, list(
            {view.topics[name].topic_id for name, _ in led}))
    except MetadataUnavailable:
        return build(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                     results=(build(result_schema, error_code=ErrorCode.kafka_storage_error,
                                    log_dir=log_dir(node), topics=(),
                                    total_bytes=UNKNOWN_VOLUME_BYTES,
                                    usable_bytes=UNKNOWN_VOLUME_BYTES),))
    partition_schema = nested(schema, "DescribeLogDirsPartition")
    by_topic: dict[str, list] = {}
    for name, index in led:
        size = sizes.get((view.topics[name].topic_id, index), 0)
        by_topic.setdefault(name, []).append(build(
            partition_schema, partition_index=index, partition_size=size, offset_lag=0,
            is_future_key=False))
    topic_schema = nested(schema, "DescribeLogDirsTopic")
    return build(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, results=(
        build(result_schema, error_code=ErrorCode.none, log_dir=log_dir(node),
              topics=tuple(build(topic_schema, name=name, partitions=tuple(parts))
                           for name, parts in by_topic.items()),
              total_bytes=UNKNOWN_VOLUME_BYTES, usable_bytes=UNKNOWN_VOLUME_BYTES),))
