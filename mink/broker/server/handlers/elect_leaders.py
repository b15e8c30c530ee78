"""ElectLeaders, mapped to what it means here: a partition's one replica is its leader.

PREFERRED: a partition with a live leader already has its preferred leader
(ELECTION_NOT_NEEDED); one without gets PREFERRED_LEADER_NOT_AVAILABLE, as Kafka answers
when the preferred replica is down. UNCLEAN: partitions without a live leader (orphans)
are re-led at once to the least loaded live nodes, as the coordinator's tick would do
(`plan_orphan_moves`, applied through `Coordinator.move_leaders`); the others need no
election. With null partitions Kafka considers every partition and answers only those
where an election ran or failed; so does this."""

from __future__ import annotations

from collections import Counter

from kio.schema.errors import ErrorCode

from mink.broker.server.forwarding import forward_unless_coordinator
from mink.broker.security.authorizer import ALTER
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema

PREFERRED, UNCLEAN = 0, 1


def plan(view, wanted: list[tuple[str, int]], election_type: int
         ) -> tuple[dict[tuple[str, int], tuple[ErrorCode, str | None]], list, list]:
    """(results, moves, moved keys) for the partitions asked for."""
    live = view.assignable or sorted(view.brokers)  # draining nodes take no leadership
    loads = Counter({n: 0 for n in live})
    for topic in view.topics.values():
        for p in topic.partitions:
            if p.leader in loads:
                loads[p.leader] += 1
    results, moves, moved = {}, [], []
    for name, index in wanted:
        topic = view.topics.get(name)
        if topic is None or not 0 <= index < len(topic.partitions):
            results[(name, index)] = (ErrorCode.unknown_topic_or_partition, None)
            continue
        p = topic.partitions[index]
        if p.leader is not None and p.leader in view.brokers:
            results[(name, index)] = (ErrorCode.election_not_needed,
                                      "Leader election not needed for topic partition.")
        elif election_type == PREFERRED or not live:
            results[(name, index)] = (ErrorCode.preferred_leader_not_available
                                      if election_type == PREFERRED else
                                      ErrorCode.eligible_leaders_not_available,
                                      f"the leader of {name}-{index} is not live")
        else:
            target = min(live, key=lambda n: (loads[n], n))
            loads[target] += 1
            moves.append((topic.topic_id, index, target, p.leader_epoch))
            moved.append((name, index))
            results[(name, index)] = (ErrorCode.none, None)
    return results, moves, moved


async def handle(node, ctx, request):
    authorized = node.authorizer.cluster(ctx, ALTER)
    forwarded = await forward_unless_coordinator(node, ctx) if authorized else None
    if forwarded is not None:
        return forwarded
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    election_type = getattr(request, "election_type", PREFERRED)
    view = node.view
    every = request.topic_partitions is None
    if every:
        wanted = [(name, p.index) for name, t in sorted(view.topics.items())
                  for p in t.partitions]
    else:
        wanted = [(t.topic, i) for t in request.topic_partitions for i in t.partitions]
    if not authorized:
        results = {key: (ErrorCode.cluster_authorization_failed, None) for key in wanted}
        moves, moved = [], []
    elif election_type not in (PREFERRED, UNCLEAN):
        results = {key: (ErrorCode.invalid_request, f"unknown election type {election_type}")
                   for key in wanted}
        moves, moved = [], []
    elif not node.coordinator.is_holder:
        results = {key: (ErrorCode.not_controller, None) for key in wanted}
        moves, moved = [], []
    else:
        results, moves, moved = plan(view, wanted, election_type)
    if moves and not await node.coordinator.move_leaders(moves, "unclean election"):
        for key in moved:
            results[key] = (ErrorCode.not_controller, "the move was refused; retry")
    ctx.applied()
    if every:
        results = {k: v for k, v in results.items() if v[0] != ErrorCode.election_not_needed}
    by_topic: dict[str, list] = {}
    partition_schema = nested(schema, "PartitionResult")
    for (name, index), (error, message) in results.items():
        by_topic.setdefault(name, []).append(build(
            partition_schema, partition_id=index, error_code=error, error_message=message))
    topic_schema = nested(schema, "ReplicaElectionResult")
    return build(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                 replica_election_results=tuple(
                     build(topic_schema, topic=name, partition_result=tuple(parts))
                     for name, parts in by_topic.items()))
