"""The consumer protocol's subscription (the metadata a consumer sends in JoinGroup).

The group coordinator carries member metadata opaquely; only OffsetDelete needs to know which
topics a consumer group subscribes to (Kafka answers GROUP_SUBSCRIBED_TO_TOPIC for those).
"""

from __future__ import annotations

import struct

from kio.schema.consumer_protocol_subscription.v0.data import (
    ConsumerProtocolSubscription as SubscriptionV0,
)
from kio.schema.consumer_protocol_subscription.v1.data import (
    ConsumerProtocolSubscription as SubscriptionV1,
)
from kio.schema.consumer_protocol_subscription.v2.data import (
    ConsumerProtocolSubscription as SubscriptionV2,
)
from kio.schema.consumer_protocol_subscription.v3.data import (
    ConsumerProtocolSubscription as SubscriptionV3,
)
from kio.serial import entity_reader

_readers = [entity_reader(s) for s in (SubscriptionV0, SubscriptionV1, SubscriptionV2,
                                        SubscriptionV3)]


def subscription_topics(metadata: bytes) -> set[str] | None:
    """The subscribed topics, or None when the bytes are not a subscription. A version newer
    than we know is read as the newest we know, as Kafka's ConsumerProtocol does (newer
    versions only append fields)."""
    if len(metadata) < 2:
        return None
    (version,) = struct.unpack_from(">h", metadata)
    if version < 0:
        return None
    read = _readers[min(version, len(_readers) - 1)]
    try:
        subscription, _ = read(memoryview(metadata).toreadonly(), 2)
    except Exception:  # kio raises assorted errors on bad input
        return None
    return set(subscription.topics)
