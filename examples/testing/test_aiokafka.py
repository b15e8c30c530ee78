"""An asyncio test with aiokafka (pytest-asyncio): the same `mink_broker` fixture."""

import aiokafka
import pytest


@pytest.mark.asyncio
async def test_aiokafka_round_trip(mink_broker):
    mink_broker.create_topic("events")
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=mink_broker.bootstrap)
    await producer.start()
    try:
        for i in range(10):
            await producer.send_and_wait("events", f"event-{i}".encode())
    finally:
        await producer.stop()

    consumer = aiokafka.AIOKafkaConsumer("events", bootstrap_servers=mink_broker.bootstrap,
                                         auto_offset_reset="earliest")
    await consumer.start()
    try:
        values = []
        async for message in consumer:
            values.append(message.value)
            if len(values) == 10:
                break
    finally:
        await consumer.stop()
    assert values == [f"event-{i}".encode() for i in range(10)]


@pytest.mark.asyncio
async def test_retries_while_the_object_store_is_paused(mink_broker):
    """The producer's send waits while uploads hang, and succeeds once they go through."""
    import asyncio

    mink_broker.create_topic("paused")
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=mink_broker.bootstrap,
                                         request_timeout_ms=30000)
    await producer.start()
    try:
        mink_broker.pause_object_store()
        sending = asyncio.ensure_future(producer.send_and_wait("paused", b"late"))
        done, _ = await asyncio.wait([sending], timeout=1.0)
        assert not done, "acknowledged while the object store was paused"
        mink_broker.resume_object_store()
        await asyncio.wait_for(sending, 20)
    finally:
        await producer.stop()
    assert [m.value for m in mink_broker.read_topic("paused")] == [b"late"]
