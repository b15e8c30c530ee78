"""Reconciliation of a KIP-848 member towards its target assignment (Kafka's
CurrentAssignmentBuilder): a pure state machine.

A member moves in steps, each answered in a heartbeat:

- it keeps `assigned ∩ target`; what it holds outside the target is *pending revocation*:
  it stays at its epoch, in UNREVOKED_PARTITIONS, and is told its assignment without those,
  until a heartbeat's owned partitions no longer list them;
- then it moves to the target epoch and gets `target - assigned`, except partitions another
  member still holds (their revocation is pending): those are *unreleased*, the member is in
  UNRELEASED_PARTITIONS and gets them at a later heartbeat, once they are free.

So a partition is never assigned to two members at once: it is given only when free.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass

TopicPartition = tuple[uuid.UUID, int]


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass(frozen=True, slots=True)
class Reconciled:
    state: MemberState
    member_epoch: int
    assigned: frozenset[TopicPartition]
    pending_revocation: frozenset[TopicPartition]


def reconcile(current: Reconciled, target_epoch: int, target: Set[TopicPartition],
              subscribed: Set[uuid.UUID], owned: Iterable[TopicPartition] | None,
              owned_by_other: Callable[[TopicPartition], bool]) -> Reconciled:
    """The member's next step. `owned` is what its heartbeat reported (None: not sent);
    `owned_by_other(tp)` is whether another member holds tp (assigned or pending
    revocation)."""
    owned_set = None if owned is None else set(owned)

    def still_owns(revoking: Set[TopicPartition]) -> bool:
        return owned_set is None or not owned_set.isdisjoint(revoking)

    if current.state is MemberState.STABLE:
        if current.member_epoch == target_epoch:
            return _drop_unsubscribed(current, subscribed, still_owns)
    elif current.state is MemberState.UNREVOKED_PARTITIONS:
        if still_owns(current.pending_revocation):
            return _drop_unsubscribed(current, subscribed, still_owns)
    return _next(current, target_epoch, target, subscribed, still_owns, owned_by_other)


def _drop_unsubscribed(current: Reconciled, subscribed, still_owns) -> Reconciled:
    """The subscription shrank at the same epoch: revoke the topics no longer subscribed."""
    dropped = {tp for tp in current.assigned if tp[0] not in subscribed}
    if not dropped:
        return current
    pending = current.pending_revocation | dropped
    assigned = current.assigned - dropped
    if still_owns(pending):
        return Reconciled(MemberState.UNREVOKED_PARTITIONS, current.member_epoch,
                          frozenset(assigned), frozenset(pending))
    return Reconciled(current.state, current.member_epoch, frozenset(assigned),
                      current.pending_revocation)


def _next(current: Reconciled, target_epoch: int, target: Set[TopicPartition], subscribed,
          still_owns, owned_by_other) -> Reconciled:
    target = {tp for tp in target if tp[0] in subscribed}
    assigned = current.assigned & target
    revoking = current.assigned - assigned
    pending_assignment = target - assigned
    unreleased = {tp for tp in pending_assignment if owned_by_other(tp)
                  and tp not in current.pending_revocation}
    pending_assignment -= unreleased
    if revoking and still_owns(revoking):
        return Reconciled(MemberState.UNREVOKED_PARTITIONS, current.member_epoch,
                          frozenset(assigned), frozenset(revoking))
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return Reconciled(state, target_epoch, frozenset(assigned | pending_assignment),
                      frozenset())
