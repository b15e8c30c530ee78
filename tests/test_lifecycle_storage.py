"""The storage lifecycle against the real PostgreSQL and object stores: retention under a
writer lease, DeleteRecords fenced by the leader epoch, collection after
file.delete.delay.ms (never of a referenced object), a reader whose object is collected
under it, metadata pruning."""

from __future__ import annotations

import pytest
import trio

from mink.storage.lifecycle import store as lifecycle
from mink.storage.log import OffsetOutOfRange, PartitionLog
from mink.storage.controlplane import StaleEpoch
from mink.storage.objectstore import open_object_store
from mink.storage.objectstore.testing import FaultyObjectStore
from mink.storage.streams import Streams
from tests.test_wal import Node, append, make_topic, metadata, read_all, values_of  # noqa: F401

HOUR_MS = 3600 * 1000


def now_ms() -> int:
    import time

    return int(time.time() * 1000)


async def delete_everything_due(metadata, objects, delay_ms: int = 0) -> list[str]:
    queued = await lifecycle.queue_unreferenced(metadata, delay_ms, 1000)
    keys = await lifecycle.due_deletions(metadata, 1000)
    for key in keys:
        await objects.delete(key)
    await lifecycle.deletions_done(metadata, keys)
    return queued


async def index_keys(metadata, topic_id, partition: int) -> set[str]:
    return {r.object_key for r in await metadata.find_batches(topic_id, partition, 0, 1000)}


async def test_retention_by_time_and_size_under_the_writer_lease(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 2)
    streams = await Node(metadata, objects, 1).start(nursery)
    old, new = now_ms() - 2 * HOUR_MS, now_ms()
    logs = [await streams.open(topic.topic_id, p, 0) for p in range(2)]
    for i in range(4):  # one index row each
        await append(logs[0], [b"old-%d" % i], old).wait(10)
    for i in range(2):
        await append(logs[0], [b"new-%d" % i], new).wait(10)
    for i in range(10):
        await append(logs[1], [b"x" * 100], new).wait(10)
    scope = f"writer/{topic.topic_id}"
    lease = await metadata.acquire_lease(scope, 1, streams.node_epoch, ttl_s=30)

    # An old lease epoch is refused: nothing moves.
    with pytest.raises(StaleEpoch):
        await lifecycle.apply_retention(metadata, topic.topic_id, scope, 1, lease + 1,
                                        HOUR_MS, -1)
    assert (await metadata.stream_state(topic.topic_id, 0)).log_start_offset == 0

    moved = await lifecycle.apply_retention(metadata, topic.topic_id, scope, 1, lease,
                                            HOUR_MS, -1)
    assert moved == {0: 4}, "the four old batches are past retention.ms, partition 1 is new"
    assert [r.base_offset for r in await metadata.find_batches(topic.topic_id, 0, 0)] == [4, 5]
    # Again: nothing more to do (and the log start never moves back).
    assert await lifecycle.apply_retention(metadata, topic.topic_id, scope, 1, lease,
                                           HOUR_MS, -1) == {}

    # Size: each row of partition 1 is one batch of the same size; keep about 3 of them.
    row_bytes = (await metadata.find_batches(topic.topic_id, 1, 0, 1))[0]
    size = row_bytes.byte_end - row_bytes.byte_start
    moved = await lifecycle.apply_retention(metadata, topic.topic_id, scope, 1, lease,
                                            -1, 3 * size)
    # Kafka deletes the oldest while what is left still holds retention.bytes: 3 rows stay
    assert moved == {1: 7}

    # Every record past retention: the partition empties (log start = high watermark).
    moved = await lifecycle.apply_retention(metadata, topic.topic_id, scope, 1, lease, 0, -1)
    assert moved == {0: 6, 1: 10}
    for p, end in ((0, 6), (1, 10)):
        state = await metadata.stream_state(topic.topic_id, p)
        assert (state.log_start_offset, state.committed_end) == (end, end)
        assert await metadata.find_batches(topic.topic_id, p, 0) == []


async def test_delete_records_is_fenced_by_the_leader_epoch(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    for i in range(5):
        await append(log, [b"v%d" % i, b"w%d" % i]).wait(10)  # offsets 2i, 2i+1

    def delete(offset, leader_epoch=0, node_epoch=streams.node_epoch):
        return lifecycle.delete_records(metadata, topic.topic_id, 0, leader_epoch, 1,
                                        node_epoch, offset)

    with pytest.raises(lifecycle.DeleteRecordsRefused) as refused:
        await delete(11)
    assert refused.value.reason == "offset_out_of_range"
    with pytest.raises(lifecycle.DeleteRecordsRefused) as refused:
        await delete(3, leader_epoch=1)
    assert refused.value.reason == "not_leader"
    with pytest.raises(lifecycle.DeleteRecordsRefused) as refused:
        await delete(3, node_epoch=streams.node_epoch - 1)
    assert refused.value.reason == "not_leader"

    assert await delete(3) == 3  # inside the second row: that row stays
    assert [r.base_offset for r in await metadata.find_batches(topic.topic_id, 0, 0)] == \
        [2, 4, 6, 8]
    assert await delete(1) == 3, "the log start only moves forward"
    log.advance_log_start(3)
    with pytest.raises(OffsetOutOfRange):
        await log.read(2, 1000)
    assert [o for o, _ in await read_all(log, 3)] == list(range(3, 10))
    assert await delete(-1) == 10, "-1 is the high watermark"
    assert await metadata.find_batches(topic.topic_id, 0, 0) == []


async def test_collection_never_deletes_a_referenced_object(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 2)
    streams = await Node(metadata, objects, 1, wal_max_delay=0.05).start(nursery)
    logs = [await streams.open(topic.topic_id, p, 0) for p in range(2)]
    # Both partitions' batches in the same WAL objects (one flush every 50 ms).
    async with trio.open_nursery() as producers:
        for p in range(2):
            producers.start_soon(lambda p=p: append(logs[p], [b"a", b"b"]).wait(10))
    shared = await index_keys(metadata, topic.topic_id, 0)
    assert shared and shared == await index_keys(metadata, topic.topic_id, 1)

    await lifecycle.delete_records(metadata, topic.topic_id, 0, 0, 1, streams.node_epoch, -1)
    assert await delete_everything_due(metadata, objects) == [], \
        "partition 1 still uses the object"
    # Try to make it: put the referenced key in the queue as a buggy step would.
    (key,) = shared
    await metadata.fetch_all(lifecycle.IDEMPOTENT,
                             "INSERT INTO unreferenced_objects (key, since) "
                             "VALUES (%s, now() - interval '1 hour') RETURNING key", (key,))
    assert await delete_everything_due(metadata, objects) == []
    assert await objects.list("wal/") == sorted(shared)
    assert [o for o, _ in await read_all(logs[1])] == [0, 1]

    # The last row goes: the object waits file.delete.delay.ms on PostgreSQL's clock...
    await lifecycle.delete_records(metadata, topic.topic_id, 1, 0, 1, streams.node_epoch, -1)
    assert await delete_everything_due(metadata, objects, delay_ms=60_000) == []
    assert await objects.list("wal/") == sorted(shared)
    # ...then it is deleted.
    assert await delete_everything_due(metadata, objects, delay_ms=0) == [key]
    assert await objects.list("wal/") == []


async def test_a_reader_whose_object_is_collected_under_it_gets_a_clean_answer(
        metadata, nursery):
    faulty = FaultyObjectStore(open_object_store("memory://"))
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, faulty, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    for i in range(3):
        await append(log, [b"v%d" % i]).wait(10)
    # A reader with cold caches (no tail): its reads go through the index and GETs.
    cold = Streams(1, streams.node_epoch, faulty, metadata)
    reader = PartitionLog(topic.topic_id, 0, 0, 3, 0, cold.wal, cold.caches)

    release = trio.Event()
    faulty.stall("get", release)
    outcome: list = []

    async def read() -> None:
        try:
            outcome.append(values_of(await reader.read(0, 1000)))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    nursery.start_soon(read)
    with trio.fail_after(10):
        while not any(op == "get" for op, _ in faulty.calls):
            await trio.sleep(0.01)
    # Between its index lookup and its GET: the rows go and the objects are collected.
    await lifecycle.delete_records(metadata, topic.topic_id, 0, 0, 1, streams.node_epoch, 2)
    faulty.clear()
    assert len(await delete_everything_due(metadata, faulty)) == 2
    release.set()
    with trio.fail_after(10):
        while not outcome:
            await trio.sleep(0.01)
    assert isinstance(outcome[0], OffsetOutOfRange), outcome
    assert reader.log_start_offset == 2, "the reader re-resolved the log start"
    assert [v for _, v in await read_all(reader, 2)] == [b"v2"]


async def test_metadata_pruning(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    for i in range(3):
        await append(log, [b"v%d" % i]).wait(10)
    await lifecycle.delete_records(metadata, topic.topic_id, 0, 0, 1, streams.node_epoch, 2)
    await delete_everything_due(metadata, objects)

    async def count(table: str) -> int:
        return (await metadata.fetch_one(lifecycle.READ, f"SELECT count(*) FROM {table}"))[0]

    wal_rows = await count("wal_objects")
    pruned = await lifecycle.prune_metadata(metadata, keep_s=0, change_log_keep=1,
                                            producer_expiration_ms=HOUR_MS, limit=1000)
    assert pruned["wal_objects"] == 2, "the two collected objects' decisions"
    assert await count("wal_objects") == wal_rows - 2
    assert await count("change_log") <= 2
    assert pruned["producer_state"] == 0


async def test_settling_orphans_at_restart_is_paged_and_skips_decided_keys(metadata, nursery):
    """More keys than one page, most of them decided already: only the undecided ones are
    abandoned (and each page is its own transaction, so no lock table fills up)."""
    from mink.storage import streams as streams_module
    from mink.storage.wal import wal_key

    objects = open_object_store("memory://")
    first = await metadata.register_node(1, "127.0.0.1", 9001, ttl_s=30)
    keys = [wal_key(1, first, seq) for seq in range(1, 2 * streams_module.SETTLE_PAGE + 501)]
    for key in keys:
        await objects.create(key, [b"x"])
    decided, undecided = keys[:-100], keys[-100:]
    await metadata.fetch_all(lifecycle.IDEMPOTENT, """
        INSERT INTO wal_objects (key, node_id, node_epoch, size, committed, outcome)
        SELECT k, 1, %s, 1, false, '{"committed": false, "reason": "x", "ranges": []}'
          FROM unnest(%s::text[]) AS k RETURNING key""", (first, decided))
    second = await metadata.register_node(1, "127.0.0.1", 9001, ttl_s=30)
    restarted = Streams(1, second, objects, metadata)
    assert sorted(await restarted.settle_orphans(objects)) == undecided
    abandoned = await metadata.fetch_all(lifecycle.READ, """
        SELECT key FROM wal_objects WHERE outcome->>'reason' = 'abandoned' ORDER BY key""")
    assert [k for (k,) in abandoned] == undecided


async def test_a_deleted_topics_objects_wait_for_the_delay_too(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    for i in range(2):
        await append(log, [b"v%d" % i]).wait(10)
    keys = sorted(await index_keys(metadata, topic.topic_id, 0))
    await metadata.delete_topic("t")
    # the committed-object scan of the older collector no longer sees them...
    assert await metadata.unreferenced_objects() == []
    # ...they wait file.delete.delay.ms in the queue, then go
    assert await delete_everything_due(metadata, objects, delay_ms=60_000) == []
    assert await objects.list("wal/") == keys
    assert sorted(await delete_everything_due(metadata, objects, delay_ms=0)) == keys
    assert await objects.list("wal/") == []


STATS_CHECK = """
SELECT p.partition, coalesce(s.indexed_bytes, 0), coalesce(s.index_rows, 0),
       (SELECT coalesce(sum(b.byte_end - b.byte_start), 0) FROM batch_index AS b
         WHERE b.topic_id = p.topic_id AND b.partition = p.partition),
       (SELECT count(*) FROM batch_index AS b
         WHERE b.topic_id = p.topic_id AND b.partition = p.partition)
  FROM partitions AS p LEFT JOIN partition_stats AS s USING (topic_id, partition)
 WHERE p.topic_id = %s ORDER BY p.partition"""


async def test_topic_statistics_are_kept_by_deltas_equal_to_the_full_sum(metadata, nursery):
    from mink.storage.controlplane.postgres import READ

    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 3)
    streams = await Node(metadata, objects, 1, wal_max_delay=0.02).start(nursery)
    logs = [await streams.open(topic.topic_id, p, 0) for p in range(3)]
    scope = f"writer/{topic.topic_id}"
    lease = await metadata.acquire_lease(scope, 1, streams.node_epoch, ttl_s=30)

    async def check() -> list[tuple[int, int]]:
        """Each partition's (bytes, rows) by deltas equals the sum over its index rows; the
        writer's statistics round (which reads the deltas) equals the topic's total."""
        rows = await metadata.fetch_all(READ, STATS_CHECK, (topic.topic_id,))
        for partition, by_delta, rows_by_delta, full, full_rows in rows:
            assert (by_delta, rows_by_delta) == (full, full_rows), f"partition {partition}"
        await metadata.write_topic_stats(topic.topic_id, scope, 1, lease)
        stats = (await metadata.topic_stats())[topic.topic_id]
        assert stats[2] == sum(r[3] for r in rows)
        return [(r[3], r[4]) for r in rows]

    old, new = now_ms() - 2 * HOUR_MS, now_ms()
    async def produce(p: int) -> None:  # the partitions at once: their rows share objects
        for i in range(4):
            await append(logs[p], [b"v" * (10 + 5 * i + p)], old if i < 2 else new).wait(10)

    async with trio.open_nursery() as producers:
        for p in range(3):
            producers.start_soon(produce, p)
    assert all(b > 0 and n > 0 for b, n in await check())

    # retention: the two old rows of each partition go
    assert await lifecycle.apply_retention(metadata, topic.topic_id, scope, 1, lease,
                                           HOUR_MS, -1) == {0: 2, 1: 2, 2: 2}
    assert [n for _, n in await check()] == [2, 2, 2]

    # DeleteRecords: one more row of partition 1, all of partition 2
    await lifecycle.delete_records(metadata, topic.topic_id, 1, 0, 1, streams.node_epoch, 3)
    await lifecycle.delete_records(metadata, topic.topic_id, 2, 0, 1, streams.node_epoch, -1)
    assert [n for _, n in await check()] == [2, 1, 0]

    # more produce after the truncations, then the topic deleted: nothing is left over
    await append(logs[0], [b"after"]).wait(10)
    assert [n for _, n in await check()] == [3, 1, 0]
    await metadata.delete_topic("t")
    left = await metadata.fetch_all(READ, "SELECT count(*) FROM partition_stats WHERE topic_id = %s "
                               "UNION ALL SELECT count(*) FROM topic_stats WHERE topic_id = %s",
                               (topic.topic_id, topic.topic_id))
    assert left == [(0,), (0,)]


class CountingStore:
    """The wrapped store, counting the keys its listings return."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.listed = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        keys = await self.inner.list(prefix, start_after)
        self.listed += len(keys)
        return keys


async def test_settling_lists_only_after_what_the_writer_and_earlier_restarts_recorded(
        metadata, nursery, monkeypatch):
    """The running writer records how far its objects are decided; a restart lists only the
    objects after that mark, and never again the epochs an earlier restart settled."""
    from mink.storage import wal as wal_module
    from mink.storage.wal import wal_key

    monkeypatch.setattr(wal_module, "DECIDED_MARK_INTERVAL", 0.05)
    objects = CountingStore(open_object_store("memory://"))
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    for i in range(30):  # 30 committed objects of epoch `first`
        await append(log, [b"v%d" % i]).wait(10)
    first = streams.node_epoch

    async def marked() -> int:
        while True:
            rows = await metadata.fetch_all(lifecycle.READ, "SELECT through_seq FROM wal_settled "
                                       "WHERE node_id = 1 AND node_epoch = %s", (first,))
            if rows and rows[0][0] == 30:
                return rows[0][0]
            await trio.sleep(0.05)

    with trio.fail_after(10):
        assert await marked() == 30
    streams.stop()
    # The crash left one object uploaded and never committed, after the mark.
    orphan = wal_key(1, first, 31)
    await objects.create(orphan, [b"x"])

    second = await metadata.register_node(1, "127.0.0.1", 9001, ttl_s=30)
    objects.listed = 0
    assert await Streams(1, second, objects, metadata).settle_orphans(objects) == [orphan]
    assert objects.listed == 1, "only the objects after the writer's mark are listed"

    # The next restart does not look at the settled epochs at all.
    third = await metadata.register_node(1, "127.0.0.1", 9001, ttl_s=30)
    objects.listed = 0
    assert await Streams(1, third, objects, metadata).settle_orphans(objects) == []
    assert objects.listed == 0
    rows = await metadata.fetch_all(lifecycle.READ, "SELECT node_epoch, complete FROM wal_settled "
                               "WHERE node_id = 1 ORDER BY node_epoch")
    assert rows == [(third - 1, True)], "one row per node stays"


async def test_deleting_more_index_rows_than_postgresql_has_locks_releases_every_object(
        metadata):
    """One statement that deletes the rows of tens of thousands of objects (a topic deleted
    with a long history still in WAL objects; a tiering swap of a round's 20,000 rows)
    takes a bounded number of locks. PostgreSQL's lock table holds about
    max_locks_per_transaction x max_connections locks (6,400 by default): with a lock per
    object released, such a deletion ran out of shared memory, every time it was tried."""
    topic = await make_topic(metadata, 1)
    rows = 60_000
    await metadata.fetch_all(lifecycle.IDEMPOTENT, """
        WITH objects AS (
            INSERT INTO wal_objects (key, committed, outcome)
            SELECT 'wal/many-' || g, true, '{}'::jsonb FROM generate_series(1, %(n)s) AS g
            RETURNING key
        ), rows AS (
            INSERT INTO batch_index (topic_id, partition, base_offset, last_offset,
                                     object_key, byte_start, byte_end, max_timestamp,
                                     batch_count, running_max_timestamp)
            SELECT %(topic)s, 0, g - 1, g - 1, 'wal/many-' || g, 0, 100, 0, 1, 0
              FROM generate_series(1, %(n)s) AS g
            RETURNING 1
        )
        UPDATE partitions SET committed_end = %(n)s
         WHERE topic_id = %(topic)s AND partition = 0
        RETURNING (SELECT count(*) FROM objects), (SELECT count(*) FROM rows)""",
        {"n": rows, "topic": topic.topic_id})
    await metadata.delete_topic("t")
    released = await metadata.fetch_all(lifecycle.IDEMPOTENT, """
        SELECT count(*), count(*) FILTER (WHERE w.gc_queued_at IS NOT NULL)
          FROM unreferenced_objects AS u LEFT JOIN wal_objects AS w USING (key)
         WHERE u.key LIKE 'wal/many-%%'""")
    assert released == [(rows, rows)]
