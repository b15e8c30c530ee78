"""Transactions and exactly-once with stock clients (confluent-kafka's transactional
producer, kafka-python's), against real nodes on PostgreSQL and the file:// store; the pure
rules of the coordinator's state machine."""

from __future__ import annotations

import time
import uuid

import pytest
import trio
from kio.schema.errors import ErrorCode

from mink.broker.transactions import state as rules

TIMEOUT = 60
TOPIC_PARTITIONS = 3


@pytest.fixture
def node_settings() -> dict:
    return dict(num_partitions=TOPIC_PARTITIONS, offsets_topic_num_partitions=3,
                transaction_state_num_partitions=3, group_initial_rebalance_delay_ms=0,
                transaction_abort_timed_out_transaction_cleanup_interval_ms=500)


def txn_producer(address: str, transactional_id: str, **conf):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "transactional.id": transactional_id,
                         "linger.ms": 5, **conf})
    producer.init_transactions(TIMEOUT)
    return producer


def consume_all(address: str, topic: str, isolation: str, partitions: int = TOPIC_PARTITIONS,
                expected: int | None = None, idle_s: float = 3.0) -> list:
    """Every message of the topic under `isolation`: until `expected` arrived, or until
    nothing came for idle_s after the consumer reached the end it sees."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": f"check-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, eof = [], set()
    deadline = time.monotonic() + TIMEOUT
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            if expected is not None and len(out) >= expected:
                break
            msg = consumer.poll(0.2)
            if msg is None:
                if expected is None and len(eof) == partitions and (
                        time.monotonic() - last > idle_s):
                    break
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    eof.add(msg.partition())
                    continue
                raise AssertionError(msg.error())
            last = time.monotonic()
            eof.discard(msg.partition())
            out.append(msg)
    finally:
        consumer.close()
    return out


def values(messages) -> list[bytes]:
    return sorted(m.value() for m in messages)


async def test_committed_visible_aborted_never_whole_or_nothing(node):
    def run():
        producer = txn_producer(node, "txn-basic")
        producer.begin_transaction()
        for i in range(30):
            producer.produce("txn", value=b"committed-%d" % i, partition=i % 3)
        producer.commit_transaction(TIMEOUT)
        producer.begin_transaction()
        for i in range(30):
            producer.produce("txn", value=b"aborted-%d" % i, partition=i % 3)
        producer.flush(TIMEOUT)  # written to the log, then aborted
        producer.abort_transaction(TIMEOUT)
        producer.begin_transaction()
        for i in range(6):
            producer.produce("txn", value=b"second-%d" % i, partition=i % 3)
        producer.commit_transaction(TIMEOUT)
        committed = consume_all(node, "txn", "read_committed")  # until idle at the end
        time.sleep(1)
        uncommitted = consume_all(node, "txn", "read_uncommitted", expected=66)
        return committed, uncommitted

    committed, uncommitted = await trio.to_thread.run_sync(run)
    assert values(committed) == sorted([b"committed-%d" % i for i in range(30)]
                                       + [b"second-%d" % i for i in range(6)])
    assert len(uncommitted) == 66, "read_uncommitted sees both, control batches skipped"
    assert {m.value()[:7] for m in uncommitted} == {b"committ", b"aborted", b"second-"}
