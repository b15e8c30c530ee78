"""A Fetch response stays within the request's max_bytes (fetch.max.bytes), except for the
first batch of the first partition that has data, as Kafka's ReplicaManager reads with
minOneMessage only until some partition returned records. librdkafka sizes its receive
buffer from fetch.max.bytes and refuses a bigger response whole, so a consumer of large
messages over several partitions was stuck (librdkafka's own test 0082_fetch_max_bytes)."""

from __future__ import annotations

import datetime
import time

import pytest
import trio
from kio.index import load_request_schema

from mink.client import KafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build, nested
from tests.support.batches import records_batch, values
from tests.support.raw import produce_request, produce_result

TOPIC = "large-records"
TIMEOUT = 30


@pytest.fixture
def node_settings() -> dict:
    return {"num_partitions": 3}


def fetch_body(offsets: dict[int, int], max_bytes: int, partition_max_bytes: int = 1 << 20):
    schema = load_request_schema(ApiKey.FETCH, 12)
    partitions = tuple(nested(schema, "FetchPartition")(
        partition=index, fetch_offset=offset, partition_max_bytes=partition_max_bytes,
        current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
        for index, offset in sorted(offsets.items()))
    return build(schema, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10),
                 min_bytes=0, max_bytes=max_bytes, isolation_level=0, session_id=0,
                 session_epoch=-1, topics=(nested(schema, "FetchTopic")(
                     topic=TOPIC, partitions=partitions),), forgotten_topics_data=(),
                 rack_id="")


def sizes(response) -> dict[int, int]:
    return {p.partition_index: len(p.records or b"") for t in response.responses
            for p in t.partitions}


async def test_only_the_first_partition_with_data_may_pass_max_bytes(node):
    async with await KafkaClient.connect(node) as client:
        for partition in range(3):
            error, _ = produce_result(await client.call(ApiKey.PRODUCE, 9, produce_request(
                TOPIC, partition, records_batch(values(1, size=3000)))))
            assert error == 0
        # 1000 bytes for the fetch: partition 0's batch (over 3000) is sent whole, the
        # others wait for the next fetch
        first = sizes(await client.call(ApiKey.FETCH, 12, fetch_body({0: 0, 1: 0, 2: 0},
                                                                      1000)))
        assert first[0] > 3000 and first[1] == first[2] == 0
        # partition 0 read: partition 1 comes first now
        second = sizes(await client.call(ApiKey.FETCH, 12, fetch_body({0: 1, 1: 0, 2: 0},
                                                                       1000)))
        assert second[0] == 0 and second[1] > 3000 and second[2] == 0
        # a partition's own limit below its first batch: the first partition with data
        # still gets it, as in Kafka
        third = sizes(await client.call(ApiKey.FETCH, 12, fetch_body(
            {0: 0, 1: 0, 2: 0}, 1 << 20, partition_max_bytes=1000)))
        assert third[0] > 3000 and third[1] == third[2] == 0
        # room for everything: everything
        everything = sizes(await client.call(ApiKey.FETCH, 12, fetch_body(
            {0: 0, 1: 0, 2: 0}, 1 << 20)))
        assert all(size > 3000 for size in everything.values())


async def test_librdkafka_consumes_large_messages_over_partitions_with_fetch_max_bytes(node):
    """librdkafka's 0082: ~900 KB messages on 3 partitions, fetch.max.bytes 1,000,000 and
    a receive buffer of fetch.max.bytes + 512, a partition's own limit far above."""
    from confluent_kafka import Consumer, Producer

    def run():
        producer = Producer({"bootstrap.servers": node, "linger.ms": 0})
        for partition in range(3):
            producer.produce(TOPIC, value=bytes([partition]) * 900_000, partition=partition)
        assert producer.flush(TIMEOUT) == 0
        failures = []  # the client's own errors: a refused response is one
        consumer = Consumer({"bootstrap.servers": node, "group.id": "large",
                             "error_cb": failures.append,
                             "auto.offset.reset": "earliest", "fetch.max.bytes": 1_000_000,
                             "max.partition.fetch.bytes": 20_000_000,
                             "receive.message.max.bytes": 1_000_512})
        consumer.subscribe([TOPIC])
        got, errors = set(), []
        deadline = time.monotonic() + TIMEOUT
        try:
            while len(got) < 3 and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    errors.append(msg.error())
                    continue
                got.add((msg.partition(), len(msg.value())))
        finally:
            consumer.close()
        return got, errors, failures

    got, errors, failures = await trio.to_thread.run_sync(run)
    assert got == {(0, 900_000), (1, 900_000), (2, 900_000)}, errors
    assert not failures, failures
