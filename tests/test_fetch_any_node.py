"""Fetch through any node (issue 25): a node that does not lead a partition serves a
consumer's read_uncommitted Fetch from the index and the object store (a replica view), with
the leader's committed high watermark and log start; a long-poll there learns of commits
through the node's poller; KIP-392 points a consumer with client.rack to a node of its rack.
Real nodes, real sockets, raw Fetches with Mink's client, librdkafka with client.rack."""

from __future__ import annotations

import datetime

import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.client import KafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build, nested
from mink.protocol.records import Record
from mink.storage.controlplane.postgres import READ
from mink.storage.stream_object import is_stream_object
from tests.support.batches import records_batch
from tests.support.raw import produce_request, produce_result

VERSION = 12  # names topics; has rack_id, preferred_read_replica and current_leader


def address(minknode) -> str:
    host, port = minknode.node.advertised
    return f"{host}:{port}"


def fetch_body(topic: str, partition: int, offset: int, *, max_bytes: int = 1 << 20,
               max_wait_ms: int = 0, min_bytes: int = 0, isolation_level: int = 0,
               current_leader_epoch: int = -1, rack_id: str = "", version: int = VERSION):
    schema = load_request_schema(ApiKey.FETCH, version)
    part = nested(schema, "FetchPartition")(
        partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes,
        current_leader_epoch=current_leader_epoch, last_fetched_epoch=-1, log_start_offset=-1)
    return build(schema, replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                 min_bytes=min_bytes, max_bytes=1 << 22, isolation_level=isolation_level,
                 session_id=0, session_epoch=-1, topics=(nested(schema, "FetchTopic")(
                     topic=topic, partitions=(part,)),),
                 forgotten_topics_data=(), rack_id=rack_id)


def partition_of(response):
    return response.responses[0].partitions[0]


def seen(response) -> tuple:
    """What a consumer is told: error, high watermark, log start, preferred replica, bytes."""
    p = partition_of(response)
    return (int(p.error_code), p.high_watermark, p.log_start_offset, p.preferred_read_replica,
            bytes(p.records or b""))


async def produce(client: KafkaClient, topic: str, partition: int, tag: str, n: int) -> int:
    error, base = produce_result(await client.call(ApiKey.PRODUCE, 9, produce_request(
        topic, partition, records_batch([Record(i, i, None, f"{tag}-{i}".encode() * (i + 1))
                                         for i in range(n)]))))
    assert error == 0
    return base


async def two_nodes_one_partition(cluster, topic: str):
    await cluster.create_topic(topic, partitions=1)
    leader = cluster.leaders(topic)[0]
    return cluster.node(leader), cluster.node(3 - leader)


async def test_a_non_leader_answers_the_leaders_bytes_and_ends_at_any_offset(mink_postgres):
    """Batches of several sizes through the leader; raw Fetches at every offset (and some
    byte budgets that end inside the log) to the leader and to the other node answer the
    same bytes, high watermark and log start; past the end both answer
    OFFSET_OUT_OF_RANGE; a newer leader epoch than PostgreSQL's is UNKNOWN_LEADER_EPOCH on
    the non-leader; read_committed answers the same there too (no transaction: the LSO is the
    high watermark)."""
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False) as cluster:
        leader, other = await two_nodes_one_partition(cluster, "any-bytes")
        async with await KafkaClient.connect(address(leader)) as to_leader, \
                await KafkaClient.connect(address(other)) as to_other:
            for r, n in enumerate([1, 4, 2, 7, 3]):
                await produce(to_leader, "any-bytes", 0, f"r{r}", n)
            end = 17
            for offset in range(end + 1):
                for budget in (1, 200, 1 << 20):
                    body = fetch_body("any-bytes", 0, offset, max_bytes=budget)
                    a = seen(await to_leader.call(ApiKey.FETCH, VERSION, body))
                    b = seen(await to_other.call(ApiKey.FETCH, VERSION, body))
                    assert a == b, (offset, budget)
                    assert a[:3] == (0, end, 0) and (offset == end) == (a[4] == b"")
            body = fetch_body("any-bytes", 0, end + 3)
            for client in (to_leader, to_other):
                assert seen(await client.call(ApiKey.FETCH, VERSION, body))[0] == int(
                    ErrorCode.offset_out_of_range)
            epoch = leader.node.view.topics["any-bytes"].partitions[0].leader_epoch
            ahead = await to_other.call(ApiKey.FETCH, VERSION, fetch_body(
                "any-bytes", 0, 0, current_leader_epoch=epoch + 1))
            assert seen(ahead)[0] == int(ErrorCode.unknown_leader_epoch)
            same = await to_other.call(ApiKey.FETCH, VERSION, fetch_body(
                "any-bytes", 0, 0, current_leader_epoch=epoch))
            assert seen(same)[0] == 0 and seen(same)[4]
            body = fetch_body("any-bytes", 0, 0, isolation_level=1)
            a, b = [(seen(r), partition_of(r).last_stable_offset) for r in [
                await c.call(ApiKey.FETCH, VERSION, body) for c in (to_leader, to_other)]]
            assert a == b and a[0][0] == 0 and a[1] == end, (a, b)
            assert other.node.replica_reads.fetches_served > 0
            assert leader.node.replica_reads.fetches_served == 0


async def test_after_tiering_the_non_leader_answers_the_same_batches(mink_postgres):
    """Many small WAL objects, then a tiering round rewrites them into stream objects: a
    one-batch Fetch at each batch's offset answers the very bytes it answered before, on the
    leader and on the other node (reading the stream objects through its view)."""
    from mink.storage.lifecycle import tiering

    from mink.testing import open_cluster

    fast = dict(tiering_delay_ms=1000, tiering_stream_object_bytes=64 * 1024,
                file_delete_delay_ms=200, coordinator_tick=0.5)
    async with open_cluster(2, mink_postgres, proxy=False, **fast) as cluster:
        leader, other = await two_nodes_one_partition(cluster, "any-tiered")
        async with await KafkaClient.connect(address(leader)) as to_leader, \
                await KafkaClient.connect(address(other)) as to_other:
            bases = [await produce(to_leader, "any-tiered", 0, f"t{r}", 1 + r % 4)
                     for r in range(30)]

            async def one_batch_each(client) -> list[bytes]:
                return [seen(await client.call(ApiKey.FETCH, VERSION, fetch_body(
                    "any-tiered", 0, base, max_bytes=1)))[4] for base in bases]

            before = await one_batch_each(to_other)
            assert before == await one_batch_each(to_leader) and all(before)
            with trio.fail_after(30):
                while (await leader.call(tiering.backlog, leader.node.metadata))[0] > 0:
                    await trio.sleep(0.1)
            keys = [r[0] for r in await leader.call(
                leader.node.metadata.fetch_all, READ, "SELECT object_key FROM batch_index")]
            assert keys and all(is_stream_object(k) for k in keys)
            assert await one_batch_each(to_other) == before
            assert await one_batch_each(to_leader) == before


async def test_a_long_poll_on_a_non_leader_returns_soon_after_a_commit(mink_postgres):
    """A Fetch waiting at the end on the non-leader (max_wait 10 s) returns the batch within
    a bound after the leader acknowledged it; while it waits the node polls PostgreSQL about
    once per replica_fetch_poll_ms, not more."""
    from mink.testing import open_cluster

    poll_ms = 100
    async with open_cluster(2, mink_postgres, proxy=False,
                            replica_fetch_poll_ms=poll_ms) as cluster:
        leader, other = await two_nodes_one_partition(cluster, "any-poll")
        replicas = other.node.replica_reads
        async with await KafkaClient.connect(address(leader)) as to_leader, \
                await KafkaClient.connect(address(other)) as to_other:
            await produce(to_leader, "any-poll", 0, "first", 2)
            answer = {}

            async def long_poll():
                answer["response"] = await to_other.call(ApiKey.FETCH, VERSION, fetch_body(
                    "any-poll", 0, 2, max_wait_ms=10_000, min_bytes=1))
                answer["at"] = trio.current_time()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(long_poll)
                with trio.fail_after(10):
                    while not any(v.waiters for v in replicas.views.values()):
                        await trio.sleep(0.01)
                polls_before, waited_from = replicas.polls, trio.current_time()
                await trio.sleep(1.0)  # nothing committed: about 10 polls
                polls_idle = replicas.polls - polls_before
                assert 3 <= polls_idle <= 1.0 / (poll_ms / 1000) + 2, polls_idle
                assert "response" not in answer
                await produce(to_leader, "any-poll", 0, "second", 3)
                acked = trio.current_time()
            latency = answer["at"] - acked
            error, high_watermark, _, _, records = seen(answer["response"])
            assert error == 0 and high_watermark == 5 and records
            assert latency < poll_ms / 1000 + 0.5, latency
            assert trio.current_time() - waited_from < 5


async def test_a_consumer_with_client_rack_reads_from_the_node_in_its_rack(mink_postgres):
    """Nodes in racks a and b; a confluent-kafka consumer in rack b reads both partitions
    (one led by each node) from the start: everything arrives, and the partition node 1
    leads was served by node 2 (rack-local) after node 1 answered preferred_read_replica."""
    from mink.testing import open_cluster

    from mink.storage.embedded_postgres import free_port

    async with open_cluster(2, mink_postgres, proxy=False, node_config={
            1: {"rack": "a"},
            2: {"rack": "b", "admin_listener": f"127.0.0.1:{free_port()}"}}) as cluster:
        await cluster.create_topic("any-rack", partitions=2)
        # one partition led by each node (the coordinator puts both on one when the other is
        # missing from its view at that moment, as on a loaded machine)
        for partition, node_id in ((0, 1), (1, 2)):
            if cluster.leaders("any-rack")[partition] != node_id:
                await cluster.move_leadership("any-rack", partition, node_id)
        leaders = cluster.leaders("any-rack")
        assert leaders == {0: 1, 1: 2}, leaders
        away = next(p for p, n in leaders.items() if n == 1)
        async with await KafkaClient.connect(address(cluster.node(1))) as to_one:
            pointed = await to_one.call(ApiKey.FETCH, VERSION, fetch_body(
                "any-rack", away, 0, rack_id="b"))
            assert seen(pointed)[3] == 2 and seen(pointed)[4] == b""
            assert seen(await to_one.call(ApiKey.FETCH, VERSION, fetch_body(
                "any-rack", away, 0, rack_id="a")))[3] == -1
        expected = set()
        async with await KafkaClient.connect(address(cluster.node(1))) as to_one, \
                await KafkaClient.connect(address(cluster.node(2))) as to_two:
            for p, n in leaders.items():
                client = to_one if n == 1 else to_two
                for r in range(4):
                    await produce(client, "any-rack", p, f"p{p}r{r}", 5)
                    expected |= {(p, f"p{p}r{r}-{i}".encode() * (i + 1)) for i in range(5)}
        served_before = cluster.node(2).node.replica_reads.fetches_served
        got = await trio.to_thread.run_sync(
            consume, cluster.node(1).bootstrap, "any-rack", [0, 1], len(expected), "b")
        assert set(got) == expected and len(got) == len(expected)
        assert cluster.node(2).node.replica_reads.fetches_served > served_before
        assert cluster.node(1).node.replica_reads.fetches_served == 0
        exposition = cluster.node(2).node.metrics.exposition().decode()
        served = float(cluster.node(2).node.replica_reads.fetches_served)
        assert f"mink_replica_fetch_partitions_total {served}" in exposition
        assert "mink_replica_views 1.0" in exposition


async def test_after_leadership_moves_the_old_leader_keeps_serving_reads(mink_postgres):
    """The partition moves from its leader to the other node: a consumer that still sends
    to the old leader without an epoch reads on (now from its replica view, with the new
    leader's committed end); one with the old epoch is told FENCED_LEADER_EPOCH."""
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False) as cluster:
        leader, other = await two_nodes_one_partition(cluster, "any-moved")
        epoch = leader.node.view.topics["any-moved"].partitions[0].leader_epoch
        async with await KafkaClient.connect(address(leader)) as to_leader:
            await produce(to_leader, "any-moved", 0, "before", 3)
        await cluster.move_leadership("any-moved", 0, other.node_id)
        async with await KafkaClient.connect(address(other)) as to_new:
            await produce(to_new, "any-moved", 0, "after", 2)
        async with await KafkaClient.connect(address(leader)) as to_old:
            with trio.fail_after(10):
                while True:
                    answer = seen(await to_old.call(ApiKey.FETCH, VERSION, fetch_body(
                        "any-moved", 0, 3)))
                    if answer[0] == 0 and answer[1] == 5:
                        break
                    await trio.sleep(0.05)
            assert b"after-0" in answer[4]
            fenced = await to_old.call(ApiKey.FETCH, VERSION, fetch_body(
                "any-moved", 0, 0, current_leader_epoch=epoch))
            assert seen(fenced)[0] == int(ErrorCode.fenced_leader_epoch)


async def test_a_consumer_keeps_reading_while_leadership_moves(mink_postgres):
    """A confluent-kafka consumer in rack b reads a partition led by node 1 (rack a),
    fetching from node 2 (KIP-392); leadership moves to node 2, then back to node 1, with
    records produced to the leader of the moment in between: it reads every record once, in
    order."""
    import threading

    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False,
                            node_config={1: {"rack": "a"}, 2: {"rack": "b"}}) as cluster:
        await cluster.create_topic("any-move", partitions=1)
        if cluster.leaders("any-move")[0] != 1:
            await cluster.move_leadership("any-move", 0, 1)
        expected: list[bytes] = []

        async def produce_round(tag: str) -> None:
            leader = cluster.node(cluster.leaders("any-move")[0])
            async with await KafkaClient.connect(address(leader)) as client:
                for r in range(3):
                    await produce(client, "any-move", 0, f"{tag}{r}", 4)
                    expected.extend(f"{tag}{r}-{i}".encode() * (i + 1) for i in range(4))

        got: list[bytes] = []
        progress = threading.Condition()
        stop = threading.Event()

        def read() -> None:
            from confluent_kafka import Consumer, TopicPartition

            consumer = Consumer({"bootstrap.servers": cluster.node(1).bootstrap,
                                 "group.id": "any-move", "enable.auto.commit": False,
                                 "client.rack": "b", "isolation.level": "read_uncommitted",
                                 "topic.metadata.refresh.interval.ms": 1000})
            consumer.assign([TopicPartition("any-move", 0, 0)])
            try:
                while not stop.is_set():
                    message = consumer.poll(0.2)
                    if message is not None and not message.error():
                        with progress:
                            got.append(message.value())
                            progress.notify_all()
            finally:
                consumer.close()

        def wait_for(count: int) -> bool:
            with progress:
                return progress.wait_for(lambda: len(got) >= count, timeout=30)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, read)
            try:
                for tag, move_to in (("one", 2), ("two", 1), ("three", None)):
                    await produce_round(tag)
                    assert await trio.to_thread.run_sync(wait_for, len(expected)), (
                        len(got), len(expected))
                    if move_to is not None:
                        await cluster.move_leadership("any-move", 0, move_to)
            finally:
                stop.set()
        assert got == expected
        assert cluster.node(2).node.replica_reads.fetches_served > 0


async def test_a_consumer_through_one_address_reads_every_partition(mink_postgres):
    """Three nodes all advertise one TCP proxy that leads to node 1 only (as behind a load
    balancer pinned to one node): a confluent-kafka consumer (read_uncommitted) reads every
    partition through it, those node 2 and 3 lead from node 1's replica views."""
    from tests.support.one_address import one_address_cluster

    async with one_address_cluster(mink_postgres) as (cluster, bootstrap):
        await cluster.create_topic("any-lb", partitions=6)
        leaders = cluster.leaders("any-lb")
        assert set(leaders.values()) == {1, 2, 3}
        expected = set()
        for p, n in leaders.items():
            async with await KafkaClient.connect(address(cluster.node(n))) as client:
                for r in range(3):
                    await produce(client, "any-lb", p, f"p{p}r{r}", 3)
                    expected |= {(p, f"p{p}r{r}-{i}".encode() * (i + 1)) for i in range(3)}
        got = await trio.to_thread.run_sync(
            consume, bootstrap, "any-lb", list(range(6)), len(expected), "")
        assert set(got) == expected and len(got) == len(expected)
        assert cluster.node(1).node.replica_reads.fetches_served > 0
        assert len(cluster.node(1).node.replica_reads.views) == 4  # the partitions of nodes 2, 3


def list_offsets_body(topic: str, timestamp: int, isolation_level: int = 0):
    schema = load_request_schema(ApiKey.LIST_OFFSETS, 7)
    return build(schema, replica_id=-1, isolation_level=isolation_level, topics=(
        nested(schema, "ListOffsetsTopic")(name=topic, partitions=(
            nested(schema, "ListOffsetsPartition")(partition_index=0, current_leader_epoch=-1,
                                                   timestamp=timestamp),)),))


def epoch_end_body(topic: str, epoch: int):
    schema = load_request_schema(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4)
    return build(schema, replica_id=-1, topics=(nested(schema, "OffsetForLeaderTopic")(
        topic=topic, partitions=(nested(schema, "OffsetForLeaderPartition")(
            partition=0, current_leader_epoch=-1, leader_epoch=epoch),)),))


async def test_list_offsets_and_epoch_ends_on_a_non_leader_are_the_leaders(mink_postgres):
    """ListOffsets (earliest, latest, a timestamp, max timestamp) and OffsetForLeaderEpoch
    sent by a consumer to the node that does not lead the partition answer what the leader
    answers, read_committed's latest (the last stable offset) included."""
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False) as cluster:
        leader, other = await two_nodes_one_partition(cluster, "any-offsets")
        async with await KafkaClient.connect(address(leader)) as to_leader, \
                await KafkaClient.connect(address(other)) as to_other:
            for r in range(3):
                await produce(to_leader, "any-offsets", 0, f"r{r}", 4)
            for timestamp in (-2, -1, 2, -3):
                body = list_offsets_body("any-offsets", timestamp)
                a, b = [(p.error_code, p.offset, p.timestamp, p.leader_epoch)
                        for c in (to_leader, to_other)
                        for p in (await c.call(ApiKey.LIST_OFFSETS, 7, body)).topics[0].partitions]
                assert a == b and a[0] == 0, (timestamp, a, b)
            body = list_offsets_body("any-offsets", -1, isolation_level=1)
            a, b = [(p.error_code, p.offset) for c in (to_leader, to_other)
                    for p in (await c.call(ApiKey.LIST_OFFSETS, 7, body)).topics[0].partitions]
            assert a == b == (0, 12), (a, b)
            epoch = leader.node.view.topics["any-offsets"].partitions[0].leader_epoch
            a, b = [(p.error_code, p.leader_epoch, p.end_offset)
                    for c in (to_leader, to_other)
                    for p in (await c.call(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, epoch_end_body(
                        "any-offsets", epoch))).topics[0].partitions]
            assert a == b == (0, epoch, 12), (a, b)


def consume(bootstrap: str, topic: str, partitions: list[int], count: int, rack: str,
            timeout: float = 30.0) -> list[tuple[int, bytes]]:
    """Blocking: (partition, value) read by a confluent-kafka consumer in `rack`."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    settings = {"bootstrap.servers": bootstrap, "group.id": "any-rack",
                "enable.auto.commit": False, "isolation.level": "read_uncommitted"}
    if rack:
        settings["client.rack"] = rack
    consumer = Consumer(settings)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    got = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            got.append((message.partition(), message.value()))
    finally:
        consumer.close()
    return got


def _transactions(bootstrap: str, topic: str, leave_open: bool) -> None:
    """Blocking: one committed transaction of 5 records, one aborted of 3, and (if
    `leave_open`) one of 2 left open, then (if not) nothing more."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn",
                         "linger.ms": 0})
    producer.init_transactions(30)
    for count, end in ((5, producer.commit_transaction), (3, producer.abort_transaction)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, value=b"%d-%d" % (count, i), partition=0)
        producer.flush(30)
        end(30)
    producer.begin_transaction()
    for i in range(2):
        producer.produce(topic, value=b"open-%d" % i, partition=0)
    producer.flush(30)
    return producer


async def test_read_committed_on_a_non_leader_is_the_leaders(mink_postgres):
    """Transactions on the leader (committed, aborted, one left open): a read_committed Fetch
    and ListOffsets on the other node answer what the leader answers (the last stable offset
    at the open transaction's first offset, the aborted transaction, the same bytes), and
    after the open one commits, both move on to the same end."""
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False) as cluster:
        leader, other = await two_nodes_one_partition(cluster, "any-txn")
        producer = await trio.to_thread.run_sync(_transactions, address(leader), "any-txn",
                                                 True)

        async def both(committed_end: int | None = None):
            async with await KafkaClient.connect(address(leader)) as to_leader, \
                    await KafkaClient.connect(address(other)) as to_other:
                body = fetch_body("any-txn", 0, 0, isolation_level=1)
                answers = []
                for client in (to_leader, to_other):
                    p = partition_of(await client.call(ApiKey.FETCH, VERSION, body))
                    latest = (await client.call(ApiKey.LIST_OFFSETS, 7, list_offsets_body(
                        "any-txn", -1, isolation_level=1))).topics[0].partitions[0]
                    answers.append((int(p.error_code), p.high_watermark, p.last_stable_offset,
                                    [(a.producer_id, a.first_offset)
                                     for a in p.aborted_transactions],
                                    bytes(p.records or b""), latest.offset))
                return answers

        # committed 5 + marker, aborted 3 + marker: the open transaction starts at 10
        with trio.fail_after(30):
            while (answers := await both())[1] != answers[0]:
                await trio.sleep(0.05)  # the non-leader's ends are polled
        a = answers[0]
        assert a[0] == 0 and a[1] == 12 and a[2] == 10 and a[5] == 10, a
        assert len(a[3]) == 1 and a[3][0][1] == 6, a  # the aborted one, from offset 6
        await trio.to_thread.run_sync(producer.commit_transaction, 30)
        with trio.fail_after(30):
            while (answers := await both())[1] != answers[0] or answers[0][2] != 13:
                await trio.sleep(0.05)
        assert answers[0][1:3] == (13, 13) and answers[0][5] == 13, answers[0]


async def test_a_long_poll_whose_partitions_move_away_one_by_one_sees_no_not_leader(
        mink_postgres):
    """A consumer's Fetch long-polling node 1 for two partitions node 1 leads (min_bytes
    4 KiB, max_wait 10 s): the first partition moves to node 2 and gets a small batch there,
    then the second moves and gets a bigger one. Each log closing under the Fetch sends it
    to a view of that partition, where it waits again: it is answered once the second
    batch is committed, with both partitions' records, not NOT_LEADER_OR_FOLLOWER for the
    one that moved second (a rebalance moves a node's partitions one after the other)."""
    from mink.testing import open_cluster

    async with open_cluster(2, mink_postgres, proxy=False) as cluster:
        await cluster.create_topic("any-away", partitions=2)
        for p in (0, 1):
            if cluster.leaders("any-away")[p] != 1:
                await cluster.move_leadership("any-away", p, 1)
        first = cluster.node(1)
        schema = load_request_schema(ApiKey.FETCH, VERSION)
        body = build(
            schema, replica_id=-1, max_wait=datetime.timedelta(seconds=10),
            min_bytes=4096, max_bytes=1 << 22, isolation_level=0, session_id=0,
            session_epoch=-1, forgotten_topics_data=(), rack_id="",
            topics=(nested(schema, "FetchTopic")(topic="any-away", partitions=tuple(
                nested(schema, "FetchPartition")(
                    partition=p, fetch_offset=0, partition_max_bytes=1 << 20,
                    current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
                for p in (0, 1))),))
        sizes = {0: 2, 1: 40}  # records: about 110 bytes, then about 7 KB
        async with await KafkaClient.connect(address(first)) as to_first:
            answer = {}

            async def long_poll():
                answer["response"] = await to_first.call(ApiKey.FETCH, VERSION, body)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(long_poll)
                topic_id = first.node.view.topics["any-away"].topic_id
                views = first.node.replica_reads.views
                logs = [first.node.leader_log(first.node.view.topics["any-away"], p)
                        for p in (0, 1)]
                with trio.fail_after(10):
                    while not all(log.waiters for log in logs):
                        await trio.sleep(0.01)
                for p, log in zip((0, 1), logs):
                    await cluster.move_leadership("any-away", p, 2)
                    with trio.fail_after(10):  # closed under the Fetch, one after the other
                        while log.closed is None:
                            await trio.sleep(0.01)
                    with trio.fail_after(10):  # the Fetch waits again, on p's view
                        while "response" not in answer and not (
                                (view := views.get((topic_id, p))) and view.waiters):
                            await trio.sleep(0.01)
                    assert "response" not in answer, (p, [
                        (q.partition_index, int(q.error_code), q.high_watermark)
                        for q in answer["response"].responses[0].partitions])
                    async with await KafkaClient.connect(
                            address(cluster.node(2))) as to_second:
                        await produce(to_second, "any-away", p, f"moved{p}", sizes[p])
                with trio.fail_after(5):  # min_bytes reached: answered before max_wait
                    while "response" not in answer:
                        await trio.sleep(0.01)
        partitions = {p.partition_index: p for p in answer["response"].responses[0].partitions}
        assert {p: int(partitions[p].error_code) for p in (0, 1)} == {0: 0, 1: 0}
        for p in (0, 1):
            assert partitions[p].high_watermark == sizes[p]
            assert f"moved{p}-0".encode() in bytes(partitions[p].records or b"")
