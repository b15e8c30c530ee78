"""A KIP-848 consumer group and its members (Kafka's ConsumerGroup, ConsumerGroupMember).

The group epoch grows whenever what the assignment depends on changes (a member joins or
leaves, a subscription or a subscribed topic's partition count changes); the target
assignment is computed for a group epoch; each member's epoch reaches the target epoch by
reconciliation (`reconciliation.py`). `owners` maps each partition held by some member
(assigned or pending revocation) to that member: the proof that nobody holds one twice.
"""

from __future__ import annotations

import enum
import math
import uuid
from dataclasses import dataclass, field

import msgspec
import re2

from mink.broker.groups.reconciliation import MemberState, Reconciled, TopicPartition
from mink.broker.groups.state import OffsetAndMetadata


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class ConsumerGroupMember:
    member_id: str
    client_id: str
    client_host: str
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = 300_000
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    state: MemberState = MemberState.STABLE
    member_epoch: int = 0
    previous_member_epoch: int = -1
    assigned: frozenset[TopicPartition] = frozenset()
    pending_revocation: frozenset[TopicPartition] = frozenset()
    # timers (trio clock): the session, and the revocation deadline while UNREVOKED
    expires_at: float = math.inf
    timer_at: float = math.inf
    timer_token: int = 0
    revoke_by: float = math.inf

    def reconciled(self) -> Reconciled:
        return Reconciled(self.state, self.member_epoch, self.assigned,
                          self.pending_revocation)


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    partition: int  # of __consumer_offsets
    group_epoch: int = 0
    target_epoch: int = 0
    members: dict[str, ConsumerGroupMember] = field(default_factory=dict)
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    owners: dict[TopicPartition, str] = field(default_factory=dict)
    # topic name -> (topic id, partitions) of every subscribed topic, as last seen
    subscription_metadata: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)
    offsets: dict[tuple[str, int], OffsetAndMetadata] = field(default_factory=dict)
    # The regular expressions the group has resolved. As in Kafka, one new to the group is
    # resolved after the heartbeat that brought it, which is answered without its topics;
    # a resolved one follows the topics as they come and go.
    resolved_regexes: set[str] = field(default_factory=set)
    dead: bool = False

    @property
    def state(self) -> ConsumerGroupState:
        """Kafka's ConsumerGroup.maybeUpdateGroupState."""
        if self.dead:
            return ConsumerGroupState.DEAD
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.target_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(m.state is not MemberState.STABLE or m.member_epoch != self.target_epoch
               for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def subscribed_topic_names(self, topics) -> set[str]:
        """Every topic a member subscribes to, by name or by its regular expression matching
        one of `topics` (names)."""
        names = {t for m in self.members.values() for t in m.subscribed_topic_names}
        for regex in self.subscribed_regexes() & self.resolved_regexes:
            names |= resolve_regex(regex, topics)
        return names

    def subscribed_regexes(self) -> set[str]:
        return {m.subscribed_topic_regex for m in self.members.values()
                if m.subscribed_topic_regex}

    def member_topics(self, member: ConsumerGroupMember, topics) -> set[str]:
        """The topics of `topics` (names) `member` subscribes to: by name, or by its regular
        expression once the group has resolved it."""
        names = set(member.subscribed_topic_names)
        regex = member.subscribed_topic_regex
        if regex and regex in self.resolved_regexes:
            names |= resolve_regex(regex, topics)
        return names

    def owned_by_other(self, member_id: str):
        return lambda tp: self.owners.get(tp, member_id) != member_id

    def release(self, member: ConsumerGroupMember) -> None:
        for tp in member.assigned | member.pending_revocation:
            if self.owners.get(tp) == member.member_id:
                del self.owners[tp]

    def take(self, member: ConsumerGroupMember) -> list[TopicPartition]:
        """Record what `member` holds; returns partitions another member already held
        (an invariant broken: never expected)."""
        clashes = []
        for tp in member.assigned | member.pending_revocation:
            holder = self.owners.setdefault(tp, member.member_id)
            if holder != member.member_id:
                clashes.append(tp)
        return clashes

    def preferred_assignor(self, default: str) -> str:
        """Kafka's ConsumerGroup.computePreferredServerAssignor: the assignor most members
        asked for, else the default."""
        counts: dict[str, int] = {}
        for m in self.members.values():
            if m.server_assignor:
                counts[m.server_assignor] = counts.get(m.server_assignor, 0) + 1
        if not counts:
            return default
        return max(sorted(counts), key=lambda name: counts[name])


def compile_regex(regex: str):
    """RE2 syntax, as Kafka's RE2/J; raises ValueError if it is not a valid one."""
    try:
        return re2.compile(regex)
    except re2.error as exc:
        raise ValueError(str(exc)) from None


def resolve_regex(regex: str, topics) -> set[str]:
    """The topics the whole name of which matches (Kafka: Pattern.matcher(t).matches()),
    internal topics excepted."""
    pattern = compile_regex(regex)
    return {t for t in topics if not t.startswith("__") and pattern.fullmatch(t)}


# -- stored form (sql/0017_consumer_groups.sql: one json document per group) -----------------

_encoder = msgspec.json.Encoder()


def _tps(partitions) -> list[list]:
    return sorted([str(t), p] for t, p in partitions)


def _from_tps(rows) -> frozenset[TopicPartition]:
    return frozenset((uuid.UUID(t), p) for t, p in rows)


def to_json(group: ConsumerGroup) -> str:
    return _encoder.encode({
        "target_epoch": group.target_epoch,
        "subscription_metadata": {name: [str(t), n] for name, (t, n)
                                  in group.subscription_metadata.items()},
        "resolved_regexes": sorted(group.resolved_regexes),
        "members": [{
            "member_id": m.member_id, "client_id": m.client_id, "client_host": m.client_host,
            "instance_id": m.instance_id, "rack_id": m.rack_id,
            "rebalance_timeout_ms": m.rebalance_timeout_ms,
            "subscribed_topic_names": list(m.subscribed_topic_names),
            "subscribed_topic_regex": m.subscribed_topic_regex,
            "server_assignor": m.server_assignor, "state": m.state.value,
            "member_epoch": m.member_epoch, "previous_member_epoch": m.previous_member_epoch,
            "assigned": _tps(m.assigned), "pending_revocation": _tps(m.pending_revocation),
            "target": _tps(group.target.get(m.member_id, ())),
        } for m in group.members.values()],
    }).decode()


def from_json(group_id: str, partition: int, group_epoch: int, state: str) -> ConsumerGroup:
    doc = msgspec.json.decode(state)
    group = ConsumerGroup(group_id, partition, group_epoch=group_epoch,
                          target_epoch=doc["target_epoch"])
    group.subscription_metadata = {name: (uuid.UUID(t), n) for name, (t, n)
                                   in doc["subscription_metadata"].items()}
    for m in doc["members"]:
        member = ConsumerGroupMember(
            m["member_id"], m["client_id"], m["client_host"], instance_id=m["instance_id"],
            rack_id=m["rack_id"], rebalance_timeout_ms=m["rebalance_timeout_ms"],
            subscribed_topic_names=tuple(m["subscribed_topic_names"]),
            subscribed_topic_regex=m.get("subscribed_topic_regex"),
            server_assignor=m["server_assignor"], state=MemberState(m["state"]),
            member_epoch=m["member_epoch"], previous_member_epoch=m["previous_member_epoch"],
            assigned=_from_tps(m["assigned"]),
            pending_revocation=_from_tps(m["pending_revocation"]))
        group.members[member.member_id] = member
        group.target[member.member_id] = _from_tps(m["target"])
        group.take(member)
    # A group written before regexes were resolved apart had every one resolved.
    resolved = doc.get("resolved_regexes")
    group.resolved_regexes = (set(resolved) if resolved is not None
                              else group.subscribed_regexes())
    return group
