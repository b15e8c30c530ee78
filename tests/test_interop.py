"""Stock Kafka clients produce to and consume from a real node (PostgreSQL + object store)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import trio

from mink.storage.embedded_postgres import free_port
from tests.support.nodes import node_config, require_tool, start_node
from tests.support.s3 import s3_options

N = 10_000


@pytest.fixture
def node_settings() -> dict:
    return dict(num_partitions=3)


@pytest.fixture
def node3(node) -> str:
    """The harness node (tests/support/nodes.py); auto-created topics have three partitions."""
    return node


# -- client helpers (blocking; run in threads) --------------------------------------------


def confluent_produce(address: str, topic: str, messages, **conf) -> list:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "linger.ms": 5, **conf})
    errors, delivered = [], []

    def on_delivery(err, msg):
        (errors if err else delivered).append(err or (msg.partition(), msg.offset()))

    for message in messages:
        while True:
            try:
                producer.produce(topic, on_delivery=on_delivery, **message)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    return delivered


def confluent_consume(address: str, topic: str, expected: int, partitions: int = 3,
                      start=0, timeout: float = 60.0, **conf) -> list:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": "unused",
                         "enable.auto.commit": False, **conf})
    consumer.assign([TopicPartition(topic, p, start) for p in range(partitions)])
    out = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert not msg.error(), msg.error()
            out.append(msg)
    finally:
        consumer.close()
    return out


def keyed(n: int) -> list[dict]:
    return [{"key": b"key-%d" % (i % 97), "value": b"value-%d" % i} for i in range(n)]


def check_per_partition_order(records: list[tuple[int, int, bytes, bytes]], n: int) -> None:
    """Nothing lost, nothing duplicated, and each partition in produce order."""
    values = [v for _, _, _, v in records]
    assert len(values) == n, f"{len(values)} consumed, {n} produced"
    assert set(values) == {b"value-%d" % i for i in range(n)}
    by_partition: dict[int, list[tuple[int, bytes, bytes]]] = {}
    for partition, offset, key, value in records:
        by_partition.setdefault(partition, []).append((offset, key, value))
    assert len(by_partition) == 3, "keys should spread over all three partitions"
    keys_seen: dict[bytes, int] = {}
    for partition, rows in by_partition.items():
        rows.sort()
        assert [o for o, _, _ in rows] == list(range(len(rows))), "offsets have holes"
        sequence = [int(v.split(b"-")[1]) for _, _, v in rows]
        assert sequence == sorted(sequence), f"partition {partition} reordered"
        for _, key, _ in rows:
            assert keys_seen.setdefault(key, partition) == partition, "a key moved partition"


# -- round trips with each client ----------------------------------------------------------


async def test_confluent_kafka_round_trip(node3):
    def run():
        confluent_produce(node3, "confluent", keyed(N), acks="all")
        msgs = confluent_consume(node3, "confluent", N)
        return [(m.partition(), m.offset(), m.key(), m.value()) for m in msgs]

    check_per_partition_order(await trio.to_thread.run_sync(run), N)


async def test_kafka_python_round_trip(node3):
    def run():
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition

        producer = KafkaProducer(bootstrap_servers=node3, enable_idempotence=False, acks="all",
                                 linger_ms=5)
        futures = [producer.send("kafka-python", **m) for m in keyed(N)]
        producer.flush(60)
        for f in futures:
            f.get(timeout=1)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=node3, enable_auto_commit=False,
                                 group_id=None, consumer_timeout_ms=10_000)
        consumer.assign([TopicPartition("kafka-python", p) for p in range(3)])
        consumer.seek_to_beginning()
        out = []
        for msg in consumer:
            out.append((msg.partition, msg.offset, msg.key, msg.value))
            if len(out) == N:
                break
        consumer.close()
        return out

    check_per_partition_order(await trio.to_thread.run_sync(run), N)


async def aiokafka_round_trip(address: str, topic: str, n: int):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    producer = AIOKafkaProducer(bootstrap_servers=address, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, **m) for m in keyed(n)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=address, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    out = []
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(3)])
        await consumer.seek_to_beginning()
        while len(out) < n:
            batches = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
            for records in batches.values():
                out += [(r.partition, r.offset, r.key, r.value) for r in records]
    finally:
        await consumer.stop()
    return out


async def test_aiokafka_round_trip(node3):
    records = await trio.to_thread.run_sync(
        lambda: asyncio.run(aiokafka_round_trip(node3, "aiokafka", N)))
    check_per_partition_order(records, N)


# -- kcat --------------------------------------------------------------------------------------


async def test_kcat_produce_consume_and_list(node3):
    kcat = require_tool("kcat")
    lines = "".join(f"k{i}:v{i}\n" for i in range(200))
    await trio.run_process([kcat, "-b", node3, "-P", "-t", "kcat", "-K:", "-z", "lz4"],
                           stdin=lines.encode())
    result = await trio.run_process(
        [kcat, "-b", node3, "-C", "-t", "kcat", "-o", "beginning", "-e", "-q",
         "-f", "%k:%s\n"], capture_stdout=True)
    assert sorted(result.stdout.decode().splitlines()) == sorted(lines.splitlines())
    listing = json.loads((await trio.run_process([kcat, "-b", node3, "-L", "-J"],
                                                 capture_stdout=True)).stdout)
    topic = next(t for t in listing["topics"] if t["topic"] == "kcat")
    assert [p["leader"] for p in topic["partitions"]] == [1, 1, 1]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_kcat_compressed_batches(node3, codec):
    kcat = require_tool("kcat")
    payload = "".join(f"{codec}-{i}-{'x' * 50}\n" for i in range(300))
    topic = f"kcat-{codec}"
    await trio.run_process([kcat, "-b", node3, "-P", "-t", topic, "-p", "0", "-z", codec],
                           stdin=payload.encode())
    result = await trio.run_process(
        [kcat, "-b", node3, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q"],
        capture_stdout=True)
    assert result.stdout.decode().splitlines() == payload.splitlines()


# -- features ------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_confluent_compression_and_headers(node3, codec):
    topic = f"compressed-{codec}"
    messages = [{"key": b"k%d" % i, "value": (b"%d-" % i) * 100,
                 "headers": [("h", b"%d" % i), ("codec", codec.encode())], "partition": 0}
                for i in range(500)]

    def run():
        confluent_produce(node3, topic, messages, **{"compression.type": codec})
        return confluent_consume(node3, topic, len(messages), partitions=1)

    got = await trio.to_thread.run_sync(run)
    assert [m.value() for m in got] == [m["value"] for m in messages]
    assert [m.headers() for m in got] == [m["headers"] for m in messages]


async def test_large_message_and_message_too_large(node3):
    from confluent_kafka import KafkaError, Producer

    big = bytes(range(256)) * (900 * 1024 // 256)

    def run():
        confluent_produce(node3, "big", [{"value": big, "partition": 0}],
                          **{"message.max.bytes": 4_000_000})
        got = confluent_consume(node3, "big", 1, partitions=1)
        producer = Producer({"bootstrap.servers": node3, "message.max.bytes": 4_000_000,
                             "compression.type": "none"})
        errors = []
        producer.produce("big", value=b"z" * 2_000_000, partition=0,
                         on_delivery=lambda err, msg: errors.append(err))
        producer.flush(30)
        return got, errors

    got, errors = await trio.to_thread.run_sync(run)
    assert got[0].value() == big
    assert errors and errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE


async def test_acks_zero_and_one(node3):
    def run():
        confluent_produce(node3, "acks0", [{"value": b"a0-%d" % i, "partition": 0}
                                           for i in range(1000)], acks=0)
        confluent_produce(node3, "acks1", [{"value": b"a1-%d" % i, "partition": 0}
                                           for i in range(1000)], acks=1)
        return (confluent_consume(node3, "acks0", 1000, partitions=1),
                confluent_consume(node3, "acks1", 1000, partitions=1))

    acks0, acks1 = await trio.to_thread.run_sync(run)
    assert [m.value() for m in acks0] == [b"a0-%d" % i for i in range(1000)]
    assert [m.value() for m in acks1] == [b"a1-%d" % i for i in range(1000)]


async def test_consume_from_a_timestamp(node3):
    from confluent_kafka import Consumer, TopicPartition

    base = 1_700_000_000_000

    def run():
        confluent_produce(node3, "times", [
            {"value": b"t%d" % i, "timestamp": base + i * 1000, "partition": 0}
            for i in range(100)])
        consumer = Consumer({"bootstrap.servers": node3, "group.id": "unused"})
        try:
            found = consumer.offsets_for_times(
                [TopicPartition("times", 0, base + 42_500)], timeout=10)
            past_end = consumer.offsets_for_times(
                [TopicPartition("times", 0, base + 10**9)], timeout=10)
        finally:
            consumer.close()
        got = confluent_consume(node3, "times", 100 - found[0].offset, partitions=1,
                                start=found[0].offset)
        return found[0].offset, past_end[0].offset, got

    offset, past_end, got = await trio.to_thread.run_sync(run)
    assert offset == 43
    assert past_end == -1  # no record that late: Kafka answers -1 (consumers go to the end)
    assert got[0].value() == b"t43" and got[0].timestamp()[1] == base + 43_000


async def test_node_killed_and_restarted_keeps_acknowledged_messages(
        pg_url, store_url, node_processes):
    config = node_config(pg_url, store_url, listener=f"127.0.0.1:{free_port()}",
                         num_partitions=3)
    first = node_processes(config)
    await trio.to_thread.run_sync(first.start)
    address = first.address
    await trio.to_thread.run_sync(
        lambda: confluent_produce(address, "durable", keyed(3000), acks="all"))
    first.kill()
    second = node_processes(config)
    await trio.to_thread.run_sync(second.start)
    msgs = await trio.to_thread.run_sync(lambda: confluent_consume(address, "durable", 3000))
    check_per_partition_order([(m.partition(), m.offset(), m.key(), m.value()) for m in msgs],
                              3000)


# -- S3 smoke tests, one per client --------------------------------------------------------


@pytest.fixture
async def s3_node(nursery, pg_url, s3_endpoint, s3_bucket_url) -> str:
    options = s3_options(s3_endpoint)
    return await start_node(nursery, node_config(
        pg_url, s3_bucket_url, num_partitions=3, s3_endpoint_url=options["endpoint_url"],
        s3_region=options["region"], s3_access_key_id=options["access_key_id"],
        s3_secret_access_key=options["secret_access_key"]))


async def test_s3_smoke_confluent(s3_node):
    def run():
        confluent_produce(s3_node, "s3", keyed(2000), acks="all")
        return confluent_consume(s3_node, "s3", 2000)

    msgs = await trio.to_thread.run_sync(run)
    check_per_partition_order([(m.partition(), m.offset(), m.key(), m.value()) for m in msgs],
                              2000)


async def test_s3_smoke_aiokafka(s3_node):
    check_per_partition_order(await trio.to_thread.run_sync(
        lambda: asyncio.run(aiokafka_round_trip(s3_node, "s3-aiokafka", 1000))), 1000)


async def test_s3_smoke_kafka_python(s3_node):
    def run():
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition

        producer = KafkaProducer(bootstrap_servers=s3_node, enable_idempotence=False)
        for m in keyed(1000):
            producer.send("s3-kafka-python", **m)
        producer.flush(60)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=s3_node, group_id=None,
                                 consumer_timeout_ms=10_000)
        consumer.assign([TopicPartition("s3-kafka-python", p) for p in range(3)])
        consumer.seek_to_beginning()
        out = []
        for m in consumer:
            out.append((m.partition, m.offset, m.key, m.value))
            if len(out) == 1000:
                break
        consumer.close()
        return out

    check_per_partition_order(await trio.to_thread.run_sync(run), 1000)


async def test_invalid_timestamp_and_streams_style_configs(node3):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    def run():
        admin = AdminClient({"bootstrap.servers": node3})
        strict = NewTopic("strict-times", 1, 1, config={
            "message.timestamp.before.max.ms": "60000",
            # What Kafka Streams sets on its internal topics: accepted, not acted on.
            "segment.bytes": "52428800", "min.insync.replicas": "1"})
        admin.create_topics([strict])["strict-times"].result(20)
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": node3})
        errors = []
        producer.produce("strict-times", value=b"old", timestamp=1_000_000_000_000,
                         on_delivery=lambda err, msg: errors.append(err))
        producer.flush(20)  # its own batch: a batch is refused whole
        producer.produce("strict-times", value=b"now",
                         on_delivery=lambda err, msg: errors.append(err))
        producer.flush(20)
        return errors

    errors = await trio.to_thread.run_sync(run)
    assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_TIMESTAMP
    assert errors[1] is None
