"""Compaction on a live node with confluent-kafka (the log cleaner under the writer lease,
mink/broker/cluster/compaction.py): a producer overwrites 10,000 keys three times and
deletes some; after compaction a consumer from the earliest offset reads exactly the latest
value of every live key, in offset order, and no deleted key once delete.retention.ms has
passed; the stored bytes shrink to about the live data; the objects swapped away are
collected; a consumer half-way through the log reads on without an error across the swap
and the collection, and another reads the log again and again while they happen."""

from __future__ import annotations

import random
import threading
import time

import trio

from mink.storage.controlplane.postgres import READ
from tests.support.metadata import ToolMetadataStore
from mink.storage.stream_object import is_stream_object
from tests.test_lifecycle import create_topic

TIMEOUT = 90
KEYS = 10_000
ROUNDS = 3
DELETED = 1_000  # every tenth key gets a tombstone after the last round
# The lapping reader's longest wait for a record (0.6 s seen with the machine's load at 14 on
# 2 cores): a read the swap or the collection held up, or one never answered, fails it.
STALL_S = 10.0
# Tiering within about a second, small stream objects, collection without delay, the
# cleaner looking every 0.2 s; delete.retention.ms 2 s on the topic.
FAST = dict(tiering_delay_ms=1000, tiering_stream_object_bytes=128 * 1024,
            file_delete_delay_ms=200, log_cleaner_backoff_ms=200, lease_ttl=6.0)


def _produce(address: str, topic: str, items: list[tuple[bytes, bytes | None]]) -> list[int]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "linger.ms": 5,
                         "compression.codec": "lz4", "enable.idempotence": True,
                         "allow.auto.create.topics": False})
    offsets: list[int] = [-1] * len(items)
    errors: list = []

    def delivered(i):
        def on_delivery(err, msg):
            if err:
                errors.append(err)
            else:
                offsets[i] = msg.offset()
        return on_delivery

    for i, (key, value) in enumerate(items):
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=0,
                                 on_delivery=delivered(i))
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(TIMEOUT) == 0
    assert not errors, errors[:3]
    return offsets


def _consumer(address: str, **extra):
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": address, "group.id": "unused",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest", **extra})


def _read_to(consumer, end: int, into: list, stop_at: int | None = None) -> None:
    """Poll until the record before `end` (or `stop_at` records in `into`) was read."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if stop_at is not None and len(into) >= stop_at:
            return
        if into and into[-1][0] >= end - 1:
            return
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        assert not msg.error(), msg.error()
        into.append((msg.offset(), msg.key(), msg.value()))
    raise AssertionError(f"read {len(into)} records, up to "
                         f"{into[-1][0] if into else None}, not to {end}")


def read_in_laps(address: str, topic: str, end: int, last_lap: threading.Event,
                 laps: list) -> None:
    """Read the partition from its start to `end` again and again (a seek back to the
    start after each lap), until a lap that began once `last_lap` was set is done. Each lap
    goes into `laps` as (began after last_lap was set, [(offset, key, value, when read)]);
    an error message, an offset not above the one before or no record for `STALL_S` fails
    it (the log is all committed: a record is always there to read)."""
    from confluent_kafka import TopicPartition

    consumer = _consumer(address, **{"fetch.max.bytes": 65536, "message.max.bytes": 65536,
                                     "max.partition.fetch.bytes": 65536})
    start = TopicPartition(topic, 0, 0)
    consumer.assign([start])
    last_read = time.monotonic()
    try:
        while True:
            final, lap = last_lap.is_set(), []
            while not lap or lap[-1][0] < end - 1:
                assert time.monotonic() - last_read < STALL_S, \
                    f"lap {len(laps)}: no record for {STALL_S} s after {lap[-1:]}"
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                last_read = time.monotonic()
                assert not msg.error(), msg.error()
                assert not lap or msg.offset() > lap[-1][0], (lap[-1][0], msg.offset())
                lap.append((msg.offset(), msg.key(), msg.value(), last_read))
            laps.append((final, lap))
            if final:
                return
            consumer.seek(start)
    finally:
        consumer.close()


def read_all(address: str, topic: str, end: int) -> list[tuple[int, bytes, bytes | None]]:
    from confluent_kafka import TopicPartition

    consumer = _consumer(address)
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list = []
    try:
        _read_to(consumer, end, out)
    finally:
        consumer.close()
    return out


async def wait_until(predicate, what: str, timeout: float = TIMEOUT) -> None:
    with trio.move_on_after(timeout):
        while not await predicate():
            await trio.sleep(0.1)
        return
    raise AssertionError(f"timed out waiting for {what}")


def expected_log(items: list[tuple[bytes, bytes | None]], offsets: list[int]):
    """What a consumer of the compacted log reads: each live key's latest record, by offset."""
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for (key, value), offset in zip(items, offsets, strict=True):
        latest[key] = (offset, value)
    return sorted((o, k, v) for k, (o, v) in latest.items() if v is not None)


async def test_a_compacted_topic_keeps_the_latest_value_of_every_live_key(
        mink_postgres, tmp_path, aio_loop):
    from mink.testing import open_node

    rng = random.Random(20)
    items: list[tuple[bytes, bytes | None]] = []
    for r in range(ROUNDS):
        order = list(range(KEYS))
        rng.shuffle(order)
        items += [(b"key-%05d" % k, b"value-%d-%05d-" % (r, k) + b"x" * rng.randint(0, 40))
                  for k in order]
    items += [(b"key-%05d" % k, None) for k in range(0, KEYS, KEYS // DELETED)]
    items.append((b"sentinel", b"last"))  # the log's last batch: kept whole by every pass
    store = (tmp_path / "objects")
    store.mkdir()
    async with open_node(mink_postgres, store_url=store.as_uri(), proxy=False,
                         **FAST) as running:
        address, node = running.bootstrap, running.node
        # the test's own connection (the node's runs in the node's asyncio loop)
        metadata = await ToolMetadataStore.open(running.postgres_url)
        # Nothing is compacted until the consumer below is half-way through.
        await trio.to_thread.run_sync(lambda: create_topic(
            address, "table", 1, cleanup_policy="compact", delete_retention_ms=2000,
            min_cleanable_dirty_ratio="0.01", min_compaction_lag_ms=3_600_000))
        offsets = await trio.to_thread.run_sync(_produce, address, "table", items)
        end = max(offsets) + 1
        assert end == len(items)
        topic_id = node.view.topics["table"].topic_id

        async def stored_bytes() -> int:
            row = await metadata.fetch_one(READ, """
                SELECT coalesce(sum(byte_end - byte_start), 0) FROM batch_index
                 WHERE topic_id = %s""", (topic_id,))
            return row[0]

        async def all_tiered() -> bool:
            rows = await metadata.fetch_all(READ, """
                SELECT object_key FROM batch_index WHERE topic_id = %s""", (topic_id,))
            return bool(rows) and all(is_stream_object(r[0]) for r in rows)

        await wait_until(all_tiered, "every record tiered into stream objects")
        before = await stored_bytes()

        # A consumer reads half of the log, then waits while compaction swaps the objects
        # it was reading (and the old ones are collected), then reads on to the end.
        from confluent_kafka import TopicPartition

        mid_way: list = []
        half_read, swapped, failure = threading.Event(), threading.Event(), []

        def slow_reader() -> None:
            try:
                consumer = _consumer(address, **{"fetch.max.bytes": 8192, "message.max.bytes": 8192,
                                                 "max.partition.fetch.bytes": 4096,
                                                 "queued.max.messages.kbytes": 16})
                consumer.assign([TopicPartition("table", 0, 0)])
                try:
                    _read_to(consumer, end, mid_way, stop_at=len(items) // 2)
                    half_read.set()
                    assert swapped.wait(TIMEOUT), "no swap"
                    _read_to(consumer, end, mid_way)
                finally:
                    consumer.close()
            except BaseException as exc:  # reported to the test below
                failure.append(exc)
                half_read.set()

        # Another one reads the log from its start to its end again and again while
        # compaction swaps the objects and collects the old ones, and one lap more.
        laps: list = []
        last_lap = threading.Event()

        def lapping_reader() -> None:
            try:
                read_in_laps(address, "table", end, last_lap, laps)
            except BaseException as exc:  # reported to the test below
                failure.append(exc)

        reader = threading.Thread(target=slow_reader)
        lapper = threading.Thread(target=lapping_reader)
        reader.start()
        try:
            assert await trio.to_thread.run_sync(half_read.wait, TIMEOUT)
            assert not failure, failure
            lapper.start()

            async def a_lap_read() -> bool:
                return bool(laps) or bool(failure)

            await wait_until(a_lap_read, "the lapping reader's first lap")
            compaction_enabled = time.monotonic()

            def compact_now() -> None:
                from confluent_kafka.admin import (
                    AlterConfigOpType,
                    ConfigEntry,
                    ConfigResource,
                    ResourceType,
                )
                from tests.test_admin_apis import confluent_admin, error_of

                resource = ConfigResource(ResourceType.TOPIC, "table", incremental_configs=[
                    ConfigEntry("min.compaction.lag.ms", "0",
                                incremental_operation=AlterConfigOpType.SET)])
                admin = confluent_admin(address)
                assert error_of(admin.incremental_alter_configs([resource])[resource]) is None

            await trio.to_thread.run_sync(compact_now)

            async def state() -> tuple[int, int | None, int] | None:
                return await metadata.fetch_one(READ, """
                    SELECT cleaned_to, tombstone_horizon, passes FROM compaction_state
                     WHERE topic_id = %s AND partition = 0""", (topic_id,))

            async def compacted_to_the_end() -> bool:
                s = await state()
                return s is not None and s[0] == end

            await wait_until(compacted_to_the_end, "a pass up to the end of the log")

            async def old_objects_collected() -> bool:
                listed = {k for k in await running.objects.list("stream/")}
                rows = await metadata.fetch_all(READ, """
                    SELECT object_key FROM batch_index WHERE topic_id = %s""", (topic_id,))
                return listed == {r[0] for r in rows}

            await wait_until(old_objects_collected, "the swapped objects collected")
            collected = time.monotonic()
            swapped.set()
            last_lap.set()
            await trio.to_thread.run_sync(reader.join, TIMEOUT)
            await trio.to_thread.run_sync(lapper.join, TIMEOUT)
            assert not reader.is_alive() and not lapper.is_alive()
            assert not failure, failure
        finally:
            swapped.set()
            last_lap.set()
            await trio.to_thread.run_sync(reader.join, TIMEOUT)
            if lapper.ident is not None:
                await trio.to_thread.run_sync(lapper.join, TIMEOUT)

        # The mid-way consumer: no error, offsets only growing, and for every live key the
        # last value it read is the latest one. A deleted key's tombstone it may have missed:
        # a consumer slower than delete.retention.ms may (Kafka's contract, KIP-534).
        assert [o for o, _, _ in mid_way] == sorted({o for o, _, _ in mid_way})
        assert mid_way[-1][0] == end - 1
        last_seen = {k: v for _, k, v in mid_way}
        latest = {k: v for k, v in items}
        assert last_seen.keys() == latest.keys()
        assert {k: v for k, v in last_seen.items() if latest[k] is not None} == {
            k: v for k, v in latest.items() if v is not None}

        # The lapping reader read on while the pass ran, swapped and the old objects went:
        # no error and no stall (read_in_laps), each lap in offset order to the end with
        # the latest value of every live key (a lap across the swap reads the old objects'
        # records, then the compacted ones'), reads from before compaction was on to after
        # the old objects went, and its last lap, begun after that, read the compacted log.
        live = {k: v for k, v in latest.items() if v is not None}
        for _, lap in laps:
            seen = {k: v for _, k, v, _ in lap}
            assert {k: seen.get(k) for k in live} == live
        times = [t for _, lap in laps for *_, t in lap]
        assert times[0] < compaction_enabled and times[-1] > collected
        during = sum(compaction_enabled <= t <= collected for t in times)
        print(f"the lapping reader: {len(laps)} laps, {len(times)} records, {during} of them "
              f"in the {collected - compaction_enabled:.1f} s from compaction on to the old "
              f"objects collected; longest wait "
              f"{max(b - a for a, b in zip(times, times[1:])):.2f} s")
        final, lap = laps[-1]
        assert final and len(lap) < len(items) - KEYS, "the last lap read the compacted log"

        # After delete.retention.ms a pass drops the tombstones (KIP-534).
        async def tombstones_gone() -> bool:
            s = await state()
            return s is not None and s[1] is None and s[2] >= 2

        await wait_until(tombstones_gone, "the pass after the tombstones' delete horizon")
        got = await trio.to_thread.run_sync(read_all, address, "table", end)
        want = expected_log(items, offsets)
        assert len(want) == KEYS - DELETED + 1
        assert got == want, "exactly the latest value of every live key, in offset order"

        # Stored bytes: at most 1.5x (live keys x record size); nothing is uncompacted here.
        after = await stored_bytes()
        record_size = sum(len(k) + len(v) for _, k, v in want) / len(want)
        assert after <= 1.5 * len(want) * record_size, (before, after, record_size)
        assert after < before / 2
        assert node.cleaner.passes >= 2 and node.cleaner.tombstones_dropped == DELETED
        with trio.CancelScope(shield=True):
            await metadata.aclose()
