"""A compaction pass against the real PostgreSQL and a file:// store
(mink/storage/compaction/store.py): it streams its range block by block through an offset
map of bounded size and writes objects of at most `object_bytes`, so its memory does not grow
with the partition; a map smaller than the dirty section's keys cleans up to where it filled
and the next pass goes on; the objects are swapped together in one transaction fenced by the
writer lease (sql/0024), refused whole when that lease moved or the rows changed."""

from __future__ import annotations

import random
import time
import tracemalloc

import pytest
import trio

from mink.protocol.records import Record, build_batch, iter_batches, iter_records
from mink.storage.compaction import store as compaction
from mink.storage.compaction.offset_map import OffsetMap
from mink.storage.controlplane import StaleEpoch
from mink.storage.controlplane.postgres import IDEMPOTENT, READ
from mink.storage.lifecycle import tiering
from mink.storage.streams import Streams
from tests.test_tiering_storage import coordinator_epoch
from tests.test_wal import Node, _reader, make_topic, metadata  # noqa: F401  (fixture)

BASE_TS = 1_700_000_000_000
SETTINGS = compaction.CompactionSettings(min_cleanable_dirty_ratio=0.01)


@pytest.fixture
async def objects(tmp_path, aio_loop):
    """A file:// store: what a pass uploads goes to disk, not to memory a test measures."""
    from mink.storage.objectstore import open_object_store

    (tmp_path / "objects").mkdir()
    store = open_object_store((tmp_path / "objects").as_uri())
    yield store
    await store.aclose()


async def written_partition(metadata, objects, nursery, *, keys: int, rounds: int,
                            value_bytes: int, per_batch: int, stream_bytes: int,
                            random_keys: bool = False):
    """A one-partition topic whose `rounds` x `keys` keyed records (each round the keys in
    another order; `random_keys`: each record's key drawn at random) are tiered into stream objects of about `stream_bytes`; the topic's
    writer lease held. Returns (topic, streams, writer fence, what was written in offset
    order as (key, value))."""
    rng = random.Random(keys * rounds)
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    items = []
    for r in range(0 if random_keys else rounds):
        order = list(range(keys))
        rng.shuffle(order)
        items += [(b"key-%06d" % k, b"%d:" % r + rng.randbytes(value_bytes)) for k in order]
    if random_keys:  # any key any time: a key may come again soon after
        items = [(b"key-%06d" % rng.randrange(keys), b"%d:" % i + rng.randbytes(value_bytes))
                 for i in range(keys * rounds)]
    for i in range(0, len(items), per_batch):
        chunk = items[i:i + per_batch]
        data = bytearray(build_batch([Record(j, j, k, v) for j, (k, v) in enumerate(chunk)],
                                     base_timestamp=BASE_TS + i))
        await log.append(data, [len(chunk)], BASE_TS + i).wait(30)
    epoch = await coordinator_epoch(metadata, streams.node_epoch)
    for plan in tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0),
                                            stream_bytes):
        await tiering.write_stream_object(metadata, objects, epoch, plan)
    assert await tiering.backlog(metadata) == (0, 0)
    writer_epoch = await metadata.acquire_lease(f"writer/{topic.topic_id}", 1,
                                                streams.node_epoch, ttl_s=120)
    assert writer_epoch is not None
    return topic, streams, tiering.WriterFence(1, writer_epoch), items


async def read_records(metadata, objects, topic, node_epoch: int):
    """Every record of the partition as a cold reader finds it: (offset, key, value)."""
    state = await metadata.stream_state(topic.topic_id, 0)
    log = _reader(Streams(1, node_epoch, objects, metadata), topic.topic_id, 0, state)
    out: list[tuple[int, bytes, bytes | None]] = []
    offset = 0
    while offset < state.committed_end:
        got = []
        for chunk in await log.read(offset, 256 * 1024):
            for header, data in iter_batches(chunk):
                got += [(header.base_offset + r.offset_delta, bytes(r.key), r.value)
                        for r in iter_records(data)]
        got = [g for g in got if g[0] >= offset]
        assert got, f"no progress at offset {offset}"
        out += got
        offset = got[-1][0] + 1
    return out


def latest(items) -> list[tuple[int, bytes, bytes]]:
    last: dict[bytes, tuple[int, bytes]] = {}
    for offset, (key, value) in enumerate(items):
        last[key] = (offset, value)
    return sorted((o, k, v) for k, (o, v) in last.items())


async def index_rows(metadata, topic):
    return await metadata.fetch_all(READ, """
        SELECT base_offset, last_offset, object_key, byte_end - byte_start FROM batch_index
         WHERE topic_id = %s AND partition = 0 ORDER BY base_offset""", (topic.topic_id,))


async def test_a_pass_is_bounded_in_memory_and_writes_several_objects(metadata, objects,
                                                                      nursery):
    """8 MiB of records (2,048 keys written 4 times), tiered into objects of 512 KiB; a pass
    writing objects of at most 256 KiB, reading blocks of 64 KiB. It keeps exactly the
    latest record of every key, in offset order, in several objects; the memory it
    allocates at its peak is about its map, one object and two blocks, an eighth of the range
    it cleans (a pass holding the range whole, as before, needs more than the range)."""
    object_bytes = 256 * 1024
    topic, streams, fence, items = await written_partition(
        metadata, objects, nursery, keys=2048, rounds=4, value_bytes=1000, per_batch=32,
        stream_bytes=512 * 1024)
    rows_before = await index_rows(metadata, topic)
    range_bytes = sum(r[3] for r in rows_before)
    assert range_bytes > 8_000_000 and len(rows_before) >= 10

    tracemalloc.start()
    try:
        outcome = await compaction.compact_partition(
            metadata, objects, topic.topic_id, 0, fence, SETTINGS, int(time.time() * 1000),
            object_bytes=object_bytes, block_bytes=64 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert outcome is not None and outcome.bytes_in == range_bytes
    assert (outcome.base_offset, outcome.last_offset) == (0, len(items) - 1)
    assert outcome.cleaned_to == len(items) and not outcome.map_full
    assert (outcome.records_in, outcome.records_out) == (len(items), 2048)
    rows = await index_rows(metadata, topic)
    assert [r[2] for r in rows] == list(outcome.keys)
    assert len(rows) >= 4, "several objects"
    assert all(size <= object_bytes for *_, size in rows)
    # the objects tile the range
    assert rows[0][0] == 0 and rows[-1][1] == len(items) - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(rows, rows[1:]))
    assert await read_records(metadata, objects, topic, streams.node_epoch) == latest(items)
    # What a pass holds at once: its map (sized for the 8,192 offsets: 16,384 slots, 384 KiB),
    # the object being written (256 KiB), two blocks (128 KiB), and the batches in hand (one
    # read, one rebuilt). Measured 0.94-0.97 MiB over 8 MiB; tracemalloc also counts what the
    # node's own tasks allocate meanwhile, so the bound is the parts + 512 KiB (1.25 MiB), not
    # the 1 MiB seen: holding all the batches kept (2 MiB here) or the range fails it.
    parts = (OffsetMap.sized(compaction.DEFAULT_MAP_BYTES, len(items)).nbytes()
             + object_bytes + 2 * 64 * 1024)
    print(f"a pass over {range_bytes / 2**20:.2f} MiB: peak {peak / 2**20:.2f} MiB "
          f"(map, object and blocks {parts / 2**20:.2f} MiB)")
    assert peak < parts + 512 * 1024, \
        f"a pass over {range_bytes} bytes allocated {peak} at its peak (its parts: {parts})"


async def test_a_map_smaller_than_the_dirty_keys_cleans_to_where_it_filled(metadata, objects,
                                                                           nursery):
    """6,144 records of 2,048 keys drawn at random; a map of 1,024 slots (921 keys). The
    first pass stops
    where the map filled: below its new checkpoint every key is there once, with its latest
    value below it, the rows after the one it stopped in are untouched, nothing is lost; a
    second pass with room for every key finishes the range, exactly as one pass would."""
    topic, streams, fence, items = await written_partition(
        metadata, objects, nursery, keys=2048, rounds=3, value_bytes=100, per_batch=64,
        stream_bytes=64 * 1024, random_keys=True)
    rows_before = await index_rows(metadata, topic)
    now = int(time.time() * 1000)

    first = await compaction.compact_partition(metadata, objects, topic.topic_id, 0, fence,
                                               SETTINGS, now, map_bytes=1024 * 24,
                                               object_bytes=32 * 1024)
    assert first is not None and first.map_full
    first_keys = set()
    for offset, (key, _) in enumerate(items):  # where 922 keys are first seen
        first_keys.add(key)
        if len(first_keys) > 921:
            break
    assert first.cleaned_to == offset, "cleaned up to the first key that did not fit"
    assert first.records_out < first.records_in
    assert first.last_offset < len(items) - 1, "only the rows up to where the map filled"
    rows = await index_rows(metadata, topic)
    assert rows[len(first.keys):] == [r for r in rows_before if r[0] > first.last_offset]
    got = await read_records(metadata, objects, topic, streams.node_epoch)
    below = [(o, k, v) for o, k, v in got if o < first.cleaned_to]
    assert len({k for _, k, _ in below}) == len(below), "each key once below the checkpoint"
    assert below == latest(items[:first.cleaned_to])
    assert [g for g in got if g[0] >= first.cleaned_to] == [
        (o, k, v) for o, (k, v) in enumerate(items) if o >= first.cleaned_to]

    second = await compaction.compact_partition(metadata, objects, topic.topic_id, 0, fence,
                                                SETTINGS, now, object_bytes=32 * 1024)
    assert second is not None and not second.map_full
    assert (second.base_offset, second.last_offset, second.cleaned_to) == (
        0, len(items) - 1, len(items))
    assert await read_records(metadata, objects, topic, streams.node_epoch) == latest(items)
    assert await compaction.compact_partition(metadata, objects, topic.topic_id, 0, fence,
                                              SETTINGS, now) is None, "nothing dirty left"


class _BeforeSwap:
    """The metadata store, with `hook` run just before a pass's swap."""

    def __init__(self, inner, hook):
        self.inner, self.hook, self.swaps = inner, hook, []

    async def fetch_one(self, kind, sql, params=()):
        if sql == compaction.SQL_SWAP:
            self.swaps.append(params)
            await self.hook()
        return await self.inner.fetch_one(kind, sql, params)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def queued(metadata) -> dict[str, str]:
    return dict(await metadata.pending_deletions())


async def test_the_swap_of_several_objects_is_refused_whole(metadata, objects, nursery):
    """A pass whose writer lease moved before its swap, and a pass whose rows another pass
    swapped meanwhile: refused, the index as the winner left it, every object of the
    refused pass queued for deletion and its uploads gone; a repeat of a swap that was
    done is 'swapped' and changes nothing."""
    topic, streams, fence, items = await written_partition(
        metadata, objects, nursery, keys=500, rounds=3, value_bytes=200, per_batch=25,
        stream_bytes=64 * 1024)
    rows_before = await index_rows(metadata, topic)
    now = int(time.time() * 1000)
    scope = f"writer/{topic.topic_id}"

    async def lease_moves():
        await metadata.release_lease(scope, 1, fence.epoch)
        moved.append(await metadata.acquire_lease(scope, 1, streams.node_epoch, ttl_s=120))

    moved: list[int] = []
    stale = _BeforeSwap(metadata, lease_moves)
    with pytest.raises(StaleEpoch) as caught:
        await compaction.compact_partition(stale, objects, topic.topic_id, 0, fence, SETTINGS,
                                           now, object_bytes=32 * 1024)
    assert caught.value.reason == "stale_writer_lease_epoch"
    assert await index_rows(metadata, topic) == rows_before, "nothing swapped"
    keys = [o["key"] for o in _objects_of(stale.swaps[0])]
    assert len(keys) >= 3
    assert set(keys) <= (await queued(metadata)).keys(), "every upload given up"
    assert await tiering.open_uploads(metadata) == []
    fence = tiering.WriterFence(1, moved[0])

    # Two passes race: the second swaps first; the first finds its rows changed.
    async def nothing():
        pass

    winner = _BeforeSwap(metadata, nothing)

    async def another_pass():
        won.append(await compaction.compact_partition(winner, objects, topic.topic_id, 0,
                                                      fence, SETTINGS, now,
                                                      object_bytes=48 * 1024))

    won: list = []
    racing = _BeforeSwap(metadata, another_pass)
    with pytest.raises(compaction.CompactionRefused) as refused:
        await compaction.compact_partition(racing, objects, topic.topic_id, 0, fence,
                                           SETTINGS, now, object_bytes=32 * 1024)
    assert refused.value.reason == "index_changed"
    assert [r[2] for r in await index_rows(metadata, topic)] == list(won[0].keys)
    lost = [o["key"] for o in _objects_of(racing.swaps[0])]
    deletions = await queued(metadata)
    assert all(deletions.get(k) == "compaction_index_changed" for k in lost)
    assert await tiering.open_uploads(metadata) == []
    assert await read_records(metadata, objects, topic, streams.node_epoch) == latest(items)

    # The winner's swap again: done already, nothing changes.
    rows = await index_rows(metadata, topic)
    (again,) = await metadata.fetch_all(IDEMPOTENT, compaction.SQL_SWAP, winner.swaps[0])
    assert again == ("swapped",) and await index_rows(metadata, topic) == rows


def _objects_of(swap_params) -> list[dict]:
    import json

    return json.loads(swap_params[6])


async def test_a_pass_failing_mid_way_raises_the_store_error_and_gives_its_uploads_up(
        metadata, objects, nursery):
    """A GET failing in the clean scan, after some objects were uploaded (the next block is
    read while one is cleaned): the store's own error comes out (not an exception group, so
    the cleaner's handlers see it), nothing is swapped, every upload begun is given up."""
    from mink.storage.objectstore import ObjectStoreUnavailable

    topic, streams, fence, items = await written_partition(
        metadata, objects, nursery, keys=300, rounds=3, value_bytes=200, per_batch=10,
        stream_bytes=64 * 1024)
    rows_before = await index_rows(metadata, topic)
    range_bytes = sum(r[3] for r in rows_before)
    blocks_per_scan = sum(-(-r[3] // 16384) for r in rows_before)

    class FailingGets:
        def __init__(self, inner, fail_at: int):
            self.inner, self.fail_at, self.gets, self.created = inner, fail_at, 0, []

        async def get(self, key, start=0, end=None):
            self.gets += 1
            if self.gets == self.fail_at:
                raise ObjectStoreUnavailable("injected")
            return await self.inner.get(key, start, end)

        async def create(self, key, data):
            self.created.append(key)
            await self.inner.create(key, data)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    failing = FailingGets(objects, 2 * blocks_per_scan - 1)  # the last round is kept
    with pytest.raises(ObjectStoreUnavailable):
        await compaction.compact_partition(metadata, failing, topic.topic_id, 0, fence,
                                           SETTINGS, int(time.time() * 1000),
                                           object_bytes=8 * 1024, block_bytes=16384)
    assert range_bytes > 16384 * 8
    assert len(failing.created) >= 2, "objects were uploaded before the failure"
    assert await index_rows(metadata, topic) == rows_before
    assert await tiering.open_uploads(metadata) == []
    deletions = await queued(metadata)
    assert all(deletions.get(k) == "tiering_abandoned" for k in failing.created)
