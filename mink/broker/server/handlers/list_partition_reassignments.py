"""ListPartitionReassignments: the leadership moves still in progress.

A move (AlterPartitionReassignments, a rebalance, a failover) is in progress from the
LeadBucket that names the new leader until that leader has opened the partition at the new
leader epoch. It is read from PostgreSQL, not the node's view: openings write no change-log
row. Shown as Kafka shows a reassignment: replicas = [new leader], adding = [new leader],
removing = [the node that had it open], if any."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import DESCRIBE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema
from mink.storage import controlplane as md
from mink.storage.controlplane import MetadataUnavailable


def in_progress(live: set[int], p: md.PartitionRecord) -> bool:
    """Led by a live node that has not opened it at its leader epoch yet."""
    opened = p.stream_state == "open" and p.opened_by_node == p.leader_node and (
        p.open_leader_epoch == p.leader_epoch)
    return p.leader_node is not None and p.leader_node in live and not opened


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    if not node.authorizer.cluster(ctx, DESCRIBE):
        # as Kafka's getErrorResponse: the partitions asked for, with nothing in them
        return build(schema, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.cluster_authorization_failed,
                     error_message="Cluster authorization failed.", topics=tuple(
                         build(nested(schema, "OngoingTopicReassignment"), name=t.name,
                               partitions=tuple(build(
                                   nested(schema, "OngoingPartitionReassignment"),
                                   partition_index=i, replicas=(), adding_replicas=(),
                                   removing_replicas=()) for i in t.partition_indexes))
                         for t in request.topics or ()))
    try:
        snapshot = await node.metadata.view()
    except MetadataUnavailable as exc:
        return build(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.request_timed_out,
                     error_message=f"the metadata store did not answer, try again: {exc}",
                     topics=())
    topics = {t.name: t for t in snapshot.topics}
    live = {n.node_id for n in snapshot.nodes}
    if request.topics is None:
        wanted = {(name, p.partition) for name, t in topics.items() for p in t.partitions}
    else:
        wanted = {(t.name, i) for t in request.topics for i in t.partition_indexes}
    partition_schema = nested(schema, "OngoingPartitionReassignment")
    by_topic: dict[str, list] = {}
    for name, index in sorted(wanted):
        topic = topics.get(name)
        if topic is None or not 0 <= index < len(topic.partitions):
            continue  # Kafka lists only partitions with a reassignment
        p = topic.partitions[index]
        if not in_progress(live, p):
            continue
        removing = ((p.opened_by_node,) if p.opened_by_node not in (None, p.leader_node)
                    else ())
        by_topic.setdefault(name, []).append(build(
            partition_schema, partition_index=index, replicas=(p.leader_node,),
            adding_replicas=(p.leader_node,), removing_replicas=removing))
    topic_schema = nested(schema, "OngoingTopicReassignment")
    return build(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                 error_message=None, topics=tuple(
                     build(topic_schema, name=name, partitions=tuple(parts))
                     for name, parts in by_topic.items()))
