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
SESSION_MS = 6000  # generous: consumers in subprocesses on a loaded 2-core machine
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
    def __init__(self, bootstrap: str, group: str, topic: str, name: str,
                 debug_log: Path | None = None) -> None:
        self.name = name
        self.events: list[dict] = []
        self.debug_log = debug_log  # librdkafka's cgrp debug log, shown when a test fails
        env = dict(os.environ, KIP848_DEBUG_LOG=str(debug_log)) if debug_log else None
        self.proc = subprocess.Popen(
            [sys.executable, str(CONSUMER), bootstrap, group, topic],
            stdout=subprocess.PIPE, text=True, env=env)
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

    def owned_topics(self) -> set[tuple[str, int]]:
        owned: set[tuple[str, int]] = set()
        for e in list(self.events):
            if e["event"] == "assigned":
                owned |= {tuple(tp) for tp in e["topic_partitions"]}
            elif e["event"] in ("revoked", "lost"):
                owned -= {tuple(tp) for tp in e["topic_partitions"]}
        return owned

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # close() hanging (its broker gone): never leave it behind
            self.proc.wait(10)
        self._reader.join(5)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(5)

    def debug_tail(self, lines: int = 150) -> str:
        """The last lines of its debug log about assignments and committed offsets."""
        if self.debug_log is None or not self.debug_log.exists():
            return ""
        kinds = ("OFFSETFETCH", "SRVPEND", "REMOVE", "ASSIGNMENT", "GRPASSIGNMENT",
                 "COOPASSIGN")
        wanted = []
        for line in self.debug_log.read_text(errors="replace").splitlines():
            fields = line.split(" ", 2)  # time, facility, message
            if len(fields) > 1 and fields[1] in kinds or "offset reset" in line:
                wanted.append(line)
        return "\n".join(wanted[-lines:])


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
              rebalance_timeout_ms=-1, server_assignor=None, instance_id=None, regex=None):
    """A raw ConsumerGroupHeartbeat v1; `owned` is [(topic id, [partitions])]. Repeated
    while the coordinator is still loading (a retriable error, as clients treat it: a node
    just started may not have opened the group's offsets partition yet), bounded."""
    schema = load_request_schema(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1)
    tp_schema = nested(schema, "TopicPartitions")
    body = build(
        schema, group_id=group_id, member_id=member_id, member_epoch=member_epoch,
        instance_id=instance_id, rack_id=None,
        rebalance_timeout=datetime.timedelta(milliseconds=rebalance_timeout_ms),
        subscribed_topic_names=None if topics is None else tuple(topics),
        subscribed_topic_regex=regex, server_assignor=server_assignor,
        topic_partitions=None if owned is None else tuple(
            build(tp_schema, topic_id=t, partitions=tuple(ps)) for t, ps in owned))
    deadline = time.monotonic() + TIMEOUT
    while True:
        response = conn.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, body)
        if (response.error_code != ErrorCode.coordinator_load_in_progress
                or time.monotonic() > deadline):
            return response
        time.sleep(0.05)


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


def txn_commit(conn, group_id, member_id, epoch, topic, partition, offset):
    """A raw TxnOffsetCommit v3 from a producer id no transaction knows: the group checks
    come first, so their errors show; past them the transaction's own."""
    schema = load_request_schema(ApiKey.TXN_OFFSET_COMMIT, 3)
    t_schema = nested(schema, "TxnOffsetCommitRequestTopic")
    p_schema = nested(schema, "TxnOffsetCommitRequestPartition")
    response = conn.call(ApiKey.TXN_OFFSET_COMMIT, 3, build(
        schema, transactional_id="txn-raw", group_id=group_id, producer_id=4242,
        producer_epoch=0, generation_id=epoch, member_id=member_id, group_instance_id=None,
        topics=(build(t_schema, name=topic, partitions=(build(
            p_schema, partition_index=partition, committed_offset=offset,
            committed_leader_epoch=-1, committed_metadata=None),)),)))
    return response.topics[0].partitions[0].error_code


def offset_delete(conn, group_id, topic, partitions) -> tuple[int, list[int]]:
    """A raw OffsetDelete v0: (group error, each partition's error)."""
    schema = load_request_schema(ApiKey.OFFSET_DELETE, 0)
    response = conn.call(ApiKey.OFFSET_DELETE, 0, build(
        schema, group_id=group_id, topics=(nested(schema, "OffsetDeleteRequestTopic")(
            name=topic, partitions=tuple(nested(schema, "OffsetDeleteRequestPartition")(
                partition_index=p) for p in partitions)),)))
    return (response.error_code,
            [p.error_code for t in response.topics for p in t.partitions])


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
            # TxnOffsetCommit (KIP-447) checks the member epoch too, as Kafka does for a
            # consumer group; past the group's checks, the unknown producer is refused
            assert txn_commit(conn, "g-raw", "member-a", 2, "kip848-raw", keep[0], 6) == (
                ErrorCode.stale_member_epoch)
            assert txn_commit(conn, "g-raw", "nobody", 1, "kip848-raw", keep[0], 6) == (
                ErrorCode.unknown_member_id)
            assert txn_commit(conn, "g-raw", "member-a", 1, "kip848-raw", keep[0], 6) == (
                ErrorCode.invalid_producer_id_mapping)
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


async def test_static_member_leaves_for_now_and_comes_back(node):
    """Static membership: a member with an instance id leaving with epoch -2 keeps its
    partitions (the group epoch does not move, nobody else gets them); the instance back
    under a new member id gets them at once; a second member with a live instance id is
    UNRELEASED_INSTANCE_ID; a static member that does not come back is expelled after the
    session timeout."""
    def run():
        topic_id = create_topic(node, "kip848-static", 4)
        with BlockingKafkaClient(node, TIMEOUT) as conn:
            a = heartbeat(conn, "g-static", "a1", 0, topics=["kip848-static"], owned=[],
                          rebalance_timeout_ms=60_000, instance_id="i-a")
            b = heartbeat(conn, "g-static", "b1", 0, topics=["kip848-static"], owned=[],
                          rebalance_timeout_ms=60_000)
            a = heartbeat(conn, "g-static", "a1", 1, owned=[(topic_id, [0, 1, 2, 3])])
            keep = assigned(a)[0][1]
            a = heartbeat(conn, "g-static", "a1", 1, owned=[(topic_id, keep)])
            b = heartbeat(conn, "g-static", "b1", 2, owned=[])
            assert a.member_epoch == b.member_epoch == 2
            left = heartbeat(conn, "g-static", "a1", -2, instance_id="i-a")
            assert (left.error_code, left.member_epoch) == (ErrorCode.none, -2)
            assert describe(conn, "g-static").group_epoch == 2
            b = heartbeat(conn, "g-static", "b1", 2, owned=assigned(b))
            assert b.assignment is None  # a's partitions stay a's
            back = heartbeat(conn, "g-static", "a2", 0, topics=["kip848-static"], owned=[],
                             rebalance_timeout_ms=60_000, instance_id="i-a")
            assert back.error_code == ErrorCode.none, back
            assert (back.member_epoch, assigned(back)) == (2, [(topic_id, keep)])
            twin = heartbeat(conn, "g-static", "a3", 0, topics=["kip848-static"], owned=[],
                             rebalance_timeout_ms=60_000, instance_id="i-a")
            assert twin.error_code == ErrorCode.unreleased_instance_id
            d = describe(conn, "g-static")
            assert d.group_epoch == 2
            assert sorted((m.member_id, m.instance_id) for m in d.members) == [
                ("a2", "i-a"), ("b1", None)]
            assert heartbeat(conn, "g-static", "a2", -2, instance_id="i-a").member_epoch == -2
            deadline = time.monotonic() + SESSION_MS / 1000 + 5
            while True:  # b keeps heartbeating; a2 does not come back
                b = heartbeat(conn, "g-static", "b1", b.member_epoch,
                              owned=[(topic_id, sorted(set(range(4)) - set(keep)))]
                              if b.member_epoch == 2 else None)
                if [m.member_id for m in describe(conn, "g-static").members] == ["b1"]:
                    break
                assert time.monotonic() < deadline, "the static member was not expelled"
                time.sleep(HEARTBEAT_MS / 1000)
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
        await trio.to_thread.run_sync(c.stop)


class Producing:
    """A producer thread: values 0, 1, 2, ... round-robin over the partitions, until
    stopped; `delivered` holds (partition, offset, value) of every acknowledged message."""

    def __init__(self, address: str, topic: str, partitions: int, rate: float = 300) -> None:
        self.address, self.topic, self.partitions, self.rate = address, topic, partitions, rate
        self.delivered: list[tuple[int, int, str]] = []
        self.errors: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.address, "linger.ms": 5,
                             "enable.idempotence": True})

        def on_delivery(err, msg):
            if err:
                self.errors.append(err)
            else:
                self.delivered.append((msg.partition(), msg.offset(), msg.value().decode()))

        i = 0
        while not self._stop.is_set():
            producer.produce(self.topic, value=str(i).encode(), partition=i % self.partitions,
                             on_delivery=on_delivery)
            producer.poll(0)
            i += 1
            time.sleep(1 / self.rate)
        assert producer.flush(60) == 0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)


def commit_offsets(address: str, group: str, topic: str, partitions: int, offset: int) -> None:
    """Blocking: an administrator commits `offset` for every partition of an empty group."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": address})
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p, offset) for p in range(partitions)])
    for future in admin.alter_consumer_group_offsets([request]).values():
        future.result(TIMEOUT)


def stop_all(producing, consumers) -> None:
    """Blocking: never on the trio thread, which runs the node."""
    producing.stop()
    for c in consumers:
        c.stop()


def owners_settled(consumers, per_member: int, partitions: int) -> bool:
    owned = [c.owned() for c in consumers]
    union = set().union(*owned)
    return (len(union) == partitions and sum(len(o) for o in owned) == partitions
            and all(len(o) == per_member for o in owned))


def consumed_counts(consumers) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    for c in consumers:
        for e in c.of("message"):
            key = (e["partition"], e["offset"])
            counts[key] = counts.get(key, 0) + 1
    return counts


def no_partition_owned_twice(caplog) -> None:
    """The coordinator logs an error if it ever records a partition for a second member."""
    assert not [r for r in caplog.records if "given partitions held by others" in r.message]


async def test_join_and_leave_move_only_what_must_move(node, caplog, tmp_path):
    """Three consumers over 12 partitions under a producer; a fourth joins, then one leaves.
    Only the partitions that move are revoked (one from each of the three when the fourth
    joins, none when one leaves); every message is consumed exactly once with synchronous
    commits."""
    topic, group = "kip848-load", "g-load"
    await trio.to_thread.run_sync(create_topic, node, topic, 12)
    # Offset 0 committed for every partition before anyone joins, so no member starts a
    # partition by an offset reset (ListOffsets). librdkafka 2.x restarts its offset-query
    # timer on a reset's outdated reply and, once the partition is fetching, lets that
    # timer fire: a second reset to the beginning, every message read again (a CI failure,
    # its debug log showing "timed offset query ... in state active"), whatever the broker.
    await trio.to_thread.run_sync(commit_offsets, node, group, topic, 12, 0)
    producing = Producing(node, topic, 12)
    consumers = [ConsumerProcess(node, group, topic, name, tmp_path / f"{name}.log")
                 for name in "abc"]
    try:
        await wait_for(lambda: owners_settled(consumers, 4, 12), what="3 x 4 partitions")
        before = {c.name: len(c.of("revoked")) for c in consumers}
        d = ConsumerProcess(node, group, topic, "d", tmp_path / "d.log")
        joined_at = time.monotonic()
        consumers.append(d)
        await wait_for(lambda: owners_settled(consumers, 3, 12), what="4 x 3 partitions")
        stable_after = time.monotonic() - joined_at
        revoked = {c.name: [p for e in c.of("revoked")[before[c.name]:]
                            for p in e["partitions"]]
                   for c in consumers[:3]}
        # each of the three gave up exactly one partition, and only that one
        assert sorted(len(v) for v in revoked.values()) == [1, 1, 1], revoked
        assert {c.name: len(c.of("revoked")) - before[c.name] for c in consumers[:3]} == {
            "a": 1, "b": 1, "c": 1}
        assert sorted(p for v in revoked.values() for p in v) == sorted(d.owned())
        # revoked before assigned elsewhere: d is given a partition only after its previous
        # owner's revocation callback ran (it acknowledges it in its next heartbeat)
        for c in consumers[:3]:
            for e in c.of("revoked")[before[c.name]:]:
                for p in e["partitions"]:
                    given = min(a["at"] for a in d.of("assigned") if p in a["partitions"])
                    assert e["at"] < given, (c.name, p, e["at"], given)
        # the partitions that stayed kept being consumed while d joined
        stayed = set(range(12)) - d.owned()
        await wait_for(lambda: stayed <= {e["partition"] for c in consumers[:3]
                                          for e in c.of("message") if e["at"] > joined_at},
                       what="messages of every partition that stayed")
        b = consumers[1]
        b_partitions = b.owned()
        await trio.to_thread.run_sync(b.stop)  # closes: leaves with member epoch -1
        rest = [consumers[0], consumers[2], d]
        revoked_before = {c.name: len(c.of("revoked")) for c in rest}
        await wait_for(lambda: owners_settled(rest, 4, 12), what="3 x 4 partitions again")
        assert {c.name: len(c.of("revoked")) for c in rest} == revoked_before
        assert set().union(*(c.owned() for c in rest)) >= b_partitions
        await trio.to_thread.run_sync(producing.stop)
        assert not producing.errors
        expected = {(p, o) for p, o, _ in producing.delivered}
        await wait_for(lambda: set(consumed_counts(consumers)) >= expected,
                       what="every delivered message consumed")
        await trio.sleep(1)
        counts = consumed_counts(consumers)
        assert not [c.of("commit_failed") for c in consumers if c.of("commit_failed")]
        twice = {k: n for k, n in counts.items() if n > 1}
        assert not twice, "read twice: " + "; ".join(  # who read each, when, and its value
            f"{key}: " + ", ".join(f"{c.name} at {e['at'] - joined_at:+.2f} s {e['value']!r}"
                                  for c in consumers for e in c.of("message")
                                  if (e["partition"], e["offset"]) == key)
            for key in sorted(twice)[:5])
        no_partition_owned_twice(caplog)
        print(f"4th member joining -> 4 x 3 partitions owned in {stable_after:.2f} s; "
              f"{len(expected)} messages, commit retries "
              f"{sum(len(c.of('commit_retry')) for c in consumers)}")
    except AssertionError:
        # seen once in CI: a member read offsets again from 0 after a rebalance; its own
        # account of its assignment and committed offsets is the first thing to look at
        for c in consumers:
            print(f"--- consumer {c.name}: librdkafka cgrp debug (assignment, offsets)")
            print(c.debug_tail())
        raise
    finally:
        await trio.to_thread.run_sync(stop_all, producing, consumers)


async def test_killed_member_is_expelled_after_the_session_timeout(node, caplog):
    """A consumer SIGKILLed (no leave) keeps its partitions until the broker's session
    timeout expels it; then they move to the others, which read on from the committed
    offsets (at most the killed one's last message per partition is read again)."""
    topic, group = "kip848-kill", "g-kill"
    await trio.to_thread.run_sync(create_topic, node, topic, 12)
    producing = Producing(node, topic, 12, rate=100)
    consumers = [ConsumerProcess(node, group, topic, name) for name in "abc"]
    try:
        await wait_for(lambda: owners_settled(consumers, 4, 12), what="3 x 4 partitions")
        victim = consumers[2]
        victim_partitions = victim.owned()
        await trio.to_thread.run_sync(victim.kill)
        killed_at = time.monotonic()
        rest = consumers[:2]
        await wait_for(lambda: owners_settled(rest, 6, 12), what="2 x 6 partitions")
        moved_after = time.monotonic() - killed_at
        # not before the session timeout (less a heartbeat's slack), not much after it
        assert SESSION_MS / 1000 - 0.5 <= moved_after <= SESSION_MS / 1000 + 5, moved_after
        assert victim_partitions <= set().union(*(c.owned() for c in rest))
        await trio.to_thread.run_sync(producing.stop)
        expected = {(p, o) for p, o, _ in producing.delivered}
        await wait_for(lambda: set(consumed_counts(consumers)) >= expected,
                       what="every delivered message consumed")
        counts = consumed_counts(consumers)
        twice = {k for k, n in counts.items() if n > 1}
        assert {p for p, _ in twice} <= victim_partitions
        assert len(twice) <= len(victim_partitions)
        no_partition_owned_twice(caplog)
        print(f"killed member's partitions moved after {moved_after:.2f} s "
              f"(session timeout {SESSION_MS} ms)")
    finally:
        await trio.to_thread.run_sync(stop_all, producing, consumers)


async def test_admin_client_describes_a_consumer_group(node):
    """confluent-kafka's AdminClient describes a KIP-848 group through ConsumerGroupDescribe
    (type CONSUMER, the uniform assignor, members with their assignments) and lists it."""
    from confluent_kafka import ConsumerGroupState, ConsumerGroupType
    from confluent_kafka.admin import AdminClient

    await trio.to_thread.run_sync(create_topic, node, "kip848-admin", 6)
    consumers = [ConsumerProcess(node, "g-admin", "kip848-admin", name) for name in "ab"]
    try:
        await wait_for(lambda: owners_settled(consumers, 3, 6), what="2 x 3 partitions")

        def described():
            admin = AdminClient({"bootstrap.servers": node})
            group = admin.describe_consumer_groups(["g-admin"])["g-admin"].result(TIMEOUT)
            listed = admin.list_consumer_groups().result(TIMEOUT).valid
            return group, listed

        deadline = trio.current_time() + TIMEOUT
        while True:  # Stable once both members' epochs reached the target epoch
            group, listed = await trio.to_thread.run_sync(described)
            if group.state == ConsumerGroupState.STABLE or trio.current_time() > deadline:
                break
            await trio.sleep(0.2)
        assert group.state == ConsumerGroupState.STABLE
        assert group.type == ConsumerGroupType.CONSUMER
        assert group.partition_assignor == "uniform"
        assignments = sorted(sorted(tp.partition for tp in m.assignment.topic_partitions)
                             for m in group.members)
        owned = sorted(sorted(c.owned()) for c in consumers)
        assert assignments == owned
        assert [(g.group_id, g.type) for g in listed] == [("g-admin", ConsumerGroupType.CONSUMER)]
    finally:
        await trio.to_thread.run_sync(lambda: [c.stop() for c in consumers])


async def test_coordinator_restart_keeps_epochs_members_and_assignments(pg_url, store_url,
                                                                        node_processes):
    """The group coordinator's node SIGKILLed and started again: the new coordinator loads
    the group from PostgreSQL with its group epoch, members, member epochs and assignments;
    the members heartbeat on at their epochs, nothing is revoked, and they consume on."""
    from mink.storage.embedded_postgres import free_port
    from tests.support.nodes import node_config

    config = node_config(pg_url, store_url, listener=f"127.0.0.1:{free_port()}",
                         num_partitions=6, offsets_topic_num_partitions=3,
                         group_consumer_heartbeat_interval_ms=HEARTBEAT_MS,
                         # outlasts the restart, which waits out the old incarnation's guard
                         group_consumer_session_timeout_ms=30_000)
    first = node_processes(config)
    await trio.to_thread.run_sync(first.start)
    address = first.address
    await trio.to_thread.run_sync(create_topic, address, "kip848-durable", 6)
    consumers = [ConsumerProcess(address, "g-durable", "kip848-durable", n) for n in "ab"]

    def snapshot():
        with BlockingKafkaClient(address, TIMEOUT) as conn:
            d = describe(conn, "g-durable")
        return (d.error_code, d.group_state, d.group_epoch, d.assignment_epoch, sorted(
            (m.member_id, m.member_epoch,
             sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions))
            for m in d.members))

    try:
        await wait_for(lambda: owners_settled(consumers, 3, 6), what="2 x 3 partitions")
        deadline = trio.current_time() + TIMEOUT
        while (before := await trio.to_thread.run_sync(snapshot))[1] != "Stable":
            assert trio.current_time() < deadline, before
            await trio.sleep(0.2)
        events = {c.name: len(c.events) for c in consumers}
        await trio.to_thread.run_sync(first.kill)
        second = node_processes(config)
        await trio.to_thread.run_sync(second.start)
        deadline = trio.current_time() + TIMEOUT
        while (after := await trio.to_thread.run_sync(snapshot))[0] != ErrorCode.none:
            assert trio.current_time() < deadline, after
            await trio.sleep(0.2)
        assert after == before
        # the members go on at their epochs: new messages are consumed, nothing revoked
        await trio.to_thread.run_sync(lambda: confluent_produce(address, "kip848-durable", [
            {"value": b"after", "partition": p} for p in range(6)]))
        await wait_for(lambda: sum(e["event"] == "message" and e["value"] == "after"
                                   for c in consumers for e in c.events) == 6,
                       what="the messages produced after the restart")
        for c in consumers:
            assert not [e for e in c.events[events[c.name]:]
                        if e["event"] in ("revoked", "lost")], c.events[events[c.name]:]
        assert await trio.to_thread.run_sync(snapshot) == before
    finally:
        await trio.to_thread.run_sync(lambda: [c.stop() for c in consumers])


async def test_regex_subscription_picks_up_a_topic_created_later(node):
    """A subscription by regular expression (RE2, resolved by the broker) follows the topics
    that match: a topic created after the members joined is assigned to them, one that does
    not match is not; an invalid expression is INVALID_REGULAR_EXPRESSION."""
    await trio.to_thread.run_sync(create_topic, node, "rx-first", 2)
    await trio.to_thread.run_sync(create_topic, node, "other-topic", 2)
    consumers = [ConsumerProcess(node, "g-regex", "^rx-.*", n) for n in "ab"]
    try:
        await wait_for(lambda: set().union(*(c.owned_topics() for c in consumers)) == {
            ("rx-first", 0), ("rx-first", 1)}, what="rx-first assigned")
        await trio.to_thread.run_sync(create_topic, node, "rx-second", 2)
        await trio.to_thread.run_sync(lambda: confluent_produce(node, "rx-second", [
            {"value": b"late", "partition": p} for p in range(2)]))
        want = {("rx-first", 0), ("rx-first", 1), ("rx-second", 0), ("rx-second", 1)}
        await wait_for(lambda: set().union(*(c.owned_topics() for c in consumers)) == want,
                       what="rx-second assigned too")
        await wait_for(lambda: sum(e.get("topic") == "rx-second" for c in consumers
                                   for e in c.of("message")) == 2, what="rx-second consumed")
        assert sum(len(c.owned_topics()) for c in consumers) == 4

        def check():
            with BlockingKafkaClient(node, TIMEOUT) as conn:
                d = describe(conn, "g-regex")
                # librdkafka sends its regular expressions joined, each in parentheses
                assert {m.subscribed_topic_regex for m in d.members} == {"(^rx-.*)"}
                schema = load_request_schema(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1)
                bad = conn.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, build(
                    schema, group_id="g-bad-regex", member_id="m", member_epoch=0,
                    instance_id=None, rack_id=None,
                    rebalance_timeout=datetime.timedelta(seconds=60), subscribed_topic_names=(),
                    subscribed_topic_regex="rx-(", server_assignor=None, topic_partitions=()))
                assert bad.error_code == ErrorCode.invalid_regular_expression
        await trio.to_thread.run_sync(check)
    finally:
        await trio.to_thread.run_sync(lambda: [c.stop() for c in consumers])


async def test_a_regex_new_to_the_group_is_assigned_after_the_heartbeat_that_brought_it(node):
    """As in Kafka (its regular expressions are resolved asynchronously): the heartbeat that
    brings a regex new to the group is answered with the member's literal topics only; the
    group resolves it after, bumps its epoch, and the next heartbeat assigns its topics. A
    regex the group has resolved is assigned at once; one nobody subscribes to any more is
    forgotten, and is new again when it comes back (librdkafka's own
    0045_resubscribe_with_regex expects this order)."""
    def run():
        literal = create_topic(node, "rl-literal", 1)
        matched = {create_topic(node, name, 1) for name in ("rl-re-1", "rl-re-2")}
        with BlockingKafkaClient(node, TIMEOUT) as conn:
            def until_regex_topics(member_id, epoch, owned):
                deadline = time.monotonic() + TIMEOUT
                while True:
                    r = heartbeat(conn, "g-rl", member_id, epoch, owned=owned)
                    assert r.error_code == ErrorCode.none, r
                    if r.assignment is not None and {t for t, _ in assigned(r)} >= matched:
                        return r
                    epoch = r.member_epoch
                    assert time.monotonic() < deadline, "the regex's topics never came"
                    time.sleep(0.05)

            a = heartbeat(conn, "g-rl", "member-a", 0, topics=["rl-literal"],
                          regex="^rl-re-.*", owned=[], rebalance_timeout_ms=60_000)
            assert a.error_code == ErrorCode.none, a
            assert assigned(a) == [(literal, [0])]
            a = until_regex_topics("member-a", a.member_epoch, [(literal, [0])])
            assert a.member_epoch > 1
            # a second member with the same, resolved regex: a rebalance at once
            b = heartbeat(conn, "g-rl", "member-b", 0, topics=[], regex="^rl-re-.*", owned=[],
                          rebalance_timeout_ms=60_000)
            assert b.error_code == ErrorCode.none, b
            d = describe(conn, "g-rl")
            assert d.group_epoch == b.member_epoch
            target_b = {tp.topic_id for m in d.members if m.member_id == "member-b"
                        for tp in m.target_assignment.topic_partitions}
            assert target_b and target_b <= matched
            # both leave: the regex is forgotten, and new again for the next member
            for member_id, epoch in (("member-a", -1), ("member-b", -1)):
                assert heartbeat(conn, "g-rl", member_id, epoch).error_code == ErrorCode.none
            c = heartbeat(conn, "g-rl", "member-c", 0, topics=["rl-literal"],
                          regex="^rl-re-.*", owned=[], rebalance_timeout_ms=60_000)
            assert assigned(c) == [(literal, [0])]
            until_regex_topics("member-c", c.member_epoch, [(literal, [0])])

    await trio.to_thread.run_sync(run)


async def test_offset_delete_of_a_consumer_group_keeps_what_it_subscribes_to(node):
    """OffsetDelete on a live KIP-848 group: offsets of a topic a member subscribes to stay
    (GROUP_SUBSCRIBED_TO_TOPIC), others go, as in Kafka (librdkafka's own 0081 asks this of
    a group with a subscribing consumer; it got GROUP_ID_NOT_FOUND)."""
    def run():
        create_topic(node, "od-mine", 1)
        create_topic(node, "od-other", 1)
        with BlockingKafkaClient(node, TIMEOUT) as conn:
            a = heartbeat(conn, "g-od", "member-a", 0, topics=["od-mine"], owned=[],
                          rebalance_timeout_ms=60_000)
            assert a.error_code == ErrorCode.none, a
            for topic in ("od-mine", "od-other"):
                assert commit(conn, "g-od", "member-a", a.member_epoch, topic, 0, 7) == (
                    ErrorCode.none)
            kept = offset_delete(conn, "g-od", "od-mine", [0])
            gone = offset_delete(conn, "g-od", "od-other", [0])
            fetched = conn.call(ApiKey.OFFSET_FETCH, 7, build(
                load_request_schema(ApiKey.OFFSET_FETCH, 7), group_id="g-od", topics=None,
                require_stable=False))
            return kept, gone, sorted(t.name for t in fetched.topics)

    kept, gone, left = await trio.to_thread.run_sync(run)
    assert kept == (ErrorCode.none, [ErrorCode.group_subscribed_to_topic])
    assert gone == (ErrorCode.none, [ErrorCode.none])
    assert left == ["od-mine"]
