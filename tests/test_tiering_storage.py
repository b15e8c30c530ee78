"""Tiering against the real PostgreSQL and object stores (memory, file://, moto S3): WAL rows
rewritten into stream objects and swapped in one fenced transaction; reads, Fetch at any
offset and ListOffsets by timestamp the same before and after; a stale coordinator epoch and
a changed index refused; WAL objects collected once their last row is swapped."""

from __future__ import annotations

import dataclasses
import errno
import random
import uuid

import pytest
import trio
import trio.testing

from mink.protocol.records import iter_batches
from mink.storage.controlplane import StaleEpoch
from mink.storage.controlplane.postgres import READ
from mink.storage.lifecycle import store as lifecycle
from mink.storage.lifecycle import tiering
from mink.storage.stream_object import is_stream_object
from mink.storage.streams import Streams
from tests.test_lifecycle_storage import delete_everything_due
from tests.test_wal import (  # noqa: F401  (fixtures)
    Node,
    _reader,
    append,
    make_topic,
    metadata,
    objects,
    read_all,
    values_of,
)

BASE_TS = 1_700_000_000_000


async def produce(logs, rounds: int, seed: int = 7) -> None:
    """Interleaved appends to every partition (so WAL objects are shared), with timestamps
    that go back and forth, sizes from a few bytes to tens of KiB."""
    rng = random.Random(seed)

    async def one(p: int) -> None:
        for i in range(rounds):
            values = [bytes([p, i % 256]) * rng.randint(1, 8000) for _ in range(rng.randint(1, 4))]
            ts = BASE_TS + i * 1000 + rng.randint(-1500, 1500)
            await append(logs[p], values, ts).wait(30)

    async with trio.open_nursery() as nursery:
        for p in range(len(logs)):
            nursery.start_soon(one, p)


async def snapshot(metadata, objects, topic, partitions: int, node_epoch: int):
    """What a reader with cold caches sees: every record, Fetch at sampled offsets with
    sampled budgets, ListOffsets at sampled timestamps."""
    cold = Streams(1, node_epoch, objects, metadata)
    rng = random.Random(3)
    out = {}
    for p in range(partitions):
        state = await metadata.stream_state(topic.topic_id, p)
        log = _reader(cold, topic.topic_id, p, state)
        records = await read_all(log)
        fetches = []
        for _ in range(25):
            offset = rng.randrange(state.log_start_offset, state.committed_end)
            got = await log.read(offset, rng.choice([1, 5000, 100_000, 10 << 20]))
            batches = [bytes(b) for chunk in got for _, b in iter_batches(chunk)]
            fetches.append((offset, batches[0], values_of(got)))
        times = [await log.offset_for_timestamp(BASE_TS + rng.randint(-5000, 80_000))
                 for _ in range(25)]
        out[p] = (records, fetches, times)
    return out


def assert_same_reads(before, after):
    for p, (records, fetches, times) in before.items():
        records_after, fetches_after, times_after = after[p]
        assert records_after == records, f"partition {p}: every record, in order"
        assert times_after == times, f"partition {p}: ListOffsets by timestamp"
        for (offset, first, values), (offset2, first2, values2) in zip(fetches, fetches_after):
            assert offset == offset2
            assert first2 == first, f"partition {p}: the batch holding offset {offset}"
            # the same records from there on (the budget may cut at another batch)
            n = min(len(values), len(values2))
            assert values2[:n] == values[:n] and n >= 1


async def index_rows(metadata, topic, p):
    return await metadata.find_batches(topic.topic_id, p, 0, 100_000)


async def coordinator_epoch(metadata, node_epoch: int) -> int:
    epoch = await metadata.acquire_lease("coordinator", 1, node_epoch, ttl_s=60)
    assert epoch is not None
    return epoch


async def one_partition_plan(metadata, nursery, rounds: int, target_bytes: int):
    """A memory:// store; a one-partition topic led by a started node, `rounds` of appends;
    the coordinator lease's epoch and the partition's one plan."""
    from mink.storage.objectstore import open_object_store

    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    await produce([log], rounds)
    epoch = await coordinator_epoch(metadata, streams.node_epoch)
    (plan,) = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), target_bytes)
    return objects, topic, streams, log, epoch, plan


async def stats(metadata, topic):
    return await metadata.fetch_all(READ, """
        SELECT partition, indexed_bytes, index_rows FROM partition_stats
         WHERE topic_id = %s ORDER BY partition""", (topic.topic_id,))


async def test_a_round_keeps_every_byte_and_every_answer(metadata, objects, nursery):
    topic = await make_topic(metadata, 3)
    streams = await Node(metadata, objects, 1).start(nursery)
    logs = [await streams.open(topic.topic_id, p, 0) for p in range(3)]
    await produce(logs, 60)
    before = await snapshot(metadata, objects, topic, 3, streams.node_epoch)
    rows_before = {p: await index_rows(metadata, topic, p) for p in range(3)}
    wal_keys = {r.object_key for rows in rows_before.values() for r in rows}
    stats_before = await stats(metadata, topic)
    epoch = await coordinator_epoch(metadata, streams.node_epoch)

    plans = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), 200_000)
    assert {p.partition for p in plans} == {0, 1, 2}
    assert len(plans) > 3, "several stream objects per partition at this target size"
    for plan in plans:
        assert plan.size <= 200_000 or len(plan.rows) == 1
        await tiering.write_stream_object(metadata, objects, epoch, plan, index_interval=4096)

    for p in range(3):
        rows = await index_rows(metadata, topic, p)
        assert all(is_stream_object(r.object_key) for r in rows)
        assert len(rows) < len(rows_before[p])
        assert (rows[0].base_offset, rows[-1].last_offset) == (
            rows_before[p][0].base_offset, rows_before[p][-1].last_offset)
        for r in rows:  # the stream object's data is exactly the rows' bytes
            data = await objects.get(r.object_key, 0, r.byte_end)
            expected = b"".join([await objects.get(o.object_key, o.byte_start, o.byte_end)
                                 for o in rows_before[p]
                                 if r.base_offset <= o.base_offset <= r.last_offset])
            assert data == expected
    assert await tiering.backlog(metadata) == (0, 0)
    assert await tiering.open_uploads(metadata) == []
    # Bytes stay, rows shrink, in the statistics kept by the triggers.
    stats_after = await stats(metadata, topic)
    for (p, bytes_before, n_before), (_, bytes_after, n_after) in zip(stats_before, stats_after):
        assert bytes_after == bytes_before and n_after == len(await index_rows(metadata, topic, p))
        assert n_after < n_before
    # The high watermarks did not move.
    for p in range(3):
        assert (await metadata.stream_state(topic.topic_id, p)).committed_end == \
            logs[p].high_watermark

    assert_same_reads(before, await snapshot(metadata, objects, topic, 3, streams.node_epoch))

    # Every WAL object lost its last row: the lifecycle's collection deletes them (here with
    # no delay), and the reads are served from the stream objects alone.
    queued = await delete_everything_due(metadata, objects)
    assert set(queued) == wal_keys
    assert await objects.list("wal/") == []
    assert_same_reads(before, await snapshot(metadata, objects, topic, 3, streams.node_epoch))

    # The leader goes on appending at its committed end; later rows are WAL rows again.
    base = await append(logs[0], [b"after"]).wait(10)
    assert base == before[0][0][-1][0] + 1
    assert (await read_all(logs[0]))[-1] == (base, b"after")


class DiedAfterUpload(Exception):
    pass


async def upload_of_a_node_that_died(metadata, objects, coordinator_epoch, plan,
                                     writer=None) -> str:
    """A job whose node died after its PUT: begun and uploaded, never swapped nor given up
    (the job's own ending, which gives a failed upload up, never ran). Its key."""
    class DieAfterPut:
        async def create(self, key, data):
            await objects.create(key, data)
            raise DiedAfterUpload(key)

        def __getattr__(self, name):
            return getattr(objects, name)

    key = tiering.stream_object_key(plan.topic_id, plan.partition, plan.base_offset,
                                    plan.last_offset, f"{coordinator_epoch}-dead")
    with pytest.raises(DiedAfterUpload):
        await tiering._write_and_swap(
            metadata, DieAfterPut(), coordinator_epoch, plan, key,
            None if writer is None else writer.node_id,
            None if writer is None else writer.epoch, tiering.DEFAULT_INDEX_INTERVAL)
    return key


async def given_up(metadata) -> set[str]:
    return {k for k, reason in await metadata.pending_deletions()
            if reason == "tiering_abandoned"}


async def test_a_stale_coordinator_epoch_is_refused_and_changes_nothing(metadata, nursery):
    from mink.storage.objectstore import open_object_store

    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    await produce([log], 20)
    rows_before = await index_rows(metadata, topic, 0)
    epoch = await coordinator_epoch(metadata, streams.node_epoch)
    (plan,) = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), 10 << 20)

    with pytest.raises(StaleEpoch):  # an old holder's round: refused at the begin
        await tiering.write_stream_object(metadata, objects, epoch - 1, plan)
    with pytest.raises(StaleEpoch):
        await tiering.write_stream_object(metadata, objects, None, plan)

    # A round that began under its epoch, then lost the lease before the swap.
    class LoseLeaseBeforeSwap:
        def __init__(self, inner):
            self.inner = inner

        async def create(self, key, data):
            await self.inner.create(key, data)
            await metadata.release_lease("coordinator", 1, epoch)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    stuck = await upload_of_a_node_that_died(metadata, objects, epoch, plan)
    with pytest.raises(StaleEpoch):
        await tiering.write_stream_object(metadata, LoseLeaseBeforeSwap(objects), epoch, plan)
    assert await index_rows(metadata, topic, 0) == rows_before, "the index did not change"
    # The refused job gave its upload up at once; the dead node's stays for the sweep.
    assert await tiering.open_uploads(metadata) == [stuck]
    (refused,) = [k for k in await objects.list("stream/") if k != stuck]
    assert await given_up(metadata) == {refused}

    # The new holder tiers the same range again, and sweeps the dead round's upload.
    new_epoch = await coordinator_epoch(metadata, streams.node_epoch)
    assert new_epoch > epoch
    key = await tiering.write_stream_object(metadata, objects, new_epoch, plan)
    assert [r.object_key for r in await index_rows(metadata, topic, 0)] == [key]
    with pytest.raises(StaleEpoch):
        await tiering.sweep_uploads(metadata, epoch, 0.0)
    assert await tiering.sweep_uploads(metadata, new_epoch, 0.0) == [stuck]
    assert await tiering.open_uploads(metadata) == []
    await delete_everything_due(metadata, objects)
    assert await objects.list("stream/") == [key], "the others went, the swapped one stays"
    assert [o for o, _ in await read_all(_reader(Streams(1, streams.node_epoch, objects,
                                                         metadata), topic.topic_id, 0,
                                                 await metadata.stream_state(topic.topic_id, 0)))
            ] == list(range(log.high_watermark))


async def test_a_stale_writer_lease_epoch_is_refused_and_changes_nothing(metadata, nursery):
    """A round handed to a topic's writer-lease holder is fenced by that lease's epoch too,
    at the begin and at the swap; a coordinator's own round (no writer fence) is refused
    while somebody holds the topic's writer lease."""
    from mink.storage.objectstore import open_object_store

    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    await produce([log], 20)
    rows_before = await index_rows(metadata, topic, 0)
    epoch = await coordinator_epoch(metadata, streams.node_epoch)
    scope = f"writer/{topic.topic_id}"
    writer_epoch = await metadata.acquire_lease(scope, 1, streams.node_epoch, ttl_s=60)
    assert writer_epoch is not None
    (plan,) = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), 10 << 20)

    async def refused(reason, *args, **kwargs):
        with pytest.raises(StaleEpoch) as caught:
            await tiering.write_stream_object(metadata, *args, **kwargs)
        assert caught.value.reason == reason

    # Refused at the begin: nothing uploaded, nothing recorded.
    await refused("stale_writer_lease_epoch", objects, epoch, plan,
                  writer=tiering.WriterFence(1, writer_epoch - 1))
    await refused("stale_writer_lease_epoch", objects, epoch, plan,
                  writer=tiering.WriterFence(2, writer_epoch))  # not the holder
    await refused("writer_lease_held", objects, epoch, plan)  # the coordinator's own round
    await refused("stale_coordinator_epoch", objects, epoch - 1, plan,
                  writer=tiering.WriterFence(1, writer_epoch))
    assert await objects.list("stream/") == [] and await tiering.open_uploads(metadata) == []

    # A round that began under the writer lease, which moved before the swap.
    class LoseWriterLeaseBeforeSwap:
        def __init__(self, inner):
            self.inner = inner

        async def create(self, key, data):
            await self.inner.create(key, data)
            await metadata.release_lease(scope, 1, writer_epoch)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    stuck = await upload_of_a_node_that_died(metadata, objects, epoch, plan,
                                             writer=tiering.WriterFence(1, writer_epoch))
    await refused("stale_writer_lease_epoch", LoseWriterLeaseBeforeSwap(objects), epoch, plan,
                  writer=tiering.WriterFence(1, writer_epoch))
    assert await index_rows(metadata, topic, 0) == rows_before, "the index did not change"
    assert await tiering.open_uploads(metadata) == [stuck], "the refused job gave its up"
    assert len(await given_up(metadata)) == 1

    # The new tenure of the writer lease tiers the same range; the stuck upload is swept.
    new_writer_epoch = await metadata.acquire_lease(scope, 1, streams.node_epoch, ttl_s=60)
    assert new_writer_epoch > writer_epoch
    await refused("stale_writer_lease_epoch", objects, epoch, plan,
                  writer=tiering.WriterFence(1, writer_epoch))
    key = await tiering.write_stream_object(metadata, objects, epoch, plan,
                                            writer=tiering.WriterFence(1, new_writer_epoch))
    assert [r.object_key for r in await index_rows(metadata, topic, 0)] == [key]
    assert await tiering.sweep_uploads(metadata, epoch, 0.0) == [stuck]

    # The writer-lease holder is gone (its lease released or expired): the coordinator's
    # own round, with no writer fence, tiers the topic.
    await append(log, [b"later"]).wait(10)
    await metadata.release_lease(scope, 1, new_writer_epoch)
    (plan,) = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), 10 << 20)
    await tiering.write_stream_object(metadata, objects, epoch, plan)
    assert await tiering.backlog(metadata) == (0, 0)
    assert [o for o, _ in await read_all(_reader(Streams(1, streams.node_epoch, objects,
                                                         metadata), topic.topic_id, 0,
                                                 await metadata.stream_state(topic.topic_id, 0)))
            ] == list(range(log.high_watermark))


async def test_assignments_go_to_live_writer_lease_holders(metadata, nursery):
    """The coordinator's schedule: an assignment names the holder and its writer epoch;
    one whose holder lost the lease is dropped at the next schedule; a done assignment is
    forgotten unless the coordinator renewed it since."""
    from mink.storage.objectstore import open_object_store

    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 2)
    streams = await Node(metadata, objects, 1).start(nursery)
    epoch = await coordinator_epoch(metadata, streams.node_epoch)
    scope = f"writer/{topic.topic_id}"
    writer_epoch = await metadata.acquire_lease(scope, 1, streams.node_epoch, ttl_s=60)
    with pytest.raises(StaleEpoch):
        await tiering.assign(metadata, epoch - 1, [(topic.topic_id, 0, 1, writer_epoch)])
    assert await tiering.assign(metadata, epoch, [(topic.topic_id, 0, 1, writer_epoch),
                                                  (topic.topic_id, 1, 1, writer_epoch)]) == 2
    mine = await tiering.assigned_to(metadata, 1)
    assert [(a.partition, a.writer_epoch, a.coordinator_epoch) for a in mine] == [
        (0, writer_epoch, epoch), (1, writer_epoch, epoch)]
    assert await tiering.assigned_to(metadata, 2) == []
    await tiering.assign(metadata, epoch, [(topic.topic_id, 1, 1, writer_epoch)])  # renewed
    await tiering.assignments_done(metadata, 1, mine)
    assert [a.partition for a in await tiering.assigned_to(metadata, 1)] == [1]
    await metadata.release_lease(scope, 1, writer_epoch)
    await tiering.assign(metadata, epoch, [])
    assert await tiering.assigned_to(metadata, 1) == [], "the holder lost its lease"


async def test_a_swap_refuses_rows_that_changed_and_a_repeat_is_done(metadata, nursery):
    from mink.storage.objectstore import open_object_store

    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    for i in range(6):
        await append(log, [b"v%d" % i]).wait(10)
    epoch = await coordinator_epoch(metadata, streams.node_epoch)
    (plan,) = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), 10 << 20)

    # DeleteRecords moves the log start past the first row between the plan and the swap.
    await lifecycle.delete_records(metadata, topic.topic_id, 0, 0, 1, streams.node_epoch, 2)
    with pytest.raises(tiering.TieringRefused) as refused:
        await tiering.write_stream_object(metadata, objects, epoch, plan)
    assert refused.value.reason == "index_changed"
    assert all(not is_stream_object(r.object_key) for r in await index_rows(metadata, topic, 0))
    assert await tiering.open_uploads(metadata) == []
    (refused_key,) = await objects.list("stream/")
    assert refused_key in await lifecycle.due_deletions(metadata, 100)

    # A plan made now tiers what is left; repeating its swap (a lost answer) says done.
    (plan,) = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), 10 << 20)
    assert plan.base_offset == 2
    key = await tiering.write_stream_object(metadata, objects, epoch, plan)
    row = await metadata.fetch_one(READ, tiering.SQL_SWAP, tiering.swap_arguments(
        epoch, None, None, key, plan, 1))
    assert row == ("swapped",)
    assert key not in await lifecycle.due_deletions(metadata, 100)


async def test_the_swaps_array_literals_read_back_as_given(metadata):
    """The swap's arrays are built as PostgreSQL literals (not by psycopg, a value at a time
    in Python): keys with quotes, backslashes, commas, braces read back as they were."""
    keys = ["wal/1-2-3", 'a"b', "c\\d", "e,f", "{g}", " h ", "NULL", "", "\u00e9"]
    numbers = [0, -1, 2**63 - 1]
    row = await metadata.fetch_one(READ, "SELECT %s::text[], %s::bigint[], %s::text[]", (
        tiering._text_array(keys), tiering._int_array(numbers), tiering._text_array([])))
    assert row == (keys, numbers, [])


async def test_a_swap_replaces_exactly_the_rows_it_was_given(metadata, nursery):
    """The swap's rows come as arrays (sql/0030): rows that are not contiguous from the
    plan's first offset to its last, or whose bytes do not add up to the object's, are
    refused as invalid_rows; rows that differ from the index in any column, as many as
    there, are refused as index_changed. Nothing changes for either, and the rows as they
    are in the index swap."""
    objects, topic, _streams, _log, epoch, plan = await one_partition_plan(
        metadata, nursery, 8, 10 << 20)
    assert len(plan.rows) >= 4
    before = await index_rows(metadata, topic, 0)
    length = sum(r.byte_end - r.byte_start for r in plan.rows)
    first, second = plan.rows[0], plan.rows[1]
    wrong = {
        "invalid_rows": [
            plan.rows[1:],  # does not start at the plan's first offset
            plan.rows[:1] + plan.rows[2:],  # a gap
            plan.rows[:-1],  # ends short of the plan's last offset
            [first, dataclasses.replace(second, byte_end=second.byte_end + 1)]
            + plan.rows[2:],  # the bytes do not add up
        ],
        "index_changed": [
            [dataclasses.replace(first, object_key="wal/x")] + plan.rows[1:],
            # the same bytes in all, split differently between two rows
            [dataclasses.replace(first, byte_end=first.byte_end + 1),
             dataclasses.replace(second, byte_start=second.byte_start + 1)] + plan.rows[2:],
        ],
    }
    for reason, row_lists in wrong.items():
        for n, rows in enumerate(row_lists):
            key = f"stream/refused-{reason}-{n}"
            await metadata.fetch_one(tiering.IDEMPOTENT, tiering.SQL_BEGIN, (
                epoch, None, None, key, topic.topic_id, 0, plan.base_offset,
                plan.last_offset))
            arguments = tiering.swap_arguments(epoch, None, None, key, plan, length)
            given = tiering.swap_arguments(epoch, None, None, key,
                                           dataclasses.replace(plan, rows=rows), length)
            row = await metadata.fetch_one(tiering.IDEMPOTENT, tiering.SQL_SWAP,
                                           arguments[:9] + given[9:])
            assert row == (reason,), (reason, n)
            assert key in await lifecycle.due_deletions(metadata, 100)
    assert await index_rows(metadata, topic, 0) == before
    key = await tiering.write_stream_object(metadata, objects, epoch, plan)
    assert [r.object_key for r in await index_rows(metadata, topic, 0)] == [key]


async def test_a_swap_locks_its_rows_not_the_partition(metadata, nursery, pg_url):
    """The swap locks the index rows it replaces, not the partition's row, which every WAL
    commit of the object's partitions takes (0011 held it from its index check to its
    commit, holding up the node's commits). A DeleteRecords of those rows meanwhile waits
    for the swap and finds them gone: the index ends consistent, the records the same."""
    import psycopg

    from mink.storage.stream_object import StreamObjectWriter, stream_object_key

    objects, topic, streams, log, epoch, plan = await one_partition_plan(
        metadata, nursery, 6, 10 << 20)
    before = values_of(await log.read(0, 100 << 20))
    key = stream_object_key(topic.topic_id, 0, plan.base_offset, plan.last_offset, "held")
    await metadata.fetch_one(tiering.IDEMPOTENT, tiering.SQL_BEGIN, (
        epoch, None, None, key, topic.topic_id, 0, plan.base_offset, plan.last_offset))
    writer = StreamObjectWriter(topic.topic_id, 0)
    for row in plan.rows:
        writer.add(await objects.get(row.object_key, row.byte_start, row.byte_end))
    await objects.create(key, writer.finish())
    swap = await trio.to_thread.run_sync(psycopg.connect, pg_url)
    probe = await trio.to_thread.run_sync(lambda: psycopg.connect(pg_url, autocommit=True))
    try:
        swapped = await trio.to_thread.run_sync(lambda: swap.execute(
            tiering.SQL_SWAP, tiering.swap_arguments(epoch, None, None, key, plan,
                                                     writer.data_length)).fetchone())
        assert swapped == ("swapped",)  # and its transaction still open

        def partition_row_is_free() -> bool:
            with probe.transaction():
                return probe.execute(
                    "SELECT 1 FROM partitions WHERE topic_id = %s AND partition = 0 "
                    "FOR UPDATE NOWAIT", (topic.topic_id,)).fetchone() == (1,)

        assert await trio.to_thread.run_sync(partition_row_is_free)

        done = trio.Event()
        start = plan.rows[1].base_offset  # the first row goes wholly

        async def delete_records() -> None:
            await lifecycle.delete_records(metadata, topic.topic_id, 0, 0, 1,
                                           streams.node_epoch, start)
            done.set()

        nursery.start_soon(delete_records)
        with trio.fail_after(10):  # it waits on the swap's row locks
            while not done.is_set() and await trio.to_thread.run_sync(lambda: probe.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()").fetchone()[0]) == 0:
                await trio.sleep(0.01)
        assert not done.is_set()
        await trio.to_thread.run_sync(swap.commit)
        with trio.fail_after(10):
            await done.wait()
    finally:
        await trio.to_thread.run_sync(swap.close)
        await trio.to_thread.run_sync(probe.close)
    assert [r.object_key for r in await index_rows(metadata, topic, 0)] == [key]
    state = await metadata.stream_state(topic.topic_id, 0)
    assert state.log_start_offset == start
    cold = _reader(Streams(1, streams.node_epoch, objects, metadata), topic.topic_id, 0, state)
    assert values_of(await cold.read(start, 100 << 20)) == before[start:]
    assert await stats(metadata, topic) == [(0, writer.data_length, 1)]


async def test_a_round_is_planned_page_by_page_as_it_would_be_at_once(
        metadata, objects, nursery, monkeypatch):
    """The planning query is paged (wal_row_pages): pages of 7 rows, of three partitions,
    of one of them, with a limit inside a page, give the rows and the plans one query
    would."""
    topic = await make_topic(metadata, 3)
    streams = await Node(metadata, objects, 1).start(nursery)
    logs = [await streams.open(topic.topic_id, p, 0) for p in range(3)]
    await produce(logs, 20)
    everything = await tiering.wal_rows(metadata, 0.0)
    assert len(everything) >= 3 * 20
    at_once = tiering.plan_stream_objects(everything, 20_000)
    monkeypatch.setattr(tiering, "PAGE_ROWS", 7)
    queries = 0
    fetch_all = metadata.fetch_all

    async def counted(*args, **kwargs):
        nonlocal queries
        queries += 1
        return await fetch_all(*args, **kwargs)

    monkeypatch.setattr(metadata, "fetch_all", counted)
    assert await tiering.wal_rows(metadata, 0.0) == everything
    assert queries >= len(everything) // 7, "one query per page"
    paged = await tiering.plan_round(metadata, 0.0, 20_000)
    assert [(p.partition, p.rows, p.due) for p in paged] == [
        (p.partition, p.rows, p.due) for p in at_once]
    one = [(topic.topic_id, 1)]
    assert await tiering.wal_rows(metadata, 0.0, partitions=one) == [
        r for r in everything if r[1] == 1]
    assert await tiering.wal_rows(metadata, 0.0, limit=10) == everything[:10]


def test_a_pace_lets_reads_through_at_its_rate():
    async def takes() -> list[float]:
        pace = tiering.Pace(1000.0)
        times = []
        for nbytes in (500, 1000, 1500, 10):
            await pace.take(nbytes)
            times.append(trio.current_time())
        await trio.sleep(10)  # idle: the next read goes at once, no burst owed
        start = trio.current_time()
        await pace.take(10)
        times.append(trio.current_time() - start)
        return times

    times = trio.run(takes, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [round(t - times[0], 6) for t in times[:4]] == [0, 0.5, 1.5, 3.0]
    assert times[4] == 0
    assert tiering.round_pace([], 15, 0.5) is None
    plan = tiering.StreamObjectPlan(None, 0, [tiering.WalRow(0, 0, "wal/k", 0, 3_000_000)])
    assert tiering.round_pace([plan], 15, 0) is None
    assert tiering.round_pace([plan, plan], 15, 0.5).bytes_per_s == 6_000_000 / 7.5


async def test_a_paced_job_reads_no_faster_than_its_pace(metadata, nursery):
    """A job's reads go through the round's pace: a plan of N bytes at N/2 bytes a second
    takes at least about a second (its first read goes at once)."""
    objects, topic, streams, log, epoch, plan = await one_partition_plan(
        metadata, nursery, 30, 10 << 20)
    assert len(plan.rows) > 10
    first = plan.rows[0].size
    pace = tiering.Pace(plan.size / 2)
    started = trio.current_time()
    await tiering.write_stream_object(metadata, objects, epoch, plan, pace=pace)
    assert trio.current_time() - started >= (plan.size - first) / pace.bytes_per_s * 0.99
    assert await tiering.backlog(metadata) == (0, 0)


def test_plan_groups_consecutive_rows_up_to_the_target():
    import uuid

    t = uuid.uuid4()
    rows = []
    offset = 0
    for p, sizes, due in ((0, [40, 40, 40, 200, 10], False), (1, [10, 10], False),
                          (2, [10, 10], True)):
        for i, size in enumerate(sizes):
            rows.append((t, p, offset, offset, f"wal/1/1/{i}", 0, size, due and i == 0))
            offset += 1
        offset = 0
    plans = tiering.plan_stream_objects(rows, 100)
    shape = [(p.partition, [r.size for r in p.rows]) for p in plans]
    # partition 0: two full groups; its last small young row waits. Partition 1 is young and
    # small: it waits. Partition 2 holds a due row: tiered.
    assert shape == [(0, [40, 40]), (0, [40]), (0, [200]), (2, [10, 10])]


async def test_a_cold_fetch_of_a_stream_object_reads_its_footer_and_a_block(
        metadata, nursery, monkeypatch):
    """One small ranged GET for the footer (cached after), then the reader's blocks (about
    STREAM_BLOCK_BYTES each, from a batch start): never the whole object for a small
    Fetch."""
    import mink.storage.log as log_module

    monkeypatch.setattr(log_module, "STREAM_BLOCK_BYTES", 16 * 1024)
    objects, topic, streams, log, epoch, plan = await one_partition_plan(
        metadata, nursery, 80, 100 << 20)
    key = await tiering.write_stream_object(metadata, objects, epoch, plan, index_interval=4096)
    (row,) = await index_rows(metadata, topic, 0)
    assert row.byte_end > 200_000

    gets = []

    class Recording:
        async def get(self, key, start=0, end=None):
            data = await objects.get(key, start, end)
            gets.append((key, start, end, len(data)))
            return data

        def __getattr__(self, name):
            return getattr(objects, name)

    cold = Streams(1, streams.node_epoch, Recording(), metadata)
    reader = _reader(cold, topic.topic_id, 0, await metadata.stream_state(topic.topic_id, 0))
    middle = log.high_watermark // 2
    got = values_of(await reader.read(middle, 1000))
    assert got[0][0] <= middle <= got[-1][0]
    footer_get, *block_gets = gets
    assert footer_get[:3] == (key, row.byte_end, None) and footer_get[3] < 8192
    blocks = await cold.caches.stream_reader(row)
    bounds = [blocks.block_range(n) for n in range(blocks.blocks)]
    # one block: the index entry a read walks from is in the block of the batch it finds
    # (blocks begin at index entries)
    assert len(block_gets) == 1 and block_gets[0][1:3] in bounds
    gets.clear()
    assert (await reader.offset_for_timestamp(BASE_TS + 40_000))[0] > 0
    assert all(start != row.byte_end for _, start, _, _ in gets), "the footer is cached"


async def test_the_leader_commits_while_rounds_swap_its_rows(metadata, nursery):
    """Rounds run beside the leader's commits: no append fails, the committed end is the
    leader's alone, and what was appended reads back the same, all tiered."""
    from mink.storage.objectstore import open_object_store

    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 2)
    streams = await Node(metadata, objects, 1).start(nursery)
    logs = [await streams.open(topic.topic_id, p, 0) for p in range(2)]
    epoch = await coordinator_epoch(metadata, streams.node_epoch)
    expected: dict[int, list] = {0: [], 1: []}
    swapped = 0

    async def producer(p: int) -> None:
        for i in range(300):
            value = b"%d-%d" % (p, i) * 50
            base = await append(logs[p], [value]).wait(30)
            expected[p].append((base, value))

    async with trio.open_nursery() as producers:
        for p in range(2):
            producers.start_soon(producer, p)
        while True:
            await trio.sleep(0.01)
            for plan in tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0),
                                                    20_000):
                await tiering.write_stream_object(metadata, objects, epoch, plan)
                swapped += 1
            if all(len(expected[p]) == 300 for p in range(2)):
                break
    for plan in tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), 20_000):
        await tiering.write_stream_object(metadata, objects, epoch, plan)
    assert swapped > 4, "rounds ran while the producers appended"
    assert await tiering.backlog(metadata) == (0, 0)
    cold = Streams(1, streams.node_epoch, objects, metadata)
    for p in range(2):
        state = await metadata.stream_state(topic.topic_id, p)
        assert state.committed_end == logs[p].high_watermark == 300
        assert await read_all(_reader(cold, topic.topic_id, p, state)) == expected[p]


async def test_readers_missing_the_same_block_share_one_get():
    from mink.storage.log import ReadCaches
    from mink.storage.objectstore import ObjectStoreUnavailable

    calls = []
    fail_first = [True]

    class Slow:
        async def get(self, key, start=0, end=None):
            calls.append((key, start, end))
            await trio.sleep(0.05)
            if key == "flaky" and fail_first[0]:
                fail_first[0] = False
                raise ObjectStoreUnavailable("first GET fails")
            return b"x" * (end - start)

    caches = ReadCaches(None, Slow(), 0, 1 << 20)
    results = []

    async def read(key):
        try:
            results.append(len(await caches.get_block(key, 0, 100)))
        except ObjectStoreUnavailable:
            results.append("failed")

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(read, "shared")
        for _ in range(3):
            nursery.start_soon(read, "flaky")
    assert calls.count(("shared", 0, 100)) == 1, "one GET for five readers"
    assert calls.count(("flaky", 0, 100)) == 2, "a failed GET is tried again by a waiter"
    assert results.count(100) == 7 and results.count("failed") == 1
    assert caches.block_used == 200


async def test_cold_reads_of_wal_rows_get_aligned_blocks_at_once_shared_by_partitions(
        metadata, nursery):
    """A cold read of WAL rows (not tiered yet) GETs them several at a time, each through
    the WAL_BLOCK_BYTES-aligned block holding it: a reader of the second partition finds
    the flushes it shares with the first in the block cache. Every record as written."""
    from mink.storage import log as log_module
    from mink.storage.objectstore import open_object_store

    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 2)
    streams = await Node(metadata, objects, 1).start(nursery)
    logs = [await streams.open(topic.topic_id, p, 0) for p in range(2)]
    await produce(logs, 40)
    expected = [await read_all(log) for log in logs]
    rows = [await index_rows(metadata, topic, p) for p in range(2)]
    assert not any(is_stream_object(r.object_key) for p in range(2) for r in rows[p])
    shared = {r.object_key for r in rows[0]} & {r.object_key for r in rows[1]}
    assert len(shared) > 5, "the partitions share WAL objects"
    gets: list[tuple[str, int, int]] = []
    in_flight = [0, 0]  # now, most

    class Slow:
        async def get(self, key, start=0, end=None):
            gets.append((key, start, end))
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
            try:
                await trio.sleep(0.01)
                return await objects.get(key, start, end)
            finally:
                in_flight[0] -= 1

        def __getattr__(self, name):
            return getattr(objects, name)

    cold = Streams(1, streams.node_epoch, Slow(), metadata)
    readers = [_reader(cold, topic.topic_id, p, await metadata.stream_state(topic.topic_id, p))
               for p in range(2)]
    assert await read_all(readers[0]) == expected[0]
    first_reader_gets = len(gets)
    assert await read_all(readers[1]) == expected[1]
    block = log_module.WAL_BLOCK_BYTES
    assert all(start % block == 0 and end - start == block for _, start, end in gets), (
        "small rows are read through their aligned block")
    assert in_flight[1] > 1, "several GETs in flight for one read"
    assert len(gets) == len(set(gets)), "each block once"
    objects_of_second_only = {r.object_key for r in rows[1]} - {r.object_key for r in rows[0]}
    assert len(gets) - first_reader_gets == len(objects_of_second_only), (
        "the second partition's reader GETs only the flushes the first did not read")


async def test_a_cold_reader_of_wal_rows_asks_the_index_once_per_lookup_and_reads_ahead(
        metadata, nursery, monkeypatch):
    """A reader walking WAL rows (not tiered yet) a little at a time asks PostgreSQL once per
    COLD_READ_ROWS rows, not at every read, and the rows after each read are fetched in the
    background, the same blocks a read asks for (each GET once): its next read finds them
    in the block cache or on their way. Rows committed after a lookup are read too: a read
    that runs past the rows it has asks the index again."""
    from mink.storage import log as log_module
    from mink.storage.objectstore import open_object_store

    monkeypatch.setattr(log_module, "COLD_READ_ROWS", 8)
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    await produce([log], 40)
    rows = await index_rows(metadata, topic, 0)
    assert len(rows) >= 30 and not any(is_stream_object(r.object_key) for r in rows)
    expected = await read_all(log)
    lookups: list[int] = []
    gets: list[tuple[str, int, int]] = []

    class CountingMetadata:
        async def find_batches(self, topic_id, partition, from_offset, max_rows=100):
            lookups.append(from_offset)
            return await metadata.find_batches(topic_id, partition, from_offset, max_rows)

        def __getattr__(self, name):
            return getattr(metadata, name)

    class Slow:
        async def get(self, key, start=0, end=None):
            gets.append((key, start, end))
            await trio.sleep(0.005)
            return await objects.get(key, start, end)

        def __getattr__(self, name):
            return getattr(objects, name)

    cold = Streams(1, streams.node_epoch, Slow(), CountingMetadata())
    state = await metadata.stream_state(topic.topic_id, 0)
    reader = _reader(cold, topic.topic_id, 0, state)
    async with trio.open_nursery() as owner:
        await owner.start(cold.caches.run_read_ahead)
        offset, got, reads = 0, [], 0
        while offset < state.committed_end:
            values = [v for v in values_of(await reader.read(offset, 4000)) if v[0] >= offset]
            got += values
            offset = values[-1][0] + 1
            reads += 1
        owner.cancel_scope.cancel()
    assert got == expected
    assert reads >= len(rows), "about a row a read"
    assert len(lookups) <= -(-len(rows) // 8) + 1, (len(lookups), len(rows))
    assert len(gets) == len(set(gets)), "each block GET once"
    assert cold.caches.read_ahead_gets >= len(gets) // 2, "most blocks were read ahead"

    # The reader's rows end at the last row; more is committed; a read from that row with a
    # budget for more gets the new rows too, not only what the cached rows hold.
    last = rows[-1].base_offset
    assert values_of(await reader.read(last, 4000))
    await produce([log], 5, seed=8)
    state = await metadata.stream_state(topic.topic_id, 0)
    reader = _reader(cold, topic.topic_id, 0, state)
    lookups.clear()
    got = [v for v in values_of(await reader.read(last, 1 << 20)) if v[0] >= last]
    assert got == [v for v in await read_all(log, last)], "the new rows are read"
    assert lookups == [rows[-1].last_offset + 1], "asked from where the cached rows end"


async def test_a_reader_whose_kept_wal_rows_are_tiered_and_collected_reads_on(
        metadata, nursery):
    """A reader part way through WAL rows it keeps (not asking the index again): tiering
    swaps them for a stream object and collection deletes the WAL objects. Its next read
    finds an object gone, forgets the rows, asks the index and reads on from the stream
    object: every record once, as written, never garbage."""
    objects, topic, streams, log, epoch, plan = await one_partition_plan(
        metadata, nursery, 40, 100 << 20)
    expected = await read_all(log)
    lookups: list[int] = []

    class CountingMetadata:
        async def find_batches(self, topic_id, partition, from_offset, max_rows=100):
            lookups.append(from_offset)
            return await metadata.find_batches(topic_id, partition, from_offset, max_rows)

        def __getattr__(self, name):
            return getattr(metadata, name)

    cold = Streams(1, streams.node_epoch, objects, CountingMetadata())
    reader = _reader(cold, topic.topic_id, 0, await metadata.stream_state(topic.topic_id, 0))
    got, offset = [], 0
    for _ in range(5):
        values = [v for v in values_of(await reader.read(offset, 4000)) if v[0] >= offset]
        got += values
        offset = values[-1][0] + 1
    assert len(lookups) == 1, "the first read's rows serve the next ones"
    kept = cold.caches._cold_rows[reader.key]
    assert kept and not any(is_stream_object(r.object_key) for r in kept)

    await tiering.write_stream_object(metadata, objects, epoch, plan)
    await delete_everything_due(metadata, objects)
    assert not [k for k in await objects.list("wal/")], "the WAL objects are gone"
    cold.caches._blocks.clear()  # (blocks already read would still serve the same bytes)
    cold.caches.block_used = 0
    while offset < log.high_watermark:
        values = [v for v in values_of(await reader.read(offset, 4000)) if v[0] >= offset]
        got += values
        offset = values[-1][0] + 1
    assert got == expected
    assert len(lookups) == 2, "asked the index once more, when the kept rows' object was gone"
    assert all(is_stream_object(r.object_key) for r in cold.caches._cold_rows[reader.key])


async def test_read_ahead_pauses_while_what_it_read_waits_unclaimed():
    """Blocks read ahead that no reader has asked for yet count against a quarter of the
    block cache: past it, read-ahead pauses (a consumer of many partitions would have its
    read-ahead evicted before reading it, every block read twice); a reader's hit, a
    reader that waited for the GET, or the block's eviction claims them."""
    import types

    from mink.storage import log as log_module
    from mink.storage.objectstore import open_object_store

    size = 600 * 1024  # over half a WAL block: a row read as itself
    objects = open_object_store("memory://")
    rows = []
    for n in range(8):
        await objects.create(f"wal/{n}", bytes([n]) * size)
        rows.append(types.SimpleNamespace(object_key=f"wal/{n}", byte_start=0, byte_end=size,
                                          base_offset=n))
    everything = 1 << 62  # the offset read-ahead stops below (the tail cache's first)
    release = trio.Event()

    class Gated:
        async def get(self, key, start=0, end=None):
            if key == "wal/7":
                await release.wait()
            return await objects.get(key, start, end)

    caches = log_module.ReadCaches(None, Gated(), 0, 8 * size)  # a quarter: 2 blocks
    async with trio.open_nursery() as owner:
        await owner.start(caches.run_read_ahead)

        async def settle():
            while caches.read_ahead_in_flight:
                await trio.sleep(0.001)

        caches._read_ahead_rows(rows[:3], 3 * size, 0)
        assert caches.read_ahead_gets == 0, "nothing the tail cache holds is read ahead"
        caches._read_ahead_rows(rows[:3], 3 * size, everything)
        await settle()
        assert caches.read_ahead_gets == 3 and caches.unclaimed_bytes == 3 * size
        caches._read_ahead_rows(rows[3:5], 2 * size, everything)
        assert caches.read_ahead_gets == 3, "paused: three blocks wait unclaimed"
        await caches.get_block("wal/0", 0, size)  # a reader's hit claims its block
        assert caches.unclaimed_bytes == 2 * size
        caches._read_ahead_rows(rows[3:5], 2 * size, everything)
        assert caches.read_ahead_gets == 3, "two blocks unclaimed: still paused"
        await caches.get_block("wal/1", 0, size)
        caches._read_ahead_rows(rows[3:5], 2 * size, everything)
        assert caches.read_ahead_gets == 5, "one unclaimed block: read-ahead resumes"
        await settle()
        # a reader that waits for a block being read ahead claims it when it lands
        for n in (2, 3, 4):
            await caches.get_block(f"wal/{n}", 0, size)
        assert caches.unclaimed_bytes == 0
        caches._read_ahead_rows(rows[7:], size, everything)
        assert caches.read_ahead_in_flight == 1
        async with trio.open_nursery() as reader:
            reader.start_soon(caches.get_block, "wal/7", 0, size)
            await trio.sleep(0.01)
            release.set()
        assert ("wal/7", 0, size) not in caches._unclaimed
        # eviction claims: the cache holds 8 blocks; 8 more evict every one read ahead
        caches._read_ahead_rows(rows[5:7], 2 * size, everything)
        await settle()
        assert caches.unclaimed_bytes == 2 * size
        for n in range(8):
            await objects.create(f"other/{n}", b"x" * size)
            await caches.get_block(f"other/{n}", 0, size)
        assert caches.unclaimed_bytes == 0 and not caches._unclaimed
        owner.cancel_scope.cancel()


async def test_a_reader_of_a_stream_object_collected_under_it(metadata, nursery):
    """A reader walking a stream object asks PostgreSQL once per row; when retention takes
    the row and collection its object, the next read re-resolves: out of range, never
    garbage."""
    from mink.storage.log import OffsetOutOfRange
    from mink.storage.objectstore import open_object_store

    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    await produce([log], 40)
    epoch = await coordinator_epoch(metadata, streams.node_epoch)
    (plan,) = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), 100 << 20)
    await tiering.write_stream_object(metadata, objects, epoch, plan)
    lookups = []

    class CountingMetadata:
        async def find_batches(self, *args, **kwargs):
            lookups.append(args)
            return await metadata.find_batches(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(metadata, name)

    cold = Streams(1, streams.node_epoch, objects, CountingMetadata())
    reader = _reader(cold, topic.topic_id, 0, await metadata.stream_state(topic.topic_id, 0))
    offset, fetches = 0, 0
    while offset < 20:
        got = values_of(await reader.read(offset, 1000))
        offset = got[-1][0] + 1
        fetches += 1
    assert fetches > 3 and len(lookups) == 1, "one index lookup for the whole walk"

    await lifecycle.delete_records(metadata, topic.topic_id, 0, 0, 1, streams.node_epoch, -1)
    await delete_everything_due(metadata, objects)
    assert await objects.list("stream/") == []
    # (blocks already in the block cache would still be served until the log learns the new
    # log start, as the tail cache is: what a read must never do is guess past a gone object)
    cold.caches._blocks.clear()
    cold.caches.block_used = 0
    with pytest.raises(OffsetOutOfRange):
        await reader.read(offset, 1000)
    assert reader.log_start_offset == log.high_watermark
    assert reader.key not in cold.caches._cold_rows, "the gone row is forgotten"


async def test_sequential_readers_get_blocks_read_ahead_shared_and_bounded(
        metadata, nursery, monkeypatch):
    """A sequential reader of a stream object gets the next blocks fetched in the
    background, in the same block-aligned ranges every reader asks for: readers of any size
    share them (each block GET once), at most READ_AHEAD_GETS are in flight, and closing the
    owner's nursery cancels them."""
    import types

    import mink.storage.log as log_module
    from mink.storage.objectstore import open_object_store

    block = 16 * 1024
    monkeypatch.setattr(log_module, "STREAM_BLOCK_BYTES", block)
    monkeypatch.setattr(log_module, "READ_AHEAD_GETS", 2)
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    await produce([log], 60)
    epoch = await coordinator_epoch(metadata, streams.node_epoch)
    (plan,) = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), 100 << 20)
    key = await tiering.write_stream_object(metadata, objects, epoch, plan, index_interval=4096)
    (row,) = await index_rows(metadata, topic, 0)
    blocks_of = await log_module.ReadCaches(metadata, objects).stream_reader(row)
    bounds = {blocks_of.block_range(n) for n in range(blocks_of.blocks)}
    blocks = len(bounds)
    assert blocks > 8
    expected = await read_all(log)

    gets: list[tuple[int, int]] = []
    in_flight_seen: list[int] = []

    class Slow:
        async def get(self, k, start=0, end=None):
            if k == key and end is not None:
                gets.append((start, end))
                in_flight_seen.append(cold.caches.read_ahead_in_flight)
            await trio.sleep(0.01)
            return await objects.get(k, start, end)

        def __getattr__(self, name):
            return getattr(objects, name)

    cold = Streams(1, streams.node_epoch, Slow(), metadata)
    state = await metadata.stream_state(topic.topic_id, 0)
    walked = {}

    async def walk(name: str, fetch_bytes: int) -> None:
        reader = _reader(cold, topic.topic_id, 0, state)
        offset, got = 0, []
        while offset < state.committed_end:
            values = values_of(await reader.read(offset, fetch_bytes))
            got += values
            offset = values[-1][0] + 1
        walked[name] = got

    async with trio.open_nursery() as owner:
        await owner.start(cold.caches.run_read_ahead)
        async with trio.open_nursery() as readers:
            readers.start_soon(walk, "small", 1000)
            readers.start_soon(walk, "large", 40_000)
        owner.cancel_scope.cancel()
    assert walked["small"] == walked["large"] == expected
    assert set(gets) == bounds, "the reader's blocks only"
    assert sorted(gets) == sorted(set(gets)), "each block fetched once, shared by everyone"
    assert len(gets) == blocks
    assert cold.caches.read_ahead_gets >= blocks // 2, "most blocks were read ahead"
    assert max(in_flight_seen) <= 2, "read-ahead GETs in flight are bounded"

    # Closing the owner cancels a read-ahead stuck on the store; none is left counted.
    class Hanging:
        async def get(self, k, start=0, end=None):
            await trio.sleep_forever()

    hanging = log_module.ReadCaches(metadata, Hanging(), 0, 1 << 20)
    fake = types.SimpleNamespace(blocks_read=(0, 0), blocks=10,
                                 block_range=lambda n: (n * block, (n + 1) * block))
    with trio.fail_after(5):
        async with trio.open_nursery() as owner:
            await owner.start(hanging.run_read_ahead)
            hanging.read_ahead("k", fake)
            assert hanging.read_ahead_in_flight == 2
            await trio.sleep(0.05)
            owner.cancel_scope.cancel()
    assert hanging.read_ahead_in_flight == 0 and hanging._loading == {}
    hanging.read_ahead("k", fake)  # no owner any more: nothing starts
    assert hanging.read_ahead_in_flight == 0


async def test_a_job_that_fails_or_is_cancelled_gives_its_upload_up(metadata, nursery):
    """Short of its swap, a job forgets its upload at once (queued for deletion), whether
    a store read failed (the store's own error, not an exception group) or the job was
    cancelled mid-upload (a node shutting down); the sweep is left nothing to find."""
    from mink.storage.objectstore import ObjectNotFound

    objects, topic, _, _, epoch, plan = await one_partition_plan(metadata, nursery, 10, 10 << 20)

    class MissingWalObject:
        async def get(self, key, start=0, end=None):
            if key == plan.rows[-1].object_key:
                raise ObjectNotFound(key)
            return await objects.get(key, start, end)

        def __getattr__(self, name):
            return getattr(objects, name)

    with pytest.raises(ObjectNotFound):
        await tiering.write_stream_object(metadata, MissingWalObject(), epoch, plan)
    assert await tiering.open_uploads(metadata) == []
    assert len(await given_up(metadata)) == 1

    stored = trio.Event()

    class HangsAfterPut:
        async def create(self, key, data):
            await objects.create(key, data)
            stored.set()
            await trio.sleep_forever()

        def __getattr__(self, name):
            return getattr(objects, name)

    async def job(task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await tiering.write_stream_object(metadata, HangsAfterPut(), epoch, plan)

    scope = await nursery.start(job)
    with trio.fail_after(10):
        await stored.wait()
    (uploaded,) = await objects.list("stream/")
    assert await tiering.open_uploads(metadata) == [uploaded]
    scope.cancel()
    with trio.fail_after(10):
        while await tiering.open_uploads(metadata):
            await trio.sleep(0.01)
    assert uploaded in await given_up(metadata)
    assert await tiering.sweep_uploads(metadata, epoch, 0.0) == []
    assert all(not is_stream_object(r.object_key) for r in await index_rows(metadata, topic, 0))


async def test_a_job_on_a_file_store_copies_rows_in_the_kernel_reading_only_headers(
        metadata, nursery, tmp_path, monkeypatch):
    """On file:// a job reads none of its rows into memory: one scan walks their batch
    headers through a small window, and one compose copies their ranges into the object,
    which is byte for byte the object assembled in memory from the same rows. Ranges that
    are not whole batches are refused as the in-memory walk refuses them."""
    from mink.storage.objectstore import open_object_store
    from mink.storage.stream_object import StreamObjectError, StreamObjectWriter

    files = open_object_store(tmp_path.as_uri())
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, files, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    await produce([log], 40)
    before = values_of(await log.read(0, 100 << 20))
    epoch = await coordinator_epoch(metadata, streams.node_epoch)
    (plan,) = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), 100 << 20)
    calls: list[str] = []
    read_bytes: list[int] = []

    class Counting:
        async def get(self, key, start=0, end=None):
            calls.append("get")
            return await files.get(key, start, end)

        async def create(self, key, data):
            calls.append("create")
            return await files.create(key, data)

        async def compose(self, key, parts):
            calls.append("compose")
            return await files.compose(key, parts)

        async def scan(self, fn):
            calls.append("scan")

            def counted(read_into):
                def read(key, position, buffer):
                    read_bytes.append(read_into(key, position, buffer))
                    return read_bytes[-1]
                return fn(read)
            return await files.scan(counted)

        def __getattr__(self, name):
            return getattr(files, name)

    def changed(**change) -> tiering.StreamObjectPlan:
        last = dataclasses.replace(plan.rows[-1], **change)
        return tiering.StreamObjectPlan(plan.topic_id, plan.partition, [*plan.rows[:-1], last])

    last = plan.rows[-1]
    with pytest.raises(StreamObjectError, match="runs past"):
        await tiering.write_stream_object(metadata, files, epoch, changed(byte_end=last.byte_end - 1))
    with pytest.raises(StreamObjectError, match="no batch header"):
        await tiering.write_stream_object(metadata, files, epoch,
                                          changed(byte_start=last.byte_start + 1))
    assert await tiering.open_uploads(metadata) == []

    monkeypatch.setattr(tiering, "WALK_WINDOW", 100)  # a header and a few bytes at a time
    key = await tiering.write_stream_object(metadata, Counting(), epoch, plan)
    assert calls == ["scan", "compose"]
    assert sum(read_bytes) < plan.size // 20, "headers read, not the records"
    assert [r.object_key for r in await index_rows(metadata, topic, 0)] == [key]
    in_memory = StreamObjectWriter(plan.topic_id, plan.partition)
    for row in plan.rows:
        in_memory.add(await files.get(row.object_key, row.byte_start, row.byte_end))
    assert await files.get(key) == b"".join(bytes(p) for p in in_memory.finish())
    cold = _reader(Streams(1, streams.node_epoch, files, metadata), topic.topic_id, 0,
                   await metadata.stream_state(topic.topic_id, 0))
    assert values_of(await cold.read(0, 100 << 20)) == before


async def test_a_job_in_a_tiering_child_writes_the_same_object_at_idle_priority(
        metadata, nursery, tmp_path):
    """On file:// a node's jobs walk and copy in a child process (tiering_child.py) under
    SCHED_IDLE: the object is byte for byte the one assembled in memory, the walk's
    refusals and the store's errors come back as themselves, the child's walk and copy are
    counted by the node's store metrics as a get and a create, a child is kept between
    jobs, one whose job is cancelled is killed and replaced, and closing kills them all."""
    import functools
    import os
    import signal

    from mink.storage.lifecycle.tiering_child import TieringChildren
    from mink.storage.objectstore import ObjectNotFound, open_object_store
    from mink.storage.objectstore.instrumented import InstrumentedObjectStore
    from mink.storage.stream_object import StreamObjectError, StreamObjectWriter

    files = open_object_store(tmp_path.as_uri())
    operations: list[tuple[str, bool]] = []
    counted = InstrumentedObjectStore(
        files, lambda operation, seconds, failed: operations.append((operation, failed)))
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, files, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    await produce([log], 40)
    before = values_of(await log.read(0, 100 << 20))
    epoch = await coordinator_epoch(metadata, streams.node_epoch)
    (plan,) = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0), 100 << 20)

    def changed(**change) -> tiering.StreamObjectPlan:
        last = dataclasses.replace(plan.rows[-1], **change)
        return tiering.StreamObjectPlan(plan.topic_id, plan.partition, [*plan.rows[:-1], last])

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    last = plan.rows[-1]
    async with TieringChildren() as children:
        with pytest.raises(StreamObjectError, match="runs past"):
            await tiering.write_stream_object(metadata, files, epoch,
                                              changed(byte_end=last.byte_end - 1),
                                              children=children)
        (pid,) = children.pids()
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        with pytest.raises(StreamObjectError, match="no batch header"):
            await tiering.write_stream_object(metadata, files, epoch,
                                              changed(byte_start=last.byte_start + 1),
                                              children=children)
        with pytest.raises(ObjectNotFound):
            await tiering.write_stream_object(metadata, counted, epoch,
                                              changed(object_key="wal/missing"),
                                              children=children)
        assert operations == [("get", False)], "a missing object is an answer, not a failure"
        with pytest.raises(tiering.TieringRefused, match="offsets"):
            await tiering.write_stream_object(metadata, files, epoch,
                                              changed(last_offset=last.last_offset + 1),
                                              children=children)
        assert children.pids() == [pid], "one child, kept between jobs"
        # cancelled mid-job: that child is killed (stopped first, so that the job cannot
        # end before it is cancelled)
        os.kill(pid, signal.SIGSTOP)
        async with trio.open_nursery() as job:
            job.start_soon(functools.partial(tiering.write_stream_object, metadata, files,
                                             epoch, plan, children=children))
            with trio.fail_after(10):
                while children.pids():  # until the job has taken the child
                    await trio.sleep(0.001)
            job.cancel_scope.cancel()
        assert children.pids() == [] and gone(pid)
        assert await tiering.open_uploads(metadata) == []
        assert not children.broken

        operations.clear()
        key = await tiering.write_stream_object(metadata, counted, epoch, plan,
                                                children=children)
        assert operations == [("get", False), ("create", False)]
        (second,) = children.pids()
        assert second != pid
    assert gone(second), "closed: its children killed"
    assert [r.object_key for r in await index_rows(metadata, topic, 0)] == [key]
    in_memory = StreamObjectWriter(plan.topic_id, plan.partition)
    for row in plan.rows:
        in_memory.add(await files.get(row.object_key, row.byte_start, row.byte_end))
    assert await files.get(key) == b"".join(bytes(p) for p in in_memory.finish())
    cold = _reader(Streams(1, streams.node_epoch, files, metadata), topic.topic_id, 0,
                   await metadata.stream_state(topic.topic_id, 0))
    assert values_of(await cold.read(0, 100 << 20)) == before


async def test_a_child_that_cannot_start_leaves_the_copy_to_the_node_for_a_while(
        monkeypatch, tmp_path):
    """A tiering child that cannot be started fails its job (ObjectStoreError) and turns
    the next ones to the node's threads, for RETRY_CHILDREN_AFTER_S only: then children
    are tried again, and one that starts is used."""
    from mink.storage.lifecycle import tiering_child
    from mink.storage.objectstore import ObjectNotFound, ObjectStoreError

    monkeypatch.setattr(tiering_child, "RETRY_CHILDREN_AFTER_S", 0.3)
    real_start = tiering_child._Child.start
    starts = []

    async def failing_start(cls):
        starts.append(trio.current_time())
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(tiering_child._Child, "start", classmethod(failing_start))
    # a WAL object that is not there: a child that runs it answers ObjectNotFound
    job = tiering_child.Job(str(tmp_path), False, False, "stream/k", str(uuid.uuid4()), 0, 0,
                            0.0, [("wal/missing", 0, 10, 0, 0)])
    async with tiering_child.TieringChildren() as children:
        assert not children.broken
        with pytest.raises(ObjectStoreError, match="no tiering child process"):
            await children.run(job)
        assert children.broken
        monkeypatch.setattr(tiering_child._Child, "start", real_start)
        with trio.fail_after(5):
            while children.broken:
                await trio.sleep(0.05)
        assert trio.current_time() - starts[0] >= 0.3
        with pytest.raises(ObjectNotFound):
            await children.run(job)
        assert len(children.pids()) == 1, "a child started, and is kept"
    assert len(starts) == 1


async def test_rows_retention_is_about_to_delete_are_not_planned(metadata, objects, nursery):
    """`kept_ms`: of a topic with retention, rows whose running max timestamp leaves them
    less than that long before retention deletes them are left out of the plan (a plan
    starting there would be refused whole, index_changed, once retention ran)."""
    import time

    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    now_ms = int(time.time() * 1000)
    for age_s in (600, 500, 400, 100, 0):
        await append(log, [b"%d s old" % age_s], now_ms - age_s * 1000).wait(10)
    everything = await tiering.wal_rows(metadata, 0.0)
    assert [r[2] for r in everything] == [0, 1, 2, 3, 4]
    # Only rows newer than 300 s (say retention 700 s less a 400 s margin): the 400, 500
    # and 600 s old ones are left out.
    kept = await tiering.wal_rows(metadata, 0.0, kept_ms={topic.topic_id: 300_000})
    assert [r[2] for r in kept] == [3, 4]
    assert await tiering.wal_rows(metadata, 0.0, partitions=[(topic.topic_id, 0)],
                                  kept_ms={topic.topic_id: 300_000}) == kept
    other = await make_topic(metadata, 1, name="other")
    assert await tiering.wal_rows(metadata, 0.0, kept_ms={other.topic_id: 0}) == everything
    # A margin past the retention itself: nothing is worth tiering.
    assert await tiering.wal_rows(metadata, 0.0, kept_ms={topic.topic_id: -1000}) == []
