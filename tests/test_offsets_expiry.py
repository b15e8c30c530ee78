"""Committed offsets expire (KIP-211) on a live node, seen through stock clients: a group that
commits and leaves loses its offsets offsets.retention after it became Empty (and is Dead),
a group that stays active keeps them, a simple consumer's (assign + commit, no members)
expire by their commit time. Retention is shortened to seconds, checked every 200 ms."""

from __future__ import annotations

import time

import pytest

from tests.support.nodes import start_node
from tests.test_groups import group_config, in_thread, produce

RETENTION_S = 3.0
TIMEOUT = 30
SESSION_MS = 6000


@pytest.fixture
async def enode(nursery, pg_url, store_url) -> str:
    return await start_node(nursery, group_config(
        pg_url, store_url, num_partitions=2, offsets_retention_minutes=RETENTION_S / 60,
        offsets_retention_check_interval_ms=200))


# -- helpers (blocking) --------------------------------------------------------------------------

def member(address: str, group: str, **conf):
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": address, "group.id": group,
                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                     "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500, **conf})


def consume_and_commit(consumer, topic: str, count: int) -> list:
    consumer.subscribe([topic])
    out = []
    deadline = time.monotonic() + TIMEOUT
    while len(out) < count and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            out.append(message)
    assert len(out) == count, f"consumed {len(out)} of {count}"
    consumer.commit(message=out[-1], asynchronous=False)
    return out


def committed(address: str, group: str, topic: str, partitions: int = 1) -> list[int]:
    """The group's committed offsets (-1001: none), by OffsetFetch, without joining."""
    from confluent_kafka import Consumer, TopicPartition

    checker = Consumer({"bootstrap.servers": address, "group.id": group})
    try:
        return [tp.offset for tp in checker.committed(
            [TopicPartition(topic, p) for p in range(partitions)], timeout=TIMEOUT)]
    finally:
        checker.close()


def wait_until(predicate, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def group_state(address: str, group: str) -> tuple[str, set[str]]:
    """(DescribeGroups state, the groups ListGroups lists)."""
    from confluent_kafka.admin import AdminClient

    client = AdminClient({"bootstrap.servers": address})
    described = client.describe_consumer_groups([group])[group].result(timeout=TIMEOUT)
    listed = client.list_consumer_groups().result(timeout=TIMEOUT)
    return described.state.name, {g.group_id for g in listed.valid}


NONE = -1001  # OFFSET_INVALID: nothing committed


# -- tests ---------------------------------------------------------------------------------------

async def test_a_group_that_left_loses_its_offsets_and_restarts_from_the_reset(enode):
    def scenario():
        produce(enode, "left", [b"m-%d" % i for i in range(10)], 1)
        first = member(enode, "leaver")
        try:
            assert [m.offset() for m in consume_and_commit(first, "left", 5)] == [0, 1, 2, 3, 4]
        finally:
            first.close()  # LeaveGroup: the group is Empty from now on
        left_at = time.monotonic()
        kept = committed(enode, "leaver", "left")
        if time.monotonic() - left_at < RETENTION_S - 0.5:  # (a loaded machine may be slower)
            assert kept == [5], "the offsets are kept until the retention has passed"
        wait_until(lambda: committed(enode, "leaver", "left") == [NONE], "offsets to expire")
        assert time.monotonic() - left_at >= RETENTION_S - 0.5  # not before the retention
        state, listed = group_state(enode, "leaver")
        assert state == "DEAD" and "leaver" not in listed
        # the next member of the group starts where auto.offset.reset says, not at 5
        again = member(enode, "leaver")
        try:
            assert consume_and_commit(again, "left", 1)[0].offset() == 0
        finally:
            again.close()

    await in_thread(scenario)


async def test_an_active_group_keeps_its_offsets_past_the_retention(enode):
    def scenario():
        produce(enode, "active", [b"m-%d" % i for i in range(4)], 1)
        staying = member(enode, "stays")
        try:
            consume_and_commit(staying, "active", 4)
            committed_at = time.monotonic()
            # a second group that commits and leaves at the same time: its offsets going
            # shows that expiry rounds ran past the retention meanwhile
            leaving = member(enode, "goes")
            try:
                consume_and_commit(leaving, "active", 4)
            finally:
                leaving.close()

            def control_expired() -> bool:
                staying.poll(0.1)  # stays a live member
                return committed(enode, "goes", "active") == [NONE]

            wait_until(control_expired, "the control group's offsets to expire")
            while time.monotonic() - committed_at < RETENTION_S + 1.0:
                staying.poll(0.1)
            assert committed(enode, "stays", "active") == [4]
            state, listed = group_state(enode, "stays")
            assert state == "STABLE" and "stays" in listed
        finally:
            staying.close()

    await in_thread(scenario)


async def test_a_simple_consumers_offsets_expire_by_commit_time(enode):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    def scenario():
        produce(enode, "simple", [b"m-%d" % i for i in range(6)], 2)
        consumer = KafkaConsumer(bootstrap_servers=enode, group_id="standalone",
                                 enable_auto_commit=False)
        try:
            p0, p1 = TopicPartition("simple", 0), TopicPartition("simple", 1)
            consumer.assign([p0, p1])  # no subscription: no member ever joins
            consumer.commit({p0: OffsetAndMetadata(3, "", -1)})
            first_at = time.monotonic()
            time.sleep(RETENTION_S / 2)
            consumer.commit({p1: OffsetAndMetadata(2, "", -1)})
            second_at = time.monotonic()
            assert committed(enode, "standalone", "simple", 2) == [3, 2]
            # p0 goes by its own commit time while p1, committed later, is still kept
            wait_until(lambda: committed(enode, "standalone", "simple", 2)[0] == NONE,
                       "the first offset to expire")
            assert time.monotonic() - first_at >= RETENTION_S - 0.5
            if time.monotonic() - second_at < RETENTION_S - 0.5:
                assert committed(enode, "standalone", "simple", 2)[1] == 2
            wait_until(lambda: committed(enode, "standalone", "simple", 2) == [NONE, NONE],
                       "the second offset to expire")
            state, listed = group_state(enode, "standalone")
            assert state == "DEAD" and "standalone" not in listed
        finally:
            consumer.close()

    await in_thread(scenario)
