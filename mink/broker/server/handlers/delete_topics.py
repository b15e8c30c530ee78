"""DeleteTopics: by name, or (v6) by topic id. The topic's partitions, index and producer
states go at once; its data objects are collected later. A topic created afterwards under the
same name has a new topic id and starts empty."""

from __future__ import annotations

import dataclasses

import logging
import uuid
from collections import Counter

from kio.schema.errors import ErrorCode

from mink.broker.server.forwarding import forward_unless_coordinator
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.security.authorizer import DELETE
from mink.broker.server.handlers.create_topics import Refused
from mink.broker.topics.admin import NotClusterCoordinator
from mink.protocol.messages import build, nested, response_schema
from mink.protocol.topics import INTERNAL_TOPICS
from mink.storage import controlplane as md

log = logging.getLogger(__name__)

ZERO_UUID = uuid.UUID(int=0)


async def handle(node, ctx, request):
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    result_schema = nested(schema, "DeletableTopicResult")
    # Forwarded as it came; the coordinator checks it, as the original principal
    forwarded = await forward_unless_coordinator(node, ctx)
    if forwarded is not None:
        return forwarded
    # DELETE on each topic
    request, denied = _authorized(node, ctx, request, result_schema)
    if ctx.header.api_version >= 6:
        wanted = [(t.name, t.topic_id if t.topic_id != ZERO_UUID else None)
                  for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    names = Counter(name for name, topic_id in wanted if topic_id is None)
    ids = Counter(topic_id for name, topic_id in wanted if name is None and topic_id is not None)

    results = list(denied)
    seen: set = set()
    for name, topic_id in wanted:
        try:
            if name is not None and topic_id is not None:
                raise Refused(ErrorCode.invalid_request,
                              "You may not specify both topic name and topic id.")
            if name is None and topic_id is None:
                raise Refused(ErrorCode.invalid_request,
                              "Neither topic name nor id were specified.")
            key = topic_id or name
            if key in seen:
                continue  # a duplicate, answered once
            seen.add(key)
            if topic_id is None and names[name] > 1:
                raise Refused(ErrorCode.invalid_request, "Duplicate topic name.")
            if topic_id is not None and ids[topic_id] > 1:
                raise Refused(ErrorCode.invalid_request, "Duplicate topic id.")
            name, topic_id = await delete_topic(node, name, topic_id)
            results.append(build(result_schema, name=name, topic_id=topic_id,
                                 error_code=ErrorCode.none, error_message=None))
        except Refused as refused:
            if name is None and topic_id is not None:
                known = node.view.topic_by_id(topic_id)
                name = known.name if known is not None else None
            results.append(build(result_schema, name=name, topic_id=topic_id or ZERO_UUID,
                                 error_code=refused.error, error_message=refused.message))
    # topic_admin.delete_topic refreshed the view: this node closed the partitions it led; the
    # other nodes follow through the change log.
    ctx.applied()
    return build(schema, throttle_time=NO_THROTTLE, responses=tuple(results))


def _authorized(node, ctx, request, result_schema):
    """The request without the topics the principal may not delete, and their answers."""
    authorizer = node.authorizer
    if not authorizer.enabled:
        return request, ()
    denied = []

    def allowed(name, topic_id) -> bool:
        if name is None and topic_id is not None:
            known = node.view.topic_by_id(topic_id)
            if known is None:
                return True  # answered UNKNOWN_TOPIC_ID
            name = known.name
        if name is None or authorizer.topic(ctx, DELETE, name):
            return True
        denied.append(build(result_schema, name=name, topic_id=topic_id or ZERO_UUID,
                            error_code=ErrorCode.topic_authorization_failed,
                            error_message="Authorization failed."))
        return False

    if ctx.header.api_version >= 6:
        kept = tuple(t for t in request.topics if allowed(
            t.name, t.topic_id if t.topic_id != ZERO_UUID else None))
        return dataclasses.replace(request, topics=kept), tuple(denied)
    kept = tuple(n for n in request.topic_names if allowed(n, None))
    return dataclasses.replace(request, topic_names=kept), tuple(denied)


async def delete_topic(node, name: str | None, topic_id: uuid.UUID | None):
    """Delete by name or by id; returns (name, topic id) of the deleted topic, or Refused."""
    known = node.view.topic_by_id(topic_id) if topic_id is not None else None
    if (known.name if known is not None else name) in INTERNAL_TOPICS:
        raise Refused(ErrorCode.invalid_request,
                      "internal topics cannot be deleted: consumer groups live there")
    try:
        if topic_id is not None:
            known = node.view.topic_by_id(topic_id)
            name = known.name if known is not None else None
            deleted_id = await node.topic_admin.delete_topic(topic_id=topic_id)
        else:
            deleted_id = await node.topic_admin.delete_topic(name)
    except NotClusterCoordinator as exc:
        raise Refused(ErrorCode.not_controller, str(exc)) from None
    except md.UnknownTopic:
        if topic_id is not None:
            raise Refused(ErrorCode.unknown_topic_id,
                          f"Topic id {topic_id} does not exist.") from None
        raise Refused(ErrorCode.unknown_topic_or_partition,
                      "This server does not host this topic-partition.") from None
    except md.MetadataUnavailable as exc:
        raise Refused(ErrorCode.request_timed_out,
                      f"the metadata store did not answer, try again: {exc}") from None
    except md.MetadataError as exc:
        raise Refused(ErrorCode.unknown_server_error, str(exc)) from None
    log.info("deleted topic %s (%s)", name, deleted_id)
    return name, deleted_id
