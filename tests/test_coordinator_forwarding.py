"""Coordinator forwarding (issue 25): a group or transaction-coordinator request reaching a
node that does not coordinate its group / transactional id is sent to the coordinator in an
Envelope as the client, and its answer returned as is. Real nodes, real sockets: Kafka
clients (kafka-python, confluent-kafka) through one TCP proxy that leads to node 1 only, as
behind a load balancer, and raw requests with Mink's client (kio bodies)."""

from __future__ import annotations

import datetime
import time

import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.client import KafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.envelope import serialize_principal
from mink.protocol.messages import build, decode_response, encode_request, nested
from tests.support.kafka_python import wait_for_partitions
from tests.support.one_address import one_address_cluster
from tests.test_produce_forwarding import address

NOT_COORDINATOR = int(ErrorCode.not_coordinator)
RETRIABLE = {NOT_COORDINATOR, int(ErrorCode.coordinator_not_available)}
SETTINGS = dict(offsets_topic_num_partitions=6, transaction_state_num_partitions=6)


def proxied_cluster(postgres, **settings):
    """`one_address_cluster` with this file's coordinator-topic sizes."""
    return one_address_cluster(postgres, **{**SETTINGS, **settings})


async def key_coordinated_elsewhere(cluster, prefix: str, *, transactional=False,
                                    not_by: int = 1) -> tuple[str, int]:
    """A group id (or transactional id) whose coordinator is a live node other than
    `not_by`, and that coordinator, once the coordinator topic is led. The coordinator topic
    may have been created while `not_by` was alone (a loaded machine starts nodes slowly):
    after a few seconds one key's partition is moved to another node."""
    from mink.broker.groups.coordinator import partition_for

    node = cluster.node(not_by).node
    finder = node.transactions if transactional else node.groups
    move_at = trio.current_time() + 5
    with trio.fail_after(60):
        while True:
            topic = "__transaction_state" if transactional else "__consumer_offsets"
            if move_at is not None and trio.current_time() >= move_at and (
                    topic in node.view.topics):
                move_at = None
                other = next(n.node_id for n in cluster.running_nodes() if n.node_id != not_by)
                await cluster.move_leadership(topic, partition_for(f"{prefix}-0", 6), other)
            for i in range(200):
                key = f"{prefix}-{i}"
                error, broker = finder.coordinator_for(key)
                if not error and broker.node_id != not_by:
                    coordinator = cluster.node(broker.node_id).node
                    coordinating = (coordinator.transactions if transactional
                                    else coordinator.groups).coordinator_for(key)[1]
                    if coordinating is not None and coordinating.node_id == broker.node_id:
                        return key, broker.node_id
            await trio.sleep(0.1)


def count_forwards(node) -> list[tuple[int, int]]:
    """(target, api key) of each request `node` forwarded and got answered, from now on."""
    forwards: list[tuple[int, int]] = []
    counted = node.metrics.coordinator_forwarded

    def coordinator_forwarded(target: int, api_key: int) -> None:
        forwards.append((target, int(api_key)))
        counted(target, api_key)

    node.metrics.coordinator_forwarded = coordinator_forwarded
    return forwards


def offset_fetch_body(group: str, topic: str, partitions: list[int], version: int = 7):
    schema = load_request_schema(ApiKey.OFFSET_FETCH, version)
    topic_schema = nested(schema, "OffsetFetchRequestTopic")
    return build(schema, group_id=group, require_stable=False, topics=(
        topic_schema(name=topic, partition_indexes=tuple(partitions)),))


async def committed_on(minknode, group: str, topic: str, partitions: list[int]) -> dict:
    """{partition: committed offset} asked with a raw OffsetFetch of node `minknode`."""
    async with await KafkaClient.connect(address(minknode)) as client:
        response = await client.call(ApiKey.OFFSET_FETCH, 7,
                                     offset_fetch_body(group, topic, partitions))
    assert response.error_code == ErrorCode.none, response
    return {p.partition_index: p.committed_offset for t in response.topics
            for p in t.partitions if p.error_code == ErrorCode.none}


# -- consumer groups through one address ---------------------------------------------------


async def test_consumer_groups_through_one_proxy_join_heartbeat_and_commit(mink_postgres):
    """A kafka-python and a confluent-kafka consumer group, both coordinated by another node
    than the one the proxy leads to: each joins, gets every partition, heartbeats through
    several session timeouts without a rebalance, commits offsets, and reads them back
    through the proxy; the coordinator itself has them too."""
    async with proxied_cluster(mink_postgres) as (cluster, bootstrap):
        await cluster.create_topic("cf-groups", partitions=6)
        assert set(cluster.leaders("cf-groups").values()) == {1, 2, 3}
        for client in ("kafka-python", "confluent-kafka"):
            group, coordinator = await key_coordinated_elsewhere(cluster, f"cf-{client}")
            forwards = count_forwards(cluster.node(1).node)
            run = _kafka_python_group if client == "kafka-python" else _confluent_group
            report = await trio.to_thread.run_sync(
                run, bootstrap, group, "cf-groups",
                lambda: _generation(cluster, coordinator, group))
            assert report["assigned"] == list(range(6)), (client, report)
            assert report["errors"] == [], (client, report)
            # heartbeats kept the member: the generation it joined in is still current
            assert report["generations"][0] == report["generations"][-1] >= 1, report
            wanted = {p: 100 + p for p in range(6)}
            assert report["committed"] == wanted, (client, report)
            assert await committed_on(cluster.node(coordinator), group, "cf-groups",
                                      list(range(6))) == wanted
            # node 1 forwarded them to the coordinator, did not answer them itself
            apis = {api for target, api in forwards if target == coordinator}
            assert {ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT,
                    ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH} <= apis, (client, apis)
            assert cluster.node(coordinator).node.groups.groups.get(group) is not None


def _generation(cluster, coordinator: int, group: str) -> int:
    """The group's generation on its coordinator (read from a client thread: a plain
    attribute read, -1 while unknown)."""
    found = cluster.node(coordinator).node.groups.groups.get(group)
    return found.generation if found is not None and found.members else -1


SESSION_MS = 3000  # the consumers' session timeout: the test heartbeats through 3 of them


def _kafka_python_group(bootstrap: str, group: str, topic: str, generation) -> dict:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
        session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300, auto_offset_reset="earliest",
        request_timeout_ms=20000)
    report = {"errors": [], "generations": []}
    try:
        # Without it CI saw no assignment: forwarded, the stranded SyncGroup is likelier.
        wait_for_partitions(consumer, topic)
        deadline = time.monotonic() + 60
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
        report["assigned"] = sorted(tp.partition for tp in consumer.assignment())
        report["generations"].append(generation())
        until = time.monotonic() + 3 * SESSION_MS / 1000
        while time.monotonic() < until:  # heartbeats go on in kafka-python's own thread
            consumer.poll(timeout_ms=200)
        report["generations"].append(generation())
        offsets = {TopicPartition(topic, p): OffsetAndMetadata(100 + p, "", -1)
                   for p in range(6)}
        consumer.commit(offsets)
        report["committed"] = {p: consumer.committed(TopicPartition(topic, p))
                               for p in range(6)}
    except Exception as exc:  # noqa: BLE001 - the test reports it
        report["errors"].append(repr(exc))
    finally:
        consumer.close(autocommit=False)
    return report


def _confluent_group(bootstrap: str, group: str, topic: str, generation) -> dict:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "session.timeout.ms": SESSION_MS,
                         "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest"})
    report = {"errors": [], "generations": []}
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.2)
        report["assigned"] = sorted(tp.partition for tp in consumer.assignment())
        report["generations"].append(generation())
        until = time.monotonic() + 3 * SESSION_MS / 1000
        while time.monotonic() < until:
            consumer.poll(0.2)
        report["generations"].append(generation())
        consumer.commit(offsets=[TopicPartition(topic, p, 100 + p) for p in range(6)],
                        asynchronous=False)
        report["committed"] = {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(topic, p) for p in range(6)], timeout=20)}
    except Exception as exc:  # noqa: BLE001 - the test reports it
        report["errors"].append(repr(exc))
    finally:
        consumer.close()
    return report


# -- a transactional producer through one address --------------------------------------------


async def test_a_transactional_producer_through_one_proxy_commits_and_aborts(mink_postgres):
    """A confluent-kafka transactional producer through the proxy, its transaction
    coordinator on another node: one transaction over every partition committed, one
    aborted; a read_committed consumer reading from the leaders directly sees the committed
    one's records only, each once."""
    async with proxied_cluster(mink_postgres) as (cluster, bootstrap):
        await cluster.create_topic("cf-txn", partitions=6)
        assert set(cluster.leaders("cf-txn").values()) == {1, 2, 3}
        transactional_id, coordinator = await key_coordinated_elsewhere(
            cluster, "cf-txn", transactional=True)
        forwards = count_forwards(cluster.node(1).node)
        report = await trio.to_thread.run_sync(_transactions, bootstrap, transactional_id,
                                               "cf-txn")
        assert report["errors"] == [], report
        apis = {api for target, api in forwards if target == coordinator}
        assert {ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN,
                ApiKey.END_TXN} <= apis, apis
        direct = address(cluster.node(2))  # the INTERNAL listener: the leaders themselves
        values = await trio.to_thread.run_sync(_read_committed, direct, "cf-txn", 60)
        assert sorted(values) == sorted(b"commit-%d" % i for i in range(60)), values[:10]


def _transactions(bootstrap: str, transactional_id: str, topic: str) -> dict:
    from confluent_kafka import KafkaException, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "linger.ms": 5, "transaction.timeout.ms": 60000})
    report = {"errors": []}

    def on_delivery(err, message):
        if err is not None:
            report["errors"].append(str(err))

    try:
        producer.init_transactions(60)
        for outcome in ("commit", "abort"):
            producer.begin_transaction()
            for i in range(60):
                producer.produce(topic, value=b"%s-%d" % (outcome.encode(), i),
                                 partition=i % 6, on_delivery=on_delivery)
            producer.flush(60)
            if outcome == "commit":
                producer.commit_transaction(60)
            else:
                producer.abort_transaction(60)
    except KafkaException as exc:
        report["errors"].append(str(exc))
    return report


def _read_committed(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cf-check",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(6)])
    got = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.3)
            if message is None:
                if len(got) >= count:
                    break  # and a quiet poll after the last: nothing more comes
                continue
            if not message.error():
                got.append(message.value())
    finally:
        consumer.close()
    return got


def test_every_coordinated_request_names_its_keys_at_every_version():
    """The fields coordinated_keys reads exist in every version this node serves (a wrong
    name would close the client's connection)."""
    import dataclasses

    from mink.broker.server.coordinator_forwarding import COORDINATED, coordinated_keys
    from mink.protocol.apis import ADVERTISED

    class Fields:
        def __init__(self, schema):
            self._names = {f.name for f in dataclasses.fields(schema)}

        def __getattr__(self, name):
            if name not in self._names:
                raise AttributeError(name)
            return () if name in ("groups", "groups_names", "group_ids", "transactions",
                                  "transactional_ids") else "key"

    for api_key in COORDINATED:
        low, high = ADVERTISED[api_key]
        for version in range(low, high + 1):
            keys = coordinated_keys(api_key, version,
                                    Fields(load_request_schema(api_key, version)))
            assert keys is not None and keys[1] in ([], ["key"]), (api_key, version, keys)


# -- one hop, and bounds ----------------------------------------------------------------------


def heartbeat_body(group: str, version: int = 4):
    return build(load_request_schema(ApiKey.HEARTBEAT, version), group_id=group,
                 generation_id=1, member_id="nobody", group_instance_id=None)


async def test_a_group_request_in_an_envelope_is_not_forwarded_again(mink_postgres,
                                                                       monkeypatch):
    """An Envelope with a Heartbeat of a group node 2 coordinates, sent to node 1 (as another
    node would): NOT_COORDINATOR there, nothing reaches node 2. The same Heartbeat sent
    plainly to node 1 is forwarded: node 2 answers it (as its coordinator)."""
    from kio.schema.envelope.v0 import EnvelopeRequest

    from mink.broker.server import handlers
    from mink.testing import open_cluster

    envelopes = []
    served = handlers.HANDLERS[ApiKey.ENVELOPE]

    async def counted(node, ctx, request):
        envelopes.append(node.node_id)
        return await served(node, ctx, request)

    monkeypatch.setitem(handlers.HANDLERS, ApiKey.ENVELOPE, counted)
    async with open_cluster(2, mink_postgres, proxy=False, **SETTINGS) as cluster:
        group, coordinator = await key_coordinated_elsewhere(cluster, "cf-once")
        assert coordinator == 2
        inner = heartbeat_body(group)
        async with await KafkaClient.connect(address(cluster.node(1))) as client:
            answer = await client.call(ApiKey.ENVELOPE, 0, EnvelopeRequest(
                request_data=encode_request(ApiKey.HEARTBEAT, 4, 5, inner, "app")[4:],
                request_principal=serialize_principal("User", "ANONYMOUS"),
                client_host_address=bytes([127, 0, 0, 1])))
            assert answer.error_code == ErrorCode.none
            _, response = decode_response(ApiKey.HEARTBEAT, 4, answer.response_data)
            assert response.error_code == ErrorCode.not_coordinator
            assert envelopes == [1]  # the one sent here, none onwards
            response = await client.call(ApiKey.HEARTBEAT, 4, inner)
        assert response.error_code != ErrorCode.not_coordinator  # node 2 coordinates it
        assert envelopes == [1, 2]


async def test_with_coordinator_forwarding_off_a_group_request_answers_not_coordinator(
        mink_postgres):
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False, coordinator_forwarding=False,
                            **SETTINGS) as cluster:
        group, _ = await key_coordinated_elsewhere(cluster, "cf-off")
        async with await KafkaClient.connect(address(cluster.node(1))) as client:
            response = await client.call(ApiKey.HEARTBEAT, 4, heartbeat_body(group))
        assert response.error_code == ErrorCode.not_coordinator


async def test_an_unreachable_coordinator_is_answered_within_its_bound(mink_postgres):
    """Node 2, the group's coordinator, killed and its port taken by a listener that accepts
    and never answers (node 2 still in the view: long leases). A JoinGroup through node 1
    (rebalance timeout 1 s) is answered NOT_COORDINATOR within its rebalance timeout and the
    margin; a Heartbeat to a port that refuses is answered at once."""
    from mink.broker.server.coordinator_forwarding import ANSWER_MARGIN
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False, lease_ttl=60.0,
                            **SETTINGS) as cluster:
        group, coordinator = await key_coordinated_elsewhere(cluster, "cf-dead")
        host, port = cluster.node(2).node.view.brokers[2].host, \
            cluster.node(2).node.view.brokers[2].port
        await cluster.kill(2)
        first = cluster.node(1)
        assert 2 in first.node.view.brokers
        async with await KafkaClient.connect(address(first)) as client:
            started = trio.current_time()
            response = await client.call(ApiKey.HEARTBEAT, 4, heartbeat_body(group))
            assert response.error_code in RETRIABLE, response
            assert trio.current_time() - started < 2.0  # refused: answered at once
            accepted = []

            async def black_hole(stream):
                accepted.append(stream)
                await trio.sleep_forever()

            async with trio.open_nursery() as nursery:
                listeners = await trio.open_tcp_listeners(port, host=host)
                nursery.start_soon(trio.serve_listeners, black_hole, listeners)
                schema = load_request_schema(ApiKey.JOIN_GROUP, 5)
                join = build(
                    schema, group_id=group, session_timeout=datetime.timedelta(seconds=6),
                    rebalance_timeout=datetime.timedelta(seconds=1), member_id="",
                    group_instance_id=None, protocol_type="consumer", protocols=(
                        nested(schema, "JoinGroupRequestProtocol")(name="range",
                                                                   metadata=b""),))
                started = trio.current_time()
                with trio.fail_after(1.0 + ANSWER_MARGIN + 3.0):
                    response = await client.call(ApiKey.JOIN_GROUP, 5, join)
                took = trio.current_time() - started
                nursery.cancel_scope.cancel()
            assert accepted  # it did reach the black hole
            assert response.error_code in RETRIABLE, response
            assert 1.0 + ANSWER_MARGIN - 0.5 <= took, took


async def test_acls_are_checked_on_the_coordinator_as_the_client(mink_postgres):
    """alice may DESCRIBE the group, bob may not, the inter-broker user `broker` has only
    CLUSTER_ACTION: alice's OffsetFetch through node 1, of a group node 2 coordinates, is
    answered (so node 2 checked it as alice, not as `broker`), bob's is
    GROUP_AUTHORIZATION_FAILED, both answered by node 2."""
    from mink.testing import open_cluster
    from tests.support.security import create_users, endpoints
    from tests.test_acls import binding, create_acls
    from tests.test_produce_forwarding import SECURED, USERS, login

    async with open_cluster(2, mink_postgres, proxy=False, **SECURED, **SETTINGS) as cluster:
        group, coordinator = await key_coordinated_elsewhere(cluster, "cf-acl")
        plain = endpoints(cluster.node(1))["PLAINTEXT"]
        await trio.to_thread.run_sync(create_users, plain, USERS)
        await trio.to_thread.run_sync(create_acls, plain, [
            binding("CLUSTER", "kafka-cluster", "User:broker", "CLUSTER_ACTION"),
            binding("GROUP", group, "User:alice", "DESCRIBE")])
        forwards = count_forwards(cluster.node(1).node)
        body = offset_fetch_body(group, "cf-acl-topic", [0])
        client_listener = endpoints(cluster.node(1))["CLIENT"]
        with trio.fail_after(20):  # the ACLs reach both views
            while True:
                async with await KafkaClient.connect(client_listener,
                                                     security=login("alice")) as alice:
                    answer = await alice.call(ApiKey.OFFSET_FETCH, 7, body)
                if answer.error_code != ErrorCode.group_authorization_failed:
                    break
                await trio.sleep(0.1)
        assert answer.error_code == ErrorCode.none, answer
        async with await KafkaClient.connect(client_listener, security=login("bob")) as bob:
            answer = await bob.call(ApiKey.OFFSET_FETCH, 7, body)
        assert answer.error_code == ErrorCode.group_authorization_failed, answer
        assert forwards and {target for target, _ in forwards} == {coordinator}
        assert len(forwards) >= 2  # alice's and bob's were both answered by node 2


# -- consume through one address (needs fetch through any node) ------------------------------


async def test_a_consumer_through_one_proxy_reads_every_partition(mink_postgres):
    """Produced through the proxy with idempotence to every partition of a topic led across
    the three nodes, then consumed through the proxy by a confluent-kafka consumer group
    and a kafka-python one: every record once, nothing lost."""
    from tests.test_produce_forwarding import _produce_idempotent

    async with proxied_cluster(mink_postgres) as (cluster, bootstrap):
        await cluster.create_topic("fwd-lb", partitions=6)
        assert set(cluster.leaders("fwd-lb").values()) == {1, 2, 3}
        count = 1200
        report = await trio.to_thread.run_sync(_produce_idempotent, bootstrap, "fwd-lb",
                                               count)
        assert report["errors"] == [] and report["delivered"] == count, report
        wanted = sorted(b"%d" % i for i in range(count))
        for consume in (_consume_confluent, _consume_kafka_python):
            group, _ = await key_coordinated_elsewhere(cluster, f"cf-read-{consume.__name__}")
            values = await trio.to_thread.run_sync(consume, bootstrap, group, "fwd-lb", count)
            assert sorted(values) == wanted, (consume.__name__, len(values))


def _consume_confluent(bootstrap: str, group: str, topic: str, count: int) -> list:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.3)
            if message is not None and not message.error():
                got.append(message.value())
    finally:
        consumer.close()
    return got


def _consume_kafka_python(bootstrap: str, group: str, topic: str, count: int) -> list:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    got = []
    deadline = time.monotonic() + 30
    try:
        wait_for_partitions(consumer, topic)
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=300).values():
                got.extend(r.value for r in records)
    finally:
        consumer.close(autocommit=False)
    return got
