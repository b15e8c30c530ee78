"""CreatePartitions: grow a topic. New partitions get leaders spread over the live nodes,
or the one live broker per partition a manual assignment names."""

from __future__ import annotations

import dataclasses

import logging
from collections import Counter

from kio.schema.errors import ErrorCode

from mink.broker.server.forwarding import forward_unless_coordinator
from mink.broker.security.authorizer import ALTER
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.server.handlers.create_topics import (
    MAX_PARTITIONS_PER_REQUEST,
    Refused,
    assigned_leader,
)
from mink.broker.topics.admin import NotClusterCoordinator
from mink.protocol.messages import build, nested, response_schema
from mink.protocol.topics import INTERNAL_TOPICS
from mink.storage import controlplane as md

log = logging.getLogger(__name__)


async def handle(node, ctx, request):
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    result_schema = nested(schema, "CreatePartitionsTopicResult")
    # Forwarded as it came; the coordinator checks it, as the original principal
    forwarded = await forward_unless_coordinator(node, ctx) if request.topics else None
    if forwarded is not None:
        return forwarded
    # ALTER on each topic
    denied = {t.name: build(result_schema, name=t.name,
                            error_code=ErrorCode.topic_authorization_failed,
                            error_message="Authorization failed.")
              for t in request.topics if not node.authorizer.topic(ctx, ALTER, t.name)}
    if denied:
        request = dataclasses.replace(request, topics=tuple(
            t for t in request.topics if t.name not in denied))
    counts = Counter(t.name for t in request.topics)
    total = sum(max(t.count, 0) for t in request.topics)
    results: dict[str, object] = dict(denied)
    for topic in request.topics:
        name = topic.name
        if name in results:
            continue
        try:
            if total > MAX_PARTITIONS_PER_REQUEST:
                raise Refused(ErrorCode.policy_violation,
                              "Excessively large number of partitions per request.")
            if counts[name] > 1:
                raise Refused(ErrorCode.invalid_request, "Duplicate topic name.")
            current, leaders = plan_partitions(node, topic)
            if not request.validate_only:
                await create_partitions(node, name, topic.count, leaders)
                log.info("topic %s grew from %d to %d partitions", name, current, topic.count)
            results[name] = build(result_schema, name=name, error_code=ErrorCode.none,
                                  error_message=None)
        except Refused as refused:
            results[name] = build(result_schema, name=name, error_code=refused.error,
                                  error_message=refused.message)
    ctx.applied()
    return build(schema, throttle_time=NO_THROTTLE, results=tuple(results.values()))


def plan_partitions(node, topic) -> tuple[int, list[int]]:
    """(current partition count, leaders of the new partitions), or Refused."""
    existing = node.view.topics.get(topic.name)
    if existing is None:
        raise Refused(ErrorCode.unknown_topic_or_partition,
                      "This server does not host this topic-partition.")
    current = len(existing.partitions)
    if topic.count < current:
        raise Refused(ErrorCode.invalid_partitions,
                      f"Topic currently has {current} partitions, which is higher than the "
                      f"requested {topic.count}.")
    if topic.count == current:
        raise Refused(ErrorCode.invalid_partitions,
                      f"Topic already has {current} partitions.")
    added = topic.count - current
    if topic.assignments is None:
        return current, node.topic_admin.assign_leaders(added, first=current)
    if len(topic.assignments) != added:
        raise Refused(ErrorCode.invalid_replica_assignment,
                      f"Attempted to add {added} additional partition(s), but only "
                      f"{len(topic.assignments)} assignment(s) were specified.")
    return current, [assigned_leader(node, current + i, a.broker_ids)
                     for i, a in enumerate(topic.assignments)]


async def create_partitions(node, name: str, total: int, leaders: list[int]) -> None:
    """Grow the topic and wait until this node's view has the new partitions."""
    if name in INTERNAL_TOPICS:
        # Groups map to its partitions by hash: more partitions would move every group.
        raise Refused(ErrorCode.invalid_request,
                      "the partitions of internal topics cannot be changed")
    try:
        await node.topic_admin.create_partitions(name, total, leaders)
    except NotClusterCoordinator as exc:
        raise Refused(ErrorCode.not_controller, str(exc)) from None
    except md.UnknownTopic:
        raise Refused(ErrorCode.unknown_topic_or_partition,
                      "This server does not host this topic-partition.") from None
    except md.InvalidPartitions as exc:
        raise Refused(ErrorCode.invalid_partitions, str(exc)) from None
    except md.MetadataUnavailable as exc:
        raise Refused(ErrorCode.request_timed_out,
                      f"the metadata store did not answer, try again: {exc}") from None
    except md.MetadataError as exc:
        raise Refused(ErrorCode.unknown_server_error, str(exc)) from None
