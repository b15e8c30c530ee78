"""The group coordinator: Kafka's classic group protocol and committed offsets.

A group maps to one partition of the internal topic `__consumer_offsets` (Kafka's hash:
`abs(groupId.hashCode()) % partitions`); the node leading that partition coordinates it.
Group state and offsets live in PostgreSQL (`mink.storage.controlplane.groups`), every write fenced by the
partition's leader epoch. The partitions this node leads come from the node's open partition
logs: when one opens (at a leader epoch) its groups are loaded (COORDINATOR_LOAD_IN_PROGRESS
meanwhile); when it closes or its leader epoch changes, its groups are dropped (NOT_COORDINATOR).

Semantics follow Kafka's GroupCoordinator (the classic protocol, 3.x): member ids
(MEMBER_ID_REQUIRED from JoinGroup v4), generations, protocol selection by vote, the initial
rebalance delay, rebalance and session timeouts, pending-sync expiry, static membership.

Concurrency: everything runs on the node's trio thread. State changes happen synchronously
inside one call; the only awaits are PostgreSQL writes, which run as tasks in this component's
nursery (a client going away never cancels a write half-way) and, per group, in the order they
were requested (`_Turns`). Timers (session, rebalance, initial delay, pending sync) are one
deadline heap served by one task.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from mink.broker.groups.consumer_coordinator import ConsumerGroupCoordinator
from mink.broker.groups.consumer_group import ConsumerGroupState
from mink.broker.groups.state import (
    UNKNOWN_MEMBER_ID,
    Group,
    GroupState,
    GroupSummary,
    JoinResult,
    Member,
    OffsetAndMetadata,
    SyncResult,
    Waiter,
    join_error,
)
from mink.broker.topics.admin import NotClusterCoordinator
from mink.protocol.topics import OFFSETS_TOPIC
from mink.storage import controlplane as md
from mink.storage.controlplane.groups import (
    Fence,
    GroupStore,
    NotGroupCoordinator,
    OffsetsExpiry,
    StoredGroup,
    StoredMember,
    StoredOffset,
)

log = logging.getLogger(__name__)

# Kafka: a new member's JoinGroup waits at most this long for the rebalance to complete.
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000
# offset.metadata.max.bytes
OFFSET_METADATA_MAX_BYTES = 4096

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    GroupState.EMPTY, GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE,
    GroupState.STABLE, GroupState.DEAD)


def java_string_hash(value: str) -> int:
    """Java's String.hashCode (over UTF-16 code units), as a signed 32-bit int."""
    data = value.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's GroupMetadataManager.partitionFor: Utils.abs(groupId.hashCode) % partitions."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


# ---------------------------------------------------------------------------------------------
# Timers and ordering


class Deadlines:
    """Callbacks at deadlines on the trio clock: one heap, one task. A callback cannot be
    cancelled; it checks a token of its own and returns when it is stale."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._count = itertools.count()
        self._wakeup = trio.Event()

    def call_at(self, deadline: float, fn: Callable[..., None], *args: Any) -> None:
        entry = (deadline, next(self._count), fn, args)
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry:
            self._wakeup.set()

    def call_after(self, seconds: float, fn: Callable[..., None], *args: Any) -> None:
        self.call_at(trio.current_time() + seconds, fn, *args)

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            while self._heap and self._heap[0][0] <= now:
                _, _, fn, args = heapq.heappop(self._heap)
                try:
                    fn(*args)
                except Exception:
                    log.exception("group coordinator timer %s failed", fn.__name__)
            self._wakeup = trio.Event()
            deadline = self._heap[0][0] if self._heap else math.inf
            with trio.move_on_at(deadline):
                await self._wakeup.wait()


class _Turns:
    """Per-group order of PostgreSQL writes: tickets are taken synchronously when a request
    is handled, and each write waits for the writes ticketed before it."""

    def __init__(self) -> None:
        self._next = 0
        self._serving = 0
        self._changed = trio.Event()

    def ticket(self) -> int:
        ticket, self._next = self._next, self._next + 1
        return ticket

    async def wait(self, ticket: int) -> None:
        while self._serving != ticket:
            await self._changed.wait()

    def done(self) -> None:
        self._serving += 1
        self._changed.set()
        self._changed = trio.Event()


@dataclass
class _Partition:
    """A partition of __consumer_offsets this node leads: its groups are loaded at this
    leader epoch (or being loaded)."""
    index: int
    topic_id: Any
    leader_epoch: int
    loaded: bool = False
    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)


@dataclass(slots=True)
class OffsetEntry:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None
    error: ErrorCode


# ---------------------------------------------------------------------------------------------
# The coordinator


class GroupCoordinator:
    def __init__(self, node) -> None:
        self.node = node
        config = node.config
        self.num_partitions = config.offsets_topic_num_partitions
        self.initial_rebalance_delay_ms = config.group_initial_rebalance_delay_ms
        self.min_session_timeout_ms = config.group_min_session_timeout_ms
        self.max_session_timeout_ms = config.group_max_session_timeout_ms
        self.store = GroupStore(node.metadata)
        self.groups: dict[str, Group] = {}
        # KIP-848 consumer groups (ConsumerGroupHeartbeat), beside the classic ones
        self.consumer = ConsumerGroupCoordinator(self)
        self._turns: dict[str, _Turns] = {}
        self._partitions: dict[int, _Partition] = {}
        self._refused: dict[int, tuple[Any, int]] = {}  # (topic id, epoch) a write was refused at
        self._timers = Deadlines()
        self._nursery: trio.Nursery | None = None

    # -- life cycle ----------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve timers, loads and writes until cancelled; keep __consumer_offsets existing."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    nursery.start_soon(self._timers.run)
                    nursery.start_soon(self._offsets_expiry_loop)
                    await self._ensure_offsets_topic()
                    self.on_view()
                    task_status.started()
                    while True:
                        await trio.sleep(1.0)
                        await self._ensure_offsets_topic()
                finally:
                    # Closed to new tasks from here on, while its children finish: a view
                    # refresh still running elsewhere on a stopping node must not spawn one.
                    self._nursery = None
        finally:
            self._nursery = None
            for index in list(self._partitions):
                self._unload(index, "node stopping")

    async def _ensure_offsets_topic(self) -> None:
        """Create __consumer_offsets if it is missing. Creating a topic is a cluster
        coordinator action: the lease holder does it, every other node waits for it."""
        node = self.node
        if OFFSETS_TOPIC in node.view.topics or not node.coordinator.is_holder:
            return
        try:
            await node.topic_admin.create_topic(OFFSETS_TOPIC, self.num_partitions, {})
            log.info("created %s with %d partitions", OFFSETS_TOPIC, self.num_partitions)
        except md.TopicExists:
            pass  # another node was quicker: the view shows it soon
        except (NotClusterCoordinator, md.MetadataError) as exc:
            log.warning("could not create %s yet: %s", OFFSETS_TOPIC, exc)

    def _offsets_topic(self):
        return self.node.view.topics.get(OFFSETS_TOPIC)

    def partition_for(self, group_id: str) -> int:
        topic = self._offsets_topic()
        count = len(topic.partitions) if topic is not None else self.num_partitions
        return partition_for(group_id, count)

    def coordinator_for(self, group_id: str):
        """(error, BrokerInfo | None): the live leader of the group's partition."""
        topic = self._offsets_topic()
        if topic is None:
            return ErrorCode.coordinator_not_available, None
        leader = topic.partitions[partition_for(group_id, len(topic.partitions))].leader
        broker = self.node.view.brokers.get(leader) if leader is not None else None
        if broker is None:
            return ErrorCode.coordinator_not_available, None
        return ErrorCode.none, broker

    # -- loading and unloading -----------------------------------------------------------------

    def on_view(self) -> None:
        """The node's view or its open partitions changed: load the groups of partitions of
        __consumer_offsets it now leads (or leads at a new leader epoch), drop the others."""
        if self._nursery is None:
            return
        wanted: dict[int, tuple[Any, int]] = {}
        topic = self._offsets_topic()
        if topic is not None:
            for p in topic.partitions:
                if p.leader == self.node.node_id:
                    partition_log = self.node.leader_log(topic, p.index)
                    if partition_log is not None:
                        wanted[p.index] = (topic.topic_id, partition_log.leader_epoch)
        for index, st in list(self._partitions.items()):
            if wanted.get(index) != (st.topic_id, st.leader_epoch):
                self._unload(index, "no longer the leader at this leader epoch")
        for index, (topic_id, epoch) in wanted.items():
            if index not in self._partitions and self._refused.get(index) != (topic_id, epoch):
                st = _Partition(index, topic_id, epoch)
                self._partitions[index] = st
                self._nursery.start_soon(self._load, st)

    async def _load(self, st: _Partition) -> None:
        delay = 0.1
        with st.cancel_scope:
            while True:
                try:
                    stored = await self.store.load(st.index)
                    consumer_stored = await self.store.load_consumer_groups(st.index)
                    break
                except md.MetadataUnavailable as exc:
                    log.warning("loading groups of %s-%d failed, retrying: %s",
                                OFFSETS_TOPIC, st.index, exc)
                    await trio.sleep(delay)
                    delay = min(delay * 2, 5.0)
        if self._partitions.get(st.index) is not st:
            return
        for record in stored:
            group = _group_from_record(record, st.index)
            self.groups[group.group_id] = group
            for member in group.members.values():
                self._touch(group, member)
        for record in consumer_stored:
            self.consumer.restore(record, st.index)
        st.loaded = True
        (log.info if stored else log.debug)(
            "coordinating %d groups of %s-%d at leader epoch %d", len(stored), OFFSETS_TOPIC,
            st.index, st.leader_epoch)

    def _unload(self, index: int, reason: str) -> None:
        st = self._partitions.pop(index, None)
        if st is None:
            return
        st.cancel_scope.cancel()
        self.consumer.unload(index)
        dropped = [g for g in self.groups.values() if g.partition == index]
        for group in dropped:
            del self.groups[group.group_id]
            self._on_group_unloaded(group)
        if dropped:
            log.info("dropped %d groups of %s-%d (leader epoch %d): %s", len(dropped),
                     OFFSETS_TOPIC, index, st.leader_epoch, reason)

    def _on_group_unloaded(self, group: Group) -> None:
        previous = group.state
        group.state = DEAD
        group.join_token += 1
        group.sync_token += 1
        if previous is not EMPTY:
            log.info("unloading group %s (%s, generation %d)", group.group_id,
                     previous.value, group.generation)
        for member in group.members.values():
            group.maybe_invoke_join(member, join_error(member.member_id,
                                                       ErrorCode.not_coordinator))
            group.maybe_invoke_sync(member, SyncResult(ErrorCode.not_coordinator))

    def _status(self, group_id: str) -> ErrorCode:
        """Kafka's validateGroupStatus, minus the group id check."""
        index = self.partition_for(group_id)
        st = self._partitions.get(index)
        if st is not None:
            topic = self._offsets_topic()
            partition_log = (self.node.leader_log(topic, index) if topic is not None
                             and index < len(topic.partitions) else None)
            if partition_log is None or partition_log.leader_epoch != st.leader_epoch:
                self.on_view()
                st = self._partitions.get(index)
        if st is not None:
            return ErrorCode.none if st.loaded else ErrorCode.coordinator_load_in_progress
        topic = self._offsets_topic()
        if topic is not None and index < len(topic.partitions) and (
                topic.partitions[index].leader == self.node.node_id):
            return ErrorCode.coordinator_load_in_progress  # opening, or about to
        return ErrorCode.not_coordinator

    def _fence(self, group: Group) -> Fence | None:
        st = self._partitions.get(group.partition)
        if st is None or not st.loaded:
            return None
        return Fence(st.topic_id, st.index, st.leader_epoch, self.node.node_id,
                     self.node.membership.node_epoch)

    def _is_current(self, group) -> bool:
        return (self.groups.get(group.group_id) is group
                or self.consumer.groups.get(group.group_id) is group)

    def _add_group(self, group_id: str) -> Group:
        group = Group(group_id, self.partition_for(group_id))
        self.groups[group_id] = group
        return group

    # -- writes --------------------------------------------------------------------------------

    def _write(self, group: Group, op: Callable[[Fence], Awaitable[None]]) -> Waiter[ErrorCode]:
        """Run a fenced write for `group` in this component's nursery, after the writes
        requested before it for the same group. The waiter gets NONE or the Kafka error:
        NOT_COORDINATOR (refused by the fence), COORDINATOR_NOT_AVAILABLE (PostgreSQL
        unreachable; nothing written) or REQUEST_TIMED_OUT (outcome unknown)."""
        waiter: Waiter[ErrorCode] = Waiter()
        if self._nursery is None:
            waiter.set(ErrorCode.coordinator_not_available)
            return waiter
        turns = self._turns.setdefault(group.group_id, _Turns())
        ticket = turns.ticket()
        self._nursery.start_soon(self._run_write, group, op, turns, ticket, waiter)
        return waiter

    async def _run_write(self, group: Group, op, turns: _Turns, ticket: int,
                         waiter: Waiter[ErrorCode]) -> None:
        error = ErrorCode.unknown_server_error
        got_turn = False
        try:
            await turns.wait(ticket)
            got_turn = True
            fence = self._fence(group)
            if fence is None or not self._is_current(group):
                error = ErrorCode.not_coordinator  # unloaded meanwhile (perhaps reloaded)
            else:
                try:
                    await op(fence)
                    error = ErrorCode.none
                except NotGroupCoordinator as exc:
                    log.warning("group %s: %s", group.group_id, exc)
                    error = ErrorCode.not_coordinator
                    self._refused[fence.partition] = (fence.topic_id, fence.leader_epoch)
                    st = self._partitions.get(fence.partition)
                    if st is not None and st.leader_epoch == fence.leader_epoch:
                        self._unload(fence.partition, "a fenced write was refused")
                except md.OutcomeUnknown as exc:
                    log.warning("group %s: write outcome unknown: %s", group.group_id, exc)
                    error = ErrorCode.request_timed_out
                except md.MetadataUnavailable as exc:
                    log.warning("group %s: PostgreSQL unavailable: %s", group.group_id, exc)
                    error = ErrorCode.coordinator_not_available
        except Exception:
            log.exception("group %s: write failed", group.group_id)
        finally:
            waiter.set(error)
            if got_turn:
                turns.done()
            if turns._serving == turns._next and self._turns.get(group.group_id) is turns:
                del self._turns[group.group_id]

    def _store_group_write(self, group: Group, assignment: dict[str, bytes] | None = None):
        record = _record_from_group(group, assignment)
        return self._write(group, lambda fence: self.store.store_group(fence, record))

    # -- timers --------------------------------------------------------------------------------

    def _touch(self, group: Group, member: Member, timeout_ms: int | None = None) -> None:
        """Kafka's completeAndScheduleNextHeartbeatExpiration: the member is alive now."""
        timeout = member.session_timeout_ms if timeout_ms is None else timeout_ms
        member.expires_at = trio.current_time() + timeout / 1000
        if member.expires_at < member.timer_at:
            self._arm(group, member, member.expires_at)

    def _arm(self, group: Group, member: Member, at: float) -> None:
        member.timer_token += 1
        member.timer_at = at
        self._timers.call_at(at, self._on_member_deadline, group, member, member.timer_token)

    def _on_member_deadline(self, group: Group, member: Member, token: int) -> None:
        if token != member.timer_token:
            return  # superseded by an earlier deadline
        member.timer_at = math.inf
        if group.state is DEAD or group.members.get(member.member_id) is not member:
            return
        if trio.current_time() < member.expires_at:
            self._arm(group, member, member.expires_at)  # it heartbeated meanwhile
            return
        if not member.is_new and (member.is_awaiting_join or member.is_awaiting_sync):
            return  # a rebalance is waiting on it; the rebalance's own timeout applies
        log.info("member %s of group %s has failed (no heartbeat within %d ms), removing it",
                 member.member_id, group.group_id, member.session_timeout_ms)
        self._remove_member_and_update_group(group, member)

    def _schedule_pending_member_expiry(self, group: Group, member_id: str,
                                        timeout_ms: int) -> None:
        self._timers.call_after(timeout_ms / 1000, self._on_pending_member_deadline, group,
                                member_id)

    def _on_pending_member_deadline(self, group: Group, member_id: str) -> None:
        if group.state is DEAD or member_id not in group.pending_members:
            return
        group.pending_members.discard(member_id)
        if group.state is PREPARING:
            self._try_complete_join(group)

    # -- rebalance -----------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state is COMPLETING:
            self._reset_and_propagate_assignment_error(group, ErrorCode.rebalance_in_progress)
        group.pending_sync.clear()
        group.sync_token += 1
        group.join_token += 1
        token = group.join_token
        initial = group.state is EMPTY
        log.info("preparing to rebalance group %s in state %s with old generation %d (%s)",
                 group.group_id, group.state.value, group.generation, reason,
                 extra={"event": "rebalance", "group": group.group_id,
                        "generation": group.generation, "reason": reason})
        self.node.metrics.group_rebalance()
        group.transition_to(PREPARING)
        group.join_is_initial = initial
        if initial:
            delay = self.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms - delay, 0)
            group.new_member_added = False
            self._timers.call_after(delay / 1000, self._on_initial_join_deadline, group, token,
                                    delay, remaining)
        else:
            self._timers.call_after(group.rebalance_timeout_ms / 1000, self._on_join_deadline,
                                    group, token)
            self._try_complete_join(group)

    def _on_initial_join_deadline(self, group: Group, token: int, delay: int,
                                  remaining: int) -> None:
        if token != group.join_token or group.state is not PREPARING:
            return
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            next_delay = min(self.initial_rebalance_delay_ms, remaining)
            self._timers.call_after(next_delay / 1000, self._on_initial_join_deadline, group,
                                    token, next_delay, max(remaining - delay, 0))
            return
        self._complete_join(group)

    def _on_join_deadline(self, group: Group, token: int) -> None:
        if token == group.join_token and group.state is PREPARING:
            self._complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        if (group.state is PREPARING and not group.join_is_initial
                and group.has_all_members_joined()):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """Kafka's onCompleteJoin."""
        group.join_token += 1
        group.join_is_initial = False
        for member in group.not_yet_rejoined_members():
            if member.group_instance_id is None:
                log.info("member %s of group %s did not rejoin in time, removing it",
                         member.member_id, group.group_id)
                group.remove(member.member_id)
        if group.state is DEAD:
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # only static members that have not rejoined: wait another rebalance timeout
            token = group.join_token
            self._timers.call_after(group.rebalance_timeout_ms / 1000, self._on_join_deadline,
                                    group, token)
            return
        group.init_next_generation()
        if group.state is EMPTY:
            log.info("group %s with generation %d is now empty", group.group_id,
                     group.generation)
            self._store_group_write(group)  # best effort, as Kafka: nobody waits for it
            return
        log.info("stabilized group %s generation %d (%s) with %d members", group.group_id,
                 group.generation, group.protocol_name, len(group.members),
                 extra={"event": "group_stable", "group": group.group_id,
                        "generation": group.generation})
        leader_view = group.current_member_metadata()
        for member in group.members.values():
            group.maybe_invoke_join(member, JoinResult(
                member_id=member.member_id, error=ErrorCode.none, generation=group.generation,
                protocol_type=group.protocol_type, protocol_name=group.protocol_name,
                leader=group.leader_id or "",
                members=leader_view if group.is_leader(member.member_id) else []))
            self._touch(group, member)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        group.sync_token += 1
        self._timers.call_after(group.rebalance_timeout_ms / 1000, self._on_sync_deadline,
                                group, group.sync_token, group.generation)

    def _on_sync_deadline(self, group: Group, token: int, generation: int) -> None:
        if token != group.sync_token or generation != group.generation:
            return
        if group.state in (COMPLETING, STABLE) and group.pending_sync:
            missing = sorted(group.pending_sync)
            for member_id in missing:
                group.remove(member_id)
            log.info("group %s removed members that sent no SyncGroup in time: %s",
                     group.group_id, missing)
            self._prepare_rebalance(group, "pending sync expired")

    def _remove_member_and_update_group(self, group: Group, member: Member) -> None:
        group.maybe_invoke_join(member, join_error(UNKNOWN_MEMBER_ID,
                                                   ErrorCode.unknown_member_id))
        group.remove(member.member_id)
        if group.state in (STABLE, COMPLETING):
            self._maybe_prepare_rebalance(group, f"removing member {member.member_id}")
        elif group.state is PREPARING:
            self._try_complete_join(group)

    def _propagate_assignment(self, group: Group, error: ErrorCode) -> None:
        protocol_type, protocol_name = ((group.protocol_type, group.protocol_name)
                                        if error == ErrorCode.none else (None, None))
        for member in group.members.values():
            if group.maybe_invoke_sync(member, SyncResult(error, member.assignment,
                                                          protocol_type, protocol_name)):
                self._touch(group, member)

    def _reset_and_propagate_assignment_error(self, group: Group, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    # -- JoinGroup -----------------------------------------------------------------------------

    def join_group(self, group_id: str, member_id: str, group_instance_id: str | None,
                   require_known_member_id: bool, client_id: str, client_host: str,
                   rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]]) -> Waiter[JoinResult]:
        """The JoinGroup answer, now or once the rebalance completes."""
        if not group_id:
            return Waiter.done(join_error(member_id, ErrorCode.invalid_group_id))
        error = self._status(group_id)
        if error:
            return Waiter.done(join_error(member_id, error))
        if not (self.min_session_timeout_ms <= session_timeout_ms
                <= self.max_session_timeout_ms):
            return Waiter.done(join_error(member_id, ErrorCode.invalid_session_timeout))
        is_unknown = member_id == UNKNOWN_MEMBER_ID
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            # Kafka with online migration disabled: a classic member cannot join a consumer
            # group that has members; an empty one is replaced, keeping its offsets.
            if consumer_group.members or not is_unknown:
                return Waiter.done(join_error(member_id,
                                              ErrorCode.inconsistent_group_protocol))
            self.consumer.delete_if_empty(group_id)
            classic = self._add_group(group_id)
            classic.offsets = consumer_group.offsets
            self._write(classic, lambda fence: self.store.drop_consumer_group(fence, group_id))
            log.info("converted the empty consumer group %s to a classic group", group_id)
        group = self.groups.get(group_id)
        if group is None:
            if not is_unknown:
                return Waiter.done(join_error(member_id, ErrorCode.unknown_member_id))
            group = self._add_group(group_id)
        waiter: Waiter[JoinResult] = Waiter()
        args = (client_id, client_host, rebalance_timeout_ms, session_timeout_ms,
                protocol_type, protocols, waiter)
        if group.state is DEAD:
            waiter.set(join_error(member_id, ErrorCode.coordinator_not_available))
        elif not group.supports_protocols(protocol_type, {name for name, _ in protocols}):
            waiter.set(join_error(member_id, ErrorCode.inconsistent_group_protocol))
        elif is_unknown:
            self._new_member_join(group, group_instance_id, require_known_member_id, *args)
        else:
            self._current_member_join(group, member_id, group_instance_id, *args)
        if group.state is PREPARING:
            self._try_complete_join(group)
        return waiter

    def _new_member_join(self, group: Group, group_instance_id: str | None,
                         require_known_member_id: bool, client_id: str, client_host: str,
                         rebalance_timeout_ms: int, session_timeout_ms: int,
                         protocol_type: str, protocols: list[tuple[str, bytes]],
                         waiter: Waiter[JoinResult]) -> None:
        new_member_id = group.generate_member_id(client_id, group_instance_id)
        if group_instance_id is not None:
            old_member_id = group.current_static_member_id(group_instance_id)
            if old_member_id is not None:
                log.info("static member %s of group %s rejoins: member %s replaces %s",
                         group_instance_id, group.group_id, new_member_id, old_member_id)
                self._update_static_member_and_rebalance(
                    group, old_member_id, new_member_id, group_instance_id, protocols,
                    rebalance_timeout_ms, session_timeout_ms, waiter)
                return
        elif require_known_member_id:
            group.pending_members.add(new_member_id)
            self._schedule_pending_member_expiry(group, new_member_id, session_timeout_ms)
            waiter.set(join_error(new_member_id, ErrorCode.member_id_required))
            return
        self._add_member_and_rebalance(group, new_member_id, group_instance_id, client_id,
                                       client_host, rebalance_timeout_ms, session_timeout_ms,
                                       protocol_type, protocols, waiter)

    def _current_member_join(self, group: Group, member_id: str, group_instance_id: str | None,
                             client_id: str, client_host: str, rebalance_timeout_ms: int,
                             session_timeout_ms: int, protocol_type: str,
                             protocols: list[tuple[str, bytes]],
                             waiter: Waiter[JoinResult]) -> None:
        if member_id in group.pending_members:
            if group_instance_id is not None:
                waiter.set(join_error(member_id, ErrorCode.unknown_member_id))
                return
            self._add_member_and_rebalance(group, member_id, None, client_id, client_host,
                                           rebalance_timeout_ms, session_timeout_ms,
                                           protocol_type, protocols, waiter)
            return
        error = group.validate_current_member(member_id, group_instance_id)
        if error is not None:
            waiter.set(join_error(member_id, error))
            return
        member = group.members[member_id]
        if group.state is PREPARING:
            self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms,
                                              session_timeout_ms, waiter)
        elif group.state is COMPLETING:
            if member.matches(protocols):
                # the member lost the JoinGroup answer: send the current generation again
                waiter.set(JoinResult(
                    member_id=member_id, error=ErrorCode.none, generation=group.generation,
                    protocol_type=group.protocol_type, protocol_name=group.protocol_name,
                    leader=group.leader_id or "",
                    members=(group.current_member_metadata() if group.is_leader(member_id)
                             else [])))
            else:
                self._update_member_and_rebalance(group, member, protocols,
                                                  rebalance_timeout_ms, session_timeout_ms,
                                                  waiter)
        elif group.state is STABLE:
            if group.is_leader(member_id) or not member.matches(protocols):
                # the leader rejoining may mean the topics changed: rebalance
                self._update_member_and_rebalance(group, member, protocols,
                                                  rebalance_timeout_ms, session_timeout_ms,
                                                  waiter)
            else:
                waiter.set(JoinResult(
                    member_id=member_id, error=ErrorCode.none, generation=group.generation,
                    protocol_type=group.protocol_type, protocol_name=group.protocol_name,
                    leader=group.leader_id or ""))
        else:
            waiter.set(join_error(member_id, ErrorCode.unknown_member_id))

    def _add_member_and_rebalance(self, group: Group, member_id: str,
                                  group_instance_id: str | None, client_id: str,
                                  client_host: str, rebalance_timeout_ms: int,
                                  session_timeout_ms: int, protocol_type: str,
                                  protocols: list[tuple[str, bytes]],
                                  waiter: Waiter[JoinResult]) -> None:
        member = Member(member_id, group_instance_id, client_id, client_host,
                        rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols,
                        is_new=True)
        if group.state is PREPARING and group.generation == 0:
            group.new_member_added = True
        group.add(member, waiter)
        # a new member cannot heartbeat before its JoinGroup is answered
        self._touch(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance(group, f"adding new member {member_id}")

    def _update_member_and_rebalance(self, group: Group, member: Member,
                                     protocols: list[tuple[str, bytes]],
                                     rebalance_timeout_ms: int, session_timeout_ms: int,
                                     waiter: Waiter[JoinResult]) -> None:
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, waiter)
        self._maybe_prepare_rebalance(group, f"member {member.member_id} rejoins")

    def _update_static_member_and_rebalance(self, group: Group, old_member_id: str,
                                            new_member_id: str, group_instance_id: str,
                                            protocols: list[tuple[str, bytes]],
                                            rebalance_timeout_ms: int,
                                            session_timeout_ms: int,
                                            waiter: Waiter[JoinResult]) -> None:
        current_leader = group.leader_id
        member = group.replace_static_member(group_instance_id, old_member_id, new_member_id)
        self._touch(group, member)
        old = (member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms)
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, waiter)
        if group.state is STABLE:
            if group.protocol_name != group.select_protocol():
                self._maybe_prepare_rebalance(
                    group, f"static member {group_instance_id} changed its protocols")
                return
            # Same assignment, new member id: persist it, no rebalance.
            written = self._store_group_write(group)
            generation = group.generation

            async def answer() -> None:
                error = await written.wait()
                if member.join_waiter is not waiter:
                    return  # a rebalance or a newer join answered it already
                if error:
                    if group.members.get(new_member_id) is member:
                        group.update_member(member, *old, None)
                        group.replace_static_member(group_instance_id, new_member_id,
                                                    old_member_id)
                        self._touch(group, member)
                    waiter.set(join_error(UNKNOWN_MEMBER_ID, error))
                    return
                # The old leader id, so that a new leader does not run a trivial assignment
                # the stable group would not send out (Kafka before JoinGroup v9).
                group.maybe_invoke_join(member, JoinResult(
                    member_id=new_member_id, error=ErrorCode.none, generation=generation,
                    protocol_type=group.protocol_type, protocol_name=group.protocol_name,
                    leader=current_leader or ""))

            assert self._nursery is not None
            self._nursery.start_soon(answer)
        elif group.state is COMPLETING:
            # the leader may have assigned to the old member id: rebalance
            self._prepare_rebalance(group, f"static member {group_instance_id} rejoined "
                                           "while completing a rebalance")
        # PreparingRebalance: the member simply waits for the join to complete

    # -- SyncGroup -----------------------------------------------------------------------------

    def sync_group(self, group_id: str, generation: int, member_id: str,
                   protocol_type: str | None, protocol_name: str | None,
                   group_instance_id: str | None,
                   assignments: dict[str, bytes]) -> Waiter[SyncResult]:
        if not group_id:
            return Waiter.done(SyncResult(ErrorCode.invalid_group_id))
        error = self._status(group_id)
        if error == ErrorCode.coordinator_load_in_progress:
            # the rebalance in progress was lost with the old coordinator: rejoin
            return Waiter.done(SyncResult(ErrorCode.rebalance_in_progress))
        if error:
            return Waiter.done(SyncResult(error))
        group = self.groups.get(group_id)
        if group is None:
            return Waiter.done(SyncResult(ErrorCode.unknown_member_id))
        if group.state is DEAD:
            return Waiter.done(SyncResult(ErrorCode.coordinator_not_available))
        error = group.validate_current_member(member_id, group_instance_id)
        if error is None and generation != group.generation:
            error = ErrorCode.illegal_generation
        if error is None and (
                (protocol_type is not None and protocol_type != group.protocol_type)
                or (protocol_name is not None and protocol_name != group.protocol_name)):
            error = ErrorCode.inconsistent_group_protocol
        if error is not None:
            return Waiter.done(SyncResult(error))
        if group.state is EMPTY:
            return Waiter.done(SyncResult(ErrorCode.unknown_member_id))
        if group.state is PREPARING:
            return Waiter.done(SyncResult(ErrorCode.rebalance_in_progress))
        member = group.members[member_id]
        group.pending_sync.discard(member_id)
        if group.state is STABLE:
            self._touch(group, member)
            return Waiter.done(SyncResult(ErrorCode.none, member.assignment,
                                          group.protocol_type, group.protocol_name))
        # CompletingRebalance: wait for the leader's assignment
        waiter: Waiter[SyncResult] = Waiter()
        if member.sync_waiter is not None:
            member.sync_waiter.set(SyncResult(ErrorCode.rebalance_in_progress))
        member.sync_waiter = waiter
        if group.is_leader(member_id):
            log.info("assignment received from leader %s of group %s for generation %d",
                     member_id, group.group_id, group.generation)
            assignment = {mid: assignments.get(mid, b"") for mid in group.members}
            written = self._store_group_write(group, assignment)
            assert self._nursery is not None
            self._nursery.start_soon(self._finish_sync, group, group.generation, assignment,
                                     written)
        return waiter

    async def _finish_sync(self, group: Group, generation: int, assignment: dict[str, bytes],
                           written: Waiter[ErrorCode]) -> None:
        error = await written.wait()
        if group.state is not COMPLETING or generation != group.generation:
            return  # another member joined, or the group was unloaded, meanwhile
        if error:
            if error == ErrorCode.request_timed_out:
                error = ErrorCode.rebalance_in_progress  # Kafka's mapping of a timed-out write
            self._reset_and_propagate_assignment_error(group, error)
            self._maybe_prepare_rebalance(group, f"storing the assignment failed: {error.name}")
            return
        for member in group.members.values():
            member.assignment = assignment.get(member.member_id, b"")
        self._propagate_assignment(group, ErrorCode.none)
        group.transition_to(STABLE)

    # -- Heartbeat, LeaveGroup -----------------------------------------------------------------

    def heartbeat(self, group_id: str, member_id: str, group_instance_id: str | None,
                  generation: int) -> ErrorCode:
        if not group_id:
            return ErrorCode.invalid_group_id
        error = self._status(group_id)
        if error == ErrorCode.coordinator_load_in_progress:
            return ErrorCode.none  # Kafka answers blindly while loading
        if error:
            return error
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.state is DEAD:
            return ErrorCode.coordinator_not_available
        error = group.validate_current_member(member_id, group_instance_id)
        if error is not None:
            return error
        if generation != group.generation:
            return ErrorCode.illegal_generation
        if group.state is EMPTY:
            return ErrorCode.unknown_member_id
        self._touch(group, group.members[member_id])
        if group.state is PREPARING:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave_group(self, group_id: str, leaving: list[tuple[str, str | None]]
                    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """(top-level error, one error per (member id, group instance id))."""
        if not group_id:
            return ErrorCode.invalid_group_id, []
        error = self._status(group_id)
        if error:
            return error, []
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.none, [ErrorCode.unknown_member_id] * len(leaving)
        if group.state is DEAD:
            return ErrorCode.coordinator_not_available, []
        errors = []
        for member_id, group_instance_id in leaving:
            if member_id == UNKNOWN_MEMBER_ID:
                # an administrator removing a static member by its instance id
                current = (group.current_static_member_id(group_instance_id)
                           if group_instance_id is not None else None)
                if current is None:
                    errors.append(ErrorCode.unknown_member_id)
                    continue
                member_id = current
            elif member_id in group.pending_members:
                group.pending_members.discard(member_id)
                if group.state is PREPARING:
                    self._try_complete_join(group)
                errors.append(ErrorCode.none)
                continue
            else:
                member_error = group.validate_current_member(member_id, group_instance_id)
                if member_error is not None:
                    errors.append(member_error)
                    continue
            member = group.members[member_id]
            log.info("member %s has left group %s", member_id, group.group_id)
            self._remove_member_and_update_group(group, member)
            errors.append(ErrorCode.none)
        return ErrorCode.none, errors

    # -- offsets -------------------------------------------------------------------------------

    def _validate_offset_commit(self, group: Group, generation: int, member_id: str,
                                group_instance_id: str | None) -> ErrorCode | None:
        if group.state is DEAD:
            return ErrorCode.coordinator_not_available
        if generation < 0 and group.state is EMPTY:
            return None  # a simple consumer, or an administrator, using Kafka for offsets
        if generation >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = group.validate_current_member(member_id, group_instance_id)
            if error is None and generation != group.generation:
                error = ErrorCode.illegal_generation
            return error
        if group.state is not EMPTY:
            return ErrorCode.unknown_member_id  # only members commit to a non-empty group
        return None

    async def commit_offsets(self, group_id: str, member_id: str,
                             group_instance_id: str | None, generation: int,
                             offsets: list[StoredOffset], api_version: int | None = None
                             ) -> dict[tuple[str, int], ErrorCode]:
        """OffsetCommit: an error per (topic, partition); NONE once durable."""
        keys = [(o.topic, o.partition) for o in offsets]

        def every(error: ErrorCode) -> dict[tuple[str, int], ErrorCode]:
            return dict.fromkeys(keys, error)

        error = self._status(group_id)
        if error:
            return every(error)
        group: Any = self.consumer.groups.get(group_id)
        if group is not None:
            # a KIP-848 consumer group: the member epoch is checked (STALE_MEMBER_EPOCH)
            error = self.consumer.validate_offset_commit(group, member_id, generation,
                                                         api_version)
            if error is not None:
                return every(error)
            session_ms = self.consumer.session_timeout_ms(group_id)
        else:
            group = self.groups.get(group_id)
            if group is None:
                if generation >= 0:
                    return every(ErrorCode.illegal_generation)  # from a generation long gone
                group = self._add_group(group_id)
            error = self._validate_offset_commit(group, generation, member_id,
                                                 group_instance_id)
            if error is None and group.state is COMPLETING:
                error = ErrorCode.rebalance_in_progress
            if error is not None:
                return every(error)
            if group.state in (STABLE, PREPARING) and member_id in group.members:
                self._touch(group, group.members[member_id])
            member = group.members.get(member_id)
            session_ms = (member.session_timeout_ms if member is not None
                          else self.node.config.group_min_session_timeout_ms)
        results: dict[tuple[str, int], ErrorCode] = {}
        accepted: list[StoredOffset] = []
        view = self.node.view
        for offset in offsets:
            topic = view.topics.get(offset.topic)
            if topic is None or not 0 <= offset.partition < len(topic.partitions):
                results[(offset.topic, offset.partition)] = (
                    ErrorCode.unknown_topic_or_partition)
            elif offset.metadata is not None and (
                    len(offset.metadata.encode()) > OFFSET_METADATA_MAX_BYTES):
                results[(offset.topic, offset.partition)] = ErrorCode.offset_metadata_too_large
            else:
                accepted.append(offset)
        if accepted:
            async def write(fence: Fence) -> None:
                await self.store.commit_offsets(fence, group_id, accepted)
                # Durable: the cache follows, also when the request stopped waiting.
                if group.state not in (DEAD, ConsumerGroupState.DEAD):
                    now_ms = int(trio.current_time() * 1000)
                    for o in accepted:
                        group.offsets[(o.topic, o.partition)] = OffsetAndMetadata(
                            o.offset, o.leader_epoch, o.metadata, now_ms)

            written = self._write(group, write)
            # Responses stay in order per connection, so a commit waiting on PostgreSQL holds
            # back the member's heartbeats: wait at most a third of its session timeout, then
            # answer as Kafka maps a timed-out offsets append (the client commits again).
            with trio.move_on_after(session_ms / 3000):
                error = await written.wait()
            if not written.is_set:
                error = ErrorCode.coordinator_not_available
            elif error == ErrorCode.request_timed_out:
                error = ErrorCode.coordinator_not_available  # Kafka's mapping for commits
            for o in accepted:
                results[(o.topic, o.partition)] = error
        return results

    # -- transactional offsets (TxnOffsetCommit; the state is in PostgreSQL, see
    # mink/broker/transactions/) ----------------------------------------------------------

    def transactional_fence(self, group_id: str, generation: int, member_id: str,
                            group_instance_id: str | None) -> tuple[ErrorCode, Fence | None]:
        """TxnOffsetCommit's checks (KIP-447: generation, member id, instance id when the
        client sends them) and the fence of the group's partition."""
        error = self._status(group_id)
        if error:
            return error, None
        consumer_group = self.consumer.groups.get(group_id)
        group = self.groups.get(group_id)
        if consumer_group is not None:  # a KIP-848 group: its member epoch is the generation
            error = self.consumer.validate_transactional_offset_commit(
                consumer_group, member_id or "", generation, group_instance_id)
            if error is not None:
                return error, None
        elif group is not None and (generation >= 0 or member_id or group_instance_id):
            error = self._validate_offset_commit(group, generation, member_id or "",
                                                 group_instance_id)
            if error is not None:
                return error, None
        elif group is None and generation >= 0:
            return ErrorCode.illegal_generation, None
        st = self._partitions.get(self.partition_for(group_id))
        return ErrorCode.none, Fence(st.topic_id, st.index, st.leader_epoch,
                                     self.node.node_id, self.node.membership.node_epoch)

    def apply_transactional_offsets(self, done) -> None:
        """A transaction's marker reached its groups' partition: the offsets its commit made
        durable (rows of mink_txn_group_marker) join the cache."""
        now_ms = int(trio.current_time() * 1000)
        for group_id, topic, partition, offset, leader_epoch, metadata, committed in done:
            if not committed or self._status(group_id):
                continue
            group = (self.consumer.groups.get(group_id) or self.groups.get(group_id)
                     or self._add_group(group_id))
            group.offsets[(topic, partition)] = OffsetAndMetadata(offset, leader_epoch,
                                                                  metadata, now_ms)

    def fetch_offsets(self, group_id: str, partitions: list[tuple[str, int]] | None,
                      member_id: str | None = None, member_epoch: int = -1
                      ) -> tuple[ErrorCode, list[OffsetEntry]]:
        """OffsetFetch: (group error, entries); every partition asked for, or every committed
        one when `partitions` is None. The member id and epoch (v9) are checked for a
        KIP-848 consumer group only, as Kafka does."""
        error = self._status(group_id)
        if error:
            return error, []
        group: Any = self.consumer.groups.get(group_id)
        if group is not None:
            error = self.consumer.validate_offset_fetch(group, member_id, member_epoch)
            if error is not None:
                return error, []
        else:
            group = self.groups.get(group_id)
        stored = group.offsets if group is not None else {}
        if partitions is None:
            partitions = sorted(stored)
        entries = []
        for topic, partition in partitions:
            found = stored.get((topic, partition))
            if found is None:
                entries.append(OffsetEntry(topic, partition, -1, -1, "", ErrorCode.none))
            else:
                entries.append(OffsetEntry(topic, partition, found.offset, found.leader_epoch,
                                           found.metadata, ErrorCode.none))
        return ErrorCode.none, entries

    async def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]
                             ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """OffsetDelete: only offsets of topics the group does not consume (or an empty
        group's). A KIP-848 consumer group's consumed topics are its members' subscriptions
        (names and regular expressions), as Kafka's ConsumerGroup.isSubscribedToTopic."""
        error = self._status(group_id) if group_id else ErrorCode.invalid_group_id
        if error:
            return error, {}
        results: dict[tuple[str, int], ErrorCode] = {}
        eligible: list[tuple[str, int]] = []
        group: Any = self.consumer.groups.get(group_id)
        if group is not None:
            subscribed: set[str] | None = group.subscribed_topic_names(self.node.view.topics)
        else:
            group = self.groups.get(group_id)
            if group is None or group.state is DEAD:
                return ErrorCode.group_id_not_found, {}
            if group.state is EMPTY:
                subscribed = set()
            elif group.protocol_type == "consumer":
                subscribed = _subscribed_topics(group)
            else:
                return ErrorCode.non_empty_group, {}
        candidates = []
        for key in partitions:
            if subscribed is None or key[0] in subscribed:
                results[key] = ErrorCode.group_subscribed_to_topic
            else:
                candidates.append(key)
        view = self.node.view
        for key in candidates:
            topic = view.topics.get(key[0])
            if topic is None or not 0 <= key[1] < len(topic.partitions):
                results[key] = ErrorCode.unknown_topic_or_partition
            else:
                eligible.append(key)
        if eligible:
            written = self._write(group, lambda fence: self.store.delete_offsets(
                fence, group_id, eligible))
            error = await written.wait()
            if error == ErrorCode.none:
                for key in eligible:
                    group.offsets.pop(key, None)
            elif error == ErrorCode.request_timed_out:
                error = ErrorCode.coordinator_not_available
            for key in eligible:
                results[key] = error
        return ErrorCode.none, results

    # -- offsets expiry (KIP-211) --------------------------------------------------------------

    async def _offsets_expiry_loop(self) -> None:
        """Kafka's offsets-cleanup task: every offsets.retention.check.interval.ms."""
        while True:
            await trio.sleep(self.node.config.offsets_retention_check_interval_ms / 1000)
            try:
                await self.expire_offsets()
            except Exception:  # a cleanup round's trouble must never stop the coordinator
                log.exception("offsets expiry round failed")

    def _expiry_mode(self, group: Group) -> tuple[str, list[str]] | None:
        """Kafka's ClassicGroup.offsetExpirationCondition, as the mode of
        mink_expire_group_offsets: None when nothing of the group can expire now."""
        if group.state is EMPTY:
            return ("empty" if group.protocol_type is not None else "simple"), []
        if group.state is STABLE and group.protocol_type == "consumer" and group.offsets:
            subscribed = _subscribed_topics(group)
            if subscribed is not None and any(t not in subscribed for t, _ in group.offsets):
                return "subscribed", sorted(subscribed)
        return None

    async def expire_offsets(self) -> dict[str, int]:
        """One expiry round over the groups this node coordinates: group id -> offsets
        expired. Each group's expiry is a fenced write in the group's order of writes, so an
        offset commit accepted before it is never lost to it, and one after it stays."""
        retention_ms = int(self.node.config.offsets_retention_minutes * 60_000)
        pending: list[tuple[Group, Waiter[ErrorCode], list[OffsetsExpiry]]] = []
        for group in list(self.groups.values()):
            st = self._partitions.get(group.partition)
            if st is None or not st.loaded:
                continue
            mode = self._expiry_mode(group)
            if mode is None:
                continue
            outcome: list[OffsetsExpiry] = []

            async def expire(fence: Fence, group=group, mode=mode, outcome=outcome) -> None:
                if self._expiry_mode(group) != mode:
                    return  # a member joined (or the group moved on) since: as Kafka under
                    # the group's lock, the condition is the group's state when it runs
                result = await self.store.expire_offsets(fence, group.group_id, mode[0],
                                                         mode[1], retention_ms)
                outcome.append(result)
                if not result.stale:
                    kept = set(result.kept)
                    for key in [k for k in group.offsets if k not in kept]:
                        del group.offsets[key]

            pending.append((group, self._write(group, expire), outcome))
        expired: dict[str, int] = {}
        for group, written, outcome in pending:
            await written.wait()
            if not outcome:
                continue  # refused or not written: the next round tries again
            result = outcome[0]
            if result.stale:
                self._store_group_write(group)  # the Empty state again: its clock starts
                continue
            if result.expired:
                expired[group.group_id] = result.expired
                log.info("removed %d expired offsets of group %s", result.expired,
                         group.group_id)
            if (result.group_deleted and group.state is EMPTY and not group.offsets
                    and self.groups.get(group.group_id) is group):
                # Kafka's cleanupGroupMetadata: an Empty group without offsets is Dead. A
                # group that a member joined meanwhile stays: its next write stores it again.
                group.state = DEAD
                del self.groups[group.group_id]
                log.info("group %s transitioned to Dead in generation %d (no offsets left)",
                         group.group_id, group.generation)
        return expired

    # -- administration ------------------------------------------------------------------------

    def list_groups(self, states: set[str] | None = None
                    ) -> tuple[ErrorCode, list[tuple[str, str, str]]]:
        """(error, [(group id, protocol type, state)]) of the groups this node coordinates."""
        loading = any(not st.loaded for st in self._partitions.values())
        wanted = {s.lower() for s in states} if states else None
        groups = [(g.group_id, g.protocol_type or "", g.state.value)
                  for g in self.groups.values()
                  if g.state is not DEAD and (wanted is None or g.state.value.lower() in wanted)]
        error = ErrorCode.coordinator_load_in_progress if loading else ErrorCode.none
        return error, sorted(groups)

    def describe_group(self, group_id: str) -> tuple[ErrorCode, GroupSummary]:
        error = self._status(group_id)
        if error:
            return error, GroupSummary("", "", "", [])
        group = self.groups.get(group_id)
        if group is None or group.state is DEAD:
            return ErrorCode.none, GroupSummary(DEAD.value, "", "", [])
        return ErrorCode.none, group.summary()

    async def delete_groups(self, group_ids: list[str]) -> dict[str, ErrorCode]:
        results: dict[str, ErrorCode] = {}
        pending: list[tuple[str, Group, Waiter[ErrorCode]]] = []
        for group_id in group_ids:
            error = self._status(group_id)
            if error:
                results[group_id] = error
                continue
            consumer_group = self.consumer.groups.get(group_id)
            if consumer_group is not None:
                if consumer_group.members:
                    results[group_id] = ErrorCode.non_empty_group
                    continue
                # an empty consumer group is deleted as an empty classic one is
                self.consumer.delete_if_empty(group_id)
                self._add_group(group_id).offsets = consumer_group.offsets
            group = self.groups.get(group_id)
            if group is None or group.state is DEAD:
                results[group_id] = ErrorCode.group_id_not_found
            elif group.state is not EMPTY:
                results[group_id] = ErrorCode.non_empty_group
            else:
                group.transition_to(DEAD)  # joins see COORDINATOR_NOT_AVAILABLE meanwhile
                written = self._write(group, lambda fence, gid=group_id:
                                      self.store.delete_groups(fence, [gid]))
                pending.append((group_id, group, written))
        for group_id, group, written in pending:
            error = await written.wait()
            if error == ErrorCode.none:
                if self.groups.get(group_id) is group:
                    del self.groups[group_id]
                log.info("deleted group %s", group_id)
            else:
                if error == ErrorCode.request_timed_out:
                    error = ErrorCode.coordinator_not_available
                if self.groups.get(group_id) is group:
                    group.state = EMPTY  # not deleted after all
            results[group_id] = error
        return results


# ---------------------------------------------------------------------------------------------
# Records


def _record_from_group(group: Group, assignment: dict[str, bytes] | None = None) -> StoredGroup:
    members = [StoredMember(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                            m.rebalance_timeout_ms, m.session_timeout_ms, m.protocol_type,
                            list(m.protocols),
                            assignment.get(m.member_id, b"") if assignment is not None
                            else m.assignment)
               for m in group.members.values()]
    return StoredGroup(group.group_id, group.protocol_type, group.protocol_name,
                       group.generation, group.leader_id if members else None, members)


def _group_from_record(record: StoredGroup, partition: int) -> Group:
    """A loaded group is Stable (it has members) or Empty, as Kafka loads them."""
    group = Group(record.group_id, partition)
    group.generation = record.generation
    group.protocol_type = record.protocol_type
    group.protocol_name = record.protocol_name
    for stored in record.members:
        member = Member(stored.member_id, stored.group_instance_id, stored.client_id,
                        stored.client_host, stored.rebalance_timeout_ms,
                        stored.session_timeout_ms, stored.protocol_type,
                        [(name, bytes(metadata)) for name, metadata in stored.protocols],
                        assignment=stored.assignment)
        group.add(member)
    if group.members:
        group.leader_id = record.leader if record.leader in group.members else group.leader_id
        group.state = STABLE
        group.protocol_type = record.protocol_type
    for o in record.offsets:
        group.offsets[(o.topic, o.partition)] = OffsetAndMetadata(
            o.offset, o.leader_epoch, o.metadata, o.commit_timestamp)
    return group


def _subscribed_topics(group: Group) -> set[str] | None:
    """The topics a consumer group's members subscribe to (ConsumerProtocolSubscription),
    None if some member's metadata cannot be read."""
    from mink.protocol.consumer_protocol import subscription_topics

    topics: set[str] = set()
    for member in group.members.values():
        found = subscription_topics(member.metadata(group.protocol_name))
        if found is None:
            return None
        topics |= found
    return topics
