"""The storage lifecycle through stock clients against live nodes (PostgreSQL + file://):
retention by time and by size, an idle partition emptied, the leader learning a log start
moved on another node, DeleteRecords (confluent-kafka, kafka-python), topic configs changed
with incremental_alter_configs / alter_configs without a restart."""

from __future__ import annotations

import time

import pytest
import trio

from tests.support.nodes import node_config, start_node

TIMEOUT = 30
HOUR_MS = 3600 * 1000

# Short lifecycle timings: retention every 300 ms, writer leases within a second.
FAST = dict(log_retention_check_interval_ms=300, lease_ttl=3.0, file_delete_delay_ms=0)


@pytest.fixture
def node_settings() -> dict:
    return FAST


# -- helpers (blocking; run in threads) --------------------------------------------------------

def admin(address: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": address})


def create_topic(address: str, name: str, partitions: int = 1, **configs) -> None:
    from confluent_kafka.admin import NewTopic

    client = admin(address)  # kept referenced until the answer: a dropped one cancels it
    futures = client.create_topics([NewTopic(
        name, partitions, 1, config={k.replace("_", "."): str(v) for k, v in configs.items()})])
    futures[name].result(timeout=TIMEOUT)


def produce_rows(address: str, topic: str, values: list[bytes], timestamp: int | None = None,
                 partition: int = 0) -> None:
    """One record per flush: one batch, one index row each."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "linger.ms": 0,
                         "allow.auto.create.topics": False})
    errors = []
    for value in values:
        extra = {"timestamp": timestamp} if timestamp is not None else {}
        producer.produce(topic, value=value, partition=partition,
                         on_delivery=lambda err, _msg: err and errors.append(err), **extra)
        assert producer.flush(TIMEOUT) == 0
    assert not errors, errors


def watermarks(address: str, topic: str, partition: int = 0) -> tuple[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": "unused"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                              timeout=TIMEOUT, cached=False)
    finally:
        consumer.close()


def wait_for_low(address: str, topic: str, low: int, partition: int = 0,
                 timeout: float = TIMEOUT) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while True:
        marks = watermarks(address, topic, partition)
        if marks[0] == low or time.monotonic() > deadline:
            assert marks[0] == low, f"low watermark {marks}, expected {low}"
            return marks
        time.sleep(0.2)


def consume(address: str, topic: str, start: int, expected: int, **conf) -> list:
    """(offset, value) of up to `expected` records from `start`, or the first error."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": "unused",
                         "enable.auto.commit": False, **conf})
    consumer.assign([TopicPartition(topic, 0, start)])
    out: list = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                out.append(msg.error())
                break
            out.append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    return out


def now_ms() -> int:
    return int(time.time() * 1000)


# -- retention -------------------------------------------------------------------------------

async def test_retention_by_time_moves_the_log_start(node):
    from confluent_kafka import OFFSET_BEGINNING, KafkaError

    def scenario():
        create_topic(node, "by-time", retention_ms=HOUR_MS)
        produce_rows(node, "by-time", [b"old-%d" % i for i in range(6)], now_ms() - 2 * HOUR_MS)
        produce_rows(node, "by-time", [b"new-%d" % i for i in range(3)])
        assert wait_for_low(node, "by-time", 6) == (6, 9)
        # a consumer from earliest starts at the new log start
        assert consume(node, "by-time", OFFSET_BEGINNING, 3) == [
            (6, b"new-0"), (7, b"new-1"), (8, b"new-2")]
        # below the log start: OFFSET_OUT_OF_RANGE, and auto.offset.reset applies
        assert consume(node, "by-time", 2, 1, **{"auto.offset.reset": "earliest"}) == [
            (6, b"new-0")]
        (error,) = consume(node, "by-time", 2, 1, **{"auto.offset.reset": "error"})
        assert error.code() == KafkaError._AUTO_OFFSET_RESET, error

    await trio.to_thread.run_sync(scenario)


async def test_an_idle_partition_past_retention_empties(node):
    def scenario():
        create_topic(node, "idle", retention_ms=1000)
        produce_rows(node, "idle", [b"a", b"b", b"c"])
        assert wait_for_low(node, "idle", 3) == (3, 3)

    await trio.to_thread.run_sync(scenario)


async def test_retention_by_size(node):
    def scenario():
        create_topic(node, "by-size", retention_bytes=3000)
        produce_rows(node, "by-size", [bytes([i]) * 1000 for i in range(12)])
        # Each batch is a bit over 1000 bytes. As in Kafka, the oldest goes while what is
        # left still holds retention.bytes: the newest three stay (over 3000 bytes).
        assert wait_for_low(node, "by-size", 9) == (9, 12)

    await trio.to_thread.run_sync(scenario)


async def test_cluster_default_retention_is_inherited(nursery, pg_url, store_url):
    address = await start_node(nursery, node_config(pg_url, store_url, log_retention_ms=1000,
                                                    **FAST))

    def scenario():
        from confluent_kafka.admin import ConfigResource, ConfigSource

        create_topic(address, "inherits")
        produce_rows(address, "inherits", [b"x", b"y"])
        assert wait_for_low(address, "inherits", 2) == (2, 2)
        resource = ConfigResource("topic", "inherits")
        client = admin(address)
        entries = client.describe_configs([resource])[resource].result(timeout=TIMEOUT)
        entry = entries["retention.ms"]
        assert (entry.value, entry.source) == ("1000", ConfigSource.STATIC_BROKER_CONFIG.value)
        # (confluent-kafka keys synonyms by name: the static one and Kafka's default share it)
        assert "log.retention.ms" in entry.synonyms

    await trio.to_thread.run_sync(scenario)


async def test_the_leader_learns_a_log_start_moved_on_another_node(nursery, pg_url,
                                                                   store_url):
    """Retention runs on the writer-lease holder; the other partition's leader learns the
    new log start from a notification (no change-log row) within a second."""
    one = await start_node(nursery, node_config(pg_url, store_url, node_id=1, **FAST))
    await start_node(nursery, node_config(pg_url, store_url, node_id=2, **FAST))

    def scenario():
        import psycopg

        client = admin(one)
        deadline = time.monotonic() + TIMEOUT
        while len(client.list_topics(timeout=TIMEOUT).brokers) < 2:
            assert time.monotonic() < deadline, "node 2 never showed up"
            time.sleep(0.1)
        create_topic(one, "spread", partitions=2, retention_ms=HOUR_MS)
        for p in range(2):
            produce_rows(one, "spread", [b"old"] * 3, now_ms() - 2 * HOUR_MS, partition=p)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            leaders = dict(conn.execute(
                "SELECT p.partition, p.leader_node FROM partitions p JOIN topics t USING "
                "(topic_id) WHERE t.name = 'spread'").fetchall())
            assert sorted(leaders.values()) == [1, 2], leaders
            deadline = time.monotonic() + TIMEOUT
            while True:
                starts = dict(conn.execute(
                    "SELECT p.partition, p.log_start_offset FROM partitions p JOIN topics t "
                    "USING (topic_id) WHERE t.name = 'spread'").fetchall())
                if starts == {0: 3, 1: 3} or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert starts == {0: 3, 1: 3}
            moved_at = time.monotonic()
        for p in range(2):
            wait_for_low(one, "spread", 3, partition=p, timeout=1.5)
        assert time.monotonic() - moved_at < 1.5

    await trio.to_thread.run_sync(scenario)


# -- DeleteRecords ---------------------------------------------------------------------------

async def test_delete_records_with_confluent_kafka(node):
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    def scenario():
        create_topic(node, "dr")
        produce_rows(node, "dr", [b"%d" % i for i in range(10)])
        client = admin(node)

        def delete(offset):
            tp = TopicPartition("dr", 0, offset)
            return client.delete_records([tp])[tp].result(timeout=TIMEOUT).low_watermark

        assert delete(4) == 4
        assert watermarks(node, "dr") == (4, 10)
        assert consume(node, "dr", -2, 1) == [(4, b"4")]
        with pytest.raises(KafkaException) as refused:
            delete(11)
        assert refused.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
        assert delete(2) == 4, "the low watermark never moves back"
        assert delete(-1) == 10, "-1: up to the high watermark"
        assert watermarks(node, "dr") == (10, 10)

    await trio.to_thread.run_sync(scenario)


async def test_a_list_offsets_sent_behind_delete_records_sees_its_log_start(node):
    """Kafka answers a connection's requests one after the other: a ListOffsets(earliest)
    pipelined right behind a DeleteRecords (confluent-kafka-python's own integration test
    does this through the admin client) gets the new log start, not the old one."""
    import datetime

    from kio.index import load_request_schema

    from mink.client import KafkaClient
    from mink.protocol.apis import ApiKey
    from mink.protocol.messages import build, nested

    await trio.to_thread.run_sync(create_topic, node, "dr-then-list")
    await trio.to_thread.run_sync(produce_rows, node, "dr-then-list",
                                  [b"%d" % i for i in range(5)])
    deletes = load_request_schema(ApiKey.DELETE_RECORDS, 2)
    lists = load_request_schema(ApiKey.LIST_OFFSETS, 7)
    list_body = build(lists, replica_id=-1, isolation_level=0, topics=(
        nested(lists, "ListOffsetsTopic")(name="dr-then-list", partitions=(
            nested(lists, "ListOffsetsPartition")(partition_index=0, current_leader_epoch=-1,
                                                  timestamp=-2),)),))
    async with await KafkaClient.connect(node) as client:
        for offset in (2, 3, 4):
            delete_body = build(deletes, timeout=datetime.timedelta(seconds=TIMEOUT), topics=(
                nested(deletes, "DeleteRecordsTopic")(name="dr-then-list", partitions=(
                    nested(deletes, "DeleteRecordsPartition")(partition_index=0,
                                                              offset=offset),)),))
            await client.send(ApiKey.DELETE_RECORDS, 2, delete_body)
            await client.send(ApiKey.LIST_OFFSETS, 7, list_body)
            _, deleted = await client.receive(ApiKey.DELETE_RECORDS, 2)
            _, listed = await client.receive(ApiKey.LIST_OFFSETS, 7)
            low = deleted.topics[0].partitions[0]
            earliest = listed.topics[0].partitions[0]
            assert (low.error_code, low.low_watermark) == (0, offset)
            assert (earliest.error_code, earliest.offset) == (0, offset)


async def test_list_offsets_from_a_replica_id_is_answered_by_the_leader(node):
    """ListOffsets with a replica id (>= 0, a follower's, or -2, a debug consumer's) is
    answered from the leader's log as a consumer's is; it crashed the handler (an undefined
    name), which closed the connection (kafka-python 3.1's own integration tests)."""
    from kio.index import load_request_schema

    from mink.client import KafkaClient
    from mink.protocol.apis import ApiKey
    from mink.protocol.messages import build, nested

    await trio.to_thread.run_sync(create_topic, node, "lo-replica")
    await trio.to_thread.run_sync(produce_rows, node, "lo-replica", [b"a", b"b", b"c"])
    lists = load_request_schema(ApiKey.LIST_OFFSETS, 7)
    answers = []
    async with await KafkaClient.connect(node) as client:
        for replica_id in (0, -2, -1):
            for timestamp in (-2, -1):
                body = build(lists, replica_id=replica_id, isolation_level=0, topics=(
                    nested(lists, "ListOffsetsTopic")(name="lo-replica", partitions=(
                        nested(lists, "ListOffsetsPartition")(
                            partition_index=0, current_leader_epoch=-1,
                            timestamp=timestamp),)),))
                await client.send(ApiKey.LIST_OFFSETS, 7, body)
                _, listed = await client.receive(ApiKey.LIST_OFFSETS, 7)
                answer = listed.topics[0].partitions[0]
                answers.append((replica_id, timestamp, answer.error_code, answer.offset))
    assert answers == [(r, t, 0, 0 if t == -2 else 3) for r in (0, -2, -1) for t in (-2, -1)]


async def test_delete_records_with_kafka_python(node):
    def scenario():
        from kafka import KafkaAdminClient, TopicPartition
        from kafka.errors import OffsetOutOfRangeError

        create_topic(node, "dr-kp")
        produce_rows(node, "dr-kp", [b"%d" % i for i in range(5)])
        client = KafkaAdminClient(bootstrap_servers=node, request_timeout_ms=TIMEOUT * 1000)
        try:
            tp = TopicPartition("dr-kp", 0)
            result = client.delete_records({tp: 3})
            assert result[tp]["low_watermark"] == 3
            with pytest.raises(OffsetOutOfRangeError):
                client.delete_records({tp: 6})
            assert client.delete_records({tp: -1})[tp]["low_watermark"] == 5
        finally:
            client.close()
        assert watermarks(node, "dr-kp") == (5, 5)

    await trio.to_thread.run_sync(scenario)


def raw_alter_configs(address: str, topic: str, configs: dict[str, str]):
    from kio.index import load_request_schema

    from mink.client import BlockingKafkaClient
    from mink.protocol.messages import build, nested

    with BlockingKafkaClient(address, TIMEOUT) as conn:
        version = conn.version(33)
        schema = load_request_schema(33, version)
        body = build(schema, validate_only=False, resources=(
            nested(schema, "AlterConfigsResource")(
                resource_type=2, resource_name=topic, configs=tuple(
                    nested(schema, "AlterableConfig")(name=k, value=v)
                    for k, v in configs.items())),))
        return version, conn.call(33, version, body)


# -- config APIs -----------------------------------------------------------------------------

async def test_incremental_alter_configs_takes_effect_without_a_restart(node):
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ConfigSource,
    )

    def alter(client, *entries):
        resource = ConfigResource("topic", "alter", incremental_configs=list(entries))
        return client.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT)

    def describe(client):
        resource = ConfigResource("topic", "alter")
        return client.describe_configs([resource])[resource].result(timeout=TIMEOUT)

    def scenario():
        client = admin(node)
        create_topic(node, "alter", segment_bytes=1 << 20)
        produce_rows(node, "alter", [b"a", b"b"], now_ms() - 2 * HOUR_MS)
        produce_rows(node, "alter", [b"c"])
        # every stored setting is described, also those Mink only keeps for Kafka tools
        entry = describe(client)["segment.bytes"]
        assert (entry.value, entry.source) == (str(1 << 20),
                                               ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
        entry = describe(client)["retention.ms"]
        assert (entry.value, entry.source) == ("604800000", ConfigSource.DEFAULT_CONFIG.value)
        assert watermarks(node, "alter") == (0, 3)

        alter(client, ConfigEntry("retention.ms", str(HOUR_MS),
                                  incremental_operation=AlterConfigOpType.SET))
        entry = describe(client)["retention.ms"]
        assert (entry.value, entry.source) == (str(HOUR_MS),
                                               ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
        assert [s.source for s in entry.synonyms.values()] == [
            ConfigSource.DYNAMIC_TOPIC_CONFIG.value, ConfigSource.DEFAULT_CONFIG.value]
        wait_for_low(node, "alter", 2)

        with pytest.raises(KafkaException) as refused:
            alter(client, ConfigEntry("retention.ms", "soon",
                                      incremental_operation=AlterConfigOpType.SET))
        assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
        with pytest.raises(KafkaException) as refused:
            alter(client, ConfigEntry("no.such.setting", "1",
                                      incremental_operation=AlterConfigOpType.SET))
        assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
        assert describe(client)["retention.ms"].value == str(HOUR_MS), "refusals change nothing"

        alter(client, ConfigEntry("retention.ms", None,
                                  incremental_operation=AlterConfigOpType.DELETE))
        entry = describe(client)["retention.ms"]
        assert (entry.value, entry.source) == ("604800000", ConfigSource.DEFAULT_CONFIG.value)

    await trio.to_thread.run_sync(scenario)


async def test_alter_configs_with_kafka_python_replaces_the_topic_config(node):
    def scenario():
        from kafka import KafkaAdminClient
        from kafka.admin import ConfigResource, ConfigResourceType

        create_topic(node, "replace", retention_bytes=1000, max_message_bytes=2000)
        client = KafkaAdminClient(bootstrap_servers=node, request_timeout_ms=TIMEOUT * 1000)
        from confluent_kafka.admin import ConfigResource as CResource

        def describe():
            resource = CResource("topic", "replace")
            described = admin(node)
            return described.describe_configs([resource])[resource].result(timeout=TIMEOUT)

        try:
            # IncrementalAlterConfigs (kafka-python's choice when the broker has it)
            client.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "replace",
                                                 configs={"retention.ms": "5000"})])
            entries = describe()
            assert (entries["retention.ms"].value, entries["retention.bytes"].value) == (
                "5000", "1000")
            # AlterConfigs (kafka-python fills in the other dynamic keys itself)
            client.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "replace",
                                                 configs={"retention.ms": "7000"})],
                                 incremental=False)
            assert describe()["retention.ms"].value == "7000"
        finally:
            client.close()
        # AlterConfigs as sent by a client that does not: the set given is the whole set
        _, response = raw_alter_configs(node, "replace", {"retention.ms": "6000"})
        assert [r.error_code for r in response.responses] == [0]
        entries = describe()
        assert entries["retention.ms"].value == "6000"
        assert entries["retention.bytes"].value == "-1", "left out: back to the default"
        assert entries["max.message.bytes"].value == "1048588"

    await trio.to_thread.run_sync(scenario)
