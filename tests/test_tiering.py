"""Tiering on live nodes (subprocesses, PostgreSQL, file:// and moto S3) with confluent-kafka: what
consumers read, Fetch at arbitrary offsets and ListOffsets by timestamp are the same before
and after WAL objects are rewritten into stream objects and collected; a tiering node
SIGKILLed mid-round loses nothing and leaves no referenced object deleted."""

from __future__ import annotations

import os
import random
import time

import pytest
import trio

from mink.storage.embedded_postgres import free_port
from mink.storage.controlplane.postgres import READ
from mink.storage.lifecycle import tiering
from mink.storage.objectstore import open_object_store
from mink.storage.stream_object import is_stream_object
from tests.support.nodes import node_config
from tests.support.s3 import s3_options
from tests.test_lifecycle import create_topic
from tests.test_wal import metadata  # noqa: F401  (fixture)

TIMEOUT = 60
# An hour ago: well within the default retention (7 days). Rows retention is about to
# delete are not tiered (TieringWorker.kept_ms), and 2023's would be.
BASE_TS = (int(time.time()) - 3600) * 1000
# Tiering within 2 s (rounds every 0.5 s), small stream objects, collection without delay;
# a job may take 10 s (a loaded machine), an upload left by a killed round goes after 20 s.
FAST = dict(tiering_delay_ms=2000, tiering_stream_object_bytes=256 * 1024,
            tiering_upload_timeout_ms=20_000, file_delete_delay_ms=200, lease_ttl=3.0,
            coordinator_tick=0.5)


def messages(n: int, partitions: int, seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    return [{"key": b"k%d" % i, "value": bytes([i % 256]) * rng.randint(1, 900),
             "partition": i % partitions,
             "timestamp": BASE_TS + i * 10 + rng.randint(-200, 200),
             "headers": [("h", b"%d" % i)]} for i in range(n)]


def produce(address: str, topic: str, items: list[dict], per_flush: int = 40) -> list:
    """(partition, offset) of each message, flushed every `per_flush` messages: many small
    WAL objects, each shared by the partitions."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "linger.ms": 1})
    errors, delivered = [], []

    def on_delivery(err, msg):
        (errors if err else delivered).append(err or (msg.partition(), msg.offset()))

    for i, item in enumerate(items):
        producer.produce(topic, on_delivery=on_delivery, **item)
        if i % per_flush == per_flush - 1:
            assert producer.flush(TIMEOUT) == 0
    assert producer.flush(TIMEOUT) == 0
    assert not errors, errors[:3]
    return delivered


def consume(address: str, topic: str, starts: dict[int, int], count: int | None = None,
            ends: dict[int, int] | None = None) -> list[tuple]:
    """(partition, offset, key, value, timestamp, headers) from each partition's start: to
    its end offset, or `count` messages of each."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": "unused",
                         "enable.auto.commit": False, "fetch.max.bytes": 2_000_000,
                         "max.partition.fetch.bytes": 50_000})
    consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
    want = {p: (count if count is not None else ends[p] - o) for p, o in starts.items()}
    got: dict[int, list] = {p: [] for p in starts}
    deadline = time.monotonic() + TIMEOUT
    try:
        while any(len(got[p]) < want[p] for p in got) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert not msg.error(), msg.error()
            if len(got[msg.partition()]) < want[msg.partition()]:
                got[msg.partition()].append((msg.partition(), msg.offset(), msg.key(),
                                             msg.value(), msg.timestamp()[1], msg.headers()))
    finally:
        consumer.close()
    assert all(len(got[p]) == want[p] for p in got), {p: len(v) for p, v in got.items()}
    return [m for p in sorted(got) for m in got[p]]


def offsets_for_times(address: str, topic: str, partitions: int, times: list[int]):
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": "unused"})
    try:
        out = []
        for ts in times:
            found = consumer.offsets_for_times(
                [TopicPartition(topic, p, ts) for p in range(partitions)], timeout=TIMEOUT)
            out.append([(tp.partition, tp.offset) for tp in found])
        return out
    finally:
        consumer.close()


def reads(address: str, topic: str, partitions: int, ends: dict[int, int]):
    """Everything, Fetch at sampled offsets, ListOffsets at sampled timestamps."""
    rng = random.Random(5)
    everything = consume(address, topic, {p: 0 for p in range(partitions)}, ends=ends)
    at_offsets = [consume(address, topic, {p: rng.randrange(ends[p] - 3)}, count=3)
                  for p in range(partitions) for _ in range(4)]
    times = [BASE_TS + rng.randint(-500, 10 * sum(ends.values()) + 500) for _ in range(8)]
    return everything, at_offsets, offsets_for_times(address, topic, partitions, times)


async def wait_until(predicate, what: str, timeout: float = TIMEOUT) -> None:
    with trio.move_on_after(timeout):
        while not await predicate():
            await trio.sleep(0.1)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def index_keys(metadata) -> set[str]:
    return {r[0] for r in await metadata.fetch_all(
        READ, "SELECT DISTINCT object_key FROM batch_index")}


@pytest.fixture(params=["file", "s3"])
def store(request, store_url):
    """(store URL, node settings to reach it, the store opened for the test's checks)."""
    if request.param == "file":
        return store_url, {}, open_object_store(store_url)
    endpoint = request.getfixturevalue("s3_endpoint")
    url = request.getfixturevalue("s3_bucket_url")
    options = s3_options(endpoint)
    settings = {"s3_endpoint_url": endpoint, "s3_region": options["region"],
                "s3_access_key_id": options["access_key_id"],
                "s3_secret_access_key": options["secret_access_key"]}
    return url, settings, open_object_store(url, **options)


async def test_clients_read_the_same_before_and_after_tiering(
        pg_url, store, node_processes, metadata):
    partitions, n = 3, 3000
    store_url, store_settings, objects = store
    config = node_config(pg_url, store_url, listener=f"127.0.0.1:{free_port()}",
                         **{**FAST, **store_settings, "tiering_delay_ms": -1})
    untiered = node_processes(config)
    await trio.to_thread.run_sync(untiered.start)
    await trio.to_thread.run_sync(create_topic, untiered.address, "tiered", partitions)
    delivered = await trio.to_thread.run_sync(produce, untiered.address, "tiered", messages(n, partitions))
    ends = {p: sum(1 for q, _ in delivered if q == p) for p in range(partitions)}
    before = await trio.to_thread.run_sync(reads, untiered.address, "tiered", partitions, ends)
    wal_rows_before, _ = await tiering.backlog(metadata)
    assert wal_rows_before > 20 * partitions, "many WAL objects per partition"
    await trio.to_thread.run_sync(untiered.stop)

    tiering_node = node_processes(node_config(pg_url, store_url, listener=config.listener,
                                              **FAST, **store_settings))
    await trio.to_thread.run_sync(tiering_node.start)

    async def tiered_and_collected() -> bool:
        return (await tiering.backlog(metadata))[0] == 0 and not await objects.list("wal/")

    await wait_until(tiered_and_collected, "every WAL object tiered and collected")
    keys = await index_keys(metadata)
    assert keys and all(is_stream_object(k) for k in keys)
    rows_after = (await metadata.fetch_one(READ, "SELECT count(*) FROM batch_index"))[0]
    assert rows_after < wal_rows_before / 5
    after = await trio.to_thread.run_sync(reads, tiering_node.address, "tiered", partitions,
                                          ends)
    assert after[0] == before[0], "every message, byte for byte, in order"
    assert after[1] == before[1], "Fetch at arbitrary offsets"
    assert after[2] == before[2], "ListOffsets by timestamp"


async def test_sigkill_of_the_tiering_node_mid_round_loses_nothing(
        pg_url, store, node_processes, metadata):
    """On file:// and on moto S3."""
    partitions, n = 8, 8000
    store_url, store_settings, objects = store
    # lease_ttl 6 s: a tiering node on a loaded machine (moto S3 in the same two cores) must
    # not lose its membership while it rewrites, or every round is fenced before its swap.
    settings = {**FAST, **store_settings, "tiering_concurrency": 1, "lease_ttl": 6.0,
                "tiering_stream_object_bytes": 64 * 1024}
    config = node_config(pg_url, store_url, listener=f"127.0.0.1:{free_port()}",
                         **{**settings, "tiering_delay_ms": -1})
    first = node_processes(config)
    await trio.to_thread.run_sync(first.start)
    await trio.to_thread.run_sync(create_topic, first.address, "killed", partitions)
    delivered = await trio.to_thread.run_sync(produce, first.address, "killed", messages(n, partitions))
    ends = {p: sum(1 for q, _ in delivered if q == p) for p in range(partitions)}
    before = await trio.to_thread.run_sync(
        lambda: consume(first.address, "killed", {p: 0 for p in range(partitions)}, ends=ends))
    await trio.to_thread.run_sync(first.stop)

    tiering_node = node_processes(node_config(pg_url, store_url, listener=config.listener,
                                              **settings))
    await trio.to_thread.run_sync(tiering_node.start)
    # SIGKILL while a stream object is being written (begun, not swapped). On file:// the
    # window is a few milliseconds, so the node is paused when one is seen, and killed only
    # if the upload is still open under the pause, and (on file://) its copy is in a
    # child: a node paused between the begin and the child's start has none yet. A window
    # missed is let go, and the next one (the round has one per stream object) is tried.
    node_pid = tiering_node.process.pid
    in_children = store_url.startswith("file:")
    with trio.fail_after(TIMEOUT):
        while True:
            while not await tiering.open_uploads(metadata):
                assert (await tiering.backlog(metadata))[0] > 0, (
                    "no window was caught" + (" with a tiering child copying" if in_children
                                              else ""))
                await trio.sleep(0.002)
            tiering_node.pause()
            # A statement the node sent before the pause (the swap) still completes in
            # PostgreSQL: let it, then look again.
            await trio.sleep(0.5)
            if await tiering.open_uploads(metadata) and (
                    bool(_tiering_children(node_pid)) or not in_children):
                break
            tiering_node.resume()
    copying = _tiering_children(node_pid)
    assert bool(copying) == store_url.startswith("file:"), "file:// copies in children"
    tiering_node.kill()
    await wait_until(lambda: _none_left(copying), "the node's tiering children exited", 10)
    stranded = await tiering.open_uploads(metadata)
    assert stranded, "killed between the begin of a stream object and its swap"
    backlog_at_kill, _ = await tiering.backlog(metadata)
    assert backlog_at_kill > 0, "killed mid-round: WAL rows were left to tier"
    stored = set(await objects.list(""))
    assert await index_keys(metadata) <= stored, "no referenced object is deleted"

    restarted = node_processes(node_config(pg_url, store_url, listener=config.listener,
                                           **settings))
    await trio.to_thread.run_sync(restarted.start)

    async def settled() -> bool:
        return ((await tiering.backlog(metadata))[0] == 0
                and not await tiering.open_uploads(metadata)
                and not await objects.list("wal/")
                and set(await objects.list("stream/")) == await index_keys(metadata))

    # (on moto S3 under load one stream object of ~30 ranged GETs takes about a second)
    await wait_until(settled, "the rest tiered, the killed round's upload deleted", 3 * TIMEOUT)
    assert all(is_stream_object(k) for k in await index_keys(metadata))
    assert not set(stranded) & set(await objects.list("")), "the killed upload is deleted"
    after = await trio.to_thread.run_sync(
        lambda: consume(restarted.address, "killed", {p: 0 for p in range(partitions)},
                        ends=ends))
    assert after == before, "nothing lost, nothing reordered, byte for byte"


def _tiering_children(node_pid: int) -> list[int]:
    """The node's tiering child processes (mink/storage/lifecycle/tiering_child_main.py): their
    command line ends with the node's pid."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
        if b"mink.storage.lifecycle.tiering_child_main" in argv and str(node_pid).encode() in argv:
            pids.append(int(entry))
    return pids


async def _none_left(pids: list[int]) -> bool:
    """None of `pids` runs (gone, or a zombie not yet reaped)."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != b"Z":
            return False
    return True


def scrape(admin_address: str) -> dict[str, float]:
    """The tiering series of one node's /metrics (sample name and labels -> value)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{admin_address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("mink_tiering"):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


async def test_rounds_run_on_the_writer_lease_holders_of_three_nodes(
        pg_url, store_url, node_processes, metadata):
    """The coordinator schedules; each topic's partitions are tiered by the holder of its
    writer lease: on a three-node cluster swaps are committed on more than one node, and
    every message reads back identical (as produced, and as read before tiering)."""
    from mink.broker.cluster.leases import preference, writer_scope

    partitions, per_topic = 2, 600
    listeners = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    admins = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes = [node_processes(node_config(
        pg_url, store_url, node_id=i + 1, listener=listeners[i], admin_listener=admins[i],
        **FAST)) for i in range(3)]
    for n in nodes:
        await trio.to_thread.run_sync(n.start)
    address = nodes[0].address
    # Topics until their writer leases (rendezvous hashing of random topic ids) prefer at
    # least two nodes: the spread this test is about.
    names, preferred = [], {}
    while len(names) < 4 or len(set(preferred.values())) < 2:
        assert len(names) < 20
        name = f"spread{len(names)}"
        await trio.to_thread.run_sync(create_topic, address, name, partitions)
        (topic_id,) = await metadata.fetch_one(READ, "SELECT topic_id FROM topics "
                                               "WHERE name = %s", (name,))
        preferred[writer_scope(topic_id)] = max(
            (1, 2, 3), key=lambda n: preference(n, writer_scope(topic_id)))
        names.append(name)

    async def writer_leases_spread() -> bool:
        holders = {lease.scope: lease.holder for lease in await metadata.leases("writer/")
                   if lease.live}
        return all(holders.get(s) == n for s, n in preferred.items())

    await wait_until(writer_leases_spread, "each writer lease on the node preferring it")
    produced = {name: messages(per_topic, partitions, seed=i) for i, name in enumerate(names)}
    before = {}
    for name, items in produced.items():
        delivered = await trio.to_thread.run_sync(produce, address, name, items)
        ends = {p: sum(1 for q, _ in delivered if q == p) for p in range(partitions)}
        assert sum(ends.values()) == per_topic
        before[name] = (ends, await trio.to_thread.run_sync(
            lambda: consume(address, name, {p: 0 for p in range(partitions)}, ends=ends)))
        # each message as produced: its header names it; offsets 0.. per partition, in order
        for p in range(partitions):
            got = [m for m in before[name][1] if m[0] == p]
            assert [m[1] for m in got] == list(range(ends[p]))
            indices = [int(m[5][0][1]) for m in got]
            assert indices == sorted(indices)
            for _, _, key, value, ts, headers in got:
                item = items[int(headers[0][1])]
                assert (key, value, ts, headers, item["partition"]) == (
                    item["key"], item["value"], item["timestamp"], item["headers"], p)
    objects = open_object_store(store_url)

    async def tiered_and_collected() -> bool:
        return (await tiering.backlog(metadata))[0] == 0 and not await objects.list("wal/")

    await wait_until(tiered_and_collected, "every WAL object tiered and collected")
    assert all(is_stream_object(k) for k in await index_keys(metadata))
    series = [await trio.to_thread.run_sync(scrape, a) for a in admins]
    swapped = [s.get("mink_tiering_stream_objects_total{}", 0) for s in series]
    assert sum(1 for n in swapped if n > 0) >= 2, f"swaps per node: {swapped}"
    # A round is counted where there was work to plan or do: on each writer-lease holder
    # (a third node may hold none of these topics' leases, and then runs no rounds).
    rounds = [s.get("mink_tiering_rounds_total{}", 0) for s in series]
    assert all(rounds[n - 1] > 0 for n in set(preferred.values())), f"rounds: {rounds}"
    assert sum(s.get("mink_tiering_bytes_total{}", 0) for s in series) > 0
    for name, (ends, messages_before) in before.items():
        after = await trio.to_thread.run_sync(
            lambda: consume(nodes[1].address, name, {p: 0 for p in range(partitions)},
                            ends=ends))
        assert after == messages_before, f"{name}: every message, byte for byte, in order"
    for n in nodes:
        await trio.to_thread.run_sync(n.stop)


def test_the_schedule_hands_each_plan_to_its_topics_writer_lease_holder():
    """`hand_out`'s table, row by row."""
    import uuid

    from mink.broker.cluster.leases import writer_scope
    from mink.broker.cluster.tiering import hand_out

    orphan, mine, stale, theirs = (uuid.uuid4() for _ in range(4))
    plans = [tiering.StreamObjectPlan(t, p, [tiering.WalRow(0, 0, "wal/1/1/1", 0, 10)])
             for t in (orphan, mine, stale, theirs) for p in (0, 1)]
    writers = {writer_scope(mine): (1, 7), writer_scope(stale): (1, 9),
               writer_scope(theirs): (2, 4)}
    held = {writer_scope(mine): 7, writer_scope(stale): 8}
    jobs, handed = hand_out(plans, 5, writers, 1, held)
    assert [(j.plan.topic_id, j.plan.partition, j.coordinator_epoch, j.writer)
            for j in jobs] == [
        (orphan, 0, 5, None), (orphan, 1, 5, None),
        (mine, 0, 5, tiering.WriterFence(1, 7)), (mine, 1, 5, tiering.WriterFence(1, 7))]
    assert handed == [(theirs, 0, 2, 4), (theirs, 1, 2, 4)]
