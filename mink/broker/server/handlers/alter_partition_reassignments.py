"""AlterPartitionReassignments, mapped to what it means here: a partition has one replica,
its leader, so a reassignment naming a target broker moves leadership there.

The first broker of the proposed replicas is the target (Kafka's preferred leader). The
moves of one request are applied as `mink cluster rebalance` applies its own: one fenced
LeadBucket per partition, in one transaction, under the coordinator lease epoch
(`Coordinator.move_leaders`); the expected leader epoch makes a move that raced another
one fail instead of overriding it. The answer comes once PostgreSQL has the new leaders;
the move completes when the new leader has opened the partition, and until then
ListPartitionReassignments shows it. A cancellation (null replicas) has nothing to cancel.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.server.forwarding import forward_unless_coordinator
from mink.broker.security.authorizer import ALTER
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema


def plan(view, name: str, index: int, replicas, allow_rf_change: bool
         ) -> tuple[ErrorCode, str | None, tuple | None]:
    """(error, message, move) of one proposed reassignment; move is (topic id, partition,
    target, expected leader epoch) or None when there is nothing to move."""
    topic = view.topics.get(name)
    if topic is None or not 0 <= index < len(topic.partitions):
        return ErrorCode.unknown_topic_or_partition, None, None
    p = topic.partitions[index]
    if replicas is None:
        return (ErrorCode.no_reassignment_in_progress,
                "a leadership move is a single step; there is nothing to cancel", None)
    if not replicas or len(set(replicas)) != len(replicas):
        return (ErrorCode.invalid_replica_assignment,
                "The proposed replica assignment is empty or has duplicate brokers.", None)
    if not allow_rf_change and len(replicas) != 1:
        return (ErrorCode.invalid_replication_factor,
                "The replication factor is changed from 1 to " f"{len(replicas)}", None)
    missing = [b for b in replicas if b not in view.brokers]
    if missing:
        return (ErrorCode.invalid_replica_assignment,
                f"The proposed assignment contains non-live brokers: {missing}", None)
    target = replicas[0]
    if p.leader == target:
        return ErrorCode.none, None, None
    return ErrorCode.none, None, (topic.topic_id, index, target, p.leader_epoch)


async def handle(node, ctx, request):
    if not node.authorizer.cluster(ctx, ALTER):
        ctx.applied()
        return _answer(response_schema(ctx.header.api_key, ctx.header.api_version), request,
                       {}, bool(getattr(request, "allow_replication_factor_change", True)),
                       ErrorCode.cluster_authorization_failed,
                       "Cluster authorization failed.")
    forwarded = await forward_unless_coordinator(node, ctx)
    if forwarded is not None:
        return forwarded
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    allow_rf_change = bool(getattr(request, "allow_replication_factor_change", True))
    results: dict[tuple[str, int], tuple[ErrorCode, str | None]] = {}
    moves, moved = [], []
    if not node.coordinator.is_holder:
        return _answer(schema, request, {}, allow_rf_change, ErrorCode.not_controller,
                       "this node is not the cluster coordinator and none is reachable")
    view = node.view
    for topic in request.topics:
        for p in topic.partitions:
            error, message, move = plan(view, topic.name, p.partition_index, p.replicas,
                                        allow_rf_change)
            results[(topic.name, p.partition_index)] = (error, message)
            if move is not None:
                moves.append(move)
                moved.append((topic.name, p.partition_index))
    if moves and not await node.coordinator.move_leaders(moves, "reassignment"):
        for key in moved:
            results[key] = (ErrorCode.not_controller,
                            "the move was refused (the coordinator lease or the partition "
                            "moved meanwhile); retry")
    ctx.applied()
    return _answer(schema, request, results, allow_rf_change, ErrorCode.none, None)


def _answer(schema, request, results, allow_rf_change, error, message):
    topic_schema = nested(schema, "ReassignableTopicResponse")
    partition_schema = nested(schema, "ReassignablePartitionResponse")
    return build(schema, throttle_time=NO_THROTTLE, error_code=error, error_message=message,
                 allow_replication_factor_change=allow_rf_change,
                 responses=tuple(build(topic_schema, name=t.name, partitions=tuple(
                     build(partition_schema, partition_index=p.partition_index,
                           error_code=results.get((t.name, p.partition_index),
                                                  (ErrorCode.none, None))[0] if results else
                           error,
                           error_message=results.get((t.name, p.partition_index),
                                                     (None, None))[1] if results else message)
                     for p in t.partitions)) for t in request.topics))
