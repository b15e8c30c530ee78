"""KIP-516 topic ids in requests: Fetch v13+ (and other APIs since) name topics by id only.

Kept apart from the handlers so that each handler's change is one line: resolve the id to
the topic the view knows, or answer UNKNOWN_TOPIC_ID as Kafka does.
"""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from mink.broker.cluster.view import ClusterView, TopicInfo

ZERO_UUID = uuid.UUID(int=0)


def requested_topic(view: ClusterView, name: str | None,
                    topic_id: uuid.UUID | None) -> tuple[str | None, uuid.UUID, ErrorCode]:
    """(name, id, error) of a topic a request names by name or (v13+) by id.

    An id the view does not know gives UNKNOWN_TOPIC_ID and no name; a name is returned
    as given (the handler's own lookup answers UNKNOWN_TOPIC_OR_PARTITION for it)."""
    if topic_id is not None and topic_id != ZERO_UUID:
        topic: TopicInfo | None = view.topic_by_id(topic_id)
        if topic is None:
            return None, topic_id, ErrorCode.unknown_topic_id
        return topic.name, topic_id, ErrorCode.none
    topic = view.topics.get(name) if name is not None else None
    return name, topic.topic_id if topic is not None else ZERO_UUID, ErrorCode.none
