"""Incremental fetch sessions (KIP-227, issue 23).

kafka-python 3.0 is the client here that uses them (its FetchSessionHandler; librdkafka,
aiokafka and kafkajs send session epoch -1, no session), so the end-to-end test runs it. The
protocol cases no client sends on purpose (a wrong epoch, an unknown session, a session
begun with names and continued with ids) are raw requests laid out from FetchRequest.json.
"""

from __future__ import annotations

import datetime
import uuid

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.broker.server.fetch_sessions import FetchSessionCache, next_epoch
from mink.client import KafkaClient
from mink.storage.embedded_postgres import free_port
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build, nested
from tests.support.batches import records_batch, values
from tests.support.raw import produce_request, produce_result

TOPIC = "sessions"


# -- the cache ------------------------------------------------------------------------------

def test_a_full_cache_evicts_only_a_session_idle_past_the_eviction_time():
    cache = FetchSessionCache(max_slots=2, eviction_s=10.0)
    first = cache.create(False, now=0.0)
    second = cache.create(False, now=1.0)
    assert first and second and first.id != second.id
    assert cache.create(False, now=5.0) is None, "both still in use: no room"
    cache.get(first.id, now=9.0)  # used again: the second is now the least recent
    third = cache.create(False, now=11.5)
    assert third is not None and cache.evictions == 1
    assert cache.get(second.id, now=11.5) is None and cache.get(first.id, now=11.5) is first


def test_no_slots_means_no_sessions_and_epochs_wrap_past_zero():
    assert FetchSessionCache(max_slots=0, eviction_s=0).create(True, now=0.0) is None
    assert next_epoch(0) == 1 and next_epoch(41) == 42 and next_epoch(2**31 - 1) == 1


# -- the protocol, raw ----------------------------------------------------------------------

@pytest.fixture
def node_settings() -> dict:
    return {"num_partitions": 3}


def fetch_body(version: int, session_id: int, epoch: int, partitions: dict, *,
               topic=TOPIC, forgotten: tuple = (), max_wait_ms: int = 10, min_bytes: int = 0):
    """partitions: {index: fetch offset}; `topic` a name (v12-) or an id (v13+)."""
    schema = load_request_schema(ApiKey.FETCH, version)
    topic_schema, partition_schema = nested(schema, "FetchTopic"), nested(schema, "FetchPartition")
    forgotten_schema = nested(schema, "ForgottenTopic")
    by_id = version >= 13
    name = {"topic_id": topic} if by_id else {"topic": topic}
    topics = (topic_schema(**name, partitions=tuple(
        partition_schema(partition=index, fetch_offset=offset, partition_max_bytes=1 << 20,
                         current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
        for index, offset in sorted(partitions.items()))),) if partitions else ()
    forgotten_topics = (forgotten_schema(**name, partitions=forgotten),) if forgotten else ()
    return build(schema, replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                 min_bytes=min_bytes, max_bytes=1 << 20, isolation_level=0, session_id=session_id,
                 session_epoch=epoch, topics=topics, forgotten_topics_data=forgotten_topics,
                 rack_id="")


def answered(response) -> dict[int, tuple[int, int, int]]:
    """{partition: (error, high watermark, bytes of records)} of a one-topic answer."""
    return {p.partition_index: (int(p.error_code), p.high_watermark, len(p.records or b""))
            for t in response.responses for p in t.partitions}


async def produce(client: KafkaClient, partition: int, count: int) -> None:
    error, _ = produce_result(await client.call(
        ApiKey.PRODUCE, 9, produce_request(TOPIC, partition, records_batch(values(count)))))
    assert error == 0


async def topic_id_of(client: KafkaClient, name: str) -> uuid.UUID:
    meta = await client.call(ApiKey.METADATA, 12, build(
        load_request_schema(ApiKey.METADATA, 12), topics=None,
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    return {t.name: t.topic_id for t in meta.topics}[name]


@pytest.mark.parametrize("version", [12, 17])
async def test_an_incremental_fetch_answers_only_what_changed(node, version):
    async with await KafkaClient.connect(node) as client:
        await produce(client, 0, 2)  # creates the topic with its 3 partitions
        topic = await topic_id_of(client, TOPIC) if version >= 13 else TOPIC
        full = await client.call(ApiKey.FETCH, version, fetch_body(
            version, 0, 0, {0: 0, 1: 0, 2: 0}, topic=topic))
        session = full.session_id
        assert full.error_code == 0 and session != 0
        assert answered(full) == {0: (0, 2, answered(full)[0][2]), 1: (0, 0, 0), 2: (0, 0, 0)}
        assert answered(full)[0][2] > 0

        # partition 0 read to its end: nothing new anywhere, so no partition is named
        quiet = await client.call(ApiKey.FETCH, version, fetch_body(
            version, session, 1, {0: 2}, topic=topic))
        assert (quiet.error_code, quiet.session_id, answered(quiet)) == (0, session, {})

        # records on partition 2 only: partition 2 alone, though the request names none
        await produce(client, 2, 3)
        moved = await client.call(ApiKey.FETCH, version, fetch_body(
            version, session, 2, {}, topic=topic))
        assert list(answered(moved)) == [2] and answered(moved)[2][:2] == (0, 3)

        # partition 1 forgotten: its new records are not answered; 2 moved on, 0 is quiet
        await produce(client, 1, 1)
        forgot = await client.call(ApiKey.FETCH, version, fetch_body(
            version, session, 3, {2: 3}, topic=topic, forgotten=(1,)))
        assert answered(forgot) == {}

        # an epoch out of turn, and a session no one opened
        stale = await client.call(ApiKey.FETCH, version, fetch_body(
            version, session, 3, {}, topic=topic))
        assert (stale.error_code, stale.session_id, stale.responses) == (
            ErrorCode.invalid_fetch_session_epoch, 0, ())
        unknown = await client.call(ApiKey.FETCH, version, fetch_body(
            version, session + 1 if session < 2**31 - 1 else 1, 1, {}, topic=topic))
        assert unknown.error_code == ErrorCode.fetch_session_id_not_found

        # the session survived the refusals; epoch -1 closes it
        still = await client.call(ApiKey.FETCH, version, fetch_body(
            version, session, 4, {}, topic=topic))
        assert still.error_code == 0 and answered(still) == {}
        closing = await client.call(ApiKey.FETCH, version, fetch_body(
            version, session, -1, {0: 0}, topic=topic))
        assert closing.session_id == 0 and list(answered(closing)) == [0]
        gone = await client.call(ApiKey.FETCH, version, fetch_body(
            version, session, 5, {}, topic=topic))
        assert gone.error_code == ErrorCode.fetch_session_id_not_found


async def test_a_session_begun_with_names_cannot_go_on_with_ids(node):
    async with await KafkaClient.connect(node) as client:
        await produce(client, 0, 1)
        topic_id = await topic_id_of(client, TOPIC)
        full = await client.call(ApiKey.FETCH, 12, fetch_body(12, 0, 0, {0: 0}))
        switched = await client.call(ApiKey.FETCH, 17, fetch_body(
            17, full.session_id, 1, {}, topic=topic_id))
        assert switched.error_code == ErrorCode.fetch_session_topic_id_error


async def test_an_error_is_answered_every_time_and_the_partition_once_it_clears(node):
    """A partition in error (an id no topic has) is answered at every incremental fetch,
    with its error (Kafka sets its cached watermark to -1, so that it is sent again once the
    error goes); a quiet partition beside it is not."""
    async with await KafkaClient.connect(node) as client:
        await produce(client, 0, 1)
        topic_id = await topic_id_of(client, TOPIC)
        stranger = uuid.uuid4()
        body = fetch_body(17, 0, 0, {0: 0}, topic=stranger)
        full = await client.call(ApiKey.FETCH, 17, body)
        session = full.session_id
        assert answered(full) == {0: (ErrorCode.unknown_topic_id, -1, 0)}
        for epoch, offset in ((1, 0), (2, 1)):
            again = await client.call(ApiKey.FETCH, 17, fetch_body(
                17, session, epoch, {0: offset}, topic=topic_id))
            # the known topic joins at epoch 1 with its record, then is read to its end
            errors = {t.topic_id: [int(p.error_code) for p in t.partitions]
                      for t in again.responses}
            assert errors[stranger] == [ErrorCode.unknown_topic_id]
            assert (topic_id in errors) == (epoch == 1)


async def test_a_full_cache_answers_full_fetches_without_a_session(mink_postgres, store_url):
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         max_incremental_fetch_session_cache_slots=1) as running:
        async with await KafkaClient.connect(running.bootstrap) as client:
            await produce(client, 0, 1)
            first = await client.call(ApiKey.FETCH, 12, fetch_body(12, 0, 0, {0: 0}))
            second = await client.call(ApiKey.FETCH, 12, fetch_body(12, 0, 0, {0: 0}))
            assert first.session_id != 0 and second.session_id == 0
            assert answered(second)[0][1] == 1, "still a whole answer, only sessionless"


# -- kafka-python, end to end --------------------------------------------------------------

async def test_kafka_python_consumes_through_incremental_sessions(mink_postgres, store_url):
    """kafka-python keeps one session per broker: every record of 12 partitions arrives
    once and in order, while the node sees the session carried forward epoch by epoch."""
    from mink.testing import open_node

    partitions, per_partition = 12, 40
    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         admin_listener=f"127.0.0.1:{free_port()}") as running:
        await running.create_topic(TOPIC, partitions)
        await running.wait_led(TOPIC)
        async with await KafkaClient.connect(running.bootstrap) as client:
            for index in range(partitions):
                await produce(client, index, per_partition // 2)

        def consume() -> dict[int, list[bytes]]:
            import time

            from kafka import KafkaConsumer, TopicPartition

            consumer = KafkaConsumer(bootstrap_servers=running.bootstrap,
                                     auto_offset_reset="earliest", enable_auto_commit=False,
                                     fetch_max_wait_ms=50)
            consumer.assign([TopicPartition(TOPIC, i) for i in range(partitions)])
            seen: dict[int, list[bytes]] = {}
            try:
                end = time.monotonic() + 30
                while sum(map(len, seen.values())) < partitions * per_partition:
                    assert time.monotonic() < end, f"read {sum(map(len, seen.values()))}"
                    for tp, records in consumer.poll(timeout_ms=200).items():
                        seen.setdefault(tp.partition, []).extend(r.value for r in records)
            finally:
                consumer.close()
            return seen

        async with trio.open_nursery() as nursery:
            result: dict = {}

            async def run_consumer():
                result["seen"] = await trio.to_thread.run_sync(consume)

            nursery.start_soon(run_consumer)
            # the second half arrives while the consumer polls through its session
            with trio.fail_after(20):
                while not running.node.fetch_sessions.partitions_cached():
                    await trio.sleep(0.05)
            async with await KafkaClient.connect(running.bootstrap) as client:
                for index in range(partitions):
                    await produce(client, index, per_partition // 2)
        expected = [r.value for r in values(per_partition // 2)] * 2
        assert result["seen"] == {i: expected for i in range(partitions)}
        sessions = list(running.node.fetch_sessions._sessions.values())
        assert len(sessions) == 1 and sessions[0].epoch > 3, "fetches went on in one session"
        assert len(sessions[0].partitions) == partitions
        exposition = running.node.metrics.exposition().decode()
        assert "mink_fetch_sessions 1.0" in exposition
        assert f"mink_fetch_session_partitions {float(partitions)}" in exposition
        assert "mink_fetch_session_evictions_total 0.0" in exposition


# -- a long poll's wake-ups -------------------------------------------------------------------

async def test_a_woken_fetch_rereads_only_the_partitions_that_committed(mink_postgres,
                                                                         store_url, monkeypatch):
    """A fetch waiting on 30 partitions is woken by a commit to one: that one is read again,
    not all 30 (they committed nothing, so they would answer the same)."""
    from mink.storage.log import PartitionLog
    from mink.testing import open_node

    reads: list[int] = []
    original = PartitionLog.read

    async def counted(self, offset, max_bytes):
        reads.append(self.partition)
        return await original(self, offset, max_bytes)

    partitions = 30
    async with open_node(mink_postgres, store_url=store_url, proxy=False) as running:
        await running.create_topic(TOPIC, partitions)
        await running.wait_led(TOPIC)
        monkeypatch.setattr(PartitionLog, "read", counted)
        async with await KafkaClient.connect(running.bootstrap) as fetcher, \
                await KafkaClient.connect(running.bootstrap) as producer:
            body = fetch_body(12, 0, -1, {i: 0 for i in range(partitions)}, max_wait_ms=10_000,
                              min_bytes=1)
            await fetcher.send(ApiKey.FETCH, 12, body)
            with trio.fail_after(10):
                while len(reads) < partitions:  # the first pass over every partition
                    await trio.sleep(0.01)
            await produce(producer, 7, 2)
            with trio.fail_after(10):
                _, response = await fetcher.receive(ApiKey.FETCH, 12)
    assert [p for p, (_, _, size) in answered(response).items() if size] == [7]
    assert sorted(reads[:partitions]) == list(range(partitions))
    assert reads[partitions:] == [7], "after the wake-up, only partition 7 was read again"
