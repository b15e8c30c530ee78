"""KIP-848 consumer groups: the assignors and the reconciliation state machine (pure), and
confluent-kafka consumers with group.protocol=consumer against a real node."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.broker.groups.assignors import range_, uniform
from mink.broker.groups.reconciliation import MemberState, Reconciled, reconcile
from mink.client import BlockingKafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build, nested
from tests.test_interop import confluent_produce

HEARTBEAT_MS = 300
SESSION_MS = 3000
CONSUMER = Path(__file__).parent / "support" / "kip848_consumer.py"
TIMEOUT = 60


@pytest.fixture
def node_settings() -> dict:
    return dict(num_partitions=12, offsets_topic_num_partitions=3,
                group_consumer_heartbeat_interval_ms=HEARTBEAT_MS,
                group_consumer_session_timeout_ms=SESSION_MS)


# ---------------------------------------------------------------------------------------------
# Consumers in subprocesses


class ConsumerProcess:
    def __init__(self, bootstrap: str, group: str, topic: str, name: str) -> None:
        self.name = name
        self.events: list[dict] = []
        self.proc = subprocess.Popen(
            [sys.executable, str(CONSUMER), bootstrap, group, topic],
            stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            event = json.loads(line)
            event["at"] = time.monotonic()
            self.events.append(event)

    def of(self, kind: str) -> list[dict]:
        return [e for e in list(self.events) if e["event"] == kind]

    def owned(self) -> set[int]:
        owned: set[int] = set()
        for e in list(self.events):
            if e["event"] == "assigned":
                owned |= set(e["partitions"])
            elif e["event"] in ("revoked", "lost"):
                owned -= set(e["partitions"])
        return owned

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self._reader.join(5)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(5)


async def wait_for(predicate, timeout: float = TIMEOUT, what: str = "condition"):
    deadline = trio.current_time() + timeout
    while not predicate():
        if trio.current_time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await trio.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# The assignors and reconciliation (pure)

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)


def parts(topic, *indexes):
    return {(topic, i) for i in indexes}


def test_uniform_balances_and_moves_only_the_surplus():
    subs = {m: {T1} for m in "abc"}
    first = uniform(subs, {T1: 12}, {})
    assert sorted(len(v) for v in first.values()) == [4, 4, 4]
    assert set().union(*first.values()) == parts(T1, *range(12))
    subs["d"] = {T1}
    second = uniform(subs, {T1: 12}, first)
    assert sorted(len(v) for v in second.values()) == [3, 3, 3, 3]
    for m in "abc":  # each keeps three of its four: only three partitions move, to d
        assert second[m] <= first[m]
    del subs["a"]
    third = uniform(subs, {T1: 12}, second)
    assert sorted(len(v) for v in third.values()) == [4, 4, 4]
    for m in "bcd":
        assert second[m] <= third[m]  # nobody loses a partition when a member leaves


def test_uniform_heterogeneous_subscriptions():
    subs = {"a": {T1}, "b": {T1, T2}, "c": {T2}}
    result = uniform(subs, {T1: 4, T2: 2}, {})
    assert set().union(*result.values()) == parts(T1, 0, 1, 2, 3) | parts(T2, 0, 1)
    assert all(tp[0] in subs[m] for m, tps in result.items() for tp in tps)
    assert sorted(len(v) for v in result.values()) == [2, 2, 2]


def test_range_gives_consecutive_ranges():
    result = range_({"a": {T1}, "b": {T1}}, {T1: 5}, {})
    assert result == {"a": parts(T1, 0, 1, 2), "b": parts(T1, 3, 4)}


def rec(state, epoch, assigned=(), pending=()):
    return Reconciled(state, epoch, frozenset(assigned), frozenset(pending))


STABLE, UNREVOKED, UNRELEASED = (MemberState.STABLE, MemberState.UNREVOKED_PARTITIONS,
                                 MemberState.UNRELEASED_PARTITIONS)


def nobody(tp):
    return False


def test_reconcile_revokes_before_the_new_epoch():
    current = rec(STABLE, 1, parts(T1, 0, 1, 2, 3))
    # target epoch 2 takes partition 3 away: the member stays at epoch 1 until it revoked it
    step = reconcile(current, 2, parts(T1, 0, 1, 2), {T1}, parts(T1, 0, 1, 2, 3), nobody)
    assert step == rec(UNREVOKED, 1, parts(T1, 0, 1, 2), parts(T1, 3))
    # still owning 3: no progress
    assert reconcile(step, 2, parts(T1, 0, 1, 2), {T1}, parts(T1, 0, 1, 2, 3), nobody) == step
    # owned partitions not sent: cannot know it revoked, no progress
    assert reconcile(step, 2, parts(T1, 0, 1, 2), {T1}, None, nobody) == step
    # revoked: epoch 2
    assert (reconcile(step, 2, parts(T1, 0, 1, 2), {T1}, parts(T1, 0, 1, 2), nobody)
            == rec(STABLE, 2, parts(T1, 0, 1, 2)))


def test_reconcile_waits_for_unreleased_partitions():
    current = rec(STABLE, 1, parts(T1, 0))
    held = parts(T1, 1)
    step = reconcile(current, 2, parts(T1, 0, 1, 2), {T1}, parts(T1, 0), lambda tp: tp in held)
    assert step == rec(UNRELEASED, 2, parts(T1, 0, 2))  # 1 is still held by another
    # released: given at the next heartbeat
    assert (reconcile(step, 2, parts(T1, 0, 1, 2), {T1}, parts(T1, 0, 2), nobody)
            == rec(STABLE, 2, parts(T1, 0, 1, 2)))


def test_reconcile_drops_unsubscribed_topics_at_the_same_epoch():
    current = rec(STABLE, 3, parts(T1, 0) | parts(T2, 0))
    step = reconcile(current, 3, parts(T1, 0) | parts(T2, 0), {T1}, parts(T1, 0) | parts(T2, 0),
                     nobody)
    assert step == rec(UNREVOKED, 3, parts(T1, 0), parts(T2, 0))


# ---------------------------------------------------------------------------------------------
# With a node: the protocol level


def heartbeat(conn, group_id, member_id, member_epoch, *, topics=None, owned=None,
              rebalance_timeout_ms=-1, server_assignor=None):
    """A raw ConsumerGroupHeartbeat v1; `owned` is [(topic id, [partitions])]."""
    schema = load_request_schema(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1)
    tp_schema = nested(schema, "TopicPartitions")
    return conn.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, build(
        schema, group_id=group_id, member_id=member_id, member_epoch=member_epoch,
        instance_id=None, rack_id=None,
        rebalance_timeout=datetime.timedelta(milliseconds=rebalance_timeout_ms),
        subscribed_topic_names=None if topics is None else tuple(topics),
        subscribed_topic_regex=None, server_assignor=server_assignor,
        topic_partitions=None if owned is None else tuple(
            build(tp_schema, topic_id=t, partitions=tuple(ps)) for t, ps in owned)))


def assigned(response) -> list[tuple[uuid.UUID, list[int]]]:
    return [(tp.topic_id, list(tp.partitions)) for tp in response.assignment.topic_partitions]


def describe(conn, group_id):
    return conn.request(ApiKey.CONSUMER_GROUP_DESCRIBE, lambda schema: build(
        schema, group_ids=(group_id,), include_authorized_operations=False)).groups[0]


def commit(conn, group_id, member_id, epoch, topic, partition, offset):
    schema = load_request_schema(ApiKey.OFFSET_COMMIT, 9)
    t_schema = nested(schema, "OffsetCommitRequestTopic")
    p_schema = nested(schema, "OffsetCommitRequestPartition")
    response = conn.call(ApiKey.OFFSET_COMMIT, 9, build(
        schema, group_id=group_id, generation_id_or_member_epoch=epoch, member_id=member_id,
        group_instance_id=None, topics=(build(t_schema, name=topic, partitions=(build(
            p_schema, partition_index=partition, committed_offset=offset,
            committed_leader_epoch=-1, committed_metadata=None),)),)))
    return response.topics[0].partitions[0].error_code


def create_topic(address, name, partitions):
    from mink.client import BlockingKafkaClient as Client
    with Client(address, TIMEOUT) as conn:
        schema = load_request_schema(ApiKey.CREATE_TOPICS, conn.version(ApiKey.CREATE_TOPICS))
        topic = nested(schema, "CreatableTopic")
        conn.request(ApiKey.CREATE_TOPICS, lambda schema: build(
            schema, topics=(build(topic, name=name, num_partitions=partitions,
                                  replication_factor=1, assignments=(), configs=()),),
            timeout=datetime.timedelta(seconds=30), validate_only=False))
        meta = conn.request(ApiKey.METADATA, lambda schema: build(
            schema, topics=(build(nested(schema, "MetadataRequestTopic"), name=name,
                                  topic_id=None),), allow_auto_topic_creation=False,
            include_topic_authorized_operations=False))
        return meta.topics[0].topic_id


async def test_heartbeat_protocol_epochs_and_offset_commit_checks(node):
    """At the protocol level: join, the group and member epochs, a second member making the
    first revoke before the partitions move, FENCED_MEMBER_EPOCH, STALE_MEMBER_EPOCH and
    UNKNOWN_MEMBER_ID in OffsetCommit, ConsumerGroupDescribe, leaving with epoch -1."""
    def run():
        topic_id = create_topic(node, "kip848-raw", 4)
        with BlockingKafkaClient(node, TIMEOUT) as conn:
            a = heartbeat(conn, "g-raw", "member-a", 0, topics=["kip848-raw"], owned=[],
                          rebalance_timeout_ms=60_000)
            assert a.error_code == ErrorCode.none, a
            assert a.member_epoch == 1
            assert a.heartbeat_interval == datetime.timedelta(milliseconds=HEARTBEAT_MS)
            assert assigned(a) == [(topic_id, [0, 1, 2, 3])]
            b = heartbeat(conn, "g-raw", "member-b", 0, topics=["kip848-raw"], owned=[],
                          rebalance_timeout_ms=60_000)
            assert b.member_epoch == 2
            assert assigned(b) == []  # a still holds everything: nothing is free yet
            # a learns of epoch 2: it must revoke two partitions, staying at epoch 1
            a = heartbeat(conn, "g-raw", "member-a", 1, owned=[(topic_id, [0, 1, 2, 3])])
            assert a.member_epoch == 1
            keep = assigned(a)[0][1]
            assert len(keep) == 2
            moving = sorted(set(range(4)) - set(keep))
            # b still gets nothing while a owns them
            b = heartbeat(conn, "g-raw", "member-b", 2, owned=[])
            assert b.assignment is None or assigned(b) == []
            desc = describe(conn, "g-raw")
            assert (desc.group_state, desc.group_epoch, desc.assignment_epoch) == (
                "Reconciling", 2, 2)
            # a commits at its epoch (1); a wrong epoch is stale, an unknown member refused
            assert commit(conn, "g-raw", "member-a", 1, "kip848-raw", keep[0], 5) == (
                ErrorCode.none)
            assert commit(conn, "g-raw", "member-a", 2, "kip848-raw", keep[0], 6) == (
                ErrorCode.stale_member_epoch)
            assert commit(conn, "g-raw", "nobody", 1, "kip848-raw", keep[0], 6) == (
                ErrorCode.unknown_member_id)
            # a revokes: it moves to epoch 2, then b gets the two freed partitions
            a = heartbeat(conn, "g-raw", "member-a", 1, owned=[(topic_id, keep)])
            assert a.member_epoch == 2
            b = heartbeat(conn, "g-raw", "member-b", 2, owned=[])
            assert assigned(b) == [(topic_id, moving)]
            # an epoch ahead of the coordinator's is fenced
            fenced = heartbeat(conn, "g-raw", "member-b", 7, owned=[(topic_id, moving)])
            assert fenced.error_code == ErrorCode.fenced_member_epoch
            desc = describe(conn, "g-raw")
            assert desc.error_code == ErrorCode.none
            assert desc.group_state == "Stable"
            assert desc.assignor_name == "uniform"
            members = {m.member_id: m for m in desc.members}
            assert {m: members[m].member_epoch for m in members} == {"member-a": 2,
                                                                   "member-b": 2}
            assert [list(tp.partitions) for tp in
                    members["member-b"].assignment.topic_partitions] == [moving]
            assert members["member-b"].assignment.topic_partitions[0].topic_name == (
                "kip848-raw")
            # leaving: epoch -1 answered with -1; the group epoch moves on
            left = heartbeat(conn, "g-raw", "member-b", -1)
            assert (left.error_code, left.member_epoch) == (ErrorCode.none, -1)
            assert describe(conn, "g-raw").group_epoch == 3
            again = heartbeat(conn, "g-raw", "member-b", 2, owned=[])
            assert again.error_code == ErrorCode.unknown_member_id
            listed = conn.request(ApiKey.LIST_GROUPS, lambda schema: build(
                schema, states_filter=(), types_filter=("consumer",)))
            assert [(g.group_id, g.group_type, g.protocol_type) for g in listed.groups] == [
                ("g-raw", "consumer", "consumer")]
    await trio.to_thread.run_sync(run)


async def test_classic_group_id_refuses_consumer_heartbeats(node):
    """Online migration disabled, as Kafka's default in a group used by classic members:
    a consumer-protocol heartbeat gets GROUP_ID_NOT_FOUND, a classic JoinGroup to a consumer
    group with members INCONSISTENT_GROUP_PROTOCOL; ConsumerGroupDescribe of a classic group
    is GROUP_ID_NOT_FOUND."""
    from confluent_kafka import Consumer

    def run():
        create_topic(node, "kip848-mixed", 2)
        classic = Consumer({"bootstrap.servers": node, "group.id": "g-classic",
                            "session.timeout.ms": 6000, "auto.offset.reset": "earliest"})
        classic.subscribe(["kip848-mixed"])
        deadline = time.monotonic() + TIMEOUT
        while not classic.assignment():
            classic.poll(0.1)
            assert time.monotonic() < deadline, "the classic consumer got no assignment"
        with BlockingKafkaClient(node, TIMEOUT) as conn:
            refused = heartbeat(conn, "g-classic", "m", 0, topics=["kip848-mixed"], owned=[],
                                rebalance_timeout_ms=60_000)
            assert refused.error_code == ErrorCode.group_id_not_found
            assert describe(conn, "g-classic").error_code == ErrorCode.group_id_not_found
            joined = heartbeat(conn, "g-new", "m", 0, topics=["kip848-mixed"], owned=[],
                               rebalance_timeout_ms=60_000)
            assert joined.error_code == ErrorCode.none
            schema = load_request_schema(ApiKey.JOIN_GROUP, 7)
            protocol = nested(schema, "JoinGroupRequestProtocol")
            join = conn.call(ApiKey.JOIN_GROUP, 7, build(
                schema, group_id="g-new", session_timeout=datetime.timedelta(seconds=10),
                rebalance_timeout=datetime.timedelta(seconds=10), member_id="",
                group_instance_id=None, protocol_type="consumer",
                protocols=(build(protocol, name="range", metadata=b""),), reason=None))
            assert join.error_code == ErrorCode.inconsistent_group_protocol
        classic.close()
    await trio.to_thread.run_sync(run)


async def test_one_consumer_consumes(node):
    topic = "kip848-one"
    await trio.to_thread.run_sync(lambda: confluent_produce(
        node, topic, [{"value": str(i).encode(), "partition": i % 12} for i in range(120)]))
    c = ConsumerProcess(node, "g-one", topic, "a")
    try:
        await wait_for(lambda: len(c.of("message")) >= 120, what="120 messages")
        assert c.owned() == set(range(12))
    finally:
        c.stop()
