"""Consumer groups: the classic group protocol and committed offsets, with stock clients
(confluent-kafka, kafka-python, aiokafka, kcat) and at the protocol level, against real nodes."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.broker.groups.coordinator import Deadlines, java_string_hash, partition_for
from mink.broker.groups.state import Group, GroupState, Member
from mink.broker.node import run_node
from mink.client import BlockingKafkaClient
from mink.protocol.apis import ADVERTISED, ApiKey
from mink.protocol.messages import build, nested
from mink.storage.embedded_postgres import free_port
from mink.storage.controlplane.groups import (
    Fence,
    GroupStore,
    NotGroupCoordinator,
    StoredGroup,
    StoredMember,
    StoredOffset,
)
from tests.support.kafka_python import wait_for_partitions
from tests.support.metadata import ToolMetadataStore
from mink.storage.controlplane import MetadataStore
from tests.support.nodes import node_config, require_tool, start_node
from tests.test_interop import confluent_produce

SESSION_MS = 6000  # group.min.session.timeout.ms: the shortest a client may ask for
TIMEOUT = 30


def group_config(pg_url, store_url, **overrides):
    values = dict(num_partitions=3, offsets_topic_num_partitions=10,
                  group_initial_rebalance_delay_ms=0)
    values.update(overrides)
    return node_config(pg_url, store_url, **values)


@pytest.fixture
def node_settings() -> dict:
    return dict(num_partitions=3, offsets_topic_num_partitions=10,
                group_min_session_timeout_ms=SESSION_MS)


@pytest.fixture
def gnode(node) -> str:
    """The harness node (tests/support/nodes.py) with three partitions per auto-created
    topic, ten __consumer_offsets partitions and Kafka's shortest session timeout."""
    return node


async def in_thread(fn, *args):
    return await trio.to_thread.run_sync(fn, *args)


async def wait_for(predicate, timeout: float = TIMEOUT, what: str = "condition"):
    deadline = trio.current_time() + timeout
    while not predicate():
        if trio.current_time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await trio.sleep(0.05)


async def wait_for_blocking(predicate, timeout: float = TIMEOUT, what: str = "condition"):
    """wait_for with a blocking predicate (a request to an in-process node): in a thread."""
    deadline = trio.current_time() + timeout
    while not await in_thread(predicate):
        if trio.current_time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await trio.sleep(0.05)


def produce(address: str, topic: str, values: list[bytes], partitions: int) -> None:
    confluent_produce(address, topic, [{"value": v, "partition": i % partitions}
                                       for i, v in enumerate(values)])


def values(prefix: str, start: int, stop: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(start, stop)]


# -- consuming half, committing, resuming: one helper per client --------------------------------


def confluent_consume(address: str, group: str, topic: str, count: int,
                      quiet: float = 0.0) -> list[bytes]:
    """Consume exactly `count` messages as a member of `group`, commit them synchronously,
    leave. With `quiet`, then poll that long more and fail on any extra message."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": address, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500})
    consumer.subscribe([topic])
    out: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(out) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                out.append(message.value())
        if out:
            consumer.commit(asynchronous=False)
        end = time.monotonic() + quiet
        while time.monotonic() < end:
            message = consumer.poll(0.1)
            assert message is None or message.error(), f"re-delivered: {message.value()}"
    finally:
        consumer.close()
    return out


def kafka_python_consume(address: str, group: str, topic: str, count: int,
                         quiet: float = 0.0) -> list[bytes]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=address, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
    # (A Metadata answer delayed by 0-150 ms made this fail in 3 of 8 runs without it.)
    wait_for_partitions(consumer, topic)
    out: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(out) < count and time.monotonic() < deadline:
            batches = consumer.poll(timeout_ms=200, max_records=count - len(out))
            for records in batches.values():
                out += [r.value for r in records]
        if out:
            consumer.commit()
        end = time.monotonic() + quiet
        while time.monotonic() < end:
            batches = consumer.poll(timeout_ms=100)
            assert not any(batches.values()), f"re-delivered: {batches}"
    finally:
        consumer.close()
    return out


def aiokafka_consume(address: str, group: str, topic: str, count: int,
                     quiet: float = 0.0) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer

    async def run() -> list[bytes]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=address, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
        await consumer.start()
        out: list[bytes] = []
        try:
            deadline = time.monotonic() + TIMEOUT
            while len(out) < count and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=200, max_records=count - len(out))
                for records in batches.values():
                    out += [r.value for r in records]
            if out:
                await consumer.commit()
            end = time.monotonic() + quiet
            while time.monotonic() < end:
                batches = await consumer.getmany(timeout_ms=100)
                assert not any(batches.values()), f"re-delivered: {batches}"
        finally:
            await consumer.stop()
        return out

    return asyncio.run(run())


CONSUMERS = {"confluent": confluent_consume, "kafka-python": kafka_python_consume,
             "aiokafka": aiokafka_consume}


@pytest.mark.parametrize("client", list(CONSUMERS))
async def test_commit_then_resume_in_the_same_group(gnode, client):
    consume = CONSUMERS[client]
    topic, group = f"resume-{client}", f"group-{client}"
    produced = values(client, 0, 300)
    await in_thread(produce, gnode, topic, produced, 3)
    first = await in_thread(consume, gnode, group, topic, 150)
    assert len(first) == 150
    second = await in_thread(consume, gnode, group, topic, 150, 1.0)
    assert len(second) == 150
    assert sorted(first + second) == sorted(produced), "skipped or re-delivered messages"


# -- members sharing a topic's partitions ------------------------------------------------------


class Ownership:
    """Which member owns which partition, from the members' assign/revoke callbacks; any
    partition assigned to a second member before the first gave it up is recorded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owners: dict[int, str] = {}
        self.violations: list[str] = []

    def assign(self, member: str, partitions) -> None:
        with self.lock:
            for p in partitions:
                owner = self.owners.get(p)
                if owner not in (None, member):
                    self.violations.append(f"partition {p} assigned to {member}, "
                                           f"still owned by {owner}")
                self.owners[p] = member

    def revoke(self, member: str, partitions) -> None:
        with self.lock:
            for p in partitions:
                if self.owners.get(p) == member:
                    del self.owners[p]

    def counts(self) -> dict[str, int]:
        with self.lock:
            counts: dict[str, int] = {}
            for owner in self.owners.values():
                counts[owner] = counts.get(owner, 0) + 1
            return counts


class ConfluentMember(threading.Thread):
    """A confluent-kafka group member that commits each message synchronously."""

    def __init__(self, name: str, address: str, group: str, topic: str, ownership: Ownership,
                 records: list, strategy: str = "range", **conf) -> None:
        super().__init__(name=name, daemon=True)
        self.member, self.address, self.group, self.topic = name, address, group, topic
        self.ownership, self.records, self.strategy, self.conf = ownership, records, strategy, conf
        self.stopping = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer({"bootstrap.servers": self.address, "group.id": self.group,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500,
                             "partition.assignment.strategy": self.strategy, **self.conf})
        consumer.subscribe(
            [self.topic],
            on_assign=lambda c, ps: self.ownership.assign(self.member,
                                                          [p.partition for p in ps]),
            on_revoke=lambda c, ps: self.ownership.revoke(self.member,
                                                          [p.partition for p in ps]),
            on_lost=lambda c, ps: self.ownership.revoke(self.member, [p.partition for p in ps]))
        try:
            while not self.stopping.is_set():
                message = consumer.poll(0.1)
                if message is None:
                    continue
                if message.error():
                    self.errors.append(str(message.error()))
                    continue
                self.records.append((self.member, message.partition(), message.value()))
                self.commit(consumer, message)
        finally:
            consumer.close()

    def commit(self, consumer, message) -> None:
        """Synchronously, retrying what an application retries. A cooperative member keeps
        consuming while its group rebalances; a commit sent meanwhile is refused, as Kafka
        refuses it: REBALANCE_IN_PROGRESS while the group completes the rebalance,
        ILLEGAL_GENERATION when it carries the generation the rebalance just ended; and
        while the coordinator moves, the coordinator errors."""
        from confluent_kafka import KafkaError, KafkaException

        retriable = (KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
                     KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                     KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._WAIT_COORD,
                     KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT)
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                consumer.commit(message=message, asynchronous=False)
                return
            except KafkaException as exc:
                if exc.args[0].code() not in retriable or time.monotonic() > deadline:
                    self.errors.append(f"commit of {message.value()}: {exc}")
                    return
                time.sleep(0.05)

    def stop(self) -> None:
        self.stopping.set()
        self.join(TIMEOUT)


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
async def test_members_split_partitions_and_consume_each_message_once(
        nursery, pg_url, store_url, strategy):
    address = await start_node(nursery, group_config(pg_url, store_url, num_partitions=6))
    topic, group = f"split-{strategy}", f"split-{strategy}"
    ownership, records = Ownership(), []
    await in_thread(produce, address, topic, values("a", 0, 600), 6)
    members = [ConfluentMember(f"m{i}", address, group, topic, ownership, records, strategy)
               for i in range(3)]
    try:
        members[0].start()
        members[1].start()
        await wait_for(lambda: ownership.counts() == {"m0": 3, "m1": 3}, what="3 + 3 owners")
        await in_thread(produce, address, topic, values("b", 0, 600), 6)
        members[2].start()
        await wait_for(lambda: ownership.counts() == {"m0": 2, "m1": 2, "m2": 2},
                       what="2 + 2 + 2 owners")
        await in_thread(produce, address, topic, values("c", 0, 600), 6)
        # 1,800 synchronous commits, each a PostgreSQL write: about a minute on a loaded machine
        await wait_for(lambda: len(records) >= 1800, timeout=120, what="every message consumed")
        await trio.sleep(0.5)  # anything re-delivered would show up now
    finally:
        for member in members:
            await in_thread(member.stop)
    assert not ownership.violations
    consumed = [value for _, _, value in records]
    expected = values("a", 0, 600) + values("b", 0, 600) + values("c", 0, 600)
    assert len(consumed) == len(set(consumed)), "a message was consumed twice"
    assert sorted(consumed) == sorted(expected)
    assert {m for m, _, _ in records} == {"m0", "m1", "m2"}
    assert not [e for m in members for e in m.errors], [m.errors for m in members]


KAFKA_PYTHON_MEMBER = textwrap.dedent("""
    import sys
    import time
    from kafka import KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    address, group, topic = sys.argv[1:4]
    consumer = KafkaConsumer(topic, bootstrap_servers=address, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=6000, heartbeat_interval_ms=500,
                             partition_assignment_strategy=[RangePartitionAssignor])
    # Partitions known before the first poll: see tests/support/kafka_python.py.
    while not consumer.partitions_for_topic(topic):
        time.sleep(0.05)
    last = None
    while True:
        consumer.poll(timeout_ms=100)
        assignment = sorted(p.partition for p in consumer.assignment())
        if assignment != last:
            print("ASSIGNED", *assignment, flush=True)
            last = assignment
""")


async def test_member_killed_without_leaving_is_expelled_after_its_session_timeout(
        nursery, pg_url, store_url):
    address = await start_node(nursery, group_config(pg_url, store_url, num_partitions=6))
    topic, group = "expel", "expel"
    ownership, records = Ownership(), []
    await in_thread(produce, address, topic, values("a", 0, 60), 6)
    victim = subprocess.Popen([sys.executable, "-c", KAFKA_PYTHON_MEMBER, address, group, topic],
                              stdout=subprocess.PIPE, text=True)
    survivor = ConfluentMember("survivor", address, group, topic, ownership, records)
    try:
        # the victim polls once it knows the topic's partitions: alone, it may already own all
        assert (await in_thread(victim.stdout.readline)).split()[:1] == ["ASSIGNED"]
        survivor.start()
        # range over two members: three partitions each
        await wait_for(lambda: ownership.counts() == {"survivor": 3}, what="the survivor's share")
        victim.kill()
        victim.wait()
        killed = trio.current_time()
        await wait_for(lambda: ownership.counts() == {"survivor": 6},
                       timeout=SESSION_MS / 1000 + 20, what="the victim's partitions")
        expelled_after = trio.current_time() - killed
        # expelled by its session timeout, not before (heartbeats every 0.5 s)
        assert SESSION_MS / 1000 - 1 < expelled_after < SESSION_MS / 1000 + 10
        await in_thread(produce, address, topic, values("b", 0, 60), 6)
        await wait_for(lambda: set(values("b", 0, 60)) <= {v for _, _, v in records},
                       what="messages produced after the kill")
    finally:
        victim.kill()
        victim.wait()
        await in_thread(survivor.stop)
    assert not ownership.violations


# -- durability --------------------------------------------------------------------------------


def describe_group(address: str, group: str):
    with BlockingKafkaClient(address, TIMEOUT) as conn:
        return conn.request(ApiKey.DESCRIBE_GROUPS, lambda schema: build(
            schema, groups=(group,), include_authorized_operations=False)).groups[0]


async def test_node_restart_keeps_offsets_and_static_members(pg_url, store_url, node_processes):
    config = group_config(pg_url, store_url, listener=f"127.0.0.1:{free_port()}")
    first = node_processes(config)
    await in_thread(first.start)
    address = first.address
    produced = values("d", 0, 200)
    await in_thread(produce, address, "durable", produced, 3)
    before = await in_thread(confluent_consume, address, "durable", "durable", 100)
    # a static member stays in its own group through the restart; its session (15 s, Kafka's
    # default is 45 s) outlasts the restart, which waits out the old incarnation's guard
    ownership, records = Ownership(), []
    static = ConfluentMember("static", address, "static", "durable", ownership, records,
                             **{"group.instance.id": "instance-1",
                                "session.timeout.ms": 15_000})
    static.start()
    try:
        await wait_for(lambda: ownership.counts() == {"static": 3}, what="the static member")
        described = await in_thread(describe_group, address, "static")
        assert described.group_state == "Stable"
        [member] = described.members
        assert member.group_instance_id == "instance-1"

        first.kill()
        second = node_processes(config)
        await in_thread(second.start)
        after = await in_thread(confluent_consume, address, "durable", "durable", 100, 1.0)
        assert sorted(before + after) == sorted(produced), "offsets not kept"

        await in_thread(produce, address, "durable", values("e", 0, 30), 3)
        await wait_for(lambda: set(values("e", 0, 30)) <= {v for _, _, v in records},
                       what="the static member to consume again")
        again = await in_thread(describe_group, address, "static")
        assert again.group_state == "Stable"
        assert [m.member_id for m in again.members] == [member.member_id], (
            "the static member lost its identity")
    finally:
        await in_thread(static.stop)
    assert not ownership.violations


async def start_stoppable(nursery, config) -> tuple[str, trio.CancelScope]:
    """An in-process node that the test can stop (cleanly: it leaves the cluster)."""

    async def run(*, task_status=trio.TASK_STATUS_IGNORED):
        scope = trio.CancelScope()

        class Started:
            @staticmethod
            def started(address=None):
                host, port = address
                task_status.started((f"{host}:{port}", scope))

        with scope:
            await run_node(config, task_status=Started())

    return await nursery.start(run)


def find_coordinator(address: str, group: str) -> int | None:
    with BlockingKafkaClient(address, TIMEOUT) as conn:
        response = conn.request(ApiKey.FIND_COORDINATOR, lambda schema: build(
            schema, key=group, key_type=0, coordinator_keys=(group,)))
    coordinator = response.coordinators[0]
    return coordinator.node_id if coordinator.error_code == ErrorCode.none else None


async def test_coordinator_moves_to_another_node_with_its_groups(nursery, pg_url, store_url):
    nodes = {}
    for node_id in (1, 2):
        nodes[node_id] = await start_stoppable(nursery, group_config(
            pg_url, store_url, node_id=node_id, num_partitions=4,
            offsets_topic_num_partitions=4))
    bootstrap = ",".join(address for address, _ in nodes.values())
    await in_thread(produce, bootstrap, "moving", values("m", 0, 100), 4)
    ownership, records = Ownership(), []
    member = ConfluentMember("member", bootstrap, "moving", "moving", ownership, records)
    member.start()
    try:
        await wait_for(lambda: len(records) == 100, what="the first half consumed")
        coordinator = await in_thread(find_coordinator, nodes[1][0], "moving")
        survivor = nodes[3 - coordinator][0]
        before = await in_thread(describe_group, nodes[coordinator][0], "moving")
        assert before.group_state == "Stable" and len(before.members) == 1
        nodes[coordinator][1].cancel()  # a clean stop: its partitions are re-led by the other
        await wait_for_blocking(lambda: find_coordinator(survivor, "moving") == 3 - coordinator,
                                what="the group's partition led by the other node")
        await in_thread(produce, survivor, "moving", values("m", 100, 200), 4)
        await wait_for(lambda: len(records) >= 200, what="the second half consumed")
        after = await in_thread(describe_group, survivor, "moving")
        # loaded by the new coordinator: the same member, the same generation, no rebalance
        assert (after.group_state, [m.member_id for m in after.members]) == (
            "Stable", [m.member_id for m in before.members])
    finally:
        await in_thread(member.stop)
    consumed = [value for _, _, value in records]
    assert sorted(consumed) == sorted(values("m", 0, 200))
    # and every offset was committed with the new coordinator: nothing left to consume
    assert await in_thread(confluent_consume, survivor, "moving", "moving", 0, 1.0) == []


# -- kcat and admin clients --------------------------------------------------------------------


async def test_kcat_consumes_as_a_group(gnode):
    kcat = require_tool("kcat")
    await in_thread(produce, gnode, "kcat-group", values("k", 0, 100), 3)

    async def consume() -> list[str]:
        result = await trio.run_process(
            [kcat, "-b", gnode, "-G", "kcat-group", "-e", "-q", "-X", "auto.offset.reset=earliest",
             "-X", "session.timeout.ms=6000", "kcat-group"],
            capture_stdout=True, capture_stderr=True)
        return result.stdout.decode().split()

    with trio.fail_after(60):
        first = await consume()
        assert sorted(first) == sorted(v.decode() for v in values("k", 0, 100))
        await in_thread(produce, gnode, "kcat-group", values("k", 100, 130), 3)
        second = await consume()  # resumes from the offsets kcat committed on exit
    assert sorted(second) == sorted(v.decode() for v in values("k", 100, 130))


async def test_kafka_python_admin_lists_describes_and_deletes_groups(gnode):
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.errors import for_code

    await in_thread(produce, gnode, "admin", values("x", 0, 30), 3)
    ownership, records = Ownership(), []
    member = ConfluentMember("member", gnode, "admin-group", "admin", ownership, records)
    member.start()
    admin = await in_thread(lambda: KafkaAdminClient(bootstrap_servers=gnode))
    try:
        await wait_for(lambda: len(records) == 30, what="the member consuming")
        listed = await in_thread(admin.list_groups)
        assert [(g["group_id"], g["protocol_type"]) for g in listed] == [
            ("admin-group", "consumer")], listed
        described = (await in_thread(admin.describe_groups, ["admin-group"]))["admin-group"]
        assert described["group_state"] == "Stable"
        assert described["protocol_type"] == "consumer"
        assert described["protocol_data"] == "range"
        [info] = described["members"]
        assert info["client_host"].startswith("/127.0.0.1")
        offsets = (await in_thread(admin.list_group_offsets, {"admin-group": None}))[
            "admin-group"]
        assert sum(o.offset for o in offsets.values()) == 30
        assert set(offsets) == {TopicPartition("admin", p) for p in range(3)}
        deleted = await in_thread(admin.delete_groups, ["admin-group"])
        assert deleted == {"admin-group": for_code(ErrorCode.non_empty_group).__name__}
        await in_thread(member.stop)
        assert await in_thread(admin.delete_groups, ["admin-group"]) == {"admin-group": "OK"}
        assert await in_thread(admin.list_groups) == []
    finally:
        await in_thread(admin.close)
        member.stopping.set()


# -- the protocol ------------------------------------------------------------------------------


class Raw:
    """One blocking connection speaking the group APIs at their highest versions."""

    def __init__(self, address: str) -> None:
        self.conn = BlockingKafkaClient(address, TIMEOUT)

    def close(self) -> None:
        self.conn.close()

    def call(self, api_key: int, version: int | None = None, **fields):
        version = self.conn.version(api_key) if version is None else version
        return self.conn.call(api_key, version,
                               build(load_request_schema(api_key, version), **fields))

    def join(self, group: str, member_id: str = "", instance: str | None = None,
             protocols=(("range", b"r"),), session_ms: int = SESSION_MS,
             protocol_type: str = "consumer", version: int | None = None,
             rebalance_ms: int = 10_000):
        schema = load_request_schema(ApiKey.JOIN_GROUP, version or self.conn.version(
            ApiKey.JOIN_GROUP))
        protocol = nested(schema, "JoinGroupRequestProtocol")
        return self.call(ApiKey.JOIN_GROUP, version, group_id=group, member_id=member_id,
                         group_instance_id=instance,
                         session_timeout=datetime.timedelta(milliseconds=session_ms),
                         rebalance_timeout=datetime.timedelta(milliseconds=rebalance_ms),
                         protocol_type=protocol_type, reason=None,
                         protocols=tuple(protocol(name=n, metadata=m) for n, m in protocols))

    def join_with_id(self, group: str, **kwargs):
        """A dynamic member's first join: MEMBER_ID_REQUIRED, then the join with that id."""
        response = self.join(group, **kwargs)
        assert response.error_code == ErrorCode.member_id_required
        return self.join(group, member_id=response.member_id, **kwargs)

    def sync(self, group: str, member_id: str, generation: int, assignments=(),
             instance: str | None = None):
        schema = load_request_schema(ApiKey.SYNC_GROUP, self.conn.version(ApiKey.SYNC_GROUP))
        assignment = nested(schema, "SyncGroupRequestAssignment")
        return self.call(ApiKey.SYNC_GROUP, group_id=group, generation_id=generation,
                         member_id=member_id, group_instance_id=instance,
                         protocol_type="consumer", protocol_name=None,
                         assignments=tuple(assignment(member_id=m, assignment=a)
                                           for m, a in assignments))

    def describe(self, group: str):
        return self.call(ApiKey.DESCRIBE_GROUPS, groups=(group,),
                         include_authorized_operations=False).groups[0]

    def heartbeat(self, group: str, member_id: str, generation: int,
                  instance: str | None = None):
        return self.call(ApiKey.HEARTBEAT, group_id=group, generation_id=generation,
                         member_id=member_id, group_instance_id=instance).error_code


@pytest.fixture
def raw(gnode):
    opened = []

    async def connect() -> Raw:  # connecting asks ApiVersions: not in the node's thread
        conn = await in_thread(Raw, gnode)
        opened.append(conn)
        # the node loads its groups after it started (COORDINATOR_LOAD_IN_PROGRESS meanwhile)
        await wait_for_blocking(lambda: conn.call(ApiKey.LIST_GROUPS, states_filter=())
                                .error_code == ErrorCode.none, what="the groups loaded")
        return conn

    yield connect
    for conn in opened:
        conn.close()


async def test_join_sync_heartbeat_leave_errors(raw):
    a, b = await raw(), await raw()
    assert (await in_thread(lambda: a.join("g", session_ms=1000))).error_code == (
        ErrorCode.invalid_session_timeout)
    assert (await in_thread(lambda: a.join("", member_id="x"))).error_code == (
        ErrorCode.invalid_group_id)
    assert (await in_thread(lambda: a.join("g", member_id="unknown"))).error_code == (
        ErrorCode.unknown_member_id)
    # the first member: a generation of its own, at once (initial delay 0)
    joined = await in_thread(lambda: a.join_with_id("g"))
    assert joined.error_code == ErrorCode.none and joined.generation_id == 1
    assert joined.leader == joined.member_id
    assert [(m.member_id, m.metadata) for m in joined.members] == [(joined.member_id, b"r")]
    a_id = joined.member_id
    synced = await in_thread(lambda: a.sync("g", a_id, 1, [(a_id, b"all")]))
    assert (synced.error_code, synced.assignment, synced.protocol_name) == (
        ErrorCode.none, b"all", "range")
    assert await in_thread(lambda: a.heartbeat("g", a_id, 1)) == ErrorCode.none
    assert await in_thread(lambda: a.heartbeat("g", a_id, 7)) == ErrorCode.illegal_generation
    assert await in_thread(lambda: a.heartbeat("g", "who", 1)) == ErrorCode.unknown_member_id
    # a member with another protocol type cannot join
    assert (await in_thread(lambda: b.join("g", protocol_type="connect"))).error_code == (
        ErrorCode.inconsistent_group_protocol)
    # nor one sharing no protocol with the members
    assert (await in_thread(lambda: b.join("g", protocols=(("other", b""),)))).error_code == (
        ErrorCode.inconsistent_group_protocol)

    # a second member: the first learns of the rebalance from its heartbeat and rejoins
    async with trio.open_nursery() as nursery:
        second = {}

        async def join_b():
            second["r"] = await in_thread(lambda: b.join_with_id("g"))

        nursery.start_soon(join_b)
        await wait_for_blocking(
            lambda: a.heartbeat("g", a_id, 1) == ErrorCode.rebalance_in_progress,
            what="REBALANCE_IN_PROGRESS")
        rejoined = await in_thread(lambda: a.join("g", member_id=a_id))
    b_id = second["r"].member_id
    assert rejoined.generation_id == second["r"].generation_id == 2
    assert rejoined.leader == a_id and len(rejoined.members) == 2 and not second["r"].members
    # the follower's SyncGroup waits for the leader's
    async with trio.open_nursery() as nursery:
        follower = {}

        async def sync_b():
            follower["r"] = await in_thread(lambda: b.sync("g", b_id, 2))

        nursery.start_soon(sync_b)
        await trio.sleep(0.2)
        assert "r" not in follower
        await in_thread(lambda: a.sync("g", a_id, 2, [(a_id, b"A"), (b_id, b"B")]))
    assert follower["r"].assignment == b"B"
    # batch LeaveGroup: one known member, one unknown
    left = await in_thread(lambda: a.call(ApiKey.LEAVE_GROUP, group_id="g", members=(
        nested(load_request_schema(ApiKey.LEAVE_GROUP, 4), "MemberIdentity")(
            member_id=b_id, group_instance_id=None),
        nested(load_request_schema(ApiKey.LEAVE_GROUP, 4), "MemberIdentity")(
            member_id="nobody", group_instance_id=None))))
    assert [m.error_code for m in left.members] == [ErrorCode.none, ErrorCode.unknown_member_id]
    assert await in_thread(lambda: a.heartbeat("g", a_id, 2)) == ErrorCode.rebalance_in_progress


async def test_member_that_does_not_rejoin_within_the_rebalance_timeout_is_removed(raw):
    a, b = await raw(), await raw()
    first = await in_thread(lambda: a.join_with_id("slow", rebalance_ms=1000))
    async with trio.open_nursery() as nursery:
        second = {}

        async def join_b():
            second["r"] = await in_thread(lambda: b.join_with_id("slow", rebalance_ms=1000))

        nursery.start_soon(join_b)
        await wait_for_blocking(lambda: len(a.describe("slow").members) == 2, what="b joining")
        started = trio.current_time()
    # a never rejoined: after the rebalance timeout the generation completes without it
    waited = trio.current_time() - started
    assert 0.8 < waited < 3, waited
    assert second["r"].generation_id == 2 and second["r"].leader == second["r"].member_id
    assert [m.member_id for m in second["r"].members] == [second["r"].member_id]
    assert await in_thread(lambda: a.heartbeat("slow", first.member_id, 1)) == (
        ErrorCode.unknown_member_id)


async def test_initial_rebalance_delay_gathers_the_first_members(nursery, pg_url, store_url):
    address = await start_node(nursery, group_config(pg_url, store_url,
                                                     group_initial_rebalance_delay_ms=700))
    conns = [await in_thread(Raw, address) for _ in range(2)]
    try:
        await wait_for_blocking(lambda: conns[0].call(ApiKey.LIST_GROUPS, states_filter=())
                                .error_code == ErrorCode.none, what="the groups loaded")
        results = {}
        started = trio.current_time()
        async with trio.open_nursery() as joins:
            for i, conn in enumerate(conns):
                async def join(i=i, conn=conn):
                    results[i] = await in_thread(lambda: conn.join_with_id("delayed"))
                joins.start_soon(join)
                await trio.sleep(0.2)
        waited = trio.current_time() - started
    finally:
        for conn in conns:
            conn.close()
    # one generation with both members, after the delay (extended once by the second join)
    assert {r.generation_id for r in results.values()} == {1}
    assert sorted(len(r.members) for r in results.values()) == [0, 2]
    assert 0.7 < waited < 3, waited


async def test_protocol_chosen_by_votes(raw):
    a, b, c = await raw(), await raw(), await raw()
    first = await in_thread(lambda: a.join_with_id("votes", protocols=(("x", b""), ("y", b""))))
    assert first.protocol_name == "x"
    async with trio.open_nursery() as nursery:
        results = {}

        async def join(name, conn, protocols):
            results[name] = await in_thread(lambda: conn.join_with_id("votes",
                                                                      protocols=protocols))

        nursery.start_soon(join, "b", b, (("y", b""), ("x", b"")))
        nursery.start_soon(join, "c", c, (("y", b""), ("x", b""), ("z", b"")))
        await wait_for_blocking(lambda: len(a.describe("votes").members) == 3,
                                what="both new members joining the rebalance")
        again = await in_thread(lambda: a.join("votes", member_id=first.member_id,
                                               protocols=(("x", b""), ("y", b""))))
    assert again.protocol_name == results["b"].protocol_name == "y"  # two votes to one


async def test_static_member_rejoins_without_rebalance_and_old_id_is_fenced(raw):
    a = await raw()
    joined = await in_thread(lambda: a.join("static", instance="i-1"))
    assert joined.error_code == ErrorCode.none and joined.generation_id == 1
    old_id = joined.member_id
    await in_thread(lambda: a.sync("static", old_id, 1, [(old_id, b"mine")], instance="i-1"))
    # the same instance restarts: a new member id, the same generation and assignment
    again = await in_thread(lambda: a.join("static", instance="i-1"))
    assert again.error_code == ErrorCode.none
    assert again.generation_id == 1 and again.member_id != old_id
    synced = await in_thread(lambda: a.sync("static", again.member_id, 1, instance="i-1"))
    assert synced.assignment == b"mine"
    assert await in_thread(lambda: a.heartbeat("static", old_id, 1, "i-1")) == (
        ErrorCode.fenced_instance_id)
    assert await in_thread(lambda: a.heartbeat("static", again.member_id, 1, "i-1")) == (
        ErrorCode.none)


async def test_offsets_of_a_simple_consumer_and_group_administration(gnode, raw):
    await in_thread(produce, gnode, "simple", values("s", 0, 9), 3)
    a = await raw()
    commit_schema = load_request_schema(ApiKey.OFFSET_COMMIT, 8)
    topic = nested(commit_schema, "OffsetCommitRequestTopic")
    part = nested(commit_schema, "OffsetCommitRequestPartition")

    def commit(group, offsets, generation=-1, member_id=""):
        return a.call(ApiKey.OFFSET_COMMIT, 8, group_id=group,
                      generation_id_or_member_epoch=generation, member_id=member_id,
                      group_instance_id=None, topics=tuple(
                          topic(name=t, partitions=tuple(
                              part(partition_index=p, committed_offset=o,
                                   committed_leader_epoch=e, committed_metadata=m)
                              for p, o, e, m in ps)) for t, ps in offsets))

    response = await in_thread(commit, "simple-group", [
        ("simple", [(0, 3, 0, "meta"), (1, 2, -1, None), (5, 1, -1, None)]),
        ("nowhere", [(0, 1, -1, None)])])
    assert [[p.error_code for p in t.partitions] for t in response.topics] == [
        [ErrorCode.none, ErrorCode.none, ErrorCode.unknown_topic_or_partition],
        [ErrorCode.unknown_topic_or_partition]]
    assert (await in_thread(commit, "simple-group", [("simple", [(2, 1, -1, "m" * 5000)])])
            ).topics[0].partitions[0].error_code == ErrorCode.offset_metadata_too_large
    # a commit with a generation to a group that does not exist is from a generation gone
    assert (await in_thread(commit, "other", [("simple", [(0, 1, -1, None)])], 3, "x")
            ).topics[0].partitions[0].error_code == ErrorCode.illegal_generation

    fetched = await in_thread(lambda: a.call(ApiKey.OFFSET_FETCH, 7, group_id="simple-group",
                                             topics=None, require_stable=True))
    assert fetched.error_code == ErrorCode.none
    assert [(t.name, [(p.partition_index, p.committed_offset, p.committed_leader_epoch,
                       p.metadata) for p in t.partitions]) for t in fetched.topics] == [
        ("simple", [(0, 3, 0, "meta"), (1, 2, -1, "")])]  # null metadata is stored as ""
    fetch_topic = nested(load_request_schema(ApiKey.OFFSET_FETCH, 1), "OffsetFetchRequestTopic")
    old = await in_thread(lambda: a.call(ApiKey.OFFSET_FETCH, 1, group_id="simple-group",
                                         topics=(fetch_topic(name="simple",
                                                             partition_indexes=(1, 2)),)))
    assert [(p.partition_index, p.committed_offset) for p in old.topics[0].partitions] == [
        (1, 2), (2, -1)]

    # OffsetDelete, then DeleteGroups of the (empty) group
    delete_schema = load_request_schema(ApiKey.OFFSET_DELETE, 0)
    deleted = await in_thread(lambda: a.call(
        ApiKey.OFFSET_DELETE, 0, group_id="simple-group", topics=(
            nested(delete_schema, "OffsetDeleteRequestTopic")(name="simple", partitions=(
                nested(delete_schema, "OffsetDeleteRequestPartition")(partition_index=0),)),)))
    assert deleted.error_code == ErrorCode.none
    assert deleted.topics[0].partitions[0].error_code == ErrorCode.none
    fetched = await in_thread(lambda: a.call(ApiKey.OFFSET_FETCH, 7, group_id="simple-group",
                                             topics=None, require_stable=False))
    assert [[p.partition_index for p in t.partitions] for t in fetched.topics] == [[1]]
    listed = await in_thread(lambda: a.call(ApiKey.LIST_GROUPS, 4, states_filter=("empty",)))
    assert [(g.group_id, g.group_state) for g in listed.groups] == [("simple-group", "Empty")]
    result = await in_thread(lambda: a.call(ApiKey.DELETE_GROUPS, 2,
                                            groups_names=("simple-group", "nobody")))
    assert [(r.group_id, r.error_code) for r in result.results] == [
        ("simple-group", ErrorCode.none), ("nobody", ErrorCode.group_id_not_found)]
    described = await in_thread(lambda: a.call(ApiKey.DESCRIBE_GROUPS, 5,
                                               groups=("simple-group",),
                                               include_authorized_operations=False))
    assert described.groups[0].group_state == "Dead"


async def test_find_coordinator_and_the_internal_topic(gnode, raw):
    a = await raw()
    batched = await in_thread(lambda: a.call(ApiKey.FIND_COORDINATOR, 4, key_type=0,
                                             coordinator_keys=("g1", "g2")))
    host, port = gnode.split(":")
    assert [(c.key, c.error_code, c.node_id, c.host, c.port) for c in batched.coordinators] == [
        ("g1", ErrorCode.none, 1, host, int(port)), ("g2", ErrorCode.none, 1, host, int(port))]
    # A transactional id's coordinator (issue 19): found once __transaction_state, created at
    # the first lookup, is led.
    with trio.fail_after(TIMEOUT):
        while True:
            txn = await in_thread(lambda: a.call(ApiKey.FIND_COORDINATOR, 3, key="tx",
                                                 key_type=1))
            if txn.error_code != ErrorCode.coordinator_not_available:
                break
            await trio.sleep(0.1)
    assert (txn.error_code, txn.node_id) == (ErrorCode.none, 1)
    unknown = await in_thread(lambda: a.call(ApiKey.FIND_COORDINATOR, 3, key="x", key_type=7))
    assert unknown.error_code == ErrorCode.invalid_request
    v0 = await in_thread(lambda: a.call(ApiKey.FIND_COORDINATOR, 0, key="g1"))
    assert (v0.error_code, v0.node_id) == (ErrorCode.none, 1)

    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import AdminClient

    def internal():
        metadata = AdminClient({"bootstrap.servers": gnode}).list_topics(timeout=10)
        topic = metadata.topics["__consumer_offsets"]
        producer = Producer({"bootstrap.servers": gnode, "message.timeout.ms": 5000})
        errors = []
        producer.produce("__consumer_offsets", b"x", partition=0,
                         on_delivery=lambda err, msg: errors.append(err))
        producer.flush(10)
        return len(topic.partitions), errors

    partitions, errors = await in_thread(internal)
    assert partitions == 10
    assert errors and errors[0].code() == KafkaError.TOPIC_EXCEPTION


async def test_every_advertised_version_of_the_group_apis(raw):
    """Each version decodes and is answered (with the errors an unknown member gets)."""
    a = await raw()

    def versions(api_key):
        low, high = ADVERTISED[api_key]
        return range(low, high + 1)

    for v in versions(ApiKey.JOIN_GROUP):
        response = await in_thread(lambda: a.join(f"v{v}", version=v))
        expected = ErrorCode.member_id_required if v >= 4 else ErrorCode.none
        assert response.error_code == expected, v
    for v in versions(ApiKey.HEARTBEAT):
        response = await in_thread(lambda: a.call(ApiKey.HEARTBEAT, v, group_id="v0",
                                                  generation_id=1, member_id="x",
                                                  group_instance_id=None))
        assert response.error_code == ErrorCode.unknown_member_id, v
    for v in versions(ApiKey.SYNC_GROUP):
        response = await in_thread(lambda: a.call(ApiKey.SYNC_GROUP, v, group_id="v0",
                                                  generation_id=1, member_id="x",
                                                  group_instance_id=None, protocol_type=None,
                                                  protocol_name=None, assignments=()))
        assert response.error_code == ErrorCode.unknown_member_id, v
    for v in versions(ApiKey.LEAVE_GROUP):
        schema = load_request_schema(ApiKey.LEAVE_GROUP, v)
        identity = getattr(sys.modules[schema.__module__], "MemberIdentity", None)
        response = await in_thread(lambda: a.call(
            ApiKey.LEAVE_GROUP, v, group_id="v0", member_id="x",
            members=(identity(member_id="x", group_instance_id=None),) if identity else ()))
        member_errors = [m.error_code for m in getattr(response, "members", ())]
        assert ErrorCode.unknown_member_id in [response.error_code, *member_errors], v
    for v in versions(ApiKey.OFFSET_FETCH):
        schema = load_request_schema(ApiKey.OFFSET_FETCH, v)
        if v >= 8:  # several groups per request (KIP-709)
            topic = nested(schema, "OffsetFetchRequestTopics")
            group = nested(schema, "OffsetFetchRequestGroup")
            response = await in_thread(lambda: a.call(
                ApiKey.OFFSET_FETCH, v, require_stable=False, groups=(group(
                    group_id="v0", topics=(topic(name="t", partition_indexes=(0,)),)),)))
            assert response.groups[0].topics[0].partitions[0].committed_offset == -1, v
            continue
        topic = nested(schema, "OffsetFetchRequestTopic")
        response = await in_thread(lambda: a.call(
            ApiKey.OFFSET_FETCH, v, group_id="v0", require_stable=False,
            topics=(topic(name="t", partition_indexes=(0,)),)))
        assert response.topics[0].partitions[0].committed_offset == -1, v
    for v in versions(ApiKey.OFFSET_COMMIT):
        schema = load_request_schema(ApiKey.OFFSET_COMMIT, v)
        response = await in_thread(lambda: a.call(
            ApiKey.OFFSET_COMMIT, v, group_id="v0", generation_id_or_member_epoch=5,
            member_id="x", group_instance_id=None,
            retention_time=datetime.timedelta(milliseconds=-1), topics=()))
        assert response.topics == (), v
    for v in versions(ApiKey.LIST_GROUPS):
        response = await in_thread(lambda: a.call(ApiKey.LIST_GROUPS, v, states_filter=()))
        assert response.error_code == ErrorCode.none, v
    for v in versions(ApiKey.DESCRIBE_GROUPS):
        response = await in_thread(lambda: a.call(ApiKey.DESCRIBE_GROUPS, v, groups=("v0",),
                                                  include_authorized_operations=False))
        assert response.groups[0].error_code == ErrorCode.none, v
        assert response.groups[0].group_state in ("CompletingRebalance", "PreparingRebalance"), v
    for v in versions(ApiKey.DELETE_GROUPS):
        response = await in_thread(lambda: a.call(ApiKey.DELETE_GROUPS, v,
                                                  groups_names=("nobody",)))
        assert response.results[0].error_code == ErrorCode.group_id_not_found, v
    for v in versions(ApiKey.FIND_COORDINATOR):
        response = await in_thread(lambda: a.call(ApiKey.FIND_COORDINATOR, v, key="g",
                                                  key_type=0, coordinator_keys=("g",)))
        errors = [c.error_code for c in getattr(response, "coordinators", ())] or [
            response.error_code]
        assert errors == [ErrorCode.none], v


# -- the state machine, without a node ---------------------------------------------------------


def test_group_partition_is_kafkas():
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    assert partition_for("polygenelubricants", 50) == 0         # Utils.abs(MIN_VALUE) == 0
    assert java_string_hash("\U0001F600") == 1772899  # a surrogate pair, as Java hashes it
    assert partition_for("console-consumer-1", 50) == abs(java_string_hash(
        "console-consumer-1")) % 50


def test_protocol_selection_votes_and_ties():
    group = Group("g", 0)

    def member(member_id, *names):
        return Member(member_id, None, "c", "/h", 1000, 6000, "consumer",
                      [(n, b"") for n in names])

    group.add(member("a", "x", "y"))
    group.add(member("b", "y", "x"))
    assert group.select_protocol() == "x"  # one vote each: the oldest member's preference
    group.add(member("c", "y", "x", "z"))
    assert group.select_protocol() == "y"
    assert group.candidate_protocols() == {"x", "y"}
    group.state = GroupState.STABLE  # an empty group takes any protocol
    assert group.supports_protocols("consumer", {"z", "x"})
    assert not group.supports_protocols("consumer", {"z"})
    group.remove("a")
    assert group.leader_id == "b"


async def test_deadlines_fire_in_order_and_on_time(autojump_clock):
    # Virtual time (trio's MockClock): "on time" is exact, whatever the machine's load.
    deadlines, fired = Deadlines(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deadlines.run)
        start = trio.current_time()
        for delay in (0.3, 0.1, 0.2, 0.0):
            deadlines.call_after(delay, lambda d=delay: fired.append(
                (d, trio.current_time() - start)))
        await trio.sleep(0.4)
        nursery.cancel_scope.cancel()
    assert [d for d, _ in fired] == [0.0, 0.1, 0.2, 0.3]
    assert all(abs(at - d) < 1e-6 for d, at in fired), fired


async def test_group_writes_are_fenced_by_the_partition_leader_epoch(pg_url, aio_loop):
    store = await ToolMetadataStore.open(pg_url)
    try:
        node_epoch = await store.register_node(1, "127.0.0.1", 9092, ttl_s=30)
        topic = await store.create_topic("__consumer_offsets", 2, {}, [1, 1])
        groups = GroupStore(store)
        fence = Fence(topic.topic_id, 0, 0, 1, node_epoch)
        member = StoredMember("m-1", "i-1", "client", "/127.0.0.1", 300000, 6000, "consumer",
                              [("range", b"meta")], b"assigned")
        await groups.commit_offsets(fence, "g", [StoredOffset("t", 0, 5, 1, "x"),
                                                 StoredOffset("t", 0, 7, 1, "y")])
        await groups.store_group(fence, StoredGroup("g", "consumer", "range", 3, "m-1", [member]))
        [loaded] = await groups.load(0)
        assert (loaded.group_id, loaded.generation, loaded.leader, loaded.members) == (
            "g", 3, "m-1", [member])
        assert [(o.topic, o.partition, o.offset, o.metadata) for o in loaded.offsets] == [
            ("t", 0, 7, "y")]
        assert await groups.load(1) == []

        # the partition gets a new leader epoch (a move, or this node restarted): refused
        new_epoch = await store.lead_partition(topic.topic_id, 0, 1)
        for write in (groups.commit_offsets(fence, "g", [StoredOffset("t", 0, 9)]),
                      groups.store_group(fence, StoredGroup("g")),
                      groups.delete_offsets(fence, "g", [("t", 0)]),
                      groups.delete_groups(fence, ["g"])):
            with pytest.raises(NotGroupCoordinator):
                await write
        # a stale node epoch is refused too
        await store.register_node(1, "127.0.0.1", 9092, ttl_s=30)
        with pytest.raises(NotGroupCoordinator):
            await groups.commit_offsets(Fence(topic.topic_id, 0, new_epoch, 1, node_epoch),
                                        "g", [StoredOffset("t", 0, 9)])
        [unchanged] = await groups.load(0)
        assert unchanged.offsets[0].offset == 7 and unchanged.generation == 3

        current = Fence(topic.topic_id, 0, new_epoch, 1, node_epoch + 1)
        await groups.delete_offsets(current, "g", [("t", 0)])
        assert (await groups.load(0))[0].offsets == []
        await groups.delete_groups(current, ["g"])
        assert await groups.load(0) == []
    finally:
        await store.aclose()
