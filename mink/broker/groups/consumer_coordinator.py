"""KIP-848 consumer groups on the group coordinator: ConsumerGroupHeartbeat,
ConsumerGroupDescribe and the member-epoch checks of OffsetCommit / OffsetFetch.

Semantics follow Kafka's GroupMetadataManager (4.0) with online migration disabled:

- A heartbeat at member epoch 0 joins (a new member, or a known one starting over, which is
  first fenced so that what it held is free); -1 leaves; any other epoch must be the
  member's epoch, or its previous one with owned partitions within its assignment (the
  answer with the bumped epoch was lost), else FENCED_MEMBER_EPOCH.
- A join, a leave, an expiry, a changed subscription or a subscribed topic's new partition
  count bumps the group epoch (a regular expression new to the group only once it is
  resolved, after the heartbeat that brought it, as Kafka resolves them asynchronously);
  the next heartbeat computes the target assignment with the group's assignor
  (`assignors.py`) and every member reconciles towards it
  (`reconciliation.py`), revoking before anything is assigned elsewhere.
- The broker sets the heartbeat interval and session timeout (a group's own
  `consumer.heartbeat.interval.ms` and `consumer.session.timeout.ms`, set with
  IncrementalAlterConfigs on the GROUP and read at every heartbeat, else the node's
  `group_consumer_heartbeat_interval_ms`, `group_consumer_session_timeout_ms`); a member
  whose session lapses, or that holds partitions to revoke past its rebalance timeout, is
  fenced and its partitions move.
- A group id held by a classic group with members answers GROUP_ID_NOT_FOUND ("not a
  consumer group"); an empty classic group becomes a consumer group and keeps its offsets.
- Static members (instance ids): -2 leaves for now, keeping the assignment until the
  session timeout; the instance rejoining under a new member id takes its place.

A heartbeat that changed the group's state is answered once that state is written to
PostgreSQL (`persist`, fenced, in the group's order of writes); a new coordinator loads it
(`restore`) and the members heartbeat on at their epochs. A write that fails leaves the
change in memory (Kafka reverts it); the coordinator is usually unloaded then anyway.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass

import trio
from kio.schema.errors import ErrorCode

from mink.broker.groups.assignors import ASSIGNORS
from mink.broker.groups.consumer_group import (
    ConsumerGroup,
    ConsumerGroupMember,
    ConsumerGroupState,
    compile_regex,
    from_json,
    to_json,
)
from mink.broker.groups.reconciliation import MemberState, TopicPartition, reconcile
from mink.broker.groups.state import GroupState, Waiter
from mink.storage.controlplane.groups import StoredConsumerGroup

log = logging.getLogger(__name__)

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
CONSUMER = "consumer"


class HeartbeatError(Exception):
    def __init__(self, error: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or error.name)
        self.error = error
        self.message = message


@dataclass(slots=True)
class HeartbeatResult:
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: list[tuple[uuid.UUID, list[int]]] | None = None
    # the fenced write of the group's new state, to wait for before answering
    written: Waiter[ErrorCode] | None = None


def _by_topic(partitions) -> list[tuple[uuid.UUID, list[int]]]:
    out: dict[uuid.UUID, list[int]] = {}
    for topic_id, index in partitions:
        out.setdefault(topic_id, []).append(index)
    return [(t, sorted(ps)) for t, ps in sorted(out.items(), key=lambda kv: str(kv[0]))]


class ConsumerGroupCoordinator:
    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        config = coordinator.node.config
        # a group's own consumer.*.ms (IncrementalAlterConfigs on a GROUP), else these
        self.configs = coordinator.node.dynamic_configs
        self.assignors = [a.strip() for a in config.group_consumer_assignors.split(",")
                          if a.strip() in ASSIGNORS] or ["uniform"]
        self.groups: dict[str, ConsumerGroup] = {}

    def session_timeout_ms(self, group_id: str) -> int:
        return self.configs.group_setting(group_id, "consumer.session.timeout.ms")

    # -- the heartbeat -------------------------------------------------------------------------

    def heartbeat(self, *, group_id: str, member_id: str, member_epoch: int,
                  instance_id: str | None, rack_id: str | None, rebalance_timeout_ms: int,
                  subscribed_topic_names: list[str] | None, subscribed_topic_regex: str | None,
                  server_assignor: str | None,
                  owned: list[tuple[uuid.UUID, list[int]]] | None,
                  client_id: str, client_host: str, version: int) -> HeartbeatResult:
        before = self._snapshot(group_id)
        try:
            result = self._heartbeat(group_id, member_id, member_epoch, instance_id, rack_id,
                                     rebalance_timeout_ms, subscribed_topic_names,
                                     subscribed_topic_regex, server_assignor, owned,
                                     client_id, client_host, version)
        except HeartbeatError as exc:
            result = HeartbeatResult(exc.error, exc.message)
        group = self.groups.get(group_id)
        if group is not None and self._snapshot(group_id) != before:
            result.written = self.persist(group)
        return result

    def _snapshot(self, group_id: str):
        group = self.groups.get(group_id)
        return None if group is None else (group.group_epoch, to_json(group))

    def persist(self, group: ConsumerGroup) -> Waiter[ErrorCode]:
        """Write the group's state as it is when the write runs (in the group's order of
        writes), fenced by its partition's leader epoch."""
        store = self.coordinator.store
        return self.coordinator._write(group, lambda fence: store.store_consumer_group(
            fence, StoredConsumerGroup(group.group_id, group.group_epoch, to_json(group))))

    def restore(self, stored: StoredConsumerGroup, partition: int) -> None:
        """A group loaded by a new coordinator: its members' sessions start anew."""
        group = from_json(stored.group_id, partition, stored.group_epoch, stored.state)
        classic = self.coordinator.groups.pop(stored.group_id, None)
        if classic is not None:
            group.offsets = classic.offsets
        self.groups[group.group_id] = group
        for member in group.members.values():
            self._touch(group, member)
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                member.revoke_by = trio.current_time() + member.rebalance_timeout_ms / 1000
        self._resolve_regexes_soon(group)  # the coordinator went before it resolved them

    def _validate(self, group_id, member_id, member_epoch, rebalance_timeout_ms,
                  subscribed_topic_names, subscribed_topic_regex, server_assignor, owned,
                  version) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
        if not group_id:
            raise HeartbeatError(ErrorCode.invalid_request, "GroupId can't be empty.")
        if version >= 1 and not member_id:
            raise HeartbeatError(ErrorCode.invalid_request, "MemberId can't be empty.")
        if member_epoch > 0 and not member_id:
            raise HeartbeatError(ErrorCode.invalid_request, "MemberId can't be empty.")
        if member_epoch == JOIN_EPOCH:
            if rebalance_timeout_ms == -1:
                raise HeartbeatError(ErrorCode.invalid_request,
                                     "RebalanceTimeoutMs must be provided in first request.")
            if owned is None or any(ps for _, ps in owned):
                raise HeartbeatError(ErrorCode.invalid_request,
                                     "TopicPartitions must be empty when (re-)joining.")
            if subscribed_topic_names is None and subscribed_topic_regex is None:
                raise HeartbeatError(ErrorCode.invalid_request,
                                     "SubscribedTopicNames or SubscribedTopicRegex must be "
                                     "set in first request.")
        elif member_epoch < STATIC_LEAVE_EPOCH:
            raise HeartbeatError(ErrorCode.invalid_request,
                                 f"MemberEpoch {member_epoch} is invalid.")
        if subscribed_topic_regex:
            try:
                compile_regex(subscribed_topic_regex)
            except ValueError as exc:
                raise HeartbeatError(ErrorCode.invalid_regular_expression,
                                     f"SubscribedTopicRegex `{subscribed_topic_regex}` is "
                                     f"not a valid regular expression: {exc}.") from None
        if server_assignor is not None and server_assignor not in self.assignors:
            raise HeartbeatError(ErrorCode.unsupported_assignor,
                                 f"ServerAssignor {server_assignor} is not supported. "
                                 f"Supported assignors: {', '.join(self.assignors)}.")

    def _heartbeat(self, group_id, member_id, member_epoch, instance_id, rack_id,
                   rebalance_timeout_ms, subscribed_topic_names, subscribed_topic_regex,
                   server_assignor, owned, client_id, client_host, version) -> HeartbeatResult:
        self._validate(group_id, member_id, member_epoch, rebalance_timeout_ms,
                       subscribed_topic_names, subscribed_topic_regex, server_assignor,
                       owned, version)
        error = self.coordinator._status(group_id)
        if error:
            raise HeartbeatError(error)
        if member_epoch == STATIC_LEAVE_EPOCH and instance_id is not None:
            return self._static_leave(group_id, member_id, instance_id)
        if member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(group_id, member_id, member_epoch)
        group = self._get_or_create(group_id, create=member_epoch == JOIN_EPOCH)
        owned_set = (None if owned is None
                     else {(t, p) for t, ps in owned for p in ps})
        joined = False
        if member_epoch == JOIN_EPOCH:
            if not member_id:
                member_id = str(uuid.uuid4())  # v0: the coordinator names the member
            existing = group.members.get(member_id)
            if existing is not None and (existing.member_epoch, existing.assigned,
                                         existing.pending_revocation) != (0, frozenset(),
                                                                          frozenset()):
                # A known member starting over has given up what it held: fence it first.
                log.info("member %s of consumer group %s rejoins at epoch 0", member_id,
                         group_id)
                self._remove_member(group, existing, "rejoined with member epoch 0")
                existing = None
            member = existing
            static = (self._static_member(group, instance_id)
                      if instance_id is not None else None)
            if member is None and static is not None and static.member_id != member_id:
                if static.member_epoch != STATIC_LEAVE_EPOCH:
                    raise HeartbeatError(ErrorCode.unreleased_instance_id,
                                         f"Static member {member_id} with instance id "
                                         f"{instance_id} cannot join the group because the "
                                         f"instance id is owned by {static.member_id}.")
                member = self._replace_static_member(group, static, member_id)
            if member is None:
                member = ConsumerGroupMember(member_id, client_id, client_host)
                group.members[member_id] = member
                joined = True
        else:
            member = group.members.get(member_id)
            if member is None:
                raise HeartbeatError(ErrorCode.unknown_member_id,
                                     f"Member {member_id} is not a member of group "
                                     f"{group_id}.")
            if member_epoch > member.member_epoch or (
                    member_epoch < member.member_epoch and (
                        member_epoch != member.previous_member_epoch
                        or owned_set is None or not owned_set <= member.assigned)):
                raise HeartbeatError(
                    ErrorCode.fenced_member_epoch,
                    f"The consumer group member has a {'greater' if member_epoch > member.member_epoch else 'smaller'} "
                    f"member epoch ({member_epoch}) than the one known by the group "
                    f"coordinator ({member.member_epoch}). The member must abandon all its "
                    f"partitions and rejoin.")
        # The member's new fields (null: unchanged)
        bump = joined
        if rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = rebalance_timeout_ms
        if instance_id is not None:
            member.instance_id = instance_id
        if rack_id is not None:
            member.rack_id = rack_id
        member.client_id, member.client_host = client_id, client_host
        if subscribed_topic_names is not None:
            names = tuple(sorted(set(subscribed_topic_names)))
            if names != member.subscribed_topic_names:
                member.subscribed_topic_names = names
                bump = True
        if subscribed_topic_regex is not None:
            regex = subscribed_topic_regex or None  # "": no regular expression
            if regex != member.subscribed_topic_regex:
                member.subscribed_topic_regex = regex
                group.resolved_regexes &= group.subscribed_regexes()
                # Kafka's maybeUpdateRegularExpressions: a regex the group has resolved
                # rebalances at once; one new to the group is resolved after this
                # heartbeat, which is answered without its topics (_resolve_regexes).
                if regex is None or regex in group.resolved_regexes:
                    bump = True
        if server_assignor is not None and server_assignor != member.server_assignor:
            member.server_assignor = server_assignor
            bump = True
        metadata = self._subscription_metadata(group)
        if metadata != group.subscription_metadata:
            group.subscription_metadata = metadata
            bump = True
        if bump:
            group.group_epoch += 1
            if joined:
                log.info("member %s joins consumer group %s (group epoch %d)", member_id,
                         group_id, group.group_epoch,
                         extra={"event": "rebalance", "group": group_id,
                                "generation": group.group_epoch, "reason": "member joined"})
                self.coordinator.node.metrics.group_rebalance()
        if group.group_epoch > group.target_epoch:
            self._compute_target(group)
        before = member.assigned
        self._reconcile(group, member, owned_set)
        self._touch(group, member)
        result = HeartbeatResult(member_id=member_id, member_epoch=member.member_epoch,
                                 heartbeat_interval_ms=self.configs.group_setting(
                                     group_id, "consumer.heartbeat.interval.ms"))
        full = (rebalance_timeout_ms != -1 and subscribed_topic_names is not None
                and owned is not None)
        if member_epoch == JOIN_EPOCH or full or member.assigned != before:
            result.assignment = _by_topic(member.assigned)
        self._resolve_regexes_soon(group)
        return result

    def _resolve_regexes_soon(self, group: ConsumerGroup) -> None:
        if group.subscribed_regexes() - group.resolved_regexes:
            self.coordinator._timers.call_at(trio.current_time(), self._resolve_regexes,
                                             group)

    def _resolve_regexes(self, group: ConsumerGroup) -> None:
        """Kafka's refreshRegularExpressions and handleRegularExpressionsResult, run after
        the heartbeat that brought a regular expression new to the group: it is resolved,
        and the group epoch bumped so that the members' next heartbeats assign its topics."""
        if group.dead or self.groups.get(group.group_id) is not group:
            return
        new = group.subscribed_regexes() - group.resolved_regexes
        if not new:
            return
        group.resolved_regexes |= new
        group.subscription_metadata = self._subscription_metadata(group)
        group.group_epoch += 1
        log.info("consumer group %s: resolved %s (group epoch %d)", group.group_id,
                 ", ".join(sorted(new)), group.group_epoch,
                 extra={"event": "rebalance", "group": group.group_id,
                        "generation": group.group_epoch,
                        "reason": "regular expression resolved"})
        self.persist(group)

    def _get_or_create(self, group_id: str, create: bool) -> ConsumerGroup:
        """Kafka's getOrMaybeCreateConsumerGroup with online migration disabled."""
        group = self.groups.get(group_id)
        if group is not None:
            return group
        classic = self.coordinator.groups.get(group_id)
        if not create:
            # Kafka answers GROUP_ID_NOT_FOUND to a member of a group it does not know (a
            # group deleted under it); UNKNOWN_MEMBER_ID makes the member join again
            # (clients treat GROUP_ID_NOT_FOUND as fatal).
            if classic is None:
                raise HeartbeatError(ErrorCode.unknown_member_id,
                                     f"Consumer group {group_id} not found.")
            raise HeartbeatError(ErrorCode.group_id_not_found,
                                 f"Group {group_id} is not a consumer group.")
        if classic is not None and classic.state is not GroupState.EMPTY:
            raise HeartbeatError(ErrorCode.group_id_not_found,
                                 f"Group {group_id} is not a consumer group.")
        group = ConsumerGroup(group_id, self.coordinator.partition_for(group_id))
        if classic is not None:
            # The empty classic group is converted (its offsets stay with the group id).
            group.offsets = classic.offsets
            del self.coordinator.groups[group_id]
            log.info("converted the empty classic group %s to a consumer group", group_id)
        self.groups[group_id] = group
        return group

    def _subscription_metadata(self, group: ConsumerGroup) -> dict[str, tuple[uuid.UUID, int]]:
        topics = self.coordinator.node.view.topics
        out = {}
        for name in group.subscribed_topic_names(topics):
            topic = topics.get(name)
            if topic is not None:
                out[name] = (topic.topic_id, len(topic.partitions))
        return out

    def _compute_target(self, group: ConsumerGroup) -> None:
        """The target assignment of the group epoch (Kafka's TargetAssignmentBuilder)."""
        metadata = group.subscription_metadata
        subscriptions = {m.member_id: {metadata[t][0] for t in group.member_topics(m, metadata)
                                       if t in metadata}
                         for m in group.members.values()}
        partitions = dict(metadata.values())
        assignor = group.preferred_assignor(self.assignors[0])
        target = ASSIGNORS[assignor](subscriptions, partitions, group.target)
        group.target = {m: frozenset(tps) for m, tps in target.items()}
        group.target_epoch = group.group_epoch
        log.info("consumer group %s: target assignment of epoch %d computed by %s over %d "
                 "members", group.group_id, group.group_epoch, assignor, len(group.members))

    def _reconcile(self, group: ConsumerGroup, member: ConsumerGroupMember,
                   owned: set[TopicPartition] | None) -> None:
        metadata = group.subscription_metadata
        subscribed = {metadata[t][0] for t in group.member_topics(member, metadata)
                      if t in metadata}
        step = reconcile(member.reconciled(), group.target_epoch,
                         group.target.get(member.member_id, frozenset()), subscribed, owned,
                         group.owned_by_other(member.member_id))
        if step == member.reconciled():
            return
        group.release(member)
        if step.member_epoch != member.member_epoch:
            member.previous_member_epoch = member.member_epoch
        was_unrevoked = member.state is MemberState.UNREVOKED_PARTITIONS
        member.state, member.member_epoch = step.state, step.member_epoch
        member.assigned, member.pending_revocation = step.assigned, step.pending_revocation
        clashes = group.take(member)
        if clashes:  # the invariant the state machine keeps: never expected
            log.error("consumer group %s: member %s given partitions held by others: %s",
                      group.group_id, member.member_id, clashes)
        if member.state is MemberState.UNREVOKED_PARTITIONS and not was_unrevoked:
            member.revoke_by = trio.current_time() + member.rebalance_timeout_ms / 1000
            self._arm(group, member, member.revoke_by)
        elif member.state is not MemberState.UNREVOKED_PARTITIONS:
            member.revoke_by = math.inf

    @staticmethod
    def _static_member(group: ConsumerGroup, instance_id: str) -> ConsumerGroupMember | None:
        for member in group.members.values():
            if member.instance_id == instance_id:
                return member
        return None

    def _replace_static_member(self, group: ConsumerGroup, old: ConsumerGroupMember,
                               member_id: str) -> ConsumerGroupMember:
        """A static member back under a new member id takes its predecessor's place and
        assignment (Kafka's static member replacement): no group epoch bump, nothing
        moves."""
        group.release(old)
        del group.members[old.member_id]
        old.timer_token += 1
        member = ConsumerGroupMember(
            member_id, old.client_id, old.client_host, instance_id=old.instance_id,
            rack_id=old.rack_id, rebalance_timeout_ms=old.rebalance_timeout_ms,
            subscribed_topic_names=old.subscribed_topic_names,
            subscribed_topic_regex=old.subscribed_topic_regex,
            server_assignor=old.server_assignor, member_epoch=0, assigned=old.assigned)
        group.members[member_id] = member
        group.target[member_id] = group.target.pop(old.member_id, frozenset())
        group.take(member)
        log.info("static member %s (instance id %s) of consumer group %s replaced by %s",
                 old.member_id, old.instance_id, group.group_id, member_id)
        return member

    def _static_leave(self, group_id: str, member_id: str, instance_id: str) -> HeartbeatResult:
        """Member epoch -2: a static member goes away for now; it keeps its assignment
        (nobody else gets those partitions) until its session timeout, and a member with
        its instance id takes over where it left."""
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is None or member.instance_id != instance_id:
            raise HeartbeatError(ErrorCode.unknown_member_id if member is None
                                 else ErrorCode.fenced_instance_id,
                                 f"Instance id {instance_id} is unknown.")
        log.info("static member %s (instance id %s) leaves consumer group %s for now",
                 member_id, instance_id, group_id)
        for tp in member.pending_revocation:
            if group.owners.get(tp) == member.member_id:
                del group.owners[tp]
        member.pending_revocation = frozenset()
        member.state = MemberState.STABLE
        member.revoke_by = math.inf
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = STATIC_LEAVE_EPOCH
        return HeartbeatResult(member_id=member_id, member_epoch=STATIC_LEAVE_EPOCH)

    def _leave(self, group_id: str, member_id: str, member_epoch: int) -> HeartbeatResult:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is None:
            raise HeartbeatError(ErrorCode.unknown_member_id,
                                 f"Member {member_id} is not a member of group {group_id}.")
        log.info("member %s leaves consumer group %s", member_id, group_id)
        self._remove_member(group, member, "left the group")
        return HeartbeatResult(member_id=member_id, member_epoch=member_epoch)

    def _remove_member(self, group: ConsumerGroup, member: ConsumerGroupMember,
                       reason: str) -> None:
        """Kafka's consumerGroupFenceMember: its partitions are free at once."""
        group.release(member)
        del group.members[member.member_id]
        group.target.pop(member.member_id, None)
        group.resolved_regexes &= group.subscribed_regexes()
        member.timer_token += 1
        group.group_epoch += 1
        log.info("consumer group %s: member %s removed (%s), group epoch %d",
                 group.group_id, member.member_id, reason, group.group_epoch,
                 extra={"event": "rebalance", "group": group.group_id,
                        "generation": group.group_epoch, "reason": reason})

    # -- timers --------------------------------------------------------------------------------

    def _touch(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        timeout_ms = self.session_timeout_ms(group.group_id)
        member.expires_at = trio.current_time() + timeout_ms / 1000
        if member.expires_at < member.timer_at:
            self._arm(group, member, member.expires_at)

    def _arm(self, group: ConsumerGroup, member: ConsumerGroupMember, at: float) -> None:
        if at >= member.timer_at and member.timer_at > trio.current_time():
            return  # an earlier timer is armed; it re-arms for the later deadline
        member.timer_token += 1
        member.timer_at = at
        self.coordinator._timers.call_at(at, self._on_deadline, group, member,
                                         member.timer_token)

    def _on_deadline(self, group: ConsumerGroup, member: ConsumerGroupMember,
                     token: int) -> None:
        if token != member.timer_token:
            return
        member.timer_at = math.inf
        if group.dead or group.members.get(member.member_id) is not member:
            return
        now = trio.current_time()
        if now >= member.expires_at:
            self._remove_member(group, member, "session timeout expired")
            self.persist(group)
        elif now >= member.revoke_by:
            self._remove_member(group, member, "did not revoke its partitions within the "
                                "rebalance timeout")
            self.persist(group)
        else:
            self._arm(group, member, min(member.expires_at, member.revoke_by))

    # -- offsets -------------------------------------------------------------------------------

    def validate_offset_commit(self, group: ConsumerGroup, member_id: str, member_epoch: int,
                               api_version: int | None) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetCommit (not transactional)."""
        if member_epoch < 0 and not group.members:
            return None  # an admin or a consumer outside group management, group empty
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if api_version is not None and api_version < 9:
            return ErrorCode.unsupported_version
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        self._touch(group, member)
        return None

    def validate_transactional_offset_commit(self, group: ConsumerGroup, member_id: str,
                                             member_epoch: int,
                                             instance_id: str | None) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetCommit for TxnOffsetCommit (KIP-447): the
        member and its epoch are checked only when the client sends them; no version check,
        and the member's session is not touched."""
        if member_epoch < 0 and not group.members:
            return None
        if member_epoch < 0 and not member_id and instance_id is None:
            return None
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return None

    def validate_offset_fetch(self, group: ConsumerGroup, member_id: str | None,
                              member_epoch: int) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetFetch: only when a member id is given."""
        if member_epoch < 0 and not member_id:
            return None
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return None

    # -- administration ------------------------------------------------------------------------

    def unload(self, partition: int) -> None:
        for group_id in [g for g, group in self.groups.items() if group.partition == partition]:
            group = self.groups.pop(group_id)
            group.dead = True

    def list_groups(self, states: set[str] | None) -> list[tuple[str, str, str]]:
        wanted = {s.lower() for s in states} if states else None
        return sorted((g.group_id, CONSUMER, g.state.value) for g in self.groups.values()
                      if wanted is None or g.state.value.lower() in wanted)

    def topic_name(self, topic_id: uuid.UUID) -> str:
        for name, topic in self.coordinator.node.view.topics.items():
            if topic.topic_id == topic_id:
                return name
        return ""

    def delete_if_empty(self, group_id: str) -> ErrorCode | None:
        """A classic JoinGroup, or DeleteGroups, for a consumer group id: an empty consumer
        group goes (its offsets stay with the group id); a non-empty one refuses."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        if group.members:
            return ErrorCode.inconsistent_group_protocol
        del self.groups[group_id]
        group.dead = True
        return None


__all__ = ["ConsumerGroupCoordinator", "ConsumerGroupState", "HeartbeatResult", "CONSUMER"]


@dataclass(slots=True)
class DescribedMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: list[tuple[uuid.UUID, str, list[int]]]
    target_assignment: list[tuple[uuid.UUID, str, list[int]]]


@dataclass(slots=True)
class DescribedGroup:
    group_id: str
    error: ErrorCode
    message: str | None = None
    state: str = ConsumerGroupState.DEAD.value
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: list[DescribedMember] | None = None


def describe(consumer: ConsumerGroupCoordinator, group_id: str) -> DescribedGroup:
    """ConsumerGroupDescribe of one group (Kafka's GroupMetadataManager.consumerGroupDescribe):
    a classic group or an unknown id is GROUP_ID_NOT_FOUND."""
    error = consumer.coordinator._status(group_id)
    if error:
        return DescribedGroup(group_id, error)
    group = consumer.groups.get(group_id)
    if group is None:
        message = (f"Group {group_id} is not a consumer group."
                   if group_id in consumer.coordinator.groups
                   else f"Group {group_id} not found.")
        return DescribedGroup(group_id, ErrorCode.group_id_not_found, message)

    def named(partitions) -> list[tuple[uuid.UUID, str, list[int]]]:
        return [(t, consumer.topic_name(t), ps) for t, ps in _by_topic(partitions)]

    return DescribedGroup(
        group_id, ErrorCode.none, None, group.state.value, group.group_epoch,
        group.target_epoch, group.preferred_assignor(consumer.assignors[0]),
        [DescribedMember(m.member_id, m.instance_id, m.rack_id, m.member_epoch, m.client_id,
                         m.client_host, m.subscribed_topic_names, m.subscribed_topic_regex,
                         named(m.assigned),
                         named(group.target.get(m.member_id, ())))
         for m in sorted(group.members.values(), key=lambda m: m.member_id)])
