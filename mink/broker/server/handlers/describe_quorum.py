"""DescribeQuorum (API 55): Kafka's KRaft metadata quorum, as Mink has it.

Mink's metadata log is the change log in PostgreSQL, and its controller the coordinator
lease holder (as DescribeCluster and Metadata report it). So `__cluster_metadata`
partition 0 is answered with the holder as leader and only voter, the lease's epoch as
leader epoch and the change log's last version this node has read as high watermark; every
other live node is an observer (what it has read is not known here: -1, as Kafka reports
a replica it has not heard from). Admin clients' describe_metadata_quorum and
kafka-metadata-quorum's `describe --status` read it.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import DESCRIBE
from mink.protocol.messages import build, nested, response_schema
from mink.storage.controlplane import MetadataUnavailable

METADATA_TOPIC = "__cluster_metadata"
UNKNOWN = -1


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    version = ctx.header.api_version
    topic_schema = nested(schema, "TopicData")
    partition_schema = nested(schema, "PartitionData")
    replica_schema = nested(schema, "ReplicaState")
    view = node.view

    def replica(node_id: int, log_end: int):
        fields = dict(replica_id=node_id, log_end_offset=log_end)
        if version >= 1:
            fields.update(last_fetch_timestamp=UNKNOWN, last_caught_up_timestamp=UNKNOWN)
        if version >= 2:
            fields.update(replica_directory_id=None)
        return build(replica_schema, **fields)

    def answer(error: ErrorCode, message: str | None, topics=()):
        fields = dict(error_code=error, topics=tuple(topics))
        if version >= 2:
            fields.update(error_message=message, nodes=_nodes(schema, view, ctx))
        return build(schema, **fields)

    def partition(index: int, error: ErrorCode, message: str | None, leader: int = UNKNOWN,
                  epoch: int = UNKNOWN, voters=(), observers=()):
        fields = dict(partition_index=index, error_code=error, leader_id=leader,
                      leader_epoch=epoch, high_watermark=view.version if leader >= 0 else -1,
                      current_voters=tuple(voters), observers=tuple(observers))
        if version >= 2:
            fields.update(error_message=message)
        return build(partition_schema, **fields)

    if not node.authorizer.cluster(ctx, DESCRIBE):  # as Kafka asks of DescribeQuorum
        return answer(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    try:
        leases = await node.metadata.leases("coordinator")
    except MetadataUnavailable as exc:
        return answer(ErrorCode.request_timed_out, f"the metadata store is unavailable: {exc}")
    lease = next((le for le in leases if le.scope == "coordinator" and le.live), None)
    topics = []
    for topic in request.topics:
        partitions = []
        for p in topic.partitions:
            if topic.topic_name != METADATA_TOPIC or p.partition_index != 0:
                partitions.append(partition(p.partition_index,
                                            ErrorCode.unknown_topic_or_partition,
                                            "only __cluster_metadata-0 has a quorum"))
            elif lease is None or lease.holder is None:
                partitions.append(partition(0, ErrorCode.not_leader_or_follower,
                                            "no node holds the coordinator lease now"))
            else:
                own, leader = view.version, lease.holder
                observers = [replica(n, own if n == node.node_id else UNKNOWN)
                             for n in sorted(view.brokers) if n != leader]
                partitions.append(partition(0, ErrorCode.none, None, leader, lease.epoch,
                                            [replica(leader, own)], observers))
        topics.append(build(topic_schema, topic_name=topic.topic_name,
                            partitions=tuple(partitions)))
    return answer(ErrorCode.none, None, topics)


def _nodes(schema, view, ctx):
    """v2: every live node's endpoint for the listener the request came in on."""
    node_schema, listener_schema = nested(schema, "Node"), nested(schema, "Listener")
    out = []
    for broker in sorted(view.brokers.values(), key=lambda b: b.node_id):
        host, port = broker.endpoint(ctx.listener_name)
        out.append(build(node_schema, node_id=broker.node_id, listeners=(
            build(listener_schema, name=ctx.listener_name or "PLAINTEXT", host=host,
                  port=port),)))
    return tuple(out)
