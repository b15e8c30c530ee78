"""The Kafka surface admin clients use (issue 21): current versions, group admin, KIP-430.

Each API is exercised through the client that has it, named in the test: kafka-python 3.0's
KafkaAdminClient (version inference, DescribeTopicPartitions, ListGroups v5, OffsetFetch v8,
features), confluent-kafka (Fetch v16 with topic ids, authorized operations); a raw request
laid out from Kafka's JSON schema only where no client here sends the case (an unknown
topic id in a Fetch).
"""

from __future__ import annotations

import logging
import time
import uuid

import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.client import BlockingKafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build, nested


async def in_thread(fn, *args):
    return await trio.to_thread.run_sync(fn, *args)


def kafka_python_admin(address: str):
    from kafka import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=15000)


def confluent_produce(address: str, topic: str, values: list[bytes], partition: int = 0):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "linger.ms": 5})
    errors = []
    for value in values:
        producer.produce(topic, value, partition=partition,
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(30) == 0
    assert not errors, errors[:3]


def create_topic(address: str, name: str, partitions: int) -> None:
    from kafka.admin import NewTopic

    admin = kafka_python_admin(address)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()


# -- 1. current versions -------------------------------------------------------------------


async def test_kafka_python_infers_3_9_or_later(node):
    """kafka-python infers the broker's version from ApiVersions (Fetch v17 means 3.9,
    ListOffsets v10 means 4.0)."""
    def infer():
        admin = kafka_python_admin(node)
        try:
            return admin.get_broker_version_data(1).broker_version
        finally:
            admin.close()

    version = await in_thread(infer)
    assert version >= (3, 9), version


async def test_kafka_python_describe_features(node):
    """ApiVersions v3+ (KIP-584): only features Mink implements (group.version 1: KIP-848)."""
    def features():
        admin = kafka_python_admin(node)
        try:
            return admin.describe_features()
        finally:
            admin.close()

    described = await in_thread(features)
    assert described == {"group.version": {"supported": (0, 1), "finalized": (1, 1),
                                           "finalized_epoch": 0},
                         "transaction.version": {"supported": (0, 0)}}


async def test_confluent_consumer_fetches_by_topic_id(node):
    """librdkafka sends Fetch v16, which names the topic by id only (KIP-516): the records
    come back, so the id was resolved and the response's topic id matched."""
    from confluent_kafka import Consumer, TopicPartition

    await in_thread(create_topic, node, "by-id", 1)
    values = [b"v%d" % i for i in range(50)]
    await in_thread(confluent_produce, node, "by-id", values)

    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger = logging.getLogger("test-admin-surface.librdkafka")
    logger.addHandler(Capture())
    logger.setLevel(logging.DEBUG)

    def consume():
        consumer = Consumer({"bootstrap.servers": node, "group.id": "unused",
                             "enable.auto.commit": False, "debug": "protocol"},
                            logger=logger)
        consumer.assign([TopicPartition("by-id", 0, 0)])
        out, deadline = [], time.monotonic() + 30
        try:
            while len(out) < len(values) and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None:
                    assert not msg.error(), msg.error()
                    out.append(msg.value())
        finally:
            consumer.close()
        return out

    assert await in_thread(consume) == values
    versions = {int(line.split("Sent FetchRequest (v")[1].split(",")[0])
                for line in lines if "Sent FetchRequest (v" in line}
    assert versions and min(versions) >= 13, versions


async def test_fetch_v17_unknown_topic_id(node):
    """Raw Fetch v17 (laid out as FetchRequest.json v17): an id no topic has gets
    UNKNOWN_TOPIC_ID, echoed with that id; a known id is answered with its own id."""
    await in_thread(create_topic, node, "known-id", 1)
    await in_thread(confluent_produce, node, "known-id", [b"x"])

    def fetch(topic_ids):
        with BlockingKafkaClient(node, timeout=10) as client:
            meta = client.request(ApiKey.METADATA, lambda s: build(
                s, topics=None, allow_auto_topic_creation=False,
                include_topic_authorized_operations=False))
            known = {t.name: t.topic_id for t in meta.topics}["known-id"]
            schema = load_request_schema(ApiKey.FETCH, 17)
            topic = nested(schema, "FetchTopic")
            partition = nested(schema, "FetchPartition")
            body = build(schema, replica_id=-1, max_wait=__import__("datetime").timedelta(
                milliseconds=10), min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="",
                topics=tuple(topic(topic_id=tid or known, partitions=(partition(
                    partition=0, fetch_offset=0, partition_max_bytes=1 << 20),))
                    for tid in topic_ids))
            return known, client.call(ApiKey.FETCH, 17, body)

    stranger = uuid.uuid4()
    known, response = await in_thread(fetch, [stranger, None])
    assert [(t.topic_id, [p.error_code for p in t.partitions]) for t in response.responses] \
        == [(stranger, [ErrorCode.unknown_topic_id]), (known, [ErrorCode.none])]
    assert response.responses[1].partitions[0].records


async def test_kafka_python_list_offsets_tiered_specs(node):
    """ListOffsets v8-10 (kafka-python list_partition_offsets): EARLIEST_LOCAL is the log
    start and LATEST_TIERED is -1, as a Kafka broker without remote storage answers."""
    from kafka import TopicPartition
    from kafka.protocol.consumer.offsets import OffsetSpec

    await in_thread(create_topic, node, "specs", 1)
    await in_thread(confluent_produce, node, "specs", [b"a", b"b", b"c"])

    def offsets():
        admin = kafka_python_admin(node)
        tp = TopicPartition("specs", 0)
        try:
            return {spec.name: admin.list_partition_offsets({tp: spec})[tp].offset
                    for spec in (OffsetSpec.EARLIEST, OffsetSpec.LATEST,
                                 OffsetSpec.EARLIEST_LOCAL, OffsetSpec.LATEST_TIERED)}
        finally:
            admin.close()

    assert await in_thread(offsets) == {"EARLIEST": 0, "LATEST": 3, "EARLIEST_LOCAL": 0,
                                        "LATEST_TIERED": -1}


async def test_kafka_python_describe_topic_partitions_pages(node):
    """DescribeTopicPartitions (API 75) through kafka-python: leaders, ISR = [leader],
    topic ids, all topic operations, and a cursor when the partition limit is reached."""
    await in_thread(create_topic, node, "dtp-a", 3)
    await in_thread(create_topic, node, "dtp-b", 2)

    def describe():
        admin = kafka_python_admin(node)
        try:
            first = admin.describe_topic_partitions(["dtp-b", "dtp-a", "dtp-none"],
                                                    response_partition_limit=4)
            rest = admin.describe_topic_partitions(["dtp-b", "dtp-a", "dtp-none"],
                                                   cursor=first["next_cursor"])
            return first, rest
        finally:
            admin.close()

    first, rest = await in_thread(describe)
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]])
            for t in first["topics"]] == [("dtp-a", [0, 1, 2]), ("dtp-b", [0])]
    assert first["next_cursor"] == {"topic_name": "dtp-b", "partition_index": 1}
    assert [(t["name"], t["error_code"], [p["partition_index"] for p in t["partitions"]])
            for t in rest["topics"]] == [("dtp-b", 0, [1]),
                                         ("dtp-none", ErrorCode.unknown_topic_or_partition, [])]
    assert rest["next_cursor"] is None
    partition = first["topics"][0]["partitions"][0]
    assert partition["leader_id"] == 1 and partition["isr_nodes"] == [1]
    # KIP-430 without ACLs: every topic operation (READ..ALTER_CONFIGS, bits 3-8, 10, 11)
    ops = first["topics"][0]["topic_authorized_operations"]
    assert ops == sum(1 << b for b in (3, 4, 5, 6, 7, 8, 10, 11))


# -- 2. group admin ------------------------------------------------------------------------


def commit_as_group(address: str, group: str, topic: str, offset: int) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(bootstrap_servers=address, group_id=group,
                             enable_auto_commit=False)
    try:
        consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(offset, "", -1)})
    finally:
        consumer.close()


async def test_kafka_python_group_admin(node):
    """ListGroups v5 with type and state filters, OffsetFetch v8 for two groups in one
    request, DescribeGroups v6 with authorized operations, through kafka-python."""
    await in_thread(create_topic, node, "grouped", 1)
    await in_thread(commit_as_group, node, "group-a", "grouped", 5)
    await in_thread(commit_as_group, node, "group-b", "grouped", 7)

    def admin_calls():
        from kafka import TopicPartition

        admin = kafka_python_admin(node)
        try:
            listed = admin.list_groups(types_filter=["classic"])
            consumer_type = admin.list_groups(types_filter=["consumer"])
            stable = admin.list_groups(states_filter=["Stable"])
            empty = admin.list_groups(states_filter=["Empty"], types_filter=["Classic"])
            offsets = admin.list_group_offsets({"group-a": None,
                                                "group-b": [TopicPartition("grouped", 0)]})
            described = admin.describe_groups(["group-a", "nobody"],
                                              include_authorized_operations=True)
            return listed, consumer_type, stable, empty, offsets, described
        finally:
            admin.close()

    listed, consumer_type, stable, empty, offsets, described = await in_thread(admin_calls)
    ids = lambda groups: sorted(g["group_id"] for g in groups)  # noqa: E731
    assert ids(listed) == ["group-a", "group-b"]
    assert {g["group_type"] for g in listed} == {"classic"}
    assert ids(consumer_type) == [] and ids(stable) == []
    assert ids(empty) == ["group-a", "group-b"]
    assert {g: {(tp.topic, tp.partition): o.offset for tp, o in parts.items()}
            for g, parts in offsets.items()} == {"group-a": {("grouped", 0): 5},
                                                 "group-b": {("grouped", 0): 7}}
    by_id = described
    assert by_id["group-a"]["group_state"] == "Empty"
    # READ, DELETE, DESCRIBE (bits 3, 6, 8): every group operation, no ACLs yet
    assert sorted(by_id["group-a"]["authorized_operations"]) == ["DELETE", "DESCRIBE", "READ"]
    # v6 (KIP-1043): a group that does not exist is an error, described as Kafka's groupError
    assert "GroupIdNotFoundError" in by_id["nobody"]["error"]
    assert by_id["nobody"]["group_state"] == ""


async def test_confluent_authorized_operations(node):
    """KIP-430 through confluent-kafka: DescribeCluster, DescribeConsumerGroups and
    DescribeTopics with include_authorized_operations list every operation of the type."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclOperation, AdminClient

    await in_thread(create_topic, node, "ops", 1)
    await in_thread(commit_as_group, node, "ops-group", "ops", 1)

    def describe():
        admin = AdminClient({"bootstrap.servers": node})
        cluster = admin.describe_cluster(include_authorized_operations=True).result(15)
        groups = admin.describe_consumer_groups(["ops-group"],
                                                include_authorized_operations=True)
        topics = admin.describe_topics(TopicCollection(["ops"]),
                                       include_authorized_operations=True)
        return (cluster, groups["ops-group"].result(15), topics["ops"].result(15))

    cluster, group, topic = await in_thread(describe)
    assert set(cluster.authorized_operations) == {
        AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
        AclOperation.DESCRIBE}
    assert set(group.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE,
                                                AclOperation.DELETE}
    assert set(topic.authorized_operations) == {
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE,
        AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS}


# -- 4. topic settings ---------------------------------------------------------------------


def stored_codecs(address: str, topic: str) -> list[int]:
    """The codec bits of every stored batch of partition 0, from a raw Fetch v12 (laid out
    from FetchRequest.json): what the object store holds, byte for byte."""
    import datetime

    from mink.protocol.records import iter_batches

    with BlockingKafkaClient(address, timeout=10) as client:
        schema = load_request_schema(ApiKey.FETCH, 12)
        body = build(schema, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10),
                     min_bytes=0, max_bytes=64 << 20, isolation_level=0, session_id=0,
                     session_epoch=-1, forgotten_topics_data=(), rack_id="",
                     topics=(nested(schema, "FetchTopic")(topic=topic, partitions=(
                         nested(schema, "FetchPartition")(
                             partition=0, fetch_offset=0, partition_max_bytes=64 << 20),)),))
        records = client.call(ApiKey.FETCH, 12, body).responses[0].partitions[0].records
    return [header.compression for header, _ in iter_batches(records or b"")]


def kafka_python_values(address: str, topic: str, count: int) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False,
                             consumer_timeout_ms=10000)
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek(TopicPartition(topic, 0), 0)
    try:
        out = []
        for message in consumer:
            out.append(message.value)
            if len(out) >= count:
                break
        return out
    finally:
        consumer.close()


async def test_topic_compression_type_recompresses(node):
    """compression.type on a topic (set through confluent-kafka's AdminClient) rebuilds a
    gzip batch from confluent-kafka in the topic's codec, as Kafka's LogValidator does;
    `producer` keeps gzip; `uncompressed` stores the records raw. kafka-python reads every
    one back."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from mink.protocol import compression as codecs

    topics = {"codec-zstd": "zstd", "codec-producer": "producer",
              "codec-none": "uncompressed", "codec-lz4": "lz4"}

    def create_and_produce():
        admin = AdminClient({"bootstrap.servers": node})
        futures = admin.create_topics([NewTopic(name, 1, 1, config={"compression.type": codec})
                                       for name, codec in topics.items()])
        for future in futures.values():
            future.result(15)
        producer = Producer({"bootstrap.servers": node, "compression.type": "gzip",
                             "linger.ms": 50})
        for name in topics:
            for i in range(100):
                producer.produce(name, b"value-%d " % i * 20, partition=0)
        assert producer.flush(30) == 0

    await in_thread(create_and_produce)
    expected = [b"value-%d " % i * 20 for i in range(100)]
    wanted = {"codec-zstd": codecs.ZSTD, "codec-producer": codecs.GZIP,
              "codec-none": codecs.NONE, "codec-lz4": codecs.LZ4}
    for name, codec in wanted.items():
        found = await in_thread(stored_codecs, node, name)
        assert found and set(found) == {codec}, (name, found)
        assert await in_thread(kafka_python_values, node, name, 100) == expected, name


async def test_describe_configs_documents_ignored_settings(node):
    """A setting Mink stores but does not act on is described with why, in DescribeConfigs'
    documentation field (a raw DescribeConfigs v4 laid out from its JSON schema:
    confluent-kafka and kafka-python do not return documentation)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    def create():
        admin = AdminClient({"bootstrap.servers": node})
        admin.create_topics([NewTopic("documented", 1, 1, config={
            "segment.bytes": "1048576", "compression.type": "zstd"})])["documented"].result(15)

    await in_thread(create)

    def describe():
        with BlockingKafkaClient(node, timeout=10) as client:
            schema = load_request_schema(ApiKey.DESCRIBE_CONFIGS, 4)
            resource = nested(schema, "DescribeConfigsResource")(
                resource_type=2, resource_name="documented", configuration_keys=None)
            return client.call(ApiKey.DESCRIBE_CONFIGS, 4, build(
                schema, resources=(resource,), include_synonyms=False,
                include_documentation=True))

    response = await in_thread(describe)
    docs = {c.name: (c.value, c.documentation) for c in response.results[0].configs}
    assert docs["segment.bytes"][0] == "1048576"
    assert docs["segment.bytes"][1].startswith("Stored for Kafka tools; Mink does not act on it")
    assert "no log segments" in docs["segment.bytes"][1]
    assert docs["compression.type"][0] == "zstd"
    assert "not act" not in docs["compression.type"][1]
