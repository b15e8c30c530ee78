"""Server-side assignors of KIP-848 consumer groups (`group.consumer.assignors`): pure
functions from the members' subscriptions, the topics' partition counts and the current
target assignment to the next target assignment.

A partition is `(topic id, partition index)`. Kafka's two assignors, written afresh:

- `uniform` (the default): balanced over every member subscribed to a partition, and sticky:
  a member keeps what it had while that keeps the balance; only the surplus moves.
- `range`: per topic, consecutive ranges of partitions over the topic's subscribers in
  member id order (co-partitioned topics land on the same member).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Set

TopicPartition = tuple[uuid.UUID, int]
Assignment = dict[str, set[TopicPartition]]

UNIFORM = "uniform"
RANGE = "range"


def uniform(subscriptions: Mapping[str, Set[uuid.UUID]], partitions: Mapping[uuid.UUID, int],
            current: Mapping[str, Set[TopicPartition]]) -> Assignment:
    """Balanced and sticky: every partition of a subscribed topic goes to one of its
    subscribers, no subscriber of a partition holds two more than another subscriber of it
    could take, and a partition stays with its current member unless balance needs it."""
    members = sorted(subscriptions)
    result: Assignment = {m: set() for m in members}
    owner: dict[TopicPartition, str] = {}
    eligible: dict[TopicPartition, list[str]] = {}
    for topic_id in sorted({t for s in subscriptions.values() for t in s if t in partitions},
                           key=str):
        subscribers = [m for m in members if topic_id in subscriptions[m]]
        for index in range(partitions[topic_id]):
            eligible[(topic_id, index)] = subscribers
    if not members or not eligible:
        return result
    # Each member's fair share if everything were interchangeable: with homogeneous
    # subscriptions this is exact (quota or quota + 1), otherwise the moves below even out.
    total = len(eligible)
    quota, extra = divmod(total, len(members))
    # 1. Stickiness: keep current partitions still eligible, up to the member's share.
    for member in members:
        kept = sorted((tp for tp in current.get(member, ()) if member in eligible.get(tp, ())
                       and tp not in owner), key=lambda tp: (str(tp[0]), tp[1]))
        limit = quota + (1 if extra > 0 and len(kept) > quota else 0)
        if limit > quota:
            extra -= 1
        for tp in kept[:limit]:
            owner[tp] = member
            result[member].add(tp)
    # 2. What is left goes to the eligible member holding least (fewest choices first).
    free = sorted((tp for tp in eligible if tp not in owner),
                  key=lambda tp: (len(eligible[tp]), str(tp[0]), tp[1]))
    for tp in free:
        member = min(eligible[tp], key=lambda m: (len(result[m]), m))
        owner[tp] = member
        result[member].add(tp)
    # 3. Balance: move a partition from a member to another eligible one holding at least
    # two fewer, until no such move exists (each move lowers the sum of squares).
    moved = True
    while moved:
        moved = False
        for tp in sorted(owner, key=lambda tp: (str(tp[0]), tp[1])):
            source = owner[tp]
            target = min(eligible[tp], key=lambda m: (len(result[m]), m))
            if len(result[target]) + 1 < len(result[source]):
                result[source].discard(tp)
                result[target].add(tp)
                owner[tp] = target
                moved = True
    return result


def range_(subscriptions: Mapping[str, Set[uuid.UUID]], partitions: Mapping[uuid.UUID, int],
           current: Mapping[str, Set[TopicPartition]]) -> Assignment:
    """Per topic, its subscribers in member id order get consecutive ranges, the first
    `count % subscribers` one partition more."""
    result: Assignment = {m: set() for m in subscriptions}
    for topic_id in {t for s in subscriptions.values() for t in s if t in partitions}:
        subscribers = sorted(m for m, s in subscriptions.items() if topic_id in s)
        quota, extra = divmod(partitions[topic_id], len(subscribers))
        start = 0
        for i, member in enumerate(subscribers):
            size = quota + (1 if i < extra else 0)
            result[member].update((topic_id, p) for p in range(start, start + size))
            start += size
    return result


ASSIGNORS = {UNIFORM: uniform, RANGE: range_}
