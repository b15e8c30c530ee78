"""Trio tests (pytest-trio): the node runs in the test's own trio run."""

import pytest
import trio

import mink.testing


@pytest.mark.trio
async def test_with_the_trio_fixture(mink_trio_broker):
    node = mink_trio_broker
    await node.create_topic("jobs", partitions=2)
    await produce(node.bootstrap, "jobs", [b"a", b"b", b"c"])
    assert sorted(m.value for m in await node.read_topic("jobs")) == [b"a", b"b", b"c"]


@pytest.mark.trio
async def test_open_node_directly(mink_postgres):
    # open_node works without pytest too; given the session's PostgreSQL it starts fast.
    async with mink.testing.open_node(mink_postgres, num_partitions=4) as node:
        await produce(node.bootstrap, "auto-created", [b"x"])
        assert len(await node.wait_led("auto-created")) == 4


async def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    import confluent_kafka

    def blocking() -> None:
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
        for value in values:
            producer.produce(topic, value)
        assert producer.flush(15) == 0

    await trio.to_thread.run_sync(blocking)  # never block the trio thread the node runs on
