"""Produce forwarding (issue 25): a Produce naming partitions another node leads is split,
each part sent to its leader inside an Envelope as the client's principal, and the answers
merged into one response in the request's order. Real nodes, real sockets; raw requests
with Mink's client (kio bodies), librdkafka through a TCP proxy as behind a load balancer.
"""

from __future__ import annotations

import collections
import datetime

import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.client import ClientSecurity, KafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.envelope import serialize_principal
from mink.protocol.messages import build, decode_response, nested
from mink.protocol.records import Record
from tests.support.batches import records_batch

NOT_LEADER = int(ErrorCode.not_leader_or_follower)
TOPIC_AUTH = int(ErrorCode.topic_authorization_failed)
VERSION = 10  # KIP-951 fields


def address(minknode) -> str:
    host, port = minknode.node.advertised
    return f"{host}:{port}"


def batch(tag: str, n: int = 3, **header) -> bytes:
    return records_batch([Record(i, i, None, f"{tag}-{i}".encode()) for i in range(n)],
                         **header)


def produce_body(parts: list[tuple[str, list[tuple[int, bytes]]]], *, acks: int = -1,
                 version: int = VERSION, timeout_s: float = 10.0, transactional_id=None):
    """A Produce naming `parts` in this order: [(topic, [(partition, records), ...]), ...]."""
    schema = load_request_schema(ApiKey.PRODUCE, version)
    topic_schema = nested(schema, "TopicProduceData")
    partition_schema = nested(schema, "PartitionProduceData")
    return build(schema, transactional_id=transactional_id, acks=acks,
                 timeout=datetime.timedelta(seconds=timeout_s),
                 topic_data=tuple(topic_schema(name=name, partition_data=tuple(
                     partition_schema(index=i, records=r) for i, r in partitions))
                     for name, partitions in parts))


def answered(response) -> list[tuple[str, int, int, int]]:
    """(topic, partition, error, base offset) in the response's order."""
    return [(t.name, p.index, int(p.error_code), p.base_offset)
            for t in response.responses for p in t.partition_responses]


def led_by(cluster, topic: str) -> dict[int, list[int]]:
    by_node = collections.defaultdict(list)
    for partition, leader in sorted(cluster.leaders(topic).items()):
        by_node[leader].append(partition)
    return by_node


def consume(bootstrap: str, topic: str, partitions: list[int], count: int,
            timeout: float = 30.0) -> list[tuple[int, int, bytes]]:
    """Blocking: (partition, offset, value) read with confluent-kafka from the leaders."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fwd-check",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    got = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            got.append((message.partition(), message.offset(), message.value()))
    finally:
        consumer.close()
    return got


async def test_a_produce_to_a_non_leader_is_forwarded_and_merged_in_request_order(
        mink_postgres):
    """Node 1 gets a Produce naming partitions of node 2 and of its own, interleaved, over
    two topics: every partition is answered with success in the request's order, the
    offsets follow each partition's order across pipelined requests, and a confluent-kafka
    consumer reads everything from the leaders."""
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False) as cluster:
        await cluster.create_topic("fwd-a", partitions=4)
        await cluster.create_topic("fwd-b", partitions=2)
        a, b = led_by(cluster, "fwd-a"), led_by(cluster, "fwd-b")
        assert a[1] and a[2], a  # spread: (i + start) % n
        first = cluster.node(1)
        # interleaved: remote, local, remote...; the second topic first
        order_a = [a[2][0], a[1][0], a[2][-1], a[1][-1]]
        order_b = [b[2][0], b[1][0]] if b[1] and b[2] else list(sorted(cluster.leaders(
            "fwd-b")))
        rounds = 5
        async with await KafkaClient.connect(address(first)) as client:
            sent = []
            for r in range(rounds):  # pipelined: all sent before any answer is read
                body = produce_body([
                    ("fwd-b", [(p, batch(f"b{p}-r{r}")) for p in order_b]),
                    ("fwd-a", [(p, batch(f"a{p}-r{r}")) for p in order_a])])
                sent.append(await client.send(ApiKey.PRODUCE, VERSION, body))
            for r in range(rounds):
                correlation_id, response = await client.receive(ApiKey.PRODUCE, VERSION)
                assert correlation_id == sent[r]
                got = answered(response)
                assert [(t, p) for t, p, _, _ in got] == (
                    [("fwd-b", p) for p in order_b] + [("fwd-a", p) for p in order_a])
                assert all(error == 0 for _, _, error, _ in got), got
                assert all(offset == 3 * r for _, _, _, offset in got), got
        messages = await cluster.read_topic("fwd-a")
        for p in order_a:
            values = [m.value for m in messages if m.partition == p]
            assert values == [f"a{p}-r{r}-{i}".encode() for r in range(rounds)
                              for i in range(3)]
        read = await trio.to_thread.run_sync(consume, address(cluster.node(2)), "fwd-a",
                                             order_a, rounds * 3 * len(order_a))
        for p in order_a:
            mine = [v for q, _, v in sorted(read) if q == p]
            assert mine == [f"a{p}-r{r}-{i}".encode() for r in range(rounds)
                            for i in range(3)]


async def test_with_forwarding_off_the_remote_partitions_answer_not_leader(mink_postgres):
    """The same mixed request with produce_forwarding off: the local partition is written,
    the remote one answers NOT_LEADER_OR_FOLLOWER with its leader (KIP-951)."""
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False, produce_forwarding=False) as cluster:
        await cluster.create_topic("nofwd", partitions=2)
        a = led_by(cluster, "nofwd")
        async with await KafkaClient.connect(address(cluster.node(1))) as client:
            response = await client.call(ApiKey.PRODUCE, VERSION, produce_body(
                [("nofwd", [(a[2][0], batch("r")), (a[1][0], batch("l"))])]))
        got = answered(response)
        assert got[0][2] == NOT_LEADER and got[1][2] == 0, got
        remote = response.responses[0].partition_responses[0]
        assert remote.current_leader.leader_id == 2
        assert [e.node_id for e in response.node_endpoints] == [2]


async def test_acks_zero_is_forwarded_without_a_response(mink_postgres):
    """acks=0 through the non-leader: no Produce response (the next answer on the
    connection is the ApiVersions sent after it), and the records reach the leader."""
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False) as cluster:
        await cluster.create_topic("fwd-acks0", partitions=2)
        remote = led_by(cluster, "fwd-acks0")[2][0]
        async with await KafkaClient.connect(address(cluster.node(1))) as client:
            for r in range(3):
                await client.send(ApiKey.PRODUCE, VERSION, produce_body(
                    [("fwd-acks0", [(remote, batch(f"z{r}"))])], acks=0))
            asked = await client.send(ApiKey.API_VERSIONS, 0,
                                      build(load_request_schema(ApiKey.API_VERSIONS, 0)))
            correlation_id, _ = await client.receive(ApiKey.API_VERSIONS, 0)
            assert correlation_id == asked
        with trio.fail_after(15):
            while True:
                values = [m.value for m in await cluster.read_topic("fwd-acks0")
                          if m.partition == remote]
                if len(values) == 9:
                    break
                await trio.sleep(0.05)
        assert values == [f"z{r}-{i}".encode() for r in range(3) for i in range(3)]


async def test_a_request_in_an_envelope_is_not_forwarded_again(mink_postgres, monkeypatch):
    """An Envelope with a Produce for node 2's partition sent to node 1 (as another node
    would): answered NOT_LEADER_OR_FOLLOWER there, nothing reaches node 2."""
    from kio.schema.envelope.v0 import EnvelopeRequest

    from mink.broker.server import handlers
    from mink.protocol.messages import encode_request
    from mink.testing import open_cluster

    envelopes = []
    served = handlers.HANDLERS[ApiKey.ENVELOPE]

    async def counted(node, ctx, request):
        envelopes.append(node.node_id)
        return await served(node, ctx, request)

    monkeypatch.setitem(handlers.HANDLERS, ApiKey.ENVELOPE, counted)
    async with open_cluster(2, mink_postgres, proxy=False) as cluster:
        await cluster.create_topic("fwd-once", partitions=2)
        remote = led_by(cluster, "fwd-once")[2][0]
        inner = produce_body([("fwd-once", [(remote, batch("x"))])])
        async with await KafkaClient.connect(address(cluster.node(1))) as client:
            answer = await client.call(ApiKey.ENVELOPE, 0, EnvelopeRequest(
                request_data=encode_request(ApiKey.PRODUCE, VERSION, 5, inner, "app")[4:],
                request_principal=serialize_principal("User", "ANONYMOUS"),
                client_host_address=bytes([127, 0, 0, 1])))
        assert answer.error_code == ErrorCode.none
        _, response = decode_response(ApiKey.PRODUCE, VERSION, answer.response_data)
        assert answered(response) == [("fwd-once", remote, NOT_LEADER, -1)]
        assert response.responses[0].partition_responses[0].current_leader.leader_id == 2
        assert envelopes == [1]  # the one sent here, none onwards
        # and a plain Produce to node 1 is forwarded: node 2 receives one Envelope
        async with await KafkaClient.connect(address(cluster.node(1))) as client:
            response = await client.call(ApiKey.PRODUCE, VERSION, inner)
        assert answered(response) == [("fwd-once", remote, 0, 0)]
        assert envelopes == [1, 2]


async def test_a_restarted_leader_is_reached_again(mink_postgres):
    """The pooled connection to node 2 is lost when node 2 restarts: the next forwarded
    Produce reconnects (a retriable error at most while node 2 comes back)."""
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False) as cluster:
        await cluster.create_topic("fwd-restart", partitions=2)
        remote = led_by(cluster, "fwd-restart")[2][0]
        first = cluster.node(1)
        async with await KafkaClient.connect(address(first)) as client:
            response = await client.call(ApiKey.PRODUCE, VERSION, produce_body(
                [("fwd-restart", [(remote, batch("before"))])]))
            assert answered(response)[0][2] == 0
            assert first.node.peers.connected(2)
            await cluster.restart(2)
            errors = []
            with trio.fail_after(30):
                while True:
                    response = await client.call(ApiKey.PRODUCE, VERSION, produce_body(
                        [("fwd-restart", [(remote, batch("after"))])]))
                    error = answered(response)[0][2]
                    if error == 0:
                        break
                    errors.append(error)
                    await trio.sleep(0.1)
        retriable = {NOT_LEADER, int(ErrorCode.request_timed_out)}
        assert set(errors) <= retriable, errors
        values = [m.value for m in await cluster.read_topic("fwd-restart")
                  if m.partition == remote]
        assert values[:3] == [b"before-0", b"before-1", b"before-2"]
        assert values[-3:] == [b"after-0", b"after-1", b"after-2"]


async def test_a_dead_leader_is_waited_for_within_the_timeout(mink_postgres):
    """Node 2 killed: a Produce for its partition through node 1 is answered within its
    timeout_ms (and a margin) with NOT_LEADER_OR_FOLLOWER, never left hanging; once the
    partition moved to node 1, the client's retry is written there."""
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False) as cluster:
        await cluster.create_topic("fwd-dead", partitions=2)
        remote = led_by(cluster, "fwd-dead")[2][0]
        await cluster.kill(2)
        async with await KafkaClient.connect(address(cluster.node(1))) as client:
            started = trio.current_time()
            response = await client.call(ApiKey.PRODUCE, VERSION, produce_body(
                [("fwd-dead", [(remote, batch("dead"))])], timeout_s=1.5))
            took = trio.current_time() - started
            assert answered(response)[0][2] == NOT_LEADER, answered(response)
            # waited for the leader (retrying to reach it) up to timeout_ms, no longer
            assert 1.0 <= took < 1.5 + 2.5, took
            with trio.fail_after(30):
                while True:
                    response = await client.call(ApiKey.PRODUCE, VERSION, produce_body(
                        [("fwd-dead", [(remote, batch("moved"))])], timeout_s=1.5))
                    if answered(response)[0][2] == 0:
                        break
                    assert answered(response)[0][2] == NOT_LEADER, answered(response)
        values = [m.value for m in await cluster.read_topic("fwd-dead")
                  if m.partition == remote]
        assert values == [b"moved-0", b"moved-1", b"moved-2"]


async def test_transactional_and_idempotent_checks_happen_on_the_leader(mink_postgres):
    """A transactional producer's batches sent to the non-leader: refused by the leader
    (INVALID_TXN_STATE) before the partition is added to the transaction (KIP-890), then
    written; a retried batch answers its first offset, a sequence gap
    OUT_OF_ORDER_SEQUENCE_NUMBER; the commit makes it readable."""
    from kio.schema.find_coordinator.v3 import FindCoordinatorRequest

    from mink.protocol.records import build_batch
    from mink.testing import open_cluster
    from tests.test_transactions import _txn_requests

    init, add, end, _ = _txn_requests()
    async with open_cluster(2, mink_postgres, proxy=False) as cluster:
        await cluster.create_topic("fwd-txn", partitions=2)
        remote = led_by(cluster, "fwd-txn")[2][0]
        with trio.fail_after(30):
            while True:
                async with await KafkaClient.connect(address(cluster.node(1))) as client:
                    found = await client.call(ApiKey.FIND_COORDINATOR, 3,
                                              FindCoordinatorRequest(key="fwd-t", key_type=1))
                    if found.error_code == ErrorCode.none:
                        coordinator = f"{found.host}:{found.port}"
                        async with await KafkaClient.connect(coordinator) as txn:
                            answer = await txn.call(22, 4, init("fwd-t"))
                        if answer.error_code == ErrorCode.none:
                            break
                await trio.sleep(0.1)
        pid, epoch = answer.producer_id, answer.producer_epoch

        def body(seq: int, value: bytes):
            records = build_batch([Record(0, 0, None, value)], producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq,
                                  is_transactional=True)
            return produce_body([("fwd-txn", [(remote, records)])], transactional_id="fwd-t")

        async with await KafkaClient.connect(address(cluster.node(1))) as client, \
                await KafkaClient.connect(coordinator) as txn:
            got = answered(await client.call(ApiKey.PRODUCE, VERSION, body(0, b"unlisted")))
            assert got[0][2] == int(ErrorCode.invalid_txn_state), got
            added = await txn.call(24, 3, add("fwd-t", pid, epoch, "fwd-txn", [remote]))
            assert added.results_by_topic_v3_and_below[0].results_by_partition[0] \
                .partition_error_code == ErrorCode.none
            assert answered(await client.call(ApiKey.PRODUCE, VERSION, body(0, b"t0"))) == [
                ("fwd-txn", remote, 0, 0)]
            assert answered(await client.call(ApiKey.PRODUCE, VERSION, body(0, b"t0"))) == [
                ("fwd-txn", remote, 0, 0)]  # a retry: its first offset, not written twice
            got = answered(await client.call(ApiKey.PRODUCE, VERSION, body(5, b"gap")))
            assert got[0][2] == int(ErrorCode.out_of_order_sequence_number), got
            assert (await txn.call(26, 3, end("fwd-t", pid, epoch, True))).error_code == 0
        with trio.fail_after(15):
            while True:
                values = [m.value for m in await cluster.read_topic("fwd-txn")
                          if m.partition == remote]
                if values:
                    break
                await trio.sleep(0.05)
        assert values == [b"t0"]


# -- ACLs: checked on the leader as the original principal -----------------------------------

USERS = {"broker": "broker-pw", "alice": "alice-pw", "bob": "bob-pw"}
SECURED = dict(
    listeners="INTERNAL://127.0.0.1:0,CLIENT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
    listener_security_protocol_map="INTERNAL:SASL_PLAINTEXT,CLIENT:SASL_PLAINTEXT,"
                                   "PLAINTEXT:PLAINTEXT",
    inter_broker_listener_name="INTERNAL", inter_broker_sasl_mechanism="PLAIN",
    inter_broker_sasl_username="broker", inter_broker_sasl_password="broker-pw",
    authorizer_enabled=True, super_users="User:ANONYMOUS",
    connection_failed_authentication_delay_ms=10)


def login(user: str) -> ClientSecurity:
    return ClientSecurity(protocol="SASL_PLAINTEXT", mechanism="PLAIN", username=user,
                          password=USERS[user])


async def test_acls_are_checked_on_the_leader_as_the_client(mink_postgres):
    """alice may WRITE `fwd-acl`, bob may not, the inter-broker user `broker` has only
    CLUSTER_ACTION: alice's Produce through the non-leader is written (so the leader took
    it as alice, not as `broker`), bob's is TOPIC_AUTHORIZATION_FAILED, and bob's Produce
    sent to the leader in an Envelope by `broker` is refused there."""
    from kio.schema.envelope.v0 import EnvelopeRequest

    from mink.protocol.messages import encode_request
    from mink.testing import open_cluster
    from tests.support.security import create_users, endpoints
    from tests.test_acls import binding, create_acls

    async with open_cluster(2, mink_postgres, proxy=False, **SECURED) as cluster:
        plain = endpoints(cluster.node(1))["PLAINTEXT"]
        await trio.to_thread.run_sync(create_users, plain, USERS)
        await trio.to_thread.run_sync(create_acls, plain, [
            binding("CLUSTER", "kafka-cluster", "User:broker", "CLUSTER_ACTION"),
            binding("TOPIC", "fwd-acl", "User:alice", "WRITE")])
        await cluster.create_topic("fwd-acl", partitions=2)
        remote = led_by(cluster, "fwd-acl")[2][0]
        body = produce_body([("fwd-acl", [(remote, batch("acl"))])])
        with trio.fail_after(20):  # the ACLs reach both views
            while True:
                async with await KafkaClient.connect(endpoints(cluster.node(1))["CLIENT"],
                                                     security=login("alice")) as alice:
                    got = answered(await alice.call(ApiKey.PRODUCE, VERSION, body))
                if got[0][2] != TOPIC_AUTH:
                    break
                await trio.sleep(0.1)
        assert got == [("fwd-acl", remote, 0, 0)]
        async with await KafkaClient.connect(endpoints(cluster.node(1))["CLIENT"],
                                             security=login("bob")) as bob:
            got = answered(await bob.call(ApiKey.PRODUCE, VERSION, body))
        assert got == [("fwd-acl", remote, TOPIC_AUTH, -1)]
        async with await KafkaClient.connect(endpoints(cluster.node(2))["INTERNAL"],
                                             security=login("broker")) as broker:
            answer = await broker.call(ApiKey.ENVELOPE, 0, EnvelopeRequest(
                request_data=encode_request(ApiKey.PRODUCE, VERSION, 5, body, "app")[4:],
                request_principal=serialize_principal("User", "bob"),
                client_host_address=bytes([127, 0, 0, 1])))
        _, response = decode_response(ApiKey.PRODUCE, VERSION, answer.response_data)
        assert answered(response) == [("fwd-acl", remote, TOPIC_AUTH, -1)]


# -- librdkafka through one address --------------------------------------------------------


async def test_an_idempotent_producer_through_one_proxy_reaches_every_partition(
        mink_postgres):
    """Three nodes all advertise one TCP proxy that leads to node 1 only (as behind a load
    balancer pinned to one node): an idempotent confluent-kafka producer writes to every
    partition with no delivery error, nothing lost, nothing duplicated, each partition in
    order."""
    from tests.support.one_address import one_address_cluster

    async with one_address_cluster(mink_postgres) as (cluster, bootstrap):
        await cluster.create_topic("fwd-lb", partitions=6)
        assert set(cluster.leaders("fwd-lb").values()) == {1, 2, 3}
        count = 3000
        report = await trio.to_thread.run_sync(_produce_idempotent, bootstrap,
                                               "fwd-lb", count)
        assert report["errors"] == [], report["errors"][:5]
        assert report["delivered"] == count
        messages = await cluster.read_topic("fwd-lb")
        values = [m.value for m in messages]
        assert len(values) == count and len(set(values)) == count  # none lost or twice
        for p in range(6):
            mine = [int(m.value) for m in messages if m.partition == p]
            assert mine == sorted(mine) and mine, p  # in order, every partition written
        forwarded = cluster.node(1).node.peers
        assert forwarded.connected(2) and forwarded.connected(3)


def _produce_idempotent(bootstrap: str, topic: str, count: int) -> dict:
    from confluent_kafka import Producer

    errors, delivered = [], []

    def on_delivery(err, message):
        (errors if err is not None else delivered).append(err or message.offset())

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, "message.timeout.ms": 60000})
    for i in range(count):
        producer.produce(topic, key=b"%d" % i, value=b"%d" % i, partition=i % 6,
                         on_delivery=on_delivery)
        producer.poll(0)
    left = producer.flush(60)
    return {"errors": [str(e) for e in errors] + ([f"{left} not flushed"] if left else []),
            "delivered": len(delivered)}


async def test_pooled_sasl_connections_are_renewed_before_their_session_ends(mink_postgres):
    """KIP-368 on the inter-broker listener (sessions of 1.5 s): forwarded Produce requests
    over 4 s all succeed, the pool opening a new connection before its session ends (the
    peer would close the old one at its first request after the end)."""
    from mink.testing import open_cluster
    from tests.support.security import create_users, endpoints
    from tests.test_acls import binding, create_acls

    async with open_cluster(2, mink_postgres, proxy=False, connections_max_reauth_ms=1500,
                            **SECURED) as cluster:
        plain = endpoints(cluster.node(1))["PLAINTEXT"]
        await trio.to_thread.run_sync(create_users, plain, USERS)
        await trio.to_thread.run_sync(create_acls, plain, [
            binding("CLUSTER", "kafka-cluster", "User:broker", "CLUSTER_ACTION"),
            binding("TOPIC", "fwd-reauth", "User:alice", "WRITE")])
        await cluster.create_topic("fwd-reauth", partitions=2)
        remote = led_by(cluster, "fwd-reauth")[2][0]
        with trio.fail_after(20):  # the ACLs reach both views
            while True:
                async with await KafkaClient.connect(endpoints(cluster.node(1))["CLIENT"],
                                                     security=login("alice")) as alice:
                    got = answered(await alice.call(ApiKey.PRODUCE, VERSION, produce_body(
                        [("fwd-reauth", [(remote, batch("warm", 1))])])))
                if got[0][2] == 0:
                    break
                await trio.sleep(0.1)
        errors = []
        ended = trio.current_time() + 4
        while trio.current_time() < ended:
            async with await KafkaClient.connect(endpoints(cluster.node(1))["CLIENT"],
                                                 security=login("alice")) as alice:
                got = answered(await alice.call(ApiKey.PRODUCE, VERSION, produce_body(
                    [("fwd-reauth", [(remote, batch("r", 1))])])))
            errors += [g[2] for g in got if g[2]]
            await trio.sleep(0.2)
        assert errors == []
