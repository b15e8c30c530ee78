"""The consumer protocol's subscription (the metadata a consumer sends in JoinGroup) and
assignment (what SyncGroup hands each member).

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
from kio.schema.consumer_protocol_assignment.v0.data import (
    ConsumerProtocolAssignment as AssignmentV0,
)
from kio.schema.consumer_protocol_assignment.v1.data import (
    ConsumerProtocolAssignment as AssignmentV1,
)
from kio.schema.consumer_protocol_assignment.v2.data import (
    ConsumerProtocolAssignment as AssignmentV2,
)
from kio.schema.consumer_protocol_assignment.v3.data import (
    ConsumerProtocolAssignment as AssignmentV3,
)
from kio.serial import entity_reader

_readers = [entity_reader(s) for s in (SubscriptionV0, SubscriptionV1, SubscriptionV2,
                                        SubscriptionV3)]
_assignment_readers = [entity_reader(a) for a in (AssignmentV0, AssignmentV1, AssignmentV2,
                                                  AssignmentV3)]


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



def assigned_partitions(assignment: bytes) -> dict[str, list[int]] | None:
    """The partitions a consumer protocol assignment (SyncGroup's bytes for one member)
    gives, by topic; None when the bytes are not an assignment. For the console: the
    coordinator itself carries assignments opaquely."""
    if len(assignment) < 2:
        return None
    (version,) = struct.unpack_from(">h", assignment)
    if version < 0:
        return None
    read = _assignment_readers[min(version, len(_assignment_readers) - 1)]
    try:
        decoded, _ = read(memoryview(assignment).toreadonly(), 2)
    except Exception:  # kio raises assorted errors on bad input
        return None
    return {tp.topic: sorted(tp.partitions) for tp in decoded.assigned_partitions}
