"""Metadata: live brokers, the controller, and each topic's partitions with their leaders.

replicas = ISR = [leader]: data durability comes from the object store, not from replicas.
"""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from mink.broker.cluster.view import ClusterView, TopicInfo
from mink.protocol.messages import EncodedBody, response_schema
from mink.protocol.metadata_encoding import encode_metadata_body, encode_metadata_topic
from mink.broker.security.authorizer import DESCRIBE
from mink.broker.security.operations import OMITTED, cluster_operations, topic_operations
from mink.protocol.topics import INTERNAL_TOPICS, topic_name_error

ZERO_UUID = uuid.UUID(int=0)
LEADER_NOT_AVAILABLE = int(ErrorCode.leader_not_available)
NO_AUTHORIZED_OPERATIONS = OMITTED


async def handle(node, ctx, request):
    version = ctx.header.api_version
    requested = request.topics
    every_topic = requested is None or (version == 0 and not requested)
    authorizer = node.authorizer
    if not every_topic and request_allows_auto_create(request, version):
        # Kafka: only topics the principal may describe and create (CREATE on the cluster
        # or the topic)
        await node.topic_admin.auto_create_topics([
            t.name for t in requested if t.name and (
                t.name in node.view.topics or (authorizer.topic(ctx, DESCRIBE, t.name)
                                               and authorizer.may_create_topic(ctx, t.name)))],
            ctx)
    ctx.applied()
    view: ClusterView = node.view
    # Encoding is the cost (about 12 ms for 10,000 partitions): one encoding per snapshot,
    # version and question.
    # KIP-430: the operations are there only when asked for (v8+; the cluster's v8-10)
    operations = (bool(getattr(request, "include_topic_authorized_operations", False)),
                  bool(getattr(request, "include_cluster_authorized_operations", False)))
    listener = ctx.listener_name  # brokers are listed with this listener's endpoints
    # With an authorizer the answer depends on the principal (its topics, its operations)
    rights = authorizer.memo_key(ctx)
    key = ("metadata", version, operations, listener, rights, None if every_topic else tuple(
        (t.name, getattr(t, "topic_id", None)) for t in requested))
    encoded = view.memo.get(key)
    if encoded is None:
        if len(view.memo) > 256:
            view.memo.clear()
        encoded = view.memo[key] = EncodedBody(response_schema(3, version), _encoded(
            view, version, requested, every_topic, operations, listener,
            _Rights(authorizer, ctx) if rights is not None else None))
    return encoded


class _Rights:
    """What a principal may see: describable topics and the KIP-430 operations."""

    def __init__(self, authorizer, ctx) -> None:
        self.authorizer = authorizer
        self.ctx = ctx

    def describes(self, name: str) -> bool:
        return self.authorizer.topic(self.ctx, DESCRIBE, name)

    def topic_operations(self, name: str, asked: bool) -> int:
        return self.authorizer.topic_operations(self.ctx, name, asked)

    def cluster_operations(self, asked: bool) -> int:
        return self.authorizer.cluster_operations(self.ctx, asked)


def _encoded(view: ClusterView, version: int, requested, every_topic: bool,
             operations: tuple[bool, bool] = (False, False),
             listener: str | None = None, rights: _Rights | None = None) -> bytes:
    """The body, laid out by protocol/metadata_encoding from plain tuples (no kio objects:
    building and writing those took 1.7 s for 100,000 partitions); brokers with the
    endpoints of `listener`, the one the request came in on. With `rights` (an authorizer
    on), only the topics the principal may describe, with its own operations."""
    topic_ops = topic_operations(operations[0])
    cluster_ops = cluster_operations(operations[1])
    encoded = _TopicBytes(view, version)
    if rights is None:
        if every_topic:
            topics = [encoded(topic, topic_ops) for topic in view.topics.values()]
        else:
            topics = [_requested_topic(view, t.name, getattr(t, "topic_id", None), topic_ops,
                                       encoded) for t in requested]
    else:
        cluster_ops = rights.cluster_operations(operations[1])
        if every_topic:
            topics = [encoded(topic, rights.topic_operations(topic.name, operations[0]))
                      for topic in view.topics.values() if rights.describes(topic.name)]
        else:
            topics = [_authorized_topic(view, t.name, getattr(t, "topic_id", None),
                                        rights, operations[0], encoded) for t in requested]
    # Recently live brokers too (ClusterView.listed_brokers says why); a partition's leader
    # is named only while it is live.
    brokers = [(b.node_id, *b.endpoint(listener), b.rack)
               for b in sorted((view.listed_brokers or view.brokers).values(),
                               key=lambda b: b.node_id)]
    return encode_metadata_body(
        version, throttle_ms=0, brokers=brokers, cluster_id=view.cluster_id,
        controller_id=view.controller_id, topics=topics,
        cluster_authorized_operations=cluster_ops,
        error_code=ErrorCode.none)  # v13 (KIP-1102): a top-level error, none here


def request_allows_auto_create(request, version: int) -> bool:
    # Before v4 the request has no flag and Kafka creates topics when the broker allows it.
    return getattr(request, "allow_auto_topic_creation", True) if version >= 4 else True


class _TopicBytes:
    """Each topic's bytes in an answer of `version`, kept from one answer to the next: a
    snapshot made by deltas shares its unchanged topics (the same TopicInfo objects) and this
    cache with the one before, so an answer after a change lays out only what changed
    (100,000 partitions took about 110 ms a version to lay out whole). An entry serves while
    its topic is the very same object and the live brokers are the same."""

    def __init__(self, view: ClusterView, version: int) -> None:
        self.view, self.version = view, version
        self.live = frozenset(view.brokers)
        cache = view.derived.get("topic_bytes")
        if cache is None or len(cache) > 4 * len(view.topics) + 1024:
            cache = view.derived["topic_bytes"] = {}  # (deleted topics' entries go too)
        self.cache = cache

    def __call__(self, topic: TopicInfo, topic_ops: int) -> bytes:
        key = (self.version, topic_ops, topic.topic_id)
        entry = self.cache.get(key)
        if entry is not None and entry[0] is topic and entry[1] == self.live:
            return entry[2]
        data = encode_metadata_topic(self.version, _topic(self.view, topic, topic_ops))
        self.cache[key] = (topic, self.live, data)
        return data


def _authorized_topic(view: ClusterView, name: str | None, topic_id, rights: _Rights,
                      asked: bool, encoded: _TopicBytes) -> tuple | bytes:
    """A requested topic the principal may not describe answers TOPIC_AUTHORIZATION_FAILED
    whether or not it exists (by id: only once the id is known)."""
    known = view.topics.get(name) if name is not None else (
        view.topic_by_id(topic_id) if topic_id is not None and topic_id != ZERO_UUID else None)
    checked = name if name is not None else (known.name if known is not None else None)
    if checked is not None and not rights.describes(checked):
        return (int(ErrorCode.topic_authorization_failed), name, ZERO_UUID, False, (),
                NO_AUTHORIZED_OPERATIONS)
    return _requested_topic(view, name, topic_id,
                            rights.topic_operations(checked, asked) if checked else OMITTED,
                            encoded)


def _requested_topic(view: ClusterView, name: str | None, topic_id,
                     topic_ops: int, encoded: _TopicBytes) -> tuple | bytes:
    topic = None
    if name is not None:
        topic = view.topics.get(name)
    elif topic_id is not None and topic_id != ZERO_UUID:
        topic = view.topic_by_id(topic_id)
    if topic is not None:
        return encoded(topic, topic_ops)
    error = ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition
    if name is not None and topic_name_error(name):
        error = ErrorCode.invalid_topic_exception
    return (error, name, topic_id or ZERO_UUID, False, (), NO_AUTHORIZED_OPERATIONS)


def _topic(view: ClusterView, topic: TopicInfo, topic_ops: int = OMITTED) -> tuple:
    live = view.brokers
    partitions = []
    for p in topic.partitions:
        if p.leader is not None and p.leader in live:
            partitions.append((0, p.index, p.leader, p.leader_epoch, (p.leader,)))
        else:
            partitions.append((LEADER_NOT_AVAILABLE, p.index, -1, p.leader_epoch, ()))
    return (0, topic.name, topic.topic_id, topic.name in INTERNAL_TOPICS, partitions, topic_ops)
