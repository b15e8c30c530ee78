"""Replica-management APIs mapped onto one replica per partition (its leader), issue 21:
AlterPartitionReassignments, ListPartitionReassignments, ElectLeaders, DescribeLogDirs,
AlterReplicaLogDirs, through kafka-python 3.0's KafkaAdminClient (the client here that has
them); a three-node reassignment under load with confluent-kafka producing."""

from __future__ import annotations

import threading
import time

import pytest
import trio
from kio.schema.errors import ErrorCode

from mink.broker.cluster.view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from mink.broker.server.handlers import elect_leaders
from mink.client import BlockingKafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build, nested


async def in_thread(fn, *args):
    return await trio.to_thread.run_sync(fn, *args)


def admin_for(address: str):
    from kafka import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=15000)


def with_admin(address: str, call):
    admin = admin_for(address)
    try:
        return call(admin)
    finally:
        admin.close()


def create_topic(address: str, name: str, partitions: int) -> None:
    from kafka.admin import NewTopic

    with_admin(address, lambda a: a.create_topics([NewTopic(name, partitions, 1)]))


def produce_batches(address: str, topic: str, batches: int, per_batch: int) -> None:
    """kafka-python producer, one flush per batch (so each flush is one stored batch)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=address, linger_ms=1000, batch_size=1 << 20)
    try:
        for b in range(batches):
            futures = [producer.send(topic, b"%d-%d" % (b, i) * 10, partition=0)
                       for i in range(per_batch)]
            producer.flush(30)
            for f in futures:
                f.get(10)
    finally:
        producer.close()


def stored_bytes(address: str, topic: str) -> int:
    """The bytes of partition 0's batches as Fetch returns them (a raw Fetch v12 laid out
    from FetchRequest.json: the stored batches, byte for byte)."""
    import datetime

    with BlockingKafkaClient(address, timeout=10) as client:
        def body(schema):
            fetch_topic = nested(schema, "FetchTopic")
            fetch_partition = nested(schema, "FetchPartition")
            return build(schema, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10),
                         min_bytes=0, max_bytes=64 << 20, isolation_level=0, session_id=0,
                         session_epoch=-1, forgotten_topics_data=(), rack_id="",
                         topics=(fetch_topic(topic=topic, partitions=(fetch_partition(
                             partition=0, fetch_offset=0, partition_max_bytes=64 << 20),)),))
        from kio.index import load_request_schema
        response = client.call(ApiKey.FETCH, 12, body(load_request_schema(ApiKey.FETCH, 12)))
    return len(response.responses[0].partitions[0].records or b"")


# -- DescribeLogDirs, AlterReplicaLogDirs -----------------------------------------------


async def test_kafka_python_describe_log_dirs_sizes(node):
    """One virtual log dir per node; each partition's size is the bytes its committed
    batches take in the object store, growing by exactly each batch written."""
    await in_thread(create_topic, node, "sized", 2)
    await in_thread(produce_batches, node, "sized", 3, 20)

    def sizes():
        dirs = with_admin(node, lambda a: a.describe_log_dirs())
        (broker,) = dirs if isinstance(dirs, list) else list(dirs.values())
        return broker

    described = await in_thread(sizes)
    text = repr(described)
    assert "/mink/object-store/node-1" in text, text
    expected = await in_thread(stored_bytes, node, "sized")
    assert expected > 3 * 20 * 10
    partition_sizes = _sizes(described, "sized")
    assert partition_sizes == {0: expected, 1: 0}, (partition_sizes, expected)

    await in_thread(produce_batches, node, "sized", 1, 5)
    grown = _sizes(await in_thread(sizes), "sized")
    assert grown[0] == await in_thread(stored_bytes, node, "sized") > expected


def _sizes(described, topic: str) -> dict[int, int]:
    """partition -> size from kafka-python's describe_log_dirs answer for one broker."""
    found: dict[int, int] = {}

    def walk(value):
        if isinstance(value, dict):
            if value.get("name") == topic or value.get("topic") == topic:
                for p in value.get("partitions", []):
                    found[p["partition_index"]] = p["partition_size"]
                return
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif hasattr(value, "__dict__") or hasattr(value, "to_dict"):
            walk(value.to_dict() if hasattr(value, "to_dict") else vars(value))

    walk(described)
    return found


async def test_kafka_python_alter_replica_log_dirs(node):
    """As Kafka with one log dir: the dir the replica is in already is accepted (nothing to
    move); any other is LOG_DIR_NOT_FOUND; a partition that does not exist is unknown."""
    from kafka import errors as Errors
    from kafka.structs import TopicPartitionReplica

    await in_thread(create_topic, node, "placed", 1)
    here = TopicPartitionReplica("placed", 0, 1)
    nowhere = TopicPartitionReplica("placed", 5, 1)
    first = await in_thread(with_admin, node, lambda a: a.alter_replica_log_dirs(
        {here: "/mink/object-store/node-1", nowhere: "/mink/object-store/node-1"}))
    second = await in_thread(with_admin, node, lambda a: a.alter_replica_log_dirs(
        {here: "/data/kafka-logs-2"}))
    assert first == {here: Errors.NoError, nowhere: Errors.UnknownTopicOrPartitionError}
    assert second == {here: Errors.LogDirNotFoundError}


# -- ElectLeaders -------------------------------------------------------------------------


async def test_kafka_python_elect_leaders_not_needed(node):
    """A live leader is the preferred (and only) replica: PREFERRED and UNCLEAN both answer
    ELECTION_NOT_NEEDED (kafka-python names every partition when given none)."""
    await in_thread(create_topic, node, "elected", 2)

    def elect(kind, partitions):
        response = with_admin(node, lambda a: a.elect_leaders(kind, partitions,
                                                                raise_errors=False))
        return {(t.topic, p.partition_id): p.error_code
                for t in response.replica_election_results for p in t.partition_result}

    assert await in_thread(elect, 0, {"elected": [0, 1]}) == {
        ("elected", 0): ErrorCode.election_not_needed,
        ("elected", 1): ErrorCode.election_not_needed}
    assert await in_thread(elect, 1, {"elected": [1]}) == {
        ("elected", 1): ErrorCode.election_not_needed}
    every = await in_thread(elect, 0, None)
    assert ("elected", 0) in every
    assert set(every.values()) == {ErrorCode.election_not_needed}


def test_elect_leaders_plan_rows():
    """The rule table: live leader -> not needed; orphan + PREFERRED -> preferred leader not
    available; orphan + UNCLEAN -> re-led to the least loaded live node at its epoch."""
    view = ClusterView(version=1, cluster_id="c", brokers={
        1: BrokerInfo(1, "h", 1), 2: BrokerInfo(2, "h", 2)}, topics={
        "t": TopicInfo("id-t", "t", (PartitionInfo(0, 1, 4), PartitionInfo(1, 3, 7),
                                     PartitionInfo(2, None, 2)))})
    wanted = [("t", 0), ("t", 1), ("t", 2), ("u", 0)]
    results, moves, _ = elect_leaders.plan(view, wanted, elect_leaders.PREFERRED)
    assert {k: v[0] for k, v in results.items()} == {
        ("t", 0): ErrorCode.election_not_needed,
        ("t", 1): ErrorCode.preferred_leader_not_available,
        ("t", 2): ErrorCode.preferred_leader_not_available,
        ("u", 0): ErrorCode.unknown_topic_or_partition}
    assert moves == []
    results, moves, moved = elect_leaders.plan(view, wanted, elect_leaders.UNCLEAN)
    assert {k: v[0] for k, v in results.items()} == {
        ("t", 0): ErrorCode.election_not_needed, ("t", 1): ErrorCode.none,
        ("t", 2): ErrorCode.none, ("u", 0): ErrorCode.unknown_topic_or_partition}
    # node 1 leads one partition already: the first orphan goes to 2, the next to 1
    assert moves == [("id-t", 1, 2, 7), ("id-t", 2, 1, 2)]
    assert moved == [("t", 1), ("t", 2)]


# -- AlterPartitionReassignments / ListPartitionReassignments, single node ---------------


async def test_kafka_python_reassignment_answers(node):
    """One node: naming its own id is accepted (nothing to move), a broker that is not live
    is INVALID_REPLICA_ASSIGNMENT, a cancellation has nothing to cancel; nothing is listed
    as in progress once the partition is open."""
    from kafka import TopicPartition
    from kafka import errors as Errors

    await in_thread(create_topic, node, "stay", 2)
    answer = await in_thread(with_admin, node, lambda a: a.alter_partition_reassignments({
        TopicPartition("stay", 0): [1], TopicPartition("stay", 1): [7],
        TopicPartition("stay", 5): [1]}))
    assert answer[TopicPartition("stay", 0)] is None
    assert answer[TopicPartition("stay", 1)] is Errors.InvalidReplicationAssignmentError
    assert answer[TopicPartition("stay", 5)] is Errors.UnknownTopicOrPartitionError
    cancel = await in_thread(with_admin, node, lambda a: a.alter_partition_reassignments({
        TopicPartition("stay", 0): None}))
    assert cancel[TopicPartition("stay", 0)] is Errors.NoReassignmentInProgressError
    with trio.fail_after(15):
        while await in_thread(with_admin, node,
                              lambda a: a.list_partition_reassignments({"stay": [0, 1]})):
            await trio.sleep(0.1)


# -- three nodes: a reassignment moves leadership under load ------------------------------


def produce_until(bootstrap: str, topic: str, stop: threading.Event, acked: list,
                  errors: list) -> None:
    """An idempotent confluent-kafka producer writing numbered values to every partition
    until `stop`; `acked` gets (partition, offset, value) of each acknowledged record."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000})

    def on_delivery(err, msg):
        if err:
            errors.append(err)
        else:
            acked.append((msg.partition(), msg.offset(), msg.value()))

    n = 0
    while not stop.is_set():
        try:
            producer.produce(topic, b"%08d" % n, partition=n % 3, on_delivery=on_delivery)
            n += 1
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
        if n % 50 == 0:
            time.sleep(0.005)
    assert producer.flush(60) == 0


@pytest.mark.mink(nodes=3)
async def test_kafka_python_reassignment_moves_leadership_under_load(mink_trio_cluster):
    """AlterPartitionReassignments through kafka-python names another node for partition
    0 while confluent-kafka produces to it: leadership moves there (one fenced LeadBucket),
    the move is listed until the new leader has opened it, and every acknowledged record
    is read back once, at the offset it was acknowledged at."""
    from kafka import TopicPartition

    cluster = mink_trio_cluster
    await cluster.create_topic("moving", 3)
    source = (await cluster.wait_led("moving"))[0]
    target = next(n for n in (1, 2, 3) if n != source)
    bootstrap = cluster.bootstrap
    stop, acked, errors = threading.Event(), [], []

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, produce_until, bootstrap, "moving", stop, acked,
                           errors)
        try:
            with trio.fail_after(30):
                while len(acked) < 300:
                    await trio.sleep(0.05)
            answer = await in_thread(with_admin, bootstrap,
                                     lambda a: a.alter_partition_reassignments(
                                         {TopicPartition("moving", 0): [target]}))
            assert answer == {TopicPartition("moving", 0): None}
            with trio.fail_after(30):
                while cluster.leaders("moving")[0] != target:
                    await trio.sleep(0.02)
                await cluster.wait_led("moving")
                while await in_thread(with_admin, bootstrap,
                                      lambda a: a.list_partition_reassignments(
                                          {"moving": [0]})):
                    await trio.sleep(0.1)
                moved_at = len(acked)
                while sum(1 for p, _, _ in acked[moved_at:] if p == 0) < 200:
                    await trio.sleep(0.05)
        finally:
            stop.set()

    assert not errors, errors[:3]
    read = {(m.partition, m.offset, m.value) for m in await cluster.read_topic("moving")}
    assert set(acked) <= read, sorted(set(acked) - read)[:5]
    values = [m for m in await cluster.read_topic("moving")]
    assert len({m.value for m in values}) == len(values)  # no duplicates
    assert cluster.leaders("moving")[0] == target
