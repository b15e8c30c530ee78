"""The epoch-fenced WAL and partition logs, against the real PostgreSQL and object stores."""

from __future__ import annotations

import psycopg
import pytest
import trio
import trio.testing

from mink.protocol.records import Record, build_batch, iter_batches, iter_records
from mink.storage.log import AppendInDoubt, NotLeader, StorageUnavailable
from tests.support.metadata import ToolMetadataStore
from mink.storage.controlplane import MetadataStore, OutcomeUnknown
from mink.storage.objectstore import ObjectStoreUnavailable, open_object_store
from mink.storage.objectstore.testing import FaultyObjectStore
from mink.storage.streams import Streams
from tests.support.s3 import s3_options


@pytest.fixture(params=["memory", "file", "s3"])
async def objects(request, tmp_path, aio_loop):
    if request.param == "memory":
        store = open_object_store("memory://")
    elif request.param == "file":
        (tmp_path / "objects").mkdir()
        store = open_object_store((tmp_path / "objects").as_uri())
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        store = open_object_store(request.getfixturevalue("s3_bucket_url"),
                                  **s3_options(endpoint))
    await store.check()
    yield store
    await store.aclose()


@pytest.fixture
async def metadata(pg_url, aio_loop):
    store = await ToolMetadataStore.open(pg_url)
    yield store
    with trio.CancelScope(shield=True):
        await store.aclose()


def batch(values: list[bytes], timestamp: int = 1_700_000_000_000) -> bytearray:
    return bytearray(build_batch([Record(i, 0, None, v) for i, v in enumerate(values)],
                                 base_timestamp=timestamp))


def append(log, values: list[bytes], timestamp: int = 1_700_000_000_000):
    return log.append(batch(values, timestamp), [len(values)], timestamp)


def values_of(chunks) -> list[tuple[int, bytes]]:
    out = []
    for chunk in chunks:
        for header, data in iter_batches(chunk):
            out += [(header.base_offset + r.offset_delta, r.value) for r in iter_records(data)]
    return out


async def read_all(log, start: int = 0) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = start
    while offset < log.high_watermark:
        got = values_of(await log.read(offset, 64 * 1024))
        assert got, f"no progress at offset {offset}"
        out += [(o, v) for o, v in got if o >= offset]
        offset = out[-1][0] + 1
    return out


class Node:
    """A node's storage side: registered, with its topic's partitions led and opened."""

    def __init__(self, metadata, objects, node_id: int, **wal):
        self.metadata = metadata
        self.objects = objects
        self.node_id = node_id
        self.wal = wal
        self.streams: Streams | None = None

    async def start(self, nursery) -> Streams:
        epoch = await self.metadata.register_node(self.node_id, "127.0.0.1", 9000 + self.node_id,
                                                  ttl_s=30)
        self.streams = Streams(self.node_id, epoch, self.objects, self.metadata, **self.wal)
        await nursery.start(self.streams.run)
        return self.streams


async def make_topic(metadata, partitions: int, leader: int = 1, name: str = "t"):
    return await metadata.create_topic(name, partitions, {}, [leader] * partitions)


async def test_round_trip_many_partitions_share_objects(metadata, objects, nursery):
    topic = await make_topic(metadata, 8)
    streams = await Node(metadata, objects, 1).start(nursery)
    logs = [await streams.open(topic.topic_id, p, 0) for p in range(8)]
    expected: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(8)}

    async def produce(p: int) -> None:
        for i in range(20):
            values = [f"p{p}-{i}-{j}".encode() * 10 for j in range(3)]
            base = await append(logs[p], values).wait(timeout=30)
            expected[p] += [(base + j, v) for j, v in enumerate(values)]

    async with trio.open_nursery() as producers:
        for p in range(8):
            producers.start_soon(produce, p)

    keys = await objects.list("wal/")
    assert len(keys) < 8 * 20, "partitions should share WAL objects"
    for p in range(8):
        expected[p].sort()
        assert [o for o, _ in expected[p]] == list(range(60)), "offsets are contiguous"
        assert logs[p].high_watermark == 60
        assert await read_all(logs[p]) == expected[p]  # from the tail cache
    # A fresh reader has empty caches: everything comes through the index and ranged GETs.
    cold = Streams(1, streams.node_epoch, objects, metadata)
    for p in range(8):
        state = await metadata.stream_state(topic.topic_id, p)
        assert state.committed_end == 60
        rows = await metadata.find_batches(topic.topic_id, p, 0)
        assert len(rows) <= len({r.object_key for r in rows}), "one index row per object"
        cold_log = _reader(cold, topic.topic_id, p, state)
        assert await read_all(cold_log) == expected[p]


def _reader(streams: Streams, topic_id, partition: int, state):
    from mink.storage.log import PartitionLog

    return PartitionLog(topic_id, partition, state.leader_epoch, state.committed_end,
                        state.log_start_offset, streams.wal, streams.caches)


async def test_reads_respect_max_bytes_but_return_the_first_batch(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    for i in range(5):
        await append(log, [bytes([i]) * 1000]).wait(timeout=10)
    first = await log.read(0, 10)
    assert [o for o, _ in values_of(first)] == [0]
    assert [o for o, _ in values_of(await log.read(3, 10**6))] == [3, 4]
    assert await log.read(5, 100) == []


async def test_a_moved_partition_fails_alone(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 2)
    node1 = await Node(metadata, objects, 1).start(nursery)
    node2 = await Node(metadata, objects, 2).start(nursery)
    log0 = await node1.open(topic.topic_id, 0, 0)
    log1 = await node1.open(topic.topic_id, 1, 0)
    await append(log0, [b"before"]).wait(timeout=10)
    # The coordinator moves partition 0 to node 2, which opens it at the new epoch.
    epoch = await metadata.lead_partition(topic.topic_id, 0, 2)
    log0_on_2 = await node2.open(topic.topic_id, 0, epoch)
    stale = append(log0, [b"stale"])
    fine = append(log1, [b"fine"])
    with pytest.raises(NotLeader):
        await stale.wait(timeout=10)
    assert await fine.wait(timeout=10) == 0
    assert log0.closed is not None and node1.get(topic.topic_id, 0) is None
    assert node1.fenced.is_set()
    # Node 2 continues exactly at the committed end; node 1's refused batch is nowhere.
    assert await append(log0_on_2, [b"after"]).wait(timeout=10) == 1
    assert [v for _, v in await read_all(log0_on_2)] == [b"before", b"after"]


async def test_stale_node_epoch_is_refused_whole(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 2)
    streams = await Node(metadata, objects, 1).start(nursery)
    logs = [await streams.open(topic.topic_id, p, 0) for p in range(2)]
    # The node is registered again behind this writer's back (as a takeover would).
    await metadata.register_node(1, "127.0.0.1", 9001, ttl_s=30)
    pending = [append(log, [b"x"]) for log in logs]
    for p in pending:
        with pytest.raises(NotLeader):
            await p.wait(timeout=10)
    for p in range(2):
        assert (await metadata.stream_state(topic.topic_id, p)).committed_end == 0


async def test_two_writers_race_for_one_stream(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    node1 = await Node(metadata, objects, 1).start(nursery)
    node2 = await Node(metadata, objects, 2).start(nursery)
    log1 = await node1.open(topic.topic_id, 0, 0)
    epoch = await metadata.lead_partition(topic.topic_id, 0, 2)
    log2 = await node2.open(topic.topic_id, 0, epoch)
    acked: dict[int, bytes] = {}
    refused = []

    async def write(log, name: str) -> None:
        for i in range(30):
            value = f"{name}-{i}".encode()
            try:
                offset = await append(log, [value]).wait(timeout=10)
            except NotLeader:
                refused.append(name)
                return
            assert offset not in acked, "an offset was acknowledged twice"
            acked[offset] = value

    async with trio.open_nursery() as writers:
        writers.start_soon(write, log1, "one")
        writers.start_soon(write, log2, "two")
    assert refused == ["one"]
    assert all(v.startswith(b"two") for v in acked.values())
    assert dict(await read_all(log2)) == acked


class _CrashBeforeCommit:
    """A metadata store whose CommitWal never returns: the node dies between upload and commit."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def commit_wal(self, *args):
        await trio.sleep_forever()


async def test_crash_between_upload_and_commit_leaves_nothing_visible(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    crashing = Node(_CrashBeforeCommit(metadata), objects, 1, commit_timeout=1.0)
    with trio.CancelScope() as crash:
        async with trio.open_nursery() as doomed:
            streams = await crashing.start(doomed)
            log = await streams.open(topic.topic_id, 0, 0)
            append(log, [b"never acknowledged"])
            with trio.fail_after(10):
                while not await objects.list("wal/"):
                    await trio.sleep(0.01)
            crash.cancel()
    orphan_keys = await objects.list("wal/")
    assert len(orphan_keys) == 1
    state = await metadata.stream_state(topic.topic_id, 0)
    assert state.committed_end == 0
    assert await metadata.find_batches(topic.topic_id, 0, 0) == []
    # The node restarts: new epoch, fresh leader epoch, nothing of the orphan is visible,
    # and its key is queued for deletion.
    restarted = await Node(metadata, objects, 1).start(nursery)
    assert await restarted.settle_orphans(objects) == orphan_keys
    assert orphan_keys[0] in [k for k, _ in await metadata.pending_deletions()]
    epoch = await metadata.lead_partition(topic.topic_id, 0, 1)
    log = await restarted.open(topic.topic_id, 0, epoch)
    assert await append(log, [b"first"]).wait(timeout=10) == 0
    assert [v for _, v in await read_all(log)] == [b"first"]


class _LosesCommitAnswers:
    """CommitWal runs, but the first `n` answers are lost on the way back."""

    def __init__(self, inner, n: int):
        self._inner = inner
        self.n = n

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def commit_wal(self, *args):
        outcome = await self._inner.commit_wal(*args)
        if self.n > 0:
            self.n -= 1
            raise OutcomeUnknown("connection lost after COMMIT (injected)")
        return outcome


async def test_lost_commit_answer_is_read_back_not_guessed(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    lossy = _LosesCommitAnswers(metadata, n=3)
    streams = await Node(lossy, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    offsets = []
    for i in range(10):
        offsets.append(await append(log, [f"v{i}".encode()]).wait(timeout=30))
    assert offsets == list(range(10))
    assert lossy.n == 0
    assert [v for _, v in await read_all(log)] == [f"v{i}".encode() for i in range(10)]


async def test_killed_backends_lose_and_duplicate_nothing(metadata, pg_url, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 4)
    node = Node(metadata, objects, 1, commit_timeout=5.0)
    streams = await node.start(nursery)
    logs = [await streams.open(topic.topic_id, p, 0) for p in range(4)]
    acked: dict[tuple[int, int], bytes] = {}
    failed = 0

    async def produce(p: int) -> None:
        nonlocal failed
        for i in range(40):
            value = f"{p}-{i}".encode()
            try:
                offset = await append(logs[p], [value]).wait(timeout=20)
            except (AppendInDoubt, StorageUnavailable):
                failed += 1
                continue
            assert (p, offset) not in acked, "an offset was acknowledged twice"
            acked[(p, offset)] = value

    killed = 0

    def kill_backends() -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return len(conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall())

    async with trio.open_nursery() as producers:
        for p in range(4):
            producers.start_soon(produce, p)
        for _ in range(5):
            await trio.sleep(0.05)
            killed += await trio.to_thread.run_sync(kill_backends)
    assert killed > 0, "no backend was killed: the fault never happened"
    assert len(acked) + failed == 4 * 40, "an append was neither acknowledged nor failed"
    assert acked, "nothing was acknowledged"
    produced = {f"{p}-{i}".encode() for p in range(4) for i in range(40)}
    for p in range(4):
        stored = dict(await read_all(logs[p]))
        state = await metadata.stream_state(topic.topic_id, p)
        assert state.committed_end == logs[p].high_watermark == len(stored)
        values = list(stored.values())
        assert len(set(values)) == len(values), "a message was stored twice"
        assert set(values) <= produced
        for (q, offset), value in acked.items():
            if q == p:
                assert stored[offset] == value, "an acknowledged message was lost"


async def test_upload_failures_fail_appends_and_commit_nothing(metadata, nursery):
    objects = FaultyObjectStore(open_object_store("memory://"))
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    assert await append(log, [b"ok"]).wait(timeout=10) == 0
    objects.fail_next("create", n=2, exc=ObjectStoreUnavailable)
    with pytest.raises(StorageUnavailable):
        await append(log, [b"lost-1"]).wait(timeout=10)
    with pytest.raises(StorageUnavailable):
        await append(log, [b"lost-2"]).wait(timeout=10)
    assert (await metadata.stream_state(topic.topic_id, 0)).committed_end == 1
    # The next offset went back to the committed end: no gap, no hole.
    assert await append(log, [b"next"]).wait(timeout=10) == 1
    assert [v for _, v in await read_all(log)] == [b"ok", b"next"]


async def test_postgres_outage_then_recovery_without_restart(pg_server, metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    node = Node(metadata, objects, 1, commit_timeout=2.0)
    streams = await node.start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    assert await append(log, [b"before"]).wait(timeout=10) == 0
    await trio.to_thread.run_sync(pg_server.stop, "immediate")
    try:
        with pytest.raises((AppendInDoubt, StorageUnavailable)):
            with trio.fail_after(15):
                await append(log, [b"during"]).wait(timeout=5)
        # Reads of cached, committed data are still served.
        assert [v for _, v in values_of(await log.read(0, 10**6))] == [b"before"]
    finally:
        await trio.to_thread.run_sync(pg_server.start)
    # Without any restart, appends work again once the in-doubt commit is resolved.
    with trio.fail_after(30):
        while True:
            try:
                offset = await append(log, [b"after"]).wait(timeout=5)
                break
            except (AppendInDoubt, StorageUnavailable):
                await trio.sleep(0.2)
    values = [v for _, v in await read_all(log)]
    assert values[0] == b"before" and values[-1] == b"after"
    assert offset == len(values) - 1
    assert set(values) <= {b"before", b"during", b"after"}


async def test_reads_across_index_and_tail_cache_have_no_gap(metadata, nursery):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    # A tail cache too small for everything: older offsets come through the index.
    streams = await Node(metadata, objects, 1, tail_cache_bytes=4096).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    expected = []
    for i in range(60):
        value = b"%03d" % i * 100
        await append(log, [value]).wait(timeout=10)
        expected.append((i, value))
    assert log.tail[0].base_offset > 0, "the tail cache should have dropped old chunks"
    for max_bytes in (100, 5000, 10**6):
        out, offset = [], 0
        while offset < log.high_watermark:
            got = [(o, v) for o, v in values_of(await log.read(offset, max_bytes)) if o >= offset]
            assert got and got[0][0] == offset, f"gap at {offset}"
            out += got
            offset = out[-1][0] + 1
        assert out == expected


@pytest.mark.parametrize("tail_cache_bytes", [0, 256 * 1024 * 1024])
async def test_a_read_that_fills_its_budget_skips_nothing(metadata, nursery, tail_cache_bytes):
    objects = open_object_store("memory://")
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, objects, 1, tail_cache_bytes=tail_cache_bytes).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)
    # Appends in flight together share WAL objects: index rows of several batches each.
    # Their sizes vary, so a budget runs out with smaller batches still behind.
    pending = [append(log, [b"x" * (10 + 97 * (i % 7))]) for i in range(60)]
    for p in pending:
        await p.wait(timeout=10)
    for max_bytes in (150, 250, 700, 3000):
        offset, seen = 0, []
        while offset < log.high_watermark:
            got = [o for o, _ in values_of(await log.read(offset, max_bytes)) if o >= offset]
            assert got == list(range(offset, offset + len(got))), f"gap after {offset}"
            seen += got
            offset = seen[-1] + 1
        assert seen == list(range(60))


async def test_a_stopped_writer_releases_producers_waiting_for_room(metadata, nursery):
    objects = FaultyObjectStore(open_object_store("memory://"))
    topic = await make_topic(metadata, 1)
    hold = trio.Event()
    objects.stall("create", until=hold)  # uploads hang: the WAL fills up
    streams = await Node(metadata, objects, 1, wal_max_bytes=1000).start(nursery)
    streams.wal.max_buffered_bytes = 2000
    log = await streams.open(topic.topic_id, 0, 0)
    pending = [append(log, [b"x" * 500]) for _ in range(6)]
    waiter_result = []

    async def wait_for_room():
        try:
            await streams.wal.wait_for_room()
            waiter_result.append("room")
        except NotLeader:
            waiter_result.append("not leader")

    nursery.start_soon(wait_for_room)
    await trio.testing.wait_all_tasks_blocked()  # the waiter is at its wait (uploads hang)
    assert waiter_result == [], "the WAL is full: the producer must wait"
    streams.stop()
    nursery.start_soon(streams.wal.settle_after_stop)  # as Membership.stop_leading does
    with trio.fail_after(5):
        while not waiter_result:
            await trio.sleep(0.01)
    assert waiter_result == ["not leader"]
    for p in pending:
        with pytest.raises((NotLeader, AppendInDoubt)):
            await p.wait(timeout=5)
    hold.set()


async def test_a_second_upload_starts_only_for_a_buffer_worth_it(metadata, nursery):
    """file://'s rule (wal_concurrent_upload_min_bytes): while an upload runs, the next object
    waits for it unless the buffer holds the minimum; then it uploads beside it."""
    store = FaultyObjectStore(open_object_store("memory://"))
    release = trio.Event()
    store.stall("create", release)
    topic = await make_topic(metadata, 1)
    streams = await Node(metadata, store, 1, wal_max_uploads=2,
                         wal_concurrent_upload_min_bytes=50_000).start(nursery)
    log = await streams.open(topic.topic_id, 0, 0)

    def creates() -> int:
        return sum(op == "create" and key.startswith("wal/") for op, key in store.calls)

    first = append(log, [b"a" * 100])
    await trio.testing.wait_all_tasks_blocked()
    assert creates() == 1
    small = append(log, [b"b" * 100])
    await trio.testing.wait_all_tasks_blocked()
    assert creates() == 1, "a small buffer waits for the running upload"
    large = append(log, [b"c" * 60_000])
    await trio.testing.wait_all_tasks_blocked()
    assert creates() == 2, "a buffer over the minimum uploads beside the running one"
    release.set()
    offsets = [await p.wait(timeout=30) for p in (first, small, large)]
    assert offsets == [0, 1, 2]
    assert await read_all(log) == [(0, b"a" * 100), (1, b"b" * 100), (2, b"c" * 60_000)]
