"""Dynamic configs: AlterConfigs and IncrementalAlterConfigs on BROKER resources (KIP-226)
and GROUP resources (KIP-848) through stock clients, stored in PostgreSQL, described as Kafka
describes them; the broker synonyms of topic settings taken as the defaults of topics
without their own value, on every node; a group's session timeout and heartbeat interval
taken by its coordinator."""

from __future__ import annotations

import datetime
import time

import pytest
import trio
from kio.schema.errors import ErrorCode

from mink.protocol.apis import ApiKey
from mink.protocol.messages import build, nested
from mink.client import BlockingKafkaClient
from tests.test_admin_apis import create_request, raw
from tests.test_consumer_groups import assigned, heartbeat
from tests.test_lifecycle import FAST, create_topic, produce_rows, wait_for_low

TIMEOUT = 30
BROKER = 4  # Kafka's ConfigResource.Type
DYNAMIC_DEFAULT_BROKER_CONFIG = 3


@pytest.fixture
def node_settings() -> dict:
    # a group's own session timeout and heartbeat interval may be short here
    return dict(group_consumer_min_session_timeout_ms=1000,
                group_consumer_min_heartbeat_interval_ms=100)


def admin(address: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": address})


OPS = {"SET": 0, "DELETE": 1, "APPEND": 2, "SUBTRACT": 3}


def alter(client, resource_name: str, *ops, validate_only: bool = False,
          kind: str = "BROKER") -> int | None:
    """IncrementalAlterConfigs of one BROKER (or `kind`) resource through confluent-kafka:
    ops are (name, op, value), op one of SET, DELETE, APPEND, SUBTRACT. None on success,
    else the error code. (librdkafka refuses the cluster default's empty name:
    `raw_alter`.)"""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    resource = ConfigResource(ResourceType[kind], resource_name, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType[op])
        for name, op, value in ops])
    future = client.incremental_alter_configs([resource],
                                              validate_only=validate_only)[resource]
    try:
        future.result(timeout=TIMEOUT)
        return None
    except KafkaException as exc:
        return exc.args[0].code()


def raw_alter(address: str, resource_name: str, *configs, incremental: bool = True,
              validate_only: bool = False) -> tuple[int, str | None]:
    """(IncrementalAlterConfigs or AlterConfigs) of one BROKER resource in raw protocol:
    configs are (name, op, value) or, not incremental, (name, value)."""
    api = ApiKey.INCREMENTAL_ALTER_CONFIGS if incremental else ApiKey.ALTER_CONFIGS

    def body(schema):
        config_schema = nested(schema, "AlterableConfig")
        entries = tuple(
            config_schema(name=c[0], config_operation=OPS[c[1]], value=c[2]) if incremental
            else config_schema(name=c[0], value=c[1]) for c in configs)
        return build(schema, validate_only=validate_only, resources=(
            nested(schema, "AlterConfigsResource")(
                resource_type=BROKER, resource_name=resource_name, configs=entries),))

    _, response = raw(address, api, body)
    (result,) = response.responses
    return result.error_code, result.error_message


def raw_describe(address: str, resource_name: str) -> dict[str, tuple[str | None, int]]:
    """DescribeConfigs of one BROKER resource in raw protocol: name -> (value, source)."""
    def body(schema):
        return build(schema, include_synonyms=True, include_documentation=False, resources=(
            nested(schema, "DescribeConfigsResource")(
                resource_type=BROKER, resource_name=resource_name, configuration_keys=None),))

    _, response = raw(address, ApiKey.DESCRIBE_CONFIGS, body)
    (result,) = response.results
    assert result.error_code == ErrorCode.none, result.error_message
    return {c.name: (c.value, c.config_source) for c in result.configs}


def describe(client, resource_name: str, kind: str = "BROKER") -> dict:
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType[kind], resource_name)
    return client.describe_configs([resource])[resource].result(timeout=TIMEOUT)


async def test_incremental_alter_configs_of_a_broker_and_of_the_cluster_default(node):
    from confluent_kafka.admin import ConfigSource

    def scenario():
        client = admin(node)
        # what librdkafka's own test (0081) and kafkajs's set: a config Mink has no use
        # for is kept and described, as Kafka keeps custom broker configs
        assert alter(client, "1", ("sasl.kerberos.min.time.before.relogin", "SET", "58000"),
                     ("background.threads", "SET", "9"),
                     ("log.cleanup.policy", "APPEND", "compact")) is None
        assert raw_alter(node, "", ("log.retention.ms", "SET", "86400000")) == (0, None)
        mine, default = describe(client, "1"), raw_describe(node, "")

        # a password is stored but never shown, as Kafka treats its PASSWORD configs
        assert alter(client, "1", ("listener.name.sasl_ssl.ssl.key.password", "SET",
                                   "hunter2")) is None
        secret = describe(client, "1")["listener.name.sasl_ssl.ssl.key.password"]
        assert (secret.value, secret.is_sensitive) == (None, True)
        kerberos = mine["sasl.kerberos.min.time.before.relogin"]
        assert (kerberos.value, kerberos.source, kerberos.is_read_only) == (
            "58000", ConfigSource.DYNAMIC_BROKER_CONFIG.value, False)
        policy = mine["log.cleanup.policy"]  # APPEND starts from Kafka's default
        assert (policy.value, policy.source) == ("delete,compact",
                                                 ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        retention = mine["log.retention.ms"]
        assert (retention.value, retention.source) == (
            "86400000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
        assert mine["broker.id"].is_read_only and mine["broker.id"].value == "1"
        # the cluster default holds only what was set at its level
        assert default == {"log.retention.ms": ("86400000", DYNAMIC_DEFAULT_BROKER_CONFIG)}

        # SUBTRACT and DELETE: back to what was there
        assert alter(client, "1", ("log.cleanup.policy", "SUBTRACT", "compact"),
                     ("background.threads", "DELETE", None)) is None
        assert raw_alter(node, "", ("log.retention.ms", "DELETE", None)) == (0, None)
        after = describe(client, "1")
        assert after["log.cleanup.policy"].value == "delete"
        assert "background.threads" not in after
        assert (after["log.retention.ms"].value, after["log.retention.ms"].source) == (
            str(7 * 24 * 3600 * 1000), ConfigSource.DEFAULT_CONFIG.value)
        assert raw_describe(node, "") == {}

        # validate_only stores nothing
        assert alter(client, "1", ("log.retention.bytes", "SET", "5"),
                     validate_only=True) is None
        assert describe(client, "1")["log.retention.bytes"].value == "-1"

    await trio.to_thread.run_sync(scenario)


async def test_broker_configs_mink_cannot_change_are_refused_and_nothing_is_stored(node):
    def scenario():
        client = admin(node)
        refused = [
            alter(client, "1", ("node.id", "SET", "7")),  # from the node's configuration
            raw_alter(node, "", ("num.partitions", "SET", "3"),
                      ("log.retention.ms", "SET", "1"))[0],  # the request whole, not half
            alter(client, "1", ("log.retention.ms", "SET", "an hour")),
            alter(client, "1", ("log.cleanup.policy", "SET", "shred")),
            alter(client, "1", ("background.threads", "APPEND", "1")),  # not a list
            raw_alter(node, "one", ("background.threads", "SET", "1"))[0],
        ]
        return refused, describe(client, "1")

    refused, described = await trio.to_thread.run_sync(scenario)
    assert refused == [ErrorCode.invalid_request] * 4 + [
        ErrorCode.invalid_config, ErrorCode.invalid_request]
    assert described["node.id"].value == "1"
    assert described["log.retention.ms"].value == str(7 * 24 * 3600 * 1000)
    assert "background.threads" not in described


async def test_alter_configs_replaces_a_brokers_configs_whole(node):
    """AlterConfigs (the API before KIP-339): keys left out go back to their defaults."""
    def scenario():
        first = raw_alter(node, "1", ("background.threads", "9"),
                          ("log.retention.bytes", "1000000"), incremental=False)
        second = raw_alter(node, "1", ("num.io.threads", "4"), incremental=False)
        return first, second, raw_describe(node, "1")

    first, second, described = await trio.to_thread.run_sync(scenario)
    assert first == second == (0, None)
    assert described["num.io.threads"] == ("4", 2)  # DYNAMIC_BROKER_CONFIG
    assert "background.threads" not in described
    assert described["log.retention.bytes"] == ("-1", 5)  # DEFAULT_CONFIG


async def test_kafka_python_alters_and_describes_broker_configs(node):
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    def scenario():
        client = KafkaAdminClient(bootstrap_servers=node, request_timeout_ms=TIMEOUT * 1000)
        try:
            outcome = [client.alter_configs([ConfigResource(
                ConfigResourceType.BROKER, "1", configs={"log.retention.bytes": "2000000"})],
                incremental=incremental) for incremental in (True, False)]
            described = client.describe_configs([ConfigResource(ConfigResourceType.BROKER,
                                                                "1")])
            return outcome, described
        finally:
            client.close()

    outcome, described = await trio.to_thread.run_sync(scenario)
    assert outcome == [{"broker": {"1": "OK"}}] * 2
    entry = described["broker"]["1"]["log.retention.bytes"]
    assert (entry["value"], entry["config_source"], entry["read_only"]) == (
        "2000000", "DYNAMIC_BROKER_CONFIG", False)


async def test_a_cluster_default_reaches_every_node_and_applies_to_topics_without_their_own(
        mink_postgres):
    """log.retention.ms set at the cluster default, through node 1: node 2 describes it
    within a sync and applies it to the topic it leads that has no retention.ms of its own;
    a topic with its own keeps it. Deleted again, the topic's describe is back to the
    default."""
    from confluent_kafka.admin import ConfigResource, ConfigSource

    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False, **FAST) as cluster:
        one, two = cluster.node(1).bootstrap, cluster.node(2).bootstrap

        def scenario():
            for name in ("inherits", "keeps"):
                extra = {"retention_ms": 3_600_000} if name == "keeps" else {}
                create_topic(one, name, partitions=2, **extra)
                produce_rows(one, name, [b"a", b"b"], partition=0)
                produce_rows(one, name, [b"c", b"d"], partition=1)
            assert raw_alter(one, "", ("log.retention.ms", "SET", "1000")) == (0, None)

            deadline = time.monotonic() + TIMEOUT
            while raw_describe(two, "2")["log.retention.ms"][0] != "1000":
                assert time.monotonic() < deadline, "node 2 never saw the cluster default"
                time.sleep(0.2)
            # both partitions (spread over the two nodes) lose their records to retention
            assert wait_for_low(two, "inherits", 2, partition=0) == (2, 2)
            assert wait_for_low(two, "inherits", 2, partition=1) == (2, 2)
            resource = ConfigResource("topic", "inherits")
            client = admin(two)  # kept referenced: a dropped one cancels its futures
            entry = client.describe_configs([resource])[resource].result(
                timeout=TIMEOUT)["retention.ms"]
            assert (entry.value, entry.source) == (
                "1000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)

            assert raw_alter(two, "", ("log.retention.ms", "DELETE", None)) == (0, None)
            # (librdkafka may ask either node, each of which sees it within a sync)
            deadline = time.monotonic() + TIMEOUT
            while True:
                entry = client.describe_configs([resource])[resource].result(
                    timeout=TIMEOUT)["retention.ms"]
                if entry.source == ConfigSource.DEFAULT_CONFIG.value:
                    break
                assert time.monotonic() < deadline, (entry.value, entry.source)
                time.sleep(0.2)
            # the topic with its own retention kept everything throughout
            return [wait_for_low(one, "keeps", 0, partition=p) for p in (0, 1)]

        assert await trio.to_thread.run_sync(scenario) == [(0, 2), (0, 2)]


async def test_a_cluster_default_cleanup_policy_compacts_topics_without_their_own(node):
    """log.cleanup.policy=compact at the cluster default: a topic without its own policy is
    compacted, so a record without a key is refused (INVALID_RECORD, as Kafka refuses it);
    a topic with its own policy is not; deleted again, the keyless record is taken."""
    def produce_keyless(topic: str):
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": node, "linger.ms": 0, "retries": 0})
        outcome = []
        producer.produce(topic, value=b"no key",
                         on_delivery=lambda err, msg: outcome.append(err.code() if err else
                                                                     msg.offset()))
        assert producer.flush(TIMEOUT) == 0
        return outcome[0]

    def scenario():
        create_topic(node, "inherits")
        create_topic(node, "own", cleanup_policy="delete")
        assert raw_alter(node, "", ("log.cleanup.policy", "SET", "compact")) == (0, None)
        refused = [produce_keyless("inherits"), produce_keyless("own")]
        # a topic created now is told so in CreateTopics' answer (v5+: its configs)
        _, created = raw(node, ApiKey.CREATE_TOPICS, create_request(
            {"name": "created-after", "partitions": 1}))
        (result,) = created.topics
        assert {c.name: (c.value, c.config_source) for c in result.configs}[
            "cleanup.policy"] == ("compact", DYNAMIC_DEFAULT_BROKER_CONFIG)
        assert raw_alter(node, "", ("log.cleanup.policy", "DELETE", None)) == (0, None)
        return refused + [produce_keyless("inherits")]

    assert await trio.to_thread.run_sync(scenario) == [ErrorCode.invalid_record, 0, 0]


async def test_group_configs_set_a_groups_session_timeout_and_heartbeat_interval(node):
    """consumer.session.timeout.ms and consumer.heartbeat.interval.ms of one group (as
    confluent-kafka's own test sets them): described as the group's, told to its members in
    every heartbeat, and a member that stops heartbeating is expelled after the group's
    timeout, not the node's (45 s, longer than this test waits)."""
    def run():
        client = admin(node)
        assert alter(client, "g-configured", ("consumer.session.timeout.ms", "SET", "1500"),
                     ("consumer.heartbeat.interval.ms", "SET", "400"), kind="GROUP") is None
        described = describe(client, "g-configured", kind="GROUP")
        assert sorted(str(e) for e in described.values() if not e.is_default) == [
            'consumer.heartbeat.interval.ms="400"', 'consumer.session.timeout.ms="1500"']
        other = describe(client, "g-other", kind="GROUP")  # any group id, as in Kafka
        assert {n: (e.value, e.is_default) for n, e in other.items()} == {
            "consumer.heartbeat.interval.ms": ("5000", True),
            "consumer.session.timeout.ms": ("45000", True)}

        create_topic(node, "grouped", partitions=4)
        with BlockingKafkaClient(node, TIMEOUT) as conn:
            a = heartbeat(conn, "g-configured", "member-a", 0, topics=["grouped"], owned=[],
                          rebalance_timeout_ms=60_000)
            assert a.heartbeat_interval == datetime.timedelta(milliseconds=400)
            (topic_id, _), = assigned(a)
            # member-a falls silent; member-b gets everything once a's 1.5 s session ends
            started = time.monotonic()
            b = heartbeat(conn, "g-configured", "member-b", 0, topics=["grouped"], owned=[],
                          rebalance_timeout_ms=60_000)
            epoch, mine = b.member_epoch, assigned(b)
            while mine != [(topic_id, [0, 1, 2, 3])]:
                assert time.monotonic() - started < TIMEOUT, "member-a was never expelled"
                time.sleep(0.3)
                b = heartbeat(conn, "g-configured", "member-b", epoch, owned=mine)
                assert b.error_code == ErrorCode.none, b
                epoch = b.member_epoch
                if b.assignment is not None:
                    mine = assigned(b)
            return time.monotonic() - started

    waited = await trio.to_thread.run_sync(run)
    assert waited >= 1.0  # not before its session ended


async def test_group_configs_out_of_bounds_or_unknown_are_refused(node):
    def run():
        client = admin(node)
        return [
            alter(client, "g", ("consumer.session.timeout.ms", "SET", "999"), kind="GROUP"),
            alter(client, "g", ("consumer.session.timeout.ms", "SET", "60001"), kind="GROUP"),
            alter(client, "g", ("consumer.session.timeout.ms", "SET", "2000"),
                  ("consumer.heartbeat.interval.ms", "SET", "2000"), kind="GROUP"),
            alter(client, "g", ("consumer.heartbeat.interval.ms", "SET", "soon"),
                  kind="GROUP"),
            alter(client, "g", ("share.record.lock.duration.ms", "SET", "30000"),
                  kind="GROUP"),
            alter(client, "g", ("consumer.session.timeout.ms", "APPEND", "1"), kind="GROUP"),
        ], describe(client, "g", kind="GROUP")

    refused, described = await trio.to_thread.run_sync(run)
    assert refused == [ErrorCode.invalid_config] * 6
    assert all(e.is_default for e in described.values())


def _mink(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "mink.cli", "configs", *args],
                          capture_output=True, text=True, timeout=TIMEOUT)


async def test_mink_configs_alters_and_describes_brokers_groups_and_topics(node):
    """`mink configs`, as `kafka-configs` is used: the brokers' cluster default, one broker,
    a group and a topic; a list value in brackets; a refusal is one line and status 1."""
    def run():
        server = ("--bootstrap-server", node)
        create_topic(node, "cli-topic")
        steps = [
            _mink("alter", *server, "--broker-default",
                  "--add-config", "log.retention.ms=3600000,log.cleanup.policy=[delete,compact]"),
            _mink("alter", *server, "--broker", "1", "--add-config", "log.retention.ms=60000"),
            _mink("alter", *server, "--group", "cli-group",
                  "--add-config", "consumer.heartbeat.interval.ms=6000"),
            _mink("alter", *server, "--topic", "cli-topic", "--add-config", "retention.ms=1000"),
        ]
        described = [_mink("describe", *server, "--broker-default"),
                     _mink("describe", *server, "--broker", "1"),
                     _mink("describe", *server, "--group", "cli-group"),
                     _mink("describe", *server, "--topic", "cli-topic")]
        refused = _mink("alter", *server, "--broker", "1", "--add-config", "node.id=2")
        removed = _mink("alter", *server, "--broker-default",
                        "--delete-config", "log.retention.ms,log.cleanup.policy")
        after = _mink("describe", *server, "--broker-default")
        return steps, described, refused, removed, after

    steps, described, refused, removed, after = await trio.to_thread.run_sync(run)
    assert [s.returncode for s in steps] == [0] * 4, [s.stderr for s in steps]
    assert steps[0].stdout == "Altered the configs of the cluster default of brokers.\n"
    default, broker, group, topic = (d.stdout.splitlines() for d in described)
    assert default == ["log.cleanup.policy=delete,compact (cluster default)",
                       "log.retention.ms=3600000 (cluster default)"]
    assert "log.retention.ms=60000 (broker)" in broker
    assert "log.cleanup.policy=delete,compact (cluster default)" in broker
    assert "node.id=1 (node configuration, read-only)" in broker
    assert group == ["consumer.heartbeat.interval.ms=6000 (group)"]
    # the topic's own value, and the cluster default it inherits
    assert "retention.ms=1000 (topic)" in topic
    assert "cleanup.policy=delete,compact (cluster default)" in topic
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("mink configs: cannot alter broker 1: INVALID_REQUEST: "
                                     "Cannot update these configs dynamically: node.id")
    assert removed.returncode == 0
    assert after.stdout == "No configs of the cluster default of brokers differ from their " \
                           "defaults.\n"


async def test_the_nodes_message_max_bytes_is_the_default_of_topics(mink_postgres, store_url):
    """Kafka's static message.max.bytes (Mink's message_max_bytes) bounds the batches of a
    topic without its own max.message.bytes, and is described as its static default; a
    topic's own value, and then a dynamic cluster default, go over it."""
    from confluent_kafka.admin import ConfigResource, ConfigSource

    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         message_max_bytes=2000) as running:
        address = running.bootstrap

        def produce_one(topic: str, size: int):
            from confluent_kafka import Producer

            producer = Producer({"bootstrap.servers": address, "linger.ms": 0,
                                 "retries": 0})
            outcome = []
            producer.produce(topic, value=b"x" * size, on_delivery=lambda err, msg:
                             outcome.append(err.code() if err else msg.offset()))
            assert producer.flush(TIMEOUT) == 0
            return outcome[0]

        def run():
            create_topic(address, "bounded")
            create_topic(address, "own", max_message_bytes=100000)
            client = admin(address)
            resource = ConfigResource("topic", "bounded")
            entry = client.describe_configs([resource])[resource].result(
                timeout=TIMEOUT)["max.message.bytes"]
            outcome = [produce_one("bounded", 3000), produce_one("own", 3000),
                       produce_one("bounded", 1000)]
            assert raw_alter(address, "", ("message.max.bytes", "SET", "100000")) == (0, None)
            outcome.append(produce_one("bounded", 3000))
            return entry, outcome

        entry, outcome = await trio.to_thread.run_sync(run)
    assert (entry.value, entry.source) == ("2000", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert outcome == [ErrorCode.message_too_large, 0, 0, 1]


async def test_list_config_resources_lists_topics_brokers_and_configured_groups(node):
    """ListConfigResources (API 74; v1 is Kafka 4.1's KIP-1142, v0 its ListClientMetrics-
    Resources): every topic, every broker and the groups with configs of their own, by
    type or all at once; a type Mink does not list is UNSUPPORTED_VERSION; v0 lists the
    client metrics resources, of which Mink has none. kafka-python's list_config_resources
    (its own integration test's check) reads it."""
    from kafka import KafkaAdminClient

    def run():
        create_topic(node, "listed-topic", 1)
        assert alter(admin(node), "g-listed", ("consumer.session.timeout.ms", "SET", "50000"),
                     kind="GROUP") is None

        def listed(version, *types):
            _, response = raw(node, ApiKey.LIST_CONFIG_RESOURCES, lambda schema: build(
                schema, **({"resource_types": types} if version else {})), version)
            return response.error_code, [
                (getattr(r, "resource_type", None), r.resource_name)
                for r in response.config_resources]

        everything = listed(1)
        only_groups = listed(1, 32)
        brokers_and_topics = listed(1, 4, 2)
        loggers = listed(1, 8)
        v0 = listed(0)
        client = KafkaAdminClient(bootstrap_servers=node, request_timeout_ms=TIMEOUT * 1000)
        try:
            by_kafka_python = client.list_config_resources()
        finally:
            client.close()
        return everything, only_groups, brokers_and_topics, loggers, v0, by_kafka_python

    everything, only_groups, brokers_and_topics, loggers, v0, by_kafka_python = (
        await trio.to_thread.run_sync(run))
    error, resources = everything
    assert error == ErrorCode.none
    assert {(32, "g-listed"), (4, "1"), (2, "listed-topic")} <= set(resources)
    assert {kind for kind, _ in resources} == {2, 4, 32}
    assert only_groups == (ErrorCode.none, [(32, "g-listed")])
    assert brokers_and_topics[0] == ErrorCode.none
    assert {kind for kind, _ in brokers_and_topics[1]} == {2, 4}
    assert loggers == (ErrorCode.unsupported_version, [])
    assert v0 == (ErrorCode.none, [])
    assert by_kafka_python["broker"] == ["1"] and "listed-topic" in by_kafka_python["topic"]
    assert by_kafka_python["group"] == ["g-listed"]
