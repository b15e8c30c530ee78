"""Admin APIs (CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, DescribeCluster)
through stock clients, the raw protocol and `mink topics`, against a live node."""

from __future__ import annotations

import asyncio
import datetime
import sys
import time
import uuid

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.client import BlockingKafkaClient
from mink.protocol.apis import ADVERTISED, ApiKey
from mink.protocol.messages import build, nested

ZERO_UUID = uuid.UUID(int=0)
TIMEOUT = 30


# -- helpers (blocking; run in threads) --------------------------------------------------------

def confluent_admin(address: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": address})


def error_of(future) -> int | None:
    """None when an admin future succeeded, else the Kafka error code it failed with."""
    from confluent_kafka import KafkaException

    try:
        future.result(timeout=TIMEOUT)
        return None
    except KafkaException as exc:
        return exc.args[0].code()


def partition_counts(address: str) -> dict[str, int]:
    metadata = confluent_admin(address).list_topics(timeout=TIMEOUT)
    return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}


def produce(address: str, topic: str, values: list[bytes], partition: int = 0) -> list[int]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "linger.ms": 5,
                         "allow.auto.create.topics": False})
    offsets, errors = [], []

    def on_delivery(err, msg):
        (errors if err else offsets).append(err or msg.offset())

    for value in values:
        producer.produce(topic, value=value, partition=partition, on_delivery=on_delivery)
    assert producer.flush(TIMEOUT) == 0
    assert not errors, errors
    return offsets


def watermarks_and_records(address: str, topic: str, expected: int) -> tuple[tuple, list]:
    """(low, high) watermarks of partition 0, and up to `expected` records read from its start."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": "unused",
                         "enable.auto.commit": False, "allow.auto.create.topics": False})
    try:
        marks = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        records = []
        deadline = time.monotonic() + TIMEOUT
        while len(records) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert not msg.error(), msg.error()
                records.append((msg.offset(), msg.value()))
        return marks, records
    finally:
        consumer.close()


def raw(address: str, api_key: int, make_body, version: int | None = None):
    """One request (at the highest version both sides know, unless given) through the CLI's
    client; (version, response)."""
    with BlockingKafkaClient(address, TIMEOUT) as conn:
        if version is None:
            version = conn.version(api_key)
        return version, conn.call(api_key, version,
                                   make_body(load_request_schema(api_key, version)))


def create_request(*topics, validate_only=False):
    def body(schema):
        topic_schema = nested(schema, "CreatableTopic")
        config_schema = nested(schema, "CreatableTopicConfig")
        assignment_schema = nested(schema, "CreatableReplicaAssignment")
        return build(schema, validate_only=validate_only,
                     timeout=datetime.timedelta(seconds=TIMEOUT), topics=tuple(
                         topic_schema(name=t["name"], num_partitions=t.get("partitions", -1),
                                      replication_factor=t.get("rf", -1),
                                      assignments=tuple(
                                          assignment_schema(partition_index=i, broker_ids=b)
                                          for i, b in enumerate(t.get("assign", ()))),
                                      configs=tuple(config_schema(name=k, value=v)
                                                    for k, v in t.get("configs", {}).items()))
                         for t in topics))
    return body


def describe_configs_request(*resources, synonyms=False, docs=False):
    def body(schema):
        resource_schema = nested(schema, "DescribeConfigsResource")
        return build(schema, include_synonyms=synonyms, include_documentation=docs,
                     resources=tuple(resource_schema(resource_type=t, resource_name=n,
                                                     configuration_keys=keys)
                                     for t, n, keys in resources))
    return body


async def in_thread(fn, *args):
    return await trio.to_thread.run_sync(fn, *args)


# -- confluent-kafka ---------------------------------------------------------------------------

async def test_confluent_create_topics(node):
    from confluent_kafka.admin import NewTopic

    def create(*topics, validate_only=False):
        admin = confluent_admin(node)
        futures = admin.create_topics(list(topics), validate_only=validate_only,
                                      operation_timeout=TIMEOUT)
        return {name: error_of(f) for name, f in futures.items()}

    outcome = await in_thread(lambda: create(
        NewTopic("orders", 3, 1, config={"retention.ms": "3600000"}),
        NewTopic("defaults"),                                           # -1, -1: defaults
        NewTopic("placed", 2, replica_assignment=[[1], [1]]),
        NewTopic("bad-config", 1, 1, config={"retention.ms": "soon"}),
        NewTopic("unknown-config", 1, 1, config={"no.such.setting": "1"}),
        NewTopic("compacted", 1, 1, config={"cleanup.policy": "compact"}),
        NewTopic("bad-policy", 1, 1, config={"cleanup.policy": "compact,shred"}),
        NewTopic("replicated", 1, 3),
        NewTopic("two-brokers", 1, replica_assignment=[[1, 2]]),
        NewTopic("absent-broker", 1, replica_assignment=[[7]]),
        NewTopic("bad name!", 1, 1),
    ))
    assert outcome == {
        "orders": None,
        "defaults": None,
        "placed": None,
        "bad-config": ErrorCode.invalid_config,
        "unknown-config": ErrorCode.invalid_config,
        "compacted": None,
        "bad-policy": ErrorCode.invalid_config,
        "replicated": ErrorCode.invalid_replication_factor,
        "two-brokers": ErrorCode.invalid_replica_assignment,
        "absent-broker": ErrorCode.invalid_replica_assignment,
        "bad name!": ErrorCode.invalid_topic_exception,
    }
    # Created means visible at once, with their partitions led.
    counts = await in_thread(partition_counts, node)
    assert {n: counts.get(n) for n in ("orders", "defaults", "placed", "bad-config")} == {
        "orders": 3, "defaults": 1, "placed": 2, "bad-config": None}

    outcome = await in_thread(lambda: create(NewTopic("dry-run", 4, 1), validate_only=True))
    assert outcome == {"dry-run": None}
    outcome = await in_thread(lambda: create(NewTopic("orders", 3, 1), validate_only=True))
    assert outcome == {"orders": ErrorCode.topic_already_exists}
    outcome = await in_thread(lambda: create(NewTopic("orders", 5, 1)))
    assert outcome == {"orders": ErrorCode.topic_already_exists}
    counts = await in_thread(partition_counts, node)
    assert "dry-run" not in counts and counts["orders"] == 3

    # The leaders were opened before the answer: producing works straight away.
    assert await in_thread(produce, node, "placed", [b"a", b"b"], 1) == [0, 1]


async def test_replication_factors_and_assignments_up_to_the_registered_brokers(mink_postgres):
    """As Kafka: a factor of 3 on three brokers is taken (Schema Registry and Connect ask for
    3 by default), 4 is refused with Kafka's message, and so are manual assignments naming
    several registered brokers, led by the first; a partition still has one copy, its
    leader's, made durable by the object store."""
    from confluent_kafka.admin import NewTopic

    from mink.testing import open_cluster

    async with open_cluster(3, mink_postgres, proxy=False) as cluster:
        bootstrap = cluster.node(1).bootstrap

        def create():
            admin = confluent_admin(bootstrap)  # kept: its futures fail once it is destroyed
            futures = admin.create_topics(
                [NewTopic("three-copies", 2, 3), NewTopic("four-copies", 1, 4),
                 NewTopic("placed-on-two", 2, replica_assignment=[[3, 1], [2, 3]]),
                 NewTopic("placed-twice", 1, replica_assignment=[[2, 2]]),
                 NewTopic("placed-unevenly", 2, replica_assignment=[[1, 2], [3]]),
                 NewTopic("placed-on-nobody", 1, replica_assignment=[[1, 9]])],
                operation_timeout=TIMEOUT)
            outcome = {name: error_of(f) for name, f in futures.items()}
            # the metadata may come from a node whose view has not moved yet (as from a
            # Kafka broker the controller has not updated yet): until both are there
            deadline = time.monotonic() + TIMEOUT
            while True:
                described = admin.list_topics(timeout=TIMEOUT).topics
                if {"three-copies", "placed-on-two"} <= set(described):
                    break
                assert time.monotonic() < deadline, sorted(described)
                time.sleep(0.05)
            return outcome, {name: {i: (p.leader, p.replicas) for i, p in
                                    described[name].partitions.items()}
                             for name in ("three-copies", "placed-on-two")}

        outcome, partitions = await in_thread(create)
        refused = ErrorCode.invalid_replica_assignment
        assert outcome == {"three-copies": None,
                           "four-copies": ErrorCode.invalid_replication_factor,
                           "placed-on-two": None, "placed-twice": refused,
                           "placed-unevenly": refused, "placed-on-nobody": refused}
        assert len(partitions["three-copies"]) == 2
        assert all(replicas == [leader] for leader, replicas in
                   partitions["three-copies"].values())
        # a manual assignment's first broker leads (Kafka's preferred leader)
        assert partitions["placed-on-two"] == {0: (3, [3]), 1: (2, [2])}
        assert await in_thread(produce, bootstrap, "three-copies", [b"a"], 0) == [0]


async def test_confluent_describe_configs(node):
    from confluent_kafka.admin import ConfigResource, ConfigSource, NewTopic, ResourceType

    def run():
        admin = confluent_admin(node)
        assert error_of(admin.create_topics(
            [NewTopic("configured", 1, 1, config={"retention.ms": "1000",
                                                  "message.timestamp.type": "LogAppendTime"})],
            operation_timeout=TIMEOUT)["configured"]) is None
        topic = ConfigResource(ResourceType.TOPIC, "configured")
        broker = ConfigResource(ResourceType.BROKER, "1")
        missing = ConfigResource(ResourceType.TOPIC, "missing")
        futures = admin.describe_configs([topic, broker, missing])
        return (futures[topic].result(timeout=TIMEOUT), futures[broker].result(timeout=TIMEOUT),
                error_of(futures[missing]))

    topic, broker, missing = await in_thread(run)
    assert topic["retention.ms"].value == "1000"
    assert topic["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not topic["retention.ms"].is_default
    assert topic["message.timestamp.type"].value == "LogAppendTime"
    assert topic["cleanup.policy"].value == "delete"
    assert topic["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    assert topic["max.message.bytes"].value == "1048588"
    assert {"retention.bytes"} <= set(topic)

    assert broker["broker.id"].value == "1"
    assert broker["num.partitions"].value == "1"
    assert broker["auto.create.topics.enable"].value == "true"
    assert broker["default.replication.factor"].value == "1"
    assert broker["min.insync.replicas"].value == "1"
    assert broker["socket.request.max.bytes"].value == str(100 * 1024 * 1024)
    # read-only: what Mink reads from its configuration; the rest may be set dynamically
    assert broker["broker.id"].is_read_only and broker["num.partitions"].is_read_only
    assert not broker["log.retention.ms"].is_read_only
    assert not broker["log.cleanup.policy"].is_read_only
    assert missing == ErrorCode.unknown_topic_or_partition


async def test_confluent_create_partitions(node):
    from confluent_kafka.admin import NewPartitions, NewTopic

    def run():
        admin = confluent_admin(node)

        def grow(*parts, validate_only=False):
            futures = admin.create_partitions(list(parts), validate_only=validate_only,
                                              operation_timeout=TIMEOUT)
            return {name: error_of(f) for name, f in futures.items()}

        assert error_of(admin.create_topics([NewTopic("grow", 1, 1)])["grow"]) is None
        results = [grow(NewPartitions("grow", 3)),
                   grow(NewPartitions("grow", 5), validate_only=True),
                   grow(NewPartitions("grow", 2)),
                   grow(NewPartitions("grow", 3)),
                   grow(NewPartitions("nowhere", 2)),
                   grow(NewPartitions("grow", 4, replica_assignment=[[1, 2]])),
                   grow(NewPartitions("grow", 4, replica_assignment=[[9]]))]
        return results

    results = await in_thread(run)
    assert results == [
        {"grow": None},
        {"grow": None},
        {"grow": ErrorCode.invalid_partitions},
        {"grow": ErrorCode.invalid_partitions},
        {"nowhere": ErrorCode.unknown_topic_or_partition},
        {"grow": ErrorCode.invalid_replica_assignment},
        {"grow": ErrorCode.invalid_replica_assignment},
    ]
    assert (await in_thread(partition_counts, node))["grow"] == 3
    # A new partition is led and open: it takes writes.
    assert await in_thread(produce, node, "grow", [b"x"], 2) == [0]


async def test_delete_topic_then_recreate_starts_empty(node):
    from confluent_kafka.admin import NewTopic

    admin = confluent_admin(node)

    def create():
        return error_of(admin.create_topics([NewTopic("again", 1, 1)],
                                            operation_timeout=TIMEOUT)["again"])

    def delete(name):
        return error_of(admin.delete_topics([name], operation_timeout=TIMEOUT)[name])

    assert await in_thread(create) is None
    assert await in_thread(produce, node, "again", [b"old-%d" % i for i in range(5)]) == \
        list(range(5))
    marks, records = await in_thread(watermarks_and_records, node, "again", 5)
    assert marks == (0, 5) and [v for _, v in records] == [b"old-%d" % i for i in range(5)]

    assert await in_thread(delete, "again") is None
    assert "again" not in await in_thread(partition_counts, node)
    assert await in_thread(delete, "again") == ErrorCode.unknown_topic_or_partition

    assert await in_thread(create) is None
    marks, records = await in_thread(watermarks_and_records, node, "again", 0)
    assert marks == (0, 0)
    assert await in_thread(produce, node, "again", [b"fresh"]) == [0]
    marks, records = await in_thread(watermarks_and_records, node, "again", 1)
    assert marks == (0, 1) and records == [(0, b"fresh")]


# -- kafka-python and aiokafka -----------------------------------------------------------------

async def test_kafka_python_admin(node):
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.errors import TopicAlreadyExistsError

    def run():
        admin = KafkaAdminClient(bootstrap_servers=node, request_timeout_ms=TIMEOUT * 1000)
        try:
            admin.create_topics({"kp": {"num_partitions": 2, "replication_factor": 1,
                                        "configs": {"retention.ms": "5000"}}})
            counts = partition_counts(node)
            with pytest.raises(TopicAlreadyExistsError):
                admin.create_topics({"kp": {"num_partitions": 2, "replication_factor": 1}})
            configs = admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, "kp")], config_filter="all")
            admin.delete_topics(["kp"])
            return counts, configs, partition_counts(node)
        finally:
            admin.close()

    before, configs, after = await in_thread(run)
    assert before["kp"] == 2 and "kp" not in after
    entries = configs["topic"]["kp"]
    assert entries["retention.ms"]["value"] == "5000"
    assert entries["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert entries["cleanup.policy"]["config_source"] == "DEFAULT_CONFIG"


async def test_aiokafka_admin_create_topics(node):
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=node, request_timeout_ms=TIMEOUT * 1000)
        await admin.start()
        try:
            response = await admin.create_topics([NewTopic("aio", 3, 1)])
            return [tuple(t)[:2] for t in response.topic_errors], await admin.list_topics()
        finally:
            await admin.close()

    errors, topics = await in_thread(lambda: asyncio.run(run()))
    assert errors == [("aio", 0)]
    assert "aio" in topics
    assert (await in_thread(partition_counts, node))["aio"] == 3


# -- the raw protocol: what clients hide -------------------------------------------------------

async def test_create_topics_protocol_details(node):
    version, response = await in_thread(raw, node, ApiKey.CREATE_TOPICS, create_request(
        {"name": "dup", "partitions": 1}, {"name": "dup", "partitions": 2},
        {"name": "full", "partitions": 2, "configs": {"retention.ms": "60000"}},
        {"name": "zero", "partitions": 0},
        {"name": "no-rf", "partitions": 1, "rf": 0},
        {"name": "mixed", "partitions": 2, "assign": [[1], [1]]},
        {"name": "null-config", "partitions": 1, "configs": {"retention.ms": None}},
    ))
    assert version == 7
    by_name = {t.name: t for t in response.topics}
    assert len(response.topics) == len(by_name) == 6
    assert by_name["dup"].error_code == ErrorCode.invalid_request
    assert by_name["dup"].error_message == "Duplicate topic name."
    assert by_name["zero"].error_code == ErrorCode.invalid_partitions
    assert by_name["no-rf"].error_code == ErrorCode.invalid_replication_factor
    assert by_name["mixed"].error_code == ErrorCode.invalid_request
    assert by_name["null-config"].error_code == ErrorCode.invalid_config
    full = by_name["full"]
    assert full.error_code == ErrorCode.none and full.error_message is None
    assert (full.num_partitions, full.replication_factor) == (2, 1)
    configs = {c.name: (c.value, c.config_source) for c in full.configs}
    assert configs["retention.ms"] == ("60000", 1)
    assert configs["cleanup.policy"] == ("delete", 5)

    _, metadata = await in_thread(raw, node, ApiKey.METADATA, lambda schema: build(
        schema, topics=None, allow_auto_topic_creation=False,
        include_topic_authorized_operations=False))
    ids = {t.name: t.topic_id for t in metadata.topics}
    assert full.topic_id == ids["full"] != ZERO_UUID
    assert "dup" not in ids and "zero" not in ids

    # Names that differ only by '.' and '_' collide, as in Kafka; too many partitions at once.
    _, response = await in_thread(raw, node, ApiKey.CREATE_TOPICS, create_request(
        {"name": "a.b", "partitions": 1}))
    assert response.topics[0].error_code == ErrorCode.none
    _, response = await in_thread(raw, node, ApiKey.CREATE_TOPICS, create_request(
        {"name": "a_b", "partitions": 1}, {"name": "huge", "partitions": 20_000}))
    assert [t.error_code for t in response.topics] == [ErrorCode.policy_violation] * 2
    _, response = await in_thread(raw, node, ApiKey.CREATE_TOPICS, create_request(
        {"name": "a_b", "partitions": 1}))
    assert response.topics[0].error_code == ErrorCode.invalid_topic_exception
    assert "collides" in response.topics[0].error_message
    # Within one request too (the view is refreshed once, after the request's topics).
    _, response = await in_thread(raw, node, ApiKey.CREATE_TOPICS, create_request(
        {"name": "c.d", "partitions": 1}, {"name": "c_d", "partitions": 1},
        {"name": "e", "partitions": 3}))
    assert [t.error_code for t in response.topics] == [
        ErrorCode.none, ErrorCode.invalid_topic_exception, ErrorCode.none]
    assert "collides" in response.topics[1].error_message
    _, metadata = await in_thread(raw, node, ApiKey.METADATA, lambda schema: build(
        schema, topics=None, allow_auto_topic_creation=False,
        include_topic_authorized_operations=False))
    counts = {t.name: len(t.partitions) for t in metadata.topics}
    assert counts["c.d"] == 1 and counts["e"] == 3 and "c_d" not in counts


async def test_delete_topics_by_id(node):
    _, created = await in_thread(raw, node, ApiKey.CREATE_TOPICS, create_request(
        {"name": "by-id", "partitions": 1}))
    topic_id = created.topics[0].topic_id

    def delete(*states):
        def body(schema):
            state = nested(schema, "DeleteTopicState")
            return build(schema, timeout=datetime.timedelta(seconds=TIMEOUT), topics=tuple(
                state(name=name, topic_id=tid) for name, tid in states))
        return body

    unknown = uuid.uuid4()
    version, response = await in_thread(raw, node, ApiKey.DELETE_TOPICS, delete(
        (None, topic_id), (None, unknown), ("by-id", topic_id), ("never", ZERO_UUID)))
    assert version == 6
    # (kio decodes the zero uuid as None)
    results = [(r.name, r.topic_id or ZERO_UUID, r.error_code) for r in response.responses]
    assert results == [
        ("by-id", topic_id, ErrorCode.none),
        (None, unknown, ErrorCode.unknown_topic_id),
        ("by-id", topic_id, ErrorCode.invalid_request),   # both a name and an id
        ("never", ZERO_UUID, ErrorCode.unknown_topic_or_partition),
    ]
    assert "by-id" not in await in_thread(partition_counts, node)


async def test_describe_configs_protocol_details(node):
    await in_thread(raw, node, ApiKey.CREATE_TOPICS, create_request(
        {"name": "doc", "partitions": 1, "configs": {"retention.ms": "2000"}}))
    request = describe_configs_request(
        (2, "doc", ("retention.ms", "cleanup.policy", "no.such.key")),
        (4, "", None), (4, "7", None), (4, "one", None), (8, "1", None), (3, "x", None),
        (2, "bad name!", None),
        synonyms=True, docs=True)
    version, response = await in_thread(raw, node, ApiKey.DESCRIBE_CONFIGS, request)
    assert version == 4
    doc, default_broker, other, not_int, logger, cluster, bad_name = response.results
    entries = {e.name: e for e in doc.configs}
    assert set(entries) == {"retention.ms", "cleanup.policy"}
    retention = entries["retention.ms"]
    assert (retention.value, retention.config_source, retention.read_only) == ("2000", 1, False)
    assert retention.config_type == 5 and retention.documentation
    assert [(s.name, s.value, s.source) for s in retention.synonyms] == [
        ("retention.ms", "2000", 1), ("log.retention.ms", "604800000", 5)]
    # the cluster-wide default holds only dynamic configs set at its level: none here
    assert default_broker.error_code == ErrorCode.none and default_broker.configs == ()
    assert other.error_code == not_int.error_code == ErrorCode.invalid_request
    assert logger.error_code == cluster.error_code == ErrorCode.invalid_request
    assert logger.error_message and cluster.error_message
    assert bad_name.error_code == ErrorCode.invalid_topic_exception


async def test_describe_cluster(node):
    version, response = await in_thread(raw, node, ApiKey.DESCRIBE_CLUSTER, lambda schema: build(
        schema, include_cluster_authorized_operations=False, endpoint_type=1,
        include_fenced_brokers=False))
    assert version == 2
    host, port = node.split(":")
    assert response.error_code == ErrorCode.none
    assert [(b.broker_id, b.host, b.port) for b in response.brokers] == [(1, host, int(port))]
    assert response.controller_id == 1 and response.cluster_id
    assert response.endpoint_type == 1
    assert response.cluster_authorized_operations == -(2**31)
    _, response = await in_thread(raw, node, ApiKey.DESCRIBE_CLUSTER, lambda schema: build(
        schema, include_cluster_authorized_operations=False, endpoint_type=2,
        include_fenced_brokers=False))
    assert response.error_code == ErrorCode.mismatched_endpoint_type


async def test_describe_quorum_names_the_coordinator_as_the_metadata_leader(node):
    """DescribeQuorum (KRaft's, API 55): Mink's metadata log is PostgreSQL's change log and
    its controller the coordinator lease holder; every version is answered, and
    kafka-python's describe_metadata_quorum (its own integration test's checks) reads it."""
    from kafka import KafkaAdminClient

    def request(topic, index):
        def body(schema):
            return build(schema, topics=(nested(schema, "TopicData")(
                topic_name=topic, partitions=(nested(schema, "PartitionData")(
                    partition_index=index),)),))
        return body

    low, high = ADVERTISED[ApiKey.DESCRIBE_QUORUM]
    for version in range(low, high + 1):
        _, response = await in_thread(raw, node, ApiKey.DESCRIBE_QUORUM,
                                      request("__cluster_metadata", 0), version)
        assert response.error_code == ErrorCode.none, response
        (partition,) = response.topics[0].partitions
        assert (partition.error_code, partition.leader_id) == (ErrorCode.none, 1), partition
        assert partition.leader_epoch >= 0 and partition.high_watermark >= 0
        assert [r.replica_id for r in partition.current_voters] == [1]
        if version >= 2:
            assert [n.node_id for n in response.nodes] == [1]
    _, other = await in_thread(raw, node, ApiKey.DESCRIBE_QUORUM, request("orders", 0))
    assert other.topics[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition

    def kafka_python():
        client = KafkaAdminClient(bootstrap_servers=node, request_timeout_ms=TIMEOUT * 1000)
        try:
            return client.describe_metadata_quorum()
        finally:
            client.close()

    described = await in_thread(kafka_python)
    (partition,) = described["topics"][0]["partitions"]
    assert described["topics"][0]["topic_name"] == "__cluster_metadata"
    assert partition["error"] is None and partition["leader_id"] == 1
    assert len(partition["current_voters"]) == 1


async def test_every_advertised_version(node):
    """Each version of each admin API decodes, is answered, and the answer says what happened."""
    def versions(api_key):
        low, high = ADVERTISED[api_key]
        return range(low, high + 1)

    for v in versions(ApiKey.CREATE_TOPICS):
        _, response = await in_thread(raw, node, ApiKey.CREATE_TOPICS, create_request(
            {"name": f"v{v}", "partitions": 2, "configs": {"retention.ms": "1000"}}), v)
        assert response.topics[0].error_code == ErrorCode.none, (v, response)
    for v in versions(ApiKey.CREATE_PARTITIONS):
        def grow(schema):
            topic = nested(schema, "CreatePartitionsTopic")
            return build(schema, timeout=datetime.timedelta(seconds=TIMEOUT), validate_only=False,
                         topics=(topic(name=f"v{v + 2}", count=3, assignments=None),))
        _, response = await in_thread(raw, node, ApiKey.CREATE_PARTITIONS, grow, v)
        assert response.results[0].error_code == ErrorCode.none, (v, response)
    for v in versions(ApiKey.DESCRIBE_CONFIGS):
        _, response = await in_thread(raw, node, ApiKey.DESCRIBE_CONFIGS,
                                      describe_configs_request((2, "v2", None), (4, "1", None)), v)
        topic, broker = response.results
        assert {e.name: e.value for e in topic.configs}["retention.ms"] == "1000", v
        assert {e.name: e.value for e in broker.configs}["broker.id"] == "1", v
    for v in versions(ApiKey.DESCRIBE_CLUSTER):
        _, response = await in_thread(raw, node, ApiKey.DESCRIBE_CLUSTER, lambda schema: build(
            schema, include_cluster_authorized_operations=False, endpoint_type=1,
            include_fenced_brokers=False), v)
        assert [b.broker_id for b in response.brokers] == [1], v
    counts = await in_thread(partition_counts, node)
    assert {n: c for n, c in counts.items() if n.startswith("v")} == {
        "v2": 3, "v3": 3, "v4": 3, "v5": 3, "v6": 2, "v7": 2}
    for v in versions(ApiKey.DELETE_TOPICS):
        def delete(schema):
            state = getattr(sys.modules[schema.__module__], "DeleteTopicState", None)
            topics = (state(name=f"v{v + 1}", topic_id=ZERO_UUID),) if state else ()
            return build(schema, timeout=datetime.timedelta(seconds=TIMEOUT), topics=topics,
                         topic_names=(f"v{v + 1}",))
        _, response = await in_thread(raw, node, ApiKey.DELETE_TOPICS, delete, v)
        assert response.responses[0].error_code == ErrorCode.none, (v, response)
    assert not [n for n in await in_thread(partition_counts, node) if n.startswith("v")]


# -- mink topics -------------------------------------------------------------------------------

async def mink_topics(*args: str) -> tuple[int, str, str]:
    result = await trio.run_process(
        [sys.executable, "-m", "mink.cli", "topics", *args], check=False,
        capture_stdout=True, capture_stderr=True)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_mink_topics_cli(node):
    server = ("--bootstrap-server", node)
    code, out, err = await mink_topics("create", "cli-topic", "--partitions", "2",
                                       "--config", "retention.ms=1000", *server)
    assert (code, err) == (0, "") and "Created topic cli-topic with 2 partitions" in out
    assert (await in_thread(partition_counts, node))["cli-topic"] == 2

    code, out, err = await mink_topics("create", "cli-topic", *server)
    assert code == 1 and "TOPIC_ALREADY_EXISTS" in err
    code, out, err = await mink_topics("create", "cli-compact", "--config",
                                       "cleanup.policy=shred", *server)
    assert code == 1 and "INVALID_CONFIG" in err and "shred" in err

    code, out, err = await mink_topics("list", *server)
    assert code == 0
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["TOPIC", "PARTITIONS"] and ["cli-topic", "2"] in rows

    code, out, err = await mink_topics("describe", "cli-topic", *server)
    assert code == 0, err
    assert "Topic: cli-topic" in out and "2 partitions" in out
    assert "Configs: retention.ms=1000" in out
    partitions = [line.split() for line in out.splitlines()
                  if line.strip() and line.split()[0].isdigit()]
    assert [p[:2] for p in partitions] == [["0", "1"], ["1", "1"]]

    code, out, err = await mink_topics("describe", "nothing-here", *server)
    assert code == 1 and "does not exist" in err

    code, out, err = await mink_topics("delete", "cli-topic", *server)
    assert (code, out.strip()) == (0, "Deleted topic cli-topic.")
    assert "cli-topic" not in await in_thread(partition_counts, node)
    code, out, err = await mink_topics("delete", "cli-topic", *server)
    assert code == 1 and "does not exist" in err


async def test_mink_topics_cli_unreachable():
    from mink.storage.embedded_postgres import free_port

    code, out, err = await mink_topics("list", "--bootstrap-server",
                                       f"127.0.0.1:{free_port()}", "--timeout", "5")
    assert code == 1 and "cannot reach" in err


async def test_internal_topic_cannot_be_deleted_or_grown(node):
    from confluent_kafka.admin import AdminClient, NewPartitions

    from mink.protocol.topics import OFFSETS_TOPIC

    def run():
        admin = AdminClient({"bootstrap.servers": node})
        deadline = time.monotonic() + 30
        while OFFSETS_TOPIC not in admin.list_topics(timeout=10).topics:
            assert time.monotonic() < deadline, "the internal topic was not created"
            time.sleep(0.1)
        errors = []
        for future in (admin.delete_topics([OFFSETS_TOPIC])[OFFSETS_TOPIC],
                       admin.create_partitions([NewPartitions(OFFSETS_TOPIC, 60)])[OFFSETS_TOPIC]):
            try:
                future.result(20)
                errors.append(None)
            except Exception as exc:
                errors.append(exc.args[0].code())
        return errors, len(admin.list_topics(timeout=10).topics[OFFSETS_TOPIC].partitions)

    from confluent_kafka import KafkaError

    errors, partitions = await trio.to_thread.run_sync(run)
    assert errors == [KafkaError.INVALID_REQUEST, KafkaError.INVALID_REQUEST]
    from mink.testing.cluster import NODE_DEFAULTS

    assert partitions == NODE_DEFAULTS["offsets_topic_num_partitions"], "not grown to 60"
