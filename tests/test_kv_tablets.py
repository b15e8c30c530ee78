"""KV tablets on the leaders of compacted partitions (mink/broker/cluster/tablets.py), in a
two-node cluster of the harness with confluent-kafka: lookups return the acknowledged
latest value of every key (or not found for a deleted or unknown one); snapshots are
written to the object store under the leader epoch, by the record count or by time, each
replacing the one before, which is collected (as is one the fence refuses); after the
leader is killed the new leader serves Produce and Fetch, restores the newest snapshot,
replays the rest, and its lookups match a reference dict built from what was acknowledged;
the HTTP lookup and `mink get` answer through either node (the non-leader forwards to the
leader)."""

from __future__ import annotations

import random
import time

import trio

from mink.storage.compaction import snapshots
from mink.storage.compaction.snapshots import KV_PREFIX
from mink.storage.controlplane.postgres import IDEMPOTENT, READ
from tests.test_compaction import _produce, read_all, wait_until
from tests.test_wal import metadata  # noqa: F401  (fixture)

KEYS = 2_000
FAST = dict(kv_snapshot_records=1_000, kv_snapshot_interval_ms=500,
            log_cleaner_backoff_ms=-1, tiering_delay_ms=1000)


def writes(rng: random.Random, rounds: int, tag: str) -> list[tuple[bytes, bytes | None]]:
    items = []
    for r in range(rounds):
        for k in rng.sample(range(KEYS), KEYS // 2):
            items.append((b"k%05d" % k, None if rng.random() < 0.05
                          else b"%s-%d-%05d" % (tag.encode(), r, k)))
    return items


async def check_lookups(node, reference: dict[bytes, bytes | None]) -> None:
    """Every key's lookup answers what was acknowledged last. "loading" (the tablet not at
    the high watermark within the lookup's own 10 s, seen on a machine at load 10) is the
    retriable 503 a client asks again on: asked again, within a minute."""
    keeper = node.node.tablets
    for key in [*reference, b"never-written"]:
        got = await node.call(keeper.lookup, "table", 0, key)
        with trio.fail_after(60):
            while got.status == "loading":
                await trio.sleep(0.1)
                got = await node.call(keeper.lookup, "table", 0, key)
        want = reference.get(key)
        if want is None:
            assert got.status == "not_found", (key, got)
        else:
            assert (got.status, got.value) == ("found", want), (key, got)


async def test_lookups_match_what_was_acknowledged_across_a_leader_kill():
    from mink.testing import open_cluster

    rng = random.Random(7)
    async with open_cluster(2, proxy=False, file_delete_delay_ms=200, **FAST) as cluster:
        await cluster.create_topic("table", 1, {"cleanup.policy": "compact"})
        leaders = await cluster.wait_led("table")
        first = cluster.node(leaders[0])
        reference: dict[bytes, bytes | None] = {}

        items = writes(rng, 3, "a")
        await trio.to_thread.run_sync(_produce, cluster.bootstrap, "table", items)
        reference.update(items)

        async def caught_up() -> bool:
            entry = first.node.tablets.tablets.get(
                (first.node.view.topics["table"].topic_id, 0))
            return entry is not None and entry.caught_up.is_set()

        await wait_until(caught_up, "the leader's tablet caught up")
        await check_lookups(first, reference)

        topic_id = first.node.view.topics["table"].topic_id

        async def snapshot_row():
            return await first.call(first.node.metadata.fetch_one, READ, """
                SELECT log_offset, object_key, leader_epoch FROM kv_snapshots
                 WHERE topic_id = %s AND partition = 0""", (topic_id,))

        async def snapshotted() -> bool:
            row = await snapshot_row()
            return row is not None and row[0] >= len(items)

        await wait_until(snapshotted, "a snapshot covering the first writes")
        snapshot = await snapshot_row()
        assert snapshot[1].startswith(KV_PREFIX)

        # Writes after the snapshot: replayed from the log by the next leader.
        more = writes(rng, 1, "b")
        await trio.to_thread.run_sync(_produce, cluster.bootstrap, "table", more)
        reference.update(more)
        await check_lookups(first, reference)  # read-your-acknowledged-writes

        # What the leader would snapshot next, to land after it lost the partition (below).
        deposed = (first.node.streams.get(topic_id, 0).leader_epoch, first.node_id,
                   first.node.membership.node_epoch,
                   first.node.tablets.tablets[(topic_id, 0)].tablet)
        await first.kill()
        second = cluster.node(2 if leaders[0] == 1 else 1)

        async def moved() -> bool:
            return second.node.streams.get(topic_id, 0) is not None

        await wait_until(moved, "the partition led by the surviving node")
        # Produce and Fetch are served at once: a consumer reads every record.
        end = len(items) + len(more)
        got = await trio.to_thread.run_sync(read_all, cluster.bootstrap, "table", end)
        assert len(got) == end

        async def restored() -> bool:
            entry = second.node.tablets.tablets.get((topic_id, 0))
            return entry is not None and entry.caught_up.is_set()

        await wait_until(restored, "the new leader's tablet restored and replayed")
        entry = second.node.tablets.tablets[(topic_id, 0)]
        assert entry.restored_from is not None and entry.restored_from >= len(items)
        await check_lookups(second, reference)

        # A snapshot of the deposed leader landing now is refused by the leader-epoch fence
        # and its upload queued; the snapshots replaced meanwhile were queued too: the store
        # ends with the referenced one alone, the refused one collected.
        status = await second.call(snapshots.write_snapshot, second.node.metadata,
                                   second.node.objects, topic_id, 0, *deposed)
        assert status == "not_leader"
        await wait_until(lambda: only_the_current_snapshot_stored(second, topic_id),
                         "the refused and replaced snapshots collected")


def http_get(admin: tuple[str, int], topic: str, partition: int, key: bytes):
    from mink.cli.get import lookup

    return lookup(f"{admin[0]}:{admin[1]}", topic, partition, key, timeout=30)


async def mink_get(admin: tuple[str, int], topic: str, key: str) -> tuple[int, bytes, str]:
    import sys

    result = await trio.run_process(
        [sys.executable, "-m", "mink.cli.main", "get", topic, key, "--admin", f"{admin[0]}:{admin[1]}"],
        check=False, capture_stdout=True, capture_stderr=True)
    return result.returncode, result.stdout, result.stderr.decode()


async def test_http_lookup_and_mink_get():
    from mink.testing import open_cluster

    rng = random.Random(8)
    async with open_cluster(2, proxy=False, admin_listener="127.0.0.1:0", **FAST) as cluster:
        await cluster.create_topic("table", 1, {"cleanup.policy": "compact"})
        await cluster.create_topic("plain", 1)
        leaders = await cluster.wait_led("table")
        leader = cluster.node(leaders[0])
        other = cluster.node(2 if leaders[0] == 1 else 1)
        items = writes(rng, 2, "h")
        await trio.to_thread.run_sync(_produce, cluster.bootstrap, "table", items)
        reference = dict(items)

        admin = leader.node.admin_address
        checked = [k for k, v in reference.items() if v is None] + \
            rng.sample([k for k, v in reference.items() if v is not None], 300)
        for key in checked:  # the first waits out the 503s of a loading tablet
            want = reference[key]
            status, body = await trio.to_thread.run_sync(http_get, admin, "table", 0, key)
            if want is None:
                assert (status, body["status"]) == (404, "not_found"), (key, body)
            else:
                assert status == 200 and body["value"] == want.decode(), (key, body)
        assert (await trio.to_thread.run_sync(http_get, admin, "table", 0, b"nope"))[0] == 404
        assert (await trio.to_thread.run_sync(http_get, admin, "plain", 0, b"k"))[1][
            "status"] == "unknown_topic"
        # Through the node that does not lead the partition: forwarded to the leader.
        for key in checked[:50]:
            status, body = await trio.to_thread.run_sync(http_get, other.node.admin_address,
                                                         "table", 0, key)
            want = reference[key]
            assert status == (404 if want is None else 200), (key, body)
            assert want is None or body["value"] == want.decode()

        live = next(k for k, v in reference.items() if v is not None)
        code, out, err = await mink_get(admin, "table", live.decode())
        assert (code, out) == (0, reference[live] + b"\n"), err
        deleted = next((k for k, v in reference.items() if v is None), b"never")
        assert (await mink_get(admin, "table", deleted.decode()))[0] == 1
        code, out, err = await mink_get(other.node.admin_address, "table", live.decode())
        assert (code, out) == (0, reference[live] + b"\n"), err


def partition_leader(address: str, topic: str) -> int:
    from tests.test_admin_apis import confluent_admin

    admin = confluent_admin(address)
    return admin.list_topics(topic, timeout=30).topics[topic].partitions[0].leader


def fetch_at(address: str, topic: str, offset: int) -> list:
    """Poll from `offset` until its record comes; the errors seen meanwhile (the killed
    leader's connection refused), for the report."""
    from confluent_kafka import TopicPartition

    from tests.test_compaction import TIMEOUT, _consumer

    consumer = _consumer(address)
    consumer.assign([TopicPartition(topic, 0, offset)])
    errors: list = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                errors.append(msg.error())
                continue
            assert msg.offset() == offset, (msg.offset(), offset)
            return errors
    finally:
        consumer.close()
    raise AssertionError(f"offset {offset} not fetched in {TIMEOUT} s; errors {errors[:3]}")


# The failover bound of the SIGKILL test below: the killed node's membership expires within
# lease_ttl, the coordinator reassigns its partitions at its next tick; then the survivor
# opens the partition (its view refresh, the partition's state from PostgreSQL) and the
# clients find it (librdkafka's metadata refresh, backing off up to retry.backoff.max.ms,
# 1 s). Those steps take about 1-2 s on an idle machine; the margin is 10 s, as
# tests/test_cluster.py's SIGKILL failover, for a loaded CI machine (2 cores, the suite two
# at a time) where they take several times longer: both figures are printed.
LEASE_TTL, TICK, FAILOVER_MARGIN = 3.0, 0.5, 10.0


async def test_sigkill_of_the_leader_subprocess(pg_url, store_url, node_processes, metadata):
    """`mink serve` subprocesses: the leader of a compacted partition is SIGKILLed; the
    other node serves Produce (new records acknowledged) and Fetch (the last record
    acknowledged before the kill read), each timed from the kill, within the failover time
    (lease_ttl + coordinator_tick + a margin), and its lookups, from the restored and
    replayed tablet, match what was acknowledged, before and after the kill."""
    from mink.storage.embedded_postgres import free_port
    from tests.support.nodes import node_config
    from tests.test_lifecycle import create_topic

    settings = dict(FAST, lease_ttl=LEASE_TTL, coordinator_tick=TICK)
    nodes = {}
    for node_id in (1, 2):
        config = node_config(pg_url, store_url, node_id=node_id,
                             listener=f"127.0.0.1:{free_port()}",
                             admin_listener=f"127.0.0.1:{free_port()}", **settings)
        nodes[node_id] = node_processes(config)
        await trio.to_thread.run_sync(nodes[node_id].start)
    bootstrap = ",".join(n.address for n in nodes.values())
    await trio.to_thread.run_sync(lambda: create_topic(nodes[1].address, "table", 1,
                                                       cleanup_policy="compact"))
    rng = random.Random(9)
    items = writes(rng, 3, "s")
    await trio.to_thread.run_sync(_produce, bootstrap, "table", items)
    reference = dict(items)
    leader = await trio.to_thread.run_sync(partition_leader, bootstrap, "table")
    survivor = nodes[2 if leader == 1 else 1]

    def admin_of(n):
        host, port = n.config.admin_listener.rsplit(":", 1)
        return host, int(port)

    async def snapshotted() -> bool:
        row = await metadata.fetch_one(READ, "SELECT log_offset FROM kv_snapshots")
        return row is not None and row[0] >= len(items)

    await wait_until(snapshotted, "a snapshot of the leader's tablet")
    more = writes(rng, 1, "t")
    offsets = await trio.to_thread.run_sync(_produce, bootstrap, "table", more)
    reference.update(more)
    last_acknowledged = max(offsets)

    await trio.to_thread.run_sync(nodes[leader].kill)
    killed_at = time.monotonic()
    after = [(b"k%05d" % k, b"after-%05d" % k) for k in range(0, KEYS, 7)]
    served: dict[str, float] = {}
    fetch_errors: list = []

    async def produce() -> None:
        await trio.to_thread.run_sync(_produce, survivor.address, "table", after)
        served["Produce"] = time.monotonic() - killed_at

    async def fetch() -> None:
        fetch_errors.extend(await trio.to_thread.run_sync(fetch_at, survivor.address, "table",
                                                          last_acknowledged))
        served["Fetch"] = time.monotonic() - killed_at

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        nursery.start_soon(fetch)
    bound = LEASE_TTL + TICK + FAILOVER_MARGIN
    print(f"after the SIGKILL the new leader served Produce in {served['Produce']:.2f} s, "
          f"Fetch in {served['Fetch']:.2f} s (lease_ttl {LEASE_TTL} s + tick {TICK} s; bound "
          f"{bound} s); the consumer's errors meanwhile: {[str(e) for e in fetch_errors[:3]]}")
    for request, seconds in served.items():
        assert seconds < bound, f"{request} served again only after {seconds:.1f} s"
    reference.update(after)

    checked = list(reference)[:: 5] + [k for k, v in reference.items() if v is None]
    for key in checked:
        status, body = await trio.to_thread.run_sync(http_get, admin_of(survivor), "table", 0,
                                                     key)
        want = reference[key]
        if want is None:
            assert status == 404, (key, body)
        else:
            assert status == 200 and body["value"] == want.decode(), (key, body)
    # The survivor's tablet came from the snapshot, then the log (its "caught up" line).
    import re

    text = survivor.log_path.read_text(errors="replace")
    restored = [int(m) for m in re.findall(r"tablet of \S+ caught up at \d+ .*snapshot at (\d+)",
                                           text)]
    assert restored and restored[-1] >= len(items), text[-2000:]


async def test_a_deleted_compacted_topic_leaves_no_snapshot_or_checkpoint_behind():
    """sql/0022: deleting a compacted topic queues its tablet snapshots for deletion and
    drops their rows and the cleaner's checkpoints, so nothing of it stays in PostgreSQL or
    the object store."""
    from confluent_kafka.admin import AdminClient

    from mink.testing import open_node

    async with open_node(proxy=False, **FAST) as node:
        await node.create_topic("table", 2, {"cleanup.policy": "compact"})
        await node.wait_led("table")
        topic_id = node.node.view.topics["table"].topic_id
        items = writes(random.Random(9), 2, "d")
        await trio.to_thread.run_sync(_produce, node.bootstrap, "table", items)
        metadata = node.node.metadata

        async def rows(table: str) -> list:
            return await node.call(metadata.fetch_all, READ,
                                   f"SELECT * FROM {table} WHERE topic_id = %s", (topic_id,))

        async def snapshotted() -> bool:
            return bool(await rows("kv_snapshots"))

        await wait_until(snapshotted, "a snapshot of the compacted partition")
        keys = [r[4] for r in await rows("kv_snapshots")]
        await node.call(metadata.fetch_all, IDEMPOTENT, """
            INSERT INTO compaction_state (topic_id, partition, cleaned_to)
            VALUES (%s, 0, 1) ON CONFLICT DO NOTHING RETURNING 1""", (topic_id,))

        def delete() -> None:
            admin = AdminClient({"bootstrap.servers": node.bootstrap})
            admin.delete_topics(["table"])["table"].result(30)

        await trio.to_thread.run_sync(delete)
        assert await rows("kv_snapshots") == [] and await rows("compaction_state") == []
        queued = await node.call(metadata.fetch_all, READ, """
            SELECT key FROM objects_to_delete WHERE key = ANY(%s)
            UNION SELECT key FROM unreferenced_objects WHERE key = ANY(%s)""", (keys, keys))
        gone = [k for k in keys if k not in {r[0] for r in queued}]
        stored = set(await node.call(node.node.objects.list, KV_PREFIX))
        for key in gone:  # not queued: already collected from the store
            assert key not in stored, key


async def test_a_lookup_on_the_leader_before_its_tablet_starts_is_loading_not_a_redirect():
    """Right after a takeover the view names this node the leader before its tablet keeper
    has started the tablet (it looks every 0.5 s): the lookup is retriable (503, `mink get`
    retries), not a 421 naming this very node (which sent the SIGKILL test's lookups, and
    any client, away with nowhere to go)."""
    from mink.testing import open_node

    async with open_node(proxy=False, **FAST) as node:
        await node.create_topic("table", 1, {"cleanup.policy": "compact"})
        await node.wait_led("table")
        keeper = node.node.tablets
        topic_id = node.node.view.topics["table"].topic_id

        async def started() -> bool:
            return (topic_id, 0) in keeper.tablets

        await wait_until(started, "the tablet started")
        entry = keeper.tablets.pop((topic_id, 0))  # as before the keeper's next look
        try:
            found = await node.call(keeper.lookup, "table", 0, b"k")
        finally:
            keeper.tablets.setdefault((topic_id, 0), entry)
        assert found.status == "loading", found


async def test_a_newly_led_compacted_partition_gets_its_tablet_at_its_open(monkeypatch):
    """The partition sync tells the keeper when it opened partitions: the tablet starts at
    once, not at the keeper's next look (made 2 minutes here, so only the hook can start it
    within the test's 10 s)."""
    from mink.broker.cluster import tablets
    from mink.testing import open_node

    monkeypatch.setattr(tablets, "TABLET_CHECK_INTERVAL_S", 120.0)
    async with open_node(proxy=False, **FAST) as node:
        await node.create_topic("table", 1, {"cleanup.policy": "compact"})
        await node.wait_led("table")
        keeper = node.node.tablets
        topic_id = node.node.view.topics["table"].topic_id

        async def started() -> bool:
            return (topic_id, 0) in keeper.tablets

        await wait_until(started, "the tablet started at the open", timeout=10)


async def test_snapshots_on_time_alone_and_the_replaced_ones_collected():
    """`kv_snapshot_interval_ms` on its own snapshots the tablet (the record count is out of
    reach here); each snapshot stored replaces the one before, which is queued for deletion
    (sql/0021, 'kv_snapshot_replaced') and collected, as is one older than the one stored
    ('kv_snapshot_older'): the store keeps the referenced one alone."""
    from mink.storage.compaction.tablet import KVTablet
    from mink.testing import open_node

    rng = random.Random(10)
    async with open_node(proxy=False, kv_snapshot_records=10**9, kv_snapshot_interval_ms=300,
                         log_cleaner_backoff_ms=-1, file_delete_delay_ms=200) as node:
        await node.create_topic("table", 1, {"cleanup.policy": "compact"})
        await node.wait_led("table")
        topic_id = node.node.view.topics["table"].topic_id
        metadata, objects = node.node.metadata, node.node.objects

        async def snapshot_row():
            return await node.call(metadata.fetch_one, READ, """
                SELECT log_offset, object_key FROM kv_snapshots
                 WHERE topic_id = %s AND partition = 0""", (topic_id,))

        async def covering(end: int) -> bool:
            row = await snapshot_row()
            return row is not None and row[0] >= end

        first = writes(rng, 1, "i")
        await trio.to_thread.run_sync(_produce, node.bootstrap, "table", first)
        await wait_until(lambda: covering(len(first)), "a snapshot on time", timeout=30)
        replaced = (await snapshot_row())[1]
        second = writes(rng, 1, "j")
        await trio.to_thread.run_sync(_produce, node.bootstrap, "table", second)
        end = len(first) + len(second)
        await wait_until(lambda: covering(end), "the next snapshot on time", timeout=30)
        current = (await snapshot_row())[1]
        assert current != replaced
        entry = node.node.tablets.tablets[(topic_id, 0)]
        assert entry.snapshots >= 2
        # One older than the one stored, from the leader itself (a slow upload): refused
        # ('older') and its upload queued too.
        partition_log = node.node.streams.get(topic_id, 0)
        status = await node.call(snapshots.write_snapshot, metadata, objects, topic_id, 0,
                                 partition_log.leader_epoch, node.node_id,
                                 node.node.membership.node_epoch, KVTablet(next_offset=1))
        assert status == "older"

        await wait_until(lambda: only_the_current_snapshot_stored(node, topic_id),
                         "the replaced and the older snapshots collected")


async def only_the_current_snapshot_stored(node, topic_id) -> bool:
    """The partition's snapshots in the store are the one kv_snapshots references, and none
    is still queued for deletion (so each other one was queued and collected)."""
    metadata = node.node.metadata
    stored = set(await node.call(node.node.objects.list, f"{KV_PREFIX}{topic_id}/"))
    row = await node.call(metadata.fetch_one, READ, """
        SELECT object_key FROM kv_snapshots WHERE topic_id = %s AND partition = 0""",
                          (topic_id,))
    queued = await node.call(metadata.fetch_all, READ,
                             "SELECT key FROM objects_to_delete WHERE key LIKE %s",
                             (f"{KV_PREFIX}{topic_id}/%",))
    return row is not None and stored == {row[0]} and not queued
