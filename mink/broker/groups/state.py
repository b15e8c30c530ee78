"""One consumer group's state, as Kafka's classic GroupMetadata / MemberMetadata keep it.

No I/O and no timers here: the GroupCoordinator drives these objects, one trio task at a
time, so a sequence of calls without an await in between is atomic.

States (Kafka's): Empty -> PreparingRebalance -> CompletingRebalance -> Stable, and Dead once
the group is unloaded or deleted. A JoinGroup or SyncGroup request that must wait for the
rebalance parks a `Waiter` on its member; the coordinator resolves it.
"""

from __future__ import annotations

import enum
import math
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import trio
from kio.schema.errors import ErrorCode

UNKNOWN_MEMBER_ID = ""
NO_GENERATION = -1

T = TypeVar("T")


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS = {
    GroupState.DEAD: {GroupState.STABLE, GroupState.PREPARING_REBALANCE,
                      GroupState.COMPLETING_REBALANCE, GroupState.EMPTY, GroupState.DEAD},
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.PREPARING_REBALANCE: {GroupState.STABLE, GroupState.COMPLETING_REBALANCE,
                                     GroupState.EMPTY},
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
}


class Waiter(Generic[T]):
    """A one-shot result a request handler waits for (Kafka's response callback)."""

    __slots__ = ("_event", "value")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.value: T | None = None

    @classmethod
    def done(cls, value: T) -> Waiter[T]:
        waiter = cls()
        waiter.set(value)
        return waiter

    def set(self, value: T) -> bool:
        if self._event.is_set():
            return False
        self.value = value
        self._event.set()
        return True

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> T:
        await self._event.wait()
        return self.value  # type: ignore[return-value]


@dataclass(slots=True)
class JoinResult:
    member_id: str
    error: ErrorCode
    generation: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    # (member id, group instance id, metadata): for the leader only
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


def join_error(member_id: str, error: ErrorCode) -> JoinResult:
    return JoinResult(member_id=member_id, error=error)


@dataclass(slots=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None
    commit_timestamp: int = -1


@dataclass(eq=False, slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_waiter: Waiter[JoinResult] | None = None
    sync_waiter: Waiter[SyncResult] | None = None
    is_new: bool = False
    # session expiry, on the trio clock; the deadline callback scheduled for it (at
    # `timer_at`, inf when none) is the one carrying `timer_token`
    expires_at: float = 0.0
    timer_at: float = math.inf
    timer_token: int = 0

    @property
    def is_awaiting_join(self) -> bool:
        return self.join_waiter is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.sync_waiter is not None

    @property
    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among the candidates."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")


@dataclass(slots=True)
class MemberSummary:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(slots=True)
class GroupSummary:
    state: str
    protocol_type: str
    protocol_data: str
    members: list[MemberSummary]


class Group:
    def __init__(self, group_id: str, partition: int) -> None:
        self.group_id = group_id
        self.partition = partition  # of __consumer_offsets
        self.state = GroupState.EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group instance id -> member id
        self.pending_members: set[str] = set()    # MEMBER_ID_REQUIRED handed out
        self.pending_sync: set[str] = set()       # joined, SyncGroup not received yet
        self.new_member_added = False             # during the initial rebalance delay
        self.offsets: dict[tuple[str, int], OffsetAndMetadata] = {}
        self._protocol_support: Counter[str] = Counter()
        # timer tokens: a scheduled callback whose token is stale does nothing
        self.join_token = 0
        self.join_is_initial = False
        self.sync_token = 0

    def __repr__(self) -> str:
        return (f"Group({self.group_id!r}, {self.state.value}, generation {self.generation}, "
                f"{len(self.members)} members)")

    # -- state ---------------------------------------------------------------------------------

    def is_(self, *states: GroupState) -> bool:
        return self.state in states

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    def transition_to(self, state: GroupState) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise AssertionError(f"group {self.group_id}: no transition from "
                                 f"{self.state.value} to {state.value}")
        self.state = state

    # -- members -------------------------------------------------------------------------------

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def generate_member_id(self, client_id: str, group_instance_id: str | None) -> str:
        return f"{group_instance_id or client_id}-{uuid.uuid4()}"

    def add(self, member: Member, waiter: Waiter[JoinResult] | None = None) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self._protocol_support.update(set(member.protocol_names))
        member.join_waiter = waiter
        self.pending_members.discard(member.member_id)
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self._protocol_support.subtract(set(member.protocol_names))
            if member.group_instance_id is not None and (
                    self.static_members.get(member.group_instance_id) == member_id):
                del self.static_members[member.group_instance_id]
            # nobody will answer these any more
            if member.join_waiter is not None:
                member.join_waiter.set(join_error(UNKNOWN_MEMBER_ID,
                                                  ErrorCode.unknown_member_id))
                member.join_waiter = None
            if member.sync_waiter is not None:
                member.sync_waiter.set(SyncResult(ErrorCode.unknown_member_id))
                member.sync_waiter = None
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync.discard(member_id)
        return member

    def update_member(self, member: Member, protocols: list[tuple[str, bytes]],
                      rebalance_timeout_ms: int, session_timeout_ms: int,
                      waiter: Waiter[JoinResult] | None) -> None:
        self._protocol_support.subtract(set(member.protocol_names))
        member.protocols = protocols
        self._protocol_support.update(set(member.protocol_names))
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if member.join_waiter is not None and member.join_waiter is not waiter:
            # a retried JoinGroup replaces the one still waiting: answer that one now
            member.join_waiter.set(join_error(member.member_id,
                                              ErrorCode.rebalance_in_progress))
        member.join_waiter = waiter

    def replace_static_member(self, group_instance_id: str, old_member_id: str,
                              new_member_id: str) -> Member:
        member = self.members.pop(old_member_id)
        # fence a duplicate of the old incarnation still waiting on a rebalance
        if member.join_waiter is not None:
            member.join_waiter.set(join_error(old_member_id, ErrorCode.fenced_instance_id))
            member.join_waiter = None
        if member.sync_waiter is not None:
            member.sync_waiter.set(SyncResult(ErrorCode.fenced_instance_id))
            member.sync_waiter = None
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        if old_member_id in self.pending_sync:
            self.pending_sync.discard(old_member_id)
            self.pending_sync.add(new_member_id)
        return member

    def maybe_invoke_join(self, member: Member, result: JoinResult) -> bool:
        waiter, member.join_waiter = member.join_waiter, None
        if waiter is None:
            return False
        waiter.set(result)
        member.is_new = False
        return True

    def maybe_invoke_sync(self, member: Member, result: SyncResult) -> bool:
        waiter, member.sync_waiter = member.sync_waiter, None
        if waiter is None:
            return False
        waiter.set(result)
        return True

    def current_static_member_id(self, group_instance_id: str) -> str | None:
        return self.static_members.get(group_instance_id)

    def validate_current_member(self, member_id: str,
                                group_instance_id: str | None) -> ErrorCode | None:
        """Kafka's validateCurrentMember: a static member's instance id maps to this member
        id (else FENCED_INSTANCE_ID, or UNKNOWN_MEMBER_ID for an unknown instance), and the
        member exists."""
        if group_instance_id is not None:
            current = self.static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
            return None
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return None

    # -- rebalance -----------------------------------------------------------------------------

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def awaiting_join_count(self) -> int:
        return sum(1 for m in self.members.values() if m.join_waiter is not None)

    def has_all_members_joined(self) -> bool:
        return (len(self.members) == self.awaiting_join_count()
                and not self.pending_members)

    def not_yet_rejoined_members(self) -> list[Member]:
        return [m for m in self.members.values() if m.join_waiter is None]

    def supports_protocols(self, protocol_type: str, protocols: set[str]) -> bool:
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(protocols)
        return self.protocol_type == protocol_type and any(
            self._protocol_support[p] == len(self.members) for p in protocols)

    def candidate_protocols(self) -> set[str]:
        n = len(self.members)
        return {p for p, count in self._protocol_support.items() if count == n and n > 0}

    def select_protocol(self) -> str:
        """The protocol every member supports with the most first-choice votes; a tie goes
        to the one the longest-standing member prefers among the tied."""
        candidates = self.candidate_protocols()
        if not candidates:
            raise ValueError(f"group {self.group_id} has no protocol all members support")
        votes = Counter(m.vote(candidates) for m in self.members.values())
        best = max(votes.values())
        tied = {p for p, count in votes.items() if count == best}
        return next(self.members.values().__iter__()).vote(tied)

    def maybe_elect_new_joined_leader(self) -> bool:
        """Make a member that rejoined the leader if the leader did not rejoin. False when
        no member rejoined."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.is_awaiting_join:
            return True
        for member_id, member in self.members.items():
            if member.is_awaiting_join:
                self.leader_id = member_id
                return True
        return False

    def init_next_generation(self) -> None:
        self.generation += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY)
        self.pending_sync.clear()

    def current_member_metadata(self) -> list[tuple[str, str | None, bytes]]:
        return [(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                for m in self.members.values()]

    # -- views ---------------------------------------------------------------------------------

    def summary(self) -> GroupSummary:
        if self.state is GroupState.STABLE:
            protocol = self.protocol_name or ""
            members = [MemberSummary(m.member_id, m.group_instance_id, m.client_id,
                                     m.client_host, m.metadata(protocol), m.assignment)
                       for m in self.members.values()]
            return GroupSummary(self.state.value, self.protocol_type or "", protocol, members)
        members = [MemberSummary(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                 b"", b"") for m in self.members.values()]
        return GroupSummary(self.state.value, self.protocol_type or "", "", members)
