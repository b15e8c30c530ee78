"""The metadata store against a real PostgreSQL (a fresh database per test)."""

from __future__ import annotations

import statistics
import time
import uuid

import psycopg
import pytest
import trio

from mink.storage import controlplane as md
from mink.storage.controlplane import migrate as migrate_mod
from mink.storage.controlplane.postgres import READ
from tests.support.metadata import ToolMetadataStore
from mink.storage.controlplane import (
    CommitOutcome,
    InvalidPartitions,
    LeaderMoved,
    MetadataStore,
    MetadataUnavailable,
    NodeAlive,
    OutcomeUnknown,
    ProducerStateUpdate,
    RangeOutcome,
    StaleEpoch,
    TopicExists,
    UnknownTopic,
    WalObject,
    WalRange,
)


@pytest.fixture
async def store(pg_url, aio_loop):
    s = await ToolMetadataStore.open(pg_url, min_size=1, max_size=8, timeout=2.0, op_timeout=10.0)
    try:
        yield s
    finally:
        await s.aclose()


async def wait_until(predicate, timeout=10.0, interval=0.05):
    """Wait on a condition (an async predicate), no blind sleeps."""
    with trio.fail_after(timeout):
        while True:
            if await predicate():
                return
            await trio.sleep(interval)


def rng(topic_id, partition, base, count=10, *, leader_epoch=1, ts=1000, states=()):
    """A partition range of `count` records starting at `base`, bytes made up."""
    return WalRange(topic_id=topic_id, partition=partition, leader_epoch=leader_epoch,
                    base_offset=base, last_offset=base + count - 1, byte_start=base * 100,
                    byte_end=(base + count) * 100, max_timestamp=ts, batch_count=2,
                    producer_states=list(states))


_keys = iter(range(1_000_000))


def obj(*ranges, key=None):
    return WalObject(key=key or f"wal/1/1/{next(_keys)}", size=4096, ranges=list(ranges))


async def topic_led_by(store, node, epoch, partitions=1, name=None, *, open_streams=True):
    """A topic whose partitions node leads at leader epoch 1, streams opened by node."""
    t = await store.create_topic(name or f"t-{uuid.uuid4().hex[:8]}", partitions, {},
                                 [node] * partitions)
    for p in range(partitions):
        assert await store.lead_partition(t.topic_id, p, node) == 1
        if open_streams:
            await store.open_stream(t.topic_id, p, 1, node, epoch)
    return t


def accepted(outcome: CommitOutcome) -> list[bool]:
    return [r.accepted for r in outcome.ranges]


# ---------------------------------------------------------------------------------------------
# Migrations

def _versions(url):
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT version, name FROM schema_migrations ORDER BY 1").fetchall()


async def test_migrations_recorded_and_idempotent(pg_server, pg_url, aio_loop):
    expected = [(m.version, m.name) for m in migrate_mod.list_migrations()]
    assert [v for v, _ in expected][:2] == [1, 2]
    assert _versions(pg_url) == expected
    assert migrate_mod.migrate_sync(pg_url) == []        # nothing left to apply
    s = await ToolMetadataStore.open(pg_url)                  # async path, migrations on open
    await s.aclose()
    assert _versions(pg_url) == expected

    # concurrent starters on an empty database: applied once, both succeed
    name = f"blank_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = pg_server.url_for(name)
    try:
        results = []

        async def starter():
            results.append(await trio.to_thread.run_sync(migrate_mod.migrate_sync, url))

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(starter)
        assert sorted(results, key=len) == [[], [], [v for v, _ in expected]]
        assert _versions(url) == expected
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# ---------------------------------------------------------------------------------------------
# Membership and leases

async def test_register_heartbeat_leave(store):
    assert await store.register_node(1, "h1", 9092, "r1", ttl_s=30) == 1
    assert await store.register_node(1, "h1", 9092, "r1", ttl_s=30) == 2  # restart: epoch + 1
    assert await store.register_node(2, "h2", 9093, ttl_s=30) == 1
    with pytest.raises(StaleEpoch):
        await store.heartbeat(1, 1, ttl_s=30)
    await store.heartbeat(1, 2, ttl_s=30)
    nodes = await store.live_nodes()
    assert [(n.node_id, n.epoch, n.host, n.port, n.rack) for n in nodes] == [
        (1, 2, "h1", 9092, "r1"), (2, 1, "h2", 9093, None)]

    await store.leave(1, 2)
    assert [n.node_id for n in await store.live_nodes()] == [2]
    with pytest.raises(StaleEpoch):             # a left node cannot come back by heartbeat
        await store.heartbeat(1, 2, ttl_s=30)
    assert {n.node_id: n.live for n in await store.nodes()} == {1: False, 2: True}
    assert await store.register_node(1, "h1", 9092, ttl_s=30) == 3  # epoch history kept
    changes, version = await store.changes_since(0)
    assert [c.kind for c in changes] == ["node_registered"] * 3 + ["node_left", "node_registered"]
    assert version == 5


async def test_liveness_by_postgres_clock_and_fencing(store):
    epoch = await store.register_node(1, "h1", 9092, ttl_s=0.3)

    async def live():
        return 1 in [n.node_id for n in await store.live_nodes()]

    assert await live()
    with pytest.raises(NodeAlive):
        await store.fence_node(1, epoch)
    await wait_until(lambda: _not(live))
    await store.heartbeat(1, epoch, ttl_s=0.3)  # expired but not fenced: live again
    assert await live()
    await wait_until(lambda: _not(live))

    assert await store.fence_node(1, epoch) == epoch + 1      # takeover
    assert await store.fence_node(1, epoch) == epoch + 1      # again: already fenced
    with pytest.raises(StaleEpoch):
        await store.heartbeat(1, epoch, ttl_s=30)
    assert not await live()
    assert await store.register_node(1, "h1", 9092, ttl_s=30) == epoch + 2


async def _not(predicate):
    return not await predicate()


async def test_leases(store):
    e1 = await store.register_node(1, "h1", 1, ttl_s=30)
    e2 = await store.register_node(2, "h2", 2, ttl_s=30)
    assert await store.acquire_lease("coordinator", 1, e1, ttl_s=0.3) == 1
    assert await store.acquire_lease("coordinator", 1, e1, ttl_s=0.3) == 1  # same tenure
    assert await store.acquire_lease("coordinator", 2, e2, ttl_s=30) is None
    await store.renew_lease("coordinator", 1, 1, ttl_s=0.3)
    with pytest.raises(StaleEpoch):
        await store.acquire_lease("coordinator", 1, e1 + 7, ttl_s=1)

    async def taken_by_2():
        return await store.acquire_lease("coordinator", 2, e2, ttl_s=30) is not None

    await wait_until(taken_by_2)
    [lease] = await store.leases("coord")
    assert (lease.holder, lease.holder_epoch, lease.epoch, lease.live) == (2, e2, 2, True)
    with pytest.raises(StaleEpoch):
        await store.renew_lease("coordinator", 1, 1, ttl_s=30)
    assert await store.release_lease("coordinator", 2, 2)
    assert not (await store.leases())[0].live
    assert await store.acquire_lease("coordinator", 1, e1, ttl_s=30) == 3

    # a new incarnation of node 1 voids the old one's leases; leaving releases them
    e1b = await store.register_node(1, "h1", 1, ttl_s=30)
    assert not (await store.leases())[0].live
    assert await store.acquire_lease("coordinator", 1, e1b, ttl_s=30) == 4
    await store.leave(1, e1b)
    assert await store.acquire_lease("coordinator", 2, e2, ttl_s=30) == 5
    assert (await store.view()).coordinator == 2


# ---------------------------------------------------------------------------------------------
# Topics and the view

async def test_topics_and_view(store):
    await store.register_node(1, "h1", 9092, ttl_s=30)
    t = await store.create_topic("orders", 3, {"retention.ms": "1000"}, [1, 2, None])
    assert (t.name, t.partitions, t.config) == ("orders", 3, {"retention.ms": "1000"})
    with pytest.raises(TopicExists):
        await store.create_topic("orders", 1, {}, [1])
    with pytest.raises(InvalidPartitions):
        await store.create_topic("bad", 2, {}, [1])
    with pytest.raises(InvalidPartitions):
        await store.create_topic("bad", 0, {}, [])
    assert await store.get_topic("orders") == t
    assert await store.get_topic("nope") is None

    grown = await store.create_partitions("orders", 5, [1, 1])
    assert grown.partitions == 5
    with pytest.raises(InvalidPartitions):
        await store.create_partitions("orders", 5, [])
    with pytest.raises(InvalidPartitions):
        await store.create_partitions("orders", 7, [1])
    with pytest.raises(UnknownTopic):
        await store.create_partitions("nope", 7, [1])

    view = await store.view()
    assert view.version == 3 and len(view.cluster_id) == 22 and view.coordinator is None
    assert [n.node_id for n in view.nodes] == [1]
    [tv] = view.topics
    assert tv.topic_id == t.topic_id and tv.config == {"retention.ms": "1000"}
    parts = [(p.partition, p.leader_node, p.leader_epoch, p.stream_state) for p in tv.partitions]
    assert parts == [
        (0, 1, 0, "closed"), (1, 2, 0, "closed"), (2, None, 0, "closed"),
        (3, 1, 0, "closed"), (4, 1, 0, "closed")]

    assert await store.delete_topic("orders") == t.topic_id
    with pytest.raises(UnknownTopic):
        await store.delete_topic("orders")
    assert await store.get_topics() == []
    t2 = await store.create_topic("orders", 1, {}, [1])       # the name is free again
    assert t2.topic_id != t.topic_id
    changes, version = await store.changes_since(1)
    assert [c.kind for c in changes] == ["topic_created", "partitions_created",
                                         "topic_deleted", "topic_created"]
    assert [c.version for c in changes] == [2, 3, 4, 5] and version == 5
    assert changes[0].body == {"topic_id": str(t.topic_id), "name": "orders", "partitions": 3}


async def test_view_since_returns_what_changed_or_everything(store):
    """A node holding the view at a version reads only the topics the change log names after
    it (deleted ones named, not returned); everything when it holds nothing or the log was
    pruned past its version."""
    from mink.storage.lifecycle import store as lifecycle

    await store.register_node(1, "h1", 9092, ttl_s=30)
    a = await store.create_topic("a", 2, {"retention.ms": "1000"}, [1, 1])
    b = await store.create_topic("b", 1, {}, [1])
    whole = await store.view_since(-1)
    assert not whole.complete and [t.name for t in whole.topics] == ["a", "b"]
    assert whole.version == (await store.view()).version == 3  # the node, a, b
    assert [n.node_id for n in whole.nodes] == [1]
    same = await store.view_since(3)
    assert same.complete and same.changed == [] and same.topics == [] and same.version == 3
    await store.lead_partition(a.topic_id, 1, 1)
    await store.delete_topic("b")
    c = await store.create_topic("c", 1, {}, [1])
    delta = await store.view_since(3)
    assert delta.complete and delta.version == 6
    assert sorted(delta.changed) == sorted([a.topic_id, b.topic_id, c.topic_id])
    assert [t.name for t in delta.topics] == ["a", "c"]
    assert delta.topics[0].config == {"retention.ms": "1000"}
    assert [(p.partition, p.leader_epoch) for p in delta.topics[0].partitions] == [(0, 0), (1, 1)]
    assert (await store.view_since(5)).changed == [c.topic_id]
    await lifecycle.prune_metadata(store, keep_s=0, change_log_keep=2,
                                   producer_expiration_ms=86_400_000, limit=1000)
    pruned = await store.view_since(2)  # rows 1-3 are gone: a holder of 2 misses 3
    assert not pruned.complete and [t.name for t in pruned.topics] == ["a", "c"]
    assert (await store.view_since(3)).complete


async def test_open_streams_in_one_round_trip_each_refused_alone(store):
    e1 = await store.register_node(1, "h1", 1, ttl_s=30)
    await store.register_node(2, "h2", 2, ttl_s=30)
    t = await store.create_topic("t", 4, {}, [1, 1, 2, 1])
    opened = await store.open_streams_with_producers(
        [(t.topic_id, 3, 0), (t.topic_id, 0, 0), (t.topic_id, 2, 0), (t.topic_id, 1, 5),
         (t.topic_id, 9, 0)], 1, e1)
    assert set(opened) == {(t.topic_id, p) for p in (0, 1, 2, 3, 9)}
    for p in (0, 3):
        state, producers = opened[(t.topic_id, p)]
        assert (state.stream_state, state.opened_by_node, state.open_leader_epoch) == (
            "open", 1, 0) and producers == []
    assert isinstance(opened[(t.topic_id, 2)], LeaderMoved)
    assert opened[(t.topic_id, 2)].leader_node == 2
    assert opened[(t.topic_id, 1)].reason == "unknown_leader_epoch"
    assert isinstance(opened[(t.topic_id, 9)], UnknownTopic)
    states = await store.stream_states([(t.topic_id, p) for p in range(5)])
    assert {p for _, p in states} == {0, 1, 2, 3}
    assert [states[(t.topic_id, p)].stream_state for p in range(4)] == [
        "open", "closed", "closed", "open"]
    refused = await store.open_streams_with_producers([(t.topic_id, 1, 0)], 1, e1 + 3)
    assert isinstance(refused[(t.topic_id, 1)], StaleEpoch)
    # a fresh leader epoch first where asked (a restarted node at its own epoch)
    fresh = await store.open_streams_with_producers([(t.topic_id, 0, 0), (t.topic_id, 1, 0)],
                                                    1, e1, fresh={(t.topic_id, 0)})
    assert fresh[(t.topic_id, 0)][0].open_leader_epoch == 1
    assert fresh[(t.topic_id, 1)][0].open_leader_epoch == 0
    stale = await store.open_streams_with_producers([(t.topic_id, 0, 0)], 1, e1,
                                                    fresh={(t.topic_id, 0)})
    assert stale[(t.topic_id, 0)].reason == "leader_epoch_changed"
    opened[(t.topic_id, 0)] = fresh[(t.topic_id, 0)]
    # closed in one statement: only what this incarnation opened at that leader epoch
    assert await store.close_streams([(t.topic_id, 0, 1), (t.topic_id, 3, 1),
                                      (t.topic_id, 2, 0)], 1, e1) == 1
    states = await store.stream_states([(t.topic_id, 0), (t.topic_id, 3)])
    assert [states[(t.topic_id, p)].stream_state for p in (0, 3)] == ["closed", "open"]
    assert await store.close_streams([(t.topic_id, 3, 0)], 1, e1 + 1) == 0


# ---------------------------------------------------------------------------------------------
# Leaders and streams

async def test_lead_partition_coordinator_epoch(store):
    e1 = await store.register_node(1, "h1", 1, ttl_s=30)
    e2 = await store.register_node(2, "h2", 2, ttl_s=30)
    t = await store.create_topic("t", 1, {}, [1])
    c1 = await store.acquire_lease("coordinator", 1, e1, ttl_s=0.3)
    assert await store.lead_partition(t.topic_id, 0, 2, c1) == 1

    async def coordinator_moved():
        return await store.acquire_lease("coordinator", 2, e2, ttl_s=30) is not None

    await wait_until(coordinator_moved)
    c2 = (await store.leases("coordinator"))[0].epoch
    assert c2 == c1 + 1
    version = (await store.view()).version
    with pytest.raises(StaleEpoch) as refused:
        await store.lead_partition(t.topic_id, 0, 1, c1)
    assert refused.value.reason == "stale_coordinator_epoch"
    with pytest.raises(StaleEpoch):
        await store.create_topic("u", 1, {}, [1], coordinator_epoch=c1)
    assert (await store.view()).version == version   # refusals use up no version
    assert await store.lead_partition(t.topic_id, 0, 1, c2) == 2
    with pytest.raises(StaleEpoch) as refused:
        await store.lead_partition(t.topic_id, 0, 2, c2, expected_leader_epoch=1)
    assert refused.value.reason == "leader_epoch_changed"
    assert await store.lead_partitions([(t.topic_id, 0, 2, 2)], c2) == [3]
    with pytest.raises(UnknownTopic):
        await store.lead_partition(t.topic_id, 7, 1)
    [p] = (await store.view()).topics[0].partitions
    assert (p.leader_node, p.leader_epoch) == (2, 3)


async def test_lead_partitions_is_one_transaction_and_one_change(store):
    """A batch of moves: all or none (an expected epoch that moved refuses the batch, as an
    unknown partition does), one change-log row naming the topics, which view_since reads."""
    await store.register_node(1, "h1", 1, ttl_s=30)
    await store.register_node(2, "h2", 2, ttl_s=30)
    a = await store.create_topic("a", 3, {}, [1, 1, 1])
    b = await store.create_topic("b", 1, {}, [1])
    version = (await store.view()).version
    with pytest.raises(StaleEpoch) as refused:
        await store.lead_partitions([(a.topic_id, 0, 2, 0), (a.topic_id, 1, 2, 7)])
    assert refused.value.reason == "leader_epoch_changed"
    with pytest.raises(UnknownTopic):
        await store.lead_partitions([(a.topic_id, 0, 2, 0), (a.topic_id, 5, 2, None)])
    assert (await store.view()).version == version, "nothing moved, nothing logged"
    moves = [(b.topic_id, 0, 2, 0), (a.topic_id, 2, 2, 0), (a.topic_id, 0, 2, None)]
    assert await store.lead_partitions(moves) == [1, 1, 1]
    changes, current = await store.changes_since(version)
    assert current == version + 1 and [c.kind for c in changes] == ["leaders_changed"]
    assert sorted(changes[0].body["topic_ids"]) == sorted([str(a.topic_id), str(b.topic_id)])
    delta = await store.view_since(version)
    assert sorted(delta.changed) == sorted([a.topic_id, b.topic_id])
    assert [[p.leader_node for p in t.partitions] for t in delta.topics] == [[2, 1, 2], [2]]


async def test_open_and_close_stream_fencing(store):
    e1 = await store.register_node(1, "h1", 1, ttl_s=30)
    e2 = await store.register_node(2, "h2", 2, ttl_s=30)
    t = await topic_led_by(store, 1, e1, open_streams=False)
    with pytest.raises(LeaderMoved) as refused:
        await store.open_stream(t.topic_id, 0, 1, 2, e2)
    assert (refused.value.reason, refused.value.leader_node, refused.value.leader_epoch) == (
        "not_leader", 1, 1)
    with pytest.raises(LeaderMoved) as refused:
        await store.open_stream(t.topic_id, 0, 0, 1, e1)
    assert refused.value.reason == "stale_leader_epoch"
    with pytest.raises(StaleEpoch):
        await store.open_stream(t.topic_id, 0, 1, 1, e1 + 5)
    with pytest.raises(UnknownTopic):
        await store.open_stream(t.topic_id, 9, 1, 1, e1)

    s = await store.open_stream(t.topic_id, 0, 1, 1, e1)
    assert (s.stream_state, s.opened_by_node, s.opened_by_epoch, s.open_leader_epoch,
            s.committed_end, s.log_start_offset) == ("open", 1, e1, 1, 0, 0)
    [o] = await store.commit_wal(1, e1, [obj(rng(t.topic_id, 0, 0))])
    assert accepted(o) == [True]

    assert not await store.close_stream(t.topic_id, 0, 1, 2, e2)   # not the opener
    assert await store.close_stream(t.topic_id, 0, 1, 1, e1)
    s = await store.stream_state(t.topic_id, 0)
    assert (s.stream_state, s.opened_by_node, s.open_leader_epoch, s.committed_end) == (
        "closed", 1, 1, 10)
    [o] = await store.commit_wal(1, e1, [obj(rng(t.topic_id, 0, 10))])
    assert o.ranges[0].reason == "not_open_by_node" and not o.committed

    # a restarted node re-opens at the same leader epoch; its old incarnation is fenced
    e1b = await store.register_node(1, "h1", 1, ttl_s=30)
    await store.open_stream(t.topic_id, 0, 1, 1, e1b)
    [o] = await store.commit_wal(1, e1, [obj(rng(t.topic_id, 0, 10))])
    assert o.ranges[0].reason == "stale_node_epoch"
    [o] = await store.commit_wal(1, e1b, [obj(rng(t.topic_id, 0, 10))])
    assert o.committed and o.ranges[0].committed_end == 20


# ---------------------------------------------------------------------------------------------
# CommitWal

async def test_commit_wal_moves_committed_end_and_indexes(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await topic_led_by(store, 1, e)
    o1 = obj(rng(t.topic_id, 0, 0, 5, ts=10))
    [out] = await store.commit_wal(1, e, [o1])
    assert out.committed and not out.repeated and out.reason is None
    assert [(r.accepted, r.reason, r.committed_end) for r in out.ranges] == [(True, None, 5)]
    [out] = await store.commit_wal(1, e, [obj(rng(t.topic_id, 0, 5, 3, ts=20))])
    assert out.ranges[0].committed_end == 8
    assert (await store.stream_state(t.topic_id, 0)).committed_end == 8
    rows = await store.find_batches(t.topic_id, 0, 0)
    assert [(r.base_offset, r.last_offset, r.object_key) for r in rows] == [
        (0, 4, o1.key), (5, 7, rows[1].object_key)]
    assert [r.base_offset for r in await store.find_batches(t.topic_id, 0, 6)] == [5]
    assert await store.find_batches(t.topic_id, 0, 8) == []
    stored = (await store.commit_outcome([o1.key]))[o1.key]
    assert stored == CommitOutcome(key=o1.key, committed=True, repeated=True,
                                   ranges=[RangeOutcome(True, None, 5)])


async def test_commit_wal_many_partitions_one_object(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await topic_led_by(store, 1, e, partitions=20)
    o = obj(*[rng(t.topic_id, p, 0, p + 1) for p in range(20)])
    [out] = await store.commit_wal(1, e, [o])
    assert all(accepted(out)) and [r.committed_end for r in out.ranges] == list(range(1, 21))
    for p in (0, 7, 19):
        [row] = await store.find_batches(t.topic_id, p, 0)   # one index row per range
        assert (row.base_offset, row.last_offset, row.object_key) == (0, p, o.key)


async def test_commit_wal_same_partition_across_objects_in_order(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await topic_led_by(store, 1, e, partitions=2)
    a, b = obj(rng(t.topic_id, 0, 0), rng(t.topic_id, 1, 0)), obj(rng(t.topic_id, 0, 10))
    outs = await store.commit_wal(1, e, [a, b])
    assert [accepted(o) for o in outs] == [[True, True], [True]]
    assert outs[1].ranges[0].committed_end == 20
    # the call order is the apply order: a later range listed first does not fit
    c, d = obj(rng(t.topic_id, 0, 30)), obj(rng(t.topic_id, 0, 20))
    outs = await store.commit_wal(1, e, [c, d])
    assert [(r.accepted, r.reason) for o in outs for r in o.ranges] == [
        (False, "offset_mismatch"), (True, None)]
    assert not outs[0].committed and outs[1].committed
    assert (await store.stream_state(t.topic_id, 0)).committed_end == 30


async def test_commit_wal_stale_node_epoch_refused_whole(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await topic_led_by(store, 1, e, partitions=2)
    await store.register_node(1, "h", 1, ttl_s=30)   # restarted: e is stale
    o = obj(rng(t.topic_id, 0, 0), rng(t.topic_id, 1, 0))
    [out] = await store.commit_wal(1, e, [o])
    assert not out.committed and out.reason == "stale_node_epoch"
    assert [(r.accepted, r.reason) for r in out.ranges] == [(False, "stale_node_epoch")] * 2
    # nothing written: no index, no ends, not decided, not queued
    assert (await store.stream_state(t.topic_id, 0)).committed_end == 0
    assert await store.find_batches(t.topic_id, 0, 0) == []
    assert await store.commit_outcome([o.key], settle=False) == {o.key: None}
    assert await store.pending_deletions() == []


async def test_commit_wal_moved_partition_fails_alone(store):
    e1 = await store.register_node(1, "h1", 1, ttl_s=30)
    await store.register_node(2, "h2", 2, ttl_s=30)
    t = await topic_led_by(store, 1, e1, partitions=3)
    await store.lead_partition(t.topic_id, 1, 2)           # partition 1 moves to node 2
    o = obj(rng(t.topic_id, 0, 0), rng(t.topic_id, 1, 0), rng(t.topic_id, 2, 0))
    [out] = await store.commit_wal(1, e1, [o])
    assert out.committed
    assert [(r.accepted, r.reason) for r in out.ranges] == [
        (True, None), (False, "stale_leader_epoch"), (True, None)]
    ends = [(await store.stream_state(t.topic_id, p)).committed_end for p in range(3)]
    assert ends == [10, 0, 10]


async def test_commit_wal_offset_gap_and_unknown_partition_fail_alone(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await topic_led_by(store, 1, e, partitions=2)
    o = obj(rng(t.topic_id, 0, 0), rng(t.topic_id, 1, 5), rng(t.topic_id, 9, 0),
            rng(uuid.uuid4(), 0, 0))
    [out] = await store.commit_wal(1, e, [o])
    assert [(r.accepted, r.reason, r.committed_end) for r in out.ranges] == [
        (True, None, 10), (False, "offset_mismatch", 0), (False, "unknown_partition", None),
        (False, "unknown_partition", None)]


async def test_commit_wal_repeat_returns_first_outcome(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await topic_led_by(store, 1, e, partitions=2)
    await store.lead_partition(t.topic_id, 1, 1)   # partition 1: a newer leader epoch
    o = obj(rng(t.topic_id, 0, 0), rng(t.topic_id, 1, 0))
    [first] = await store.commit_wal(1, e, [o])
    assert accepted(first) == [True, False]
    [again] = await store.commit_wal(1, e, [o])
    assert again.repeated and again.ranges == first.ranges and again.committed
    assert len(await store.find_batches(t.topic_id, 0, 0)) == 1
    assert (await store.stream_state(t.topic_id, 0)).committed_end == 10
    # even once the node is fenced, the first outcome comes back (the reply may have been lost)
    await store.register_node(1, "h", 1, ttl_s=30)
    fresh = obj(rng(t.topic_id, 0, 10))
    outs = await store.commit_wal(1, e, [o, fresh])
    assert outs[0].ranges == first.ranges and outs[0].repeated
    assert outs[1].reason == "stale_node_epoch" and not outs[1].repeated


async def test_commit_wal_all_refused_object_goes_to_deletion(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await topic_led_by(store, 1, e)
    o = obj(rng(t.topic_id, 0, 50))
    [out] = await store.commit_wal(1, e, [o])
    assert not out.committed and out.ranges[0].reason == "offset_mismatch"
    assert await store.pending_deletions() == [(o.key, "refused")]
    [again] = await store.commit_wal(1, e, [o])
    assert again.repeated and again.ranges == out.ranges
    assert (await store.commit_outcome([o.key]))[o.key].ranges == out.ranges
    assert await store.unreferenced_objects() == []


async def test_commit_outcome_settles_unknown_keys(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await topic_led_by(store, 1, e)
    lost, done = obj(rng(t.topic_id, 0, 0)), obj(rng(t.topic_id, 0, 0))
    [out] = await store.commit_wal(1, e, [done])
    result = await store.commit_outcome([lost.key, done.key])
    assert result[lost.key] is None and result[done.key].ranges == out.ranges
    # the late commit of the abandoned key is refused and writes nothing
    [late] = await store.commit_wal(1, e, [obj(rng(t.topic_id, 0, 10), key=lost.key)])
    assert late.repeated and not late.committed and late.reason == "abandoned"
    assert [(r.accepted, r.reason) for r in late.ranges] == [(False, "abandoned")]
    assert (await store.stream_state(t.topic_id, 0)).committed_end == 10
    assert (lost.key, "abandoned") in await store.pending_deletions()


async def test_commit_wal_producer_states(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await topic_led_by(store, 1, e, partitions=2)
    o1 = obj(rng(t.topic_id, 0, 0, states=[ProducerStateUpdate(7, 0, b"\x00first")]),
             rng(t.topic_id, 1, 0, states=[ProducerStateUpdate(7, 0, b"other")]))
    o2 = obj(rng(t.topic_id, 0, 10, states=[ProducerStateUpdate(7, 1, b"\xffsecond"),
                                            ProducerStateUpdate(8, 0, b"x" * 300)]))
    outs = await store.commit_wal(1, e, [o1, o2])
    assert all(o.committed for o in outs)
    states = await store.producer_states(t.topic_id, 0)
    assert [(s.producer_id, s.producer_epoch, s.state) for s in states] == [
        (7, 1, b"\xffsecond"), (8, 0, b"x" * 300)]
    assert [s.state for s in await store.producer_states(t.topic_id, 1)] == [b"other"]
    # refused ranges carry no state
    gap = rng(t.topic_id, 0, 99, states=[ProducerStateUpdate(9, 0, b"")])
    await store.commit_wal(1, e, [obj(gap)])
    assert [s.producer_id for s in await store.producer_states(t.topic_id, 0)] == [7, 8]
    # ranges without states (a producer without idempotence) beside one with a state: the
    # upsert is skipped only when no accepted range has any (sql/0031)
    [mixed] = await store.commit_wal(1, e, [obj(
        rng(t.topic_id, 0, 20, states=[ProducerStateUpdate(5, 2, b"late")]),
        rng(t.topic_id, 1, 10), rng(t.topic_id, 1, 20))])
    assert mixed.committed and all(r.accepted for r in mixed.ranges)
    assert [(s.producer_id, s.state) for s in await store.producer_states(t.topic_id, 0)] == [
        (5, b"late"), (7, b"\xffsecond"), (8, b"x" * 300)]
    [plain] = await store.commit_wal(1, e, [obj(rng(t.topic_id, 0, 30))])
    assert plain.committed
    assert [s.producer_id for s in await store.producer_states(t.topic_id, 0)] == [5, 7, 8]


async def test_two_writers_race_exactly_one_wins(store):
    """Node 1 commits at the committed end while the coordinator moves the partition to node 2,
    which opens and commits at that same offset: in every round exactly one commit wins."""
    e1 = await store.register_node(1, "h1", 1, ttl_s=30)
    e2 = await store.register_node(2, "h2", 2, ttl_s=30)
    t = await store.create_topic("race", 1, {}, [1])
    tid = t.topic_id
    end = 0
    for round_ in range(15):
        leader_epoch = await store.lead_partition(tid, 0, 1)
        end = (await store.open_stream(tid, 0, leader_epoch, 1, e1)).committed_end
        results = {}

        async def writer_1():
            o1 = obj(rng(tid, 0, end, 3, leader_epoch=leader_epoch))
            [o] = await store.commit_wal(1, e1, [o1])
            results[1] = o.ranges[0]

        async def writer_2():
            epoch = await store.lead_partition(tid, 0, 2)
            await store.open_stream(tid, 0, epoch, 2, e2)
            [o] = await store.commit_wal(2, e2, [obj(rng(tid, 0, end, 3, leader_epoch=epoch))])
            results[2] = o.ranges[0]

        async with trio.open_nursery() as nursery:
            if round_ % 2:
                nursery.start_soon(writer_1)
                nursery.start_soon(writer_2)
            else:
                nursery.start_soon(writer_2)
                nursery.start_soon(writer_1)
        assert sorted(r.accepted for r in results.values()) == [False, True], results
        loser = results[1] if results[2].accepted else results[2]
        assert loser.reason in ("stale_leader_epoch", "offset_mismatch")
    rows = await store.find_batches(tid, 0, 0, max_rows=1000)
    assert [(r.base_offset, r.last_offset) for r in rows] == [(3 * i, 3 * i + 2) for i in range(15)]
    assert (await store.stream_state(tid, 0)).committed_end == 45


# ---------------------------------------------------------------------------------------------
# Change log

async def test_change_log_has_no_gaps_under_concurrent_writers(store):
    await store.register_node(1, "h", 1, ttl_s=30)
    t = await store.create_topic("busy", 4, {}, [1] * 4)
    _, start = await store.changes_since(0)
    writers, per_writer = 6, 15
    seen: list[int] = []
    done = trio.Event()

    async def writer(w):
        for i in range(per_writer):
            if i % 3 == 0:
                await store.create_topic(f"w{w}-{i}", 1, {}, [1])
            else:
                await store.lead_partition(t.topic_id, (w + i) % 4, 1)

    async def reader():
        last = start
        while True:
            finished = done.is_set()
            changes, current = await store.changes_since(last, limit=7)
            for c in changes:
                assert c.version == last + 1, (c.version, last)  # strictly increasing, no gaps
                last = c.version
                seen.append(c.version)
            assert current >= last
            if finished and last == current:
                return
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        async with trio.open_nursery() as writing:
            for w in range(writers):
                writing.start_soon(writer, w)
        done.set()
    assert seen == list(range(start + 1, start + 1 + writers * per_writer))


async def test_listen_wakes_up_on_a_change(store):
    async with store.listen() as wakeups:
        assert wakeups.connected
        t = await store.create_topic("woken", 1, {}, [None])
        with trio.fail_after(5):
            hint = await wakeups.wait()
        changes, current = await store.changes_since(0)
        assert hint == current and changes[-1].body["topic_id"] == str(t.topic_id)
        await store.lead_partition(t.topic_id, 0, 3)
        with trio.fail_after(5):
            async for hint in wakeups:
                if hint == current + 1:
                    break


# ---------------------------------------------------------------------------------------------
# Reads

async def test_leader_epoch_end(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await store.create_topic("epochs", 2, {}, [1, 1])
    tid = t.topic_id
    assert await store.leader_epoch_end(tid, 0, 0) == (-1, -1)        # never opened

    async def lead_open_commit(p, count):
        epoch = await store.lead_partition(tid, p, 1)
        s = await store.open_stream(tid, p, epoch, 1, e)
        if count:
            r = rng(tid, p, s.committed_end, count, leader_epoch=epoch)
            await store.commit_wal(1, e, [obj(r)])
        return epoch

    assert await lead_open_commit(0, 10) == 1     # epoch 1: 0..9
    assert await lead_open_commit(0, 10) == 2     # epoch 2: 10..19
    assert await lead_open_commit(0, 0) == 3      # epoch 3 writes nothing: dropped by epoch 4
    assert await lead_open_commit(0, 5) == 4      # epoch 4: 20..24
    assert await store.leader_epoch_end(tid, 0, 1) == (1, 10)
    assert await store.leader_epoch_end(tid, 0, 2) == (2, 20)
    assert await store.leader_epoch_end(tid, 0, 3) == (2, 20)
    assert await store.leader_epoch_end(tid, 0, 4) == (4, 25)       # latest: the committed end
    assert await store.leader_epoch_end(tid, 0, 5) == (-1, -1)      # above every epoch
    assert await store.leader_epoch_end(tid, 0, -1) == (-1, -1)
    assert await store.leader_epoch_end(tid, 0, 0) == (0, 0)        # below every epoch

    await store.lead_partition(tid, 1, 1)
    await store.lead_partition(tid, 1, 1)
    assert await lead_open_commit(1, 3) == 3      # first opened at epoch 3
    assert await store.leader_epoch_end(tid, 1, 1) == (1, 0)
    with pytest.raises(UnknownTopic):
        await store.leader_epoch_end(tid, 5, 1)


async def test_offset_for_timestamp(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await topic_led_by(store, 1, e)
    ranges = [rng(t.topic_id, 0, 0, ts=100), rng(t.topic_id, 0, 10, ts=50),
              rng(t.topic_id, 0, 20, ts=300), rng(t.topic_id, 0, 30, ts=200)]
    outs = await store.commit_wal(1, e, [obj(r) for r in ranges])
    assert all(o.committed for o in outs)

    async def first(ts):
        row = await store.offset_for_timestamp(t.topic_id, 0, ts)
        return None if row is None else row.base_offset

    assert [await first(ts) for ts in (0, 50, 80, 100, 101, 250, 300, 301)] == [
        0, 0, 0, 0, 20, 20, 20, None]


async def test_delete_topic_and_garbage(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    a = await topic_led_by(store, 1, e, name="a")
    b = await topic_led_by(store, 1, e, name="b")
    shared, only_a = obj(rng(a.topic_id, 0, 0), rng(b.topic_id, 0, 0)), obj(rng(a.topic_id, 0, 10))
    assert all(o.committed for o in await store.commit_wal(1, e, [shared, only_a]))
    assert await store.unreferenced_objects() == []
    await store.delete_topic("a")
    assert await store.stream_state(a.topic_id, 0) is None
    # Its objects that lost their last index row wait in the lifecycle's queue for
    # file.delete.delay.ms (0008_lifecycle.sql); the committed-object scan finds nothing.
    assert await store.unreferenced_objects() == []
    queued = await store.fetch_all(READ, "SELECT key FROM unreferenced_objects")
    assert queued == [(only_a.key,)]                                # shared: b still uses it
    assert await store.queue_for_deletion([shared.key, only_a.key], "unreferenced") == [only_a.key]
    assert await store.unreferenced_objects() == []
    assert await store.pending_deletions() == [(only_a.key, "unreferenced")]
    await store.deletions_done([only_a.key])
    assert await store.pending_deletions() == []
    [late] = await store.commit_wal(1, e, [obj(rng(a.topic_id, 0, 20))])
    assert late.ranges[0].reason == "unknown_partition"
    # a key queued before CommitWal decided it can never be committed afterwards
    early = obj(rng(b.topic_id, 0, 10))
    assert await store.queue_for_deletion([early.key], "orphan") == [early.key]
    [out] = await store.commit_wal(1, e, [early])
    assert not out.committed and out.reason == "abandoned"
    assert (await store.stream_state(b.topic_id, 0)).committed_end == 10


async def test_allocate_producer_ids(store):
    assert await store.allocate_producer_ids(1000) == 0
    assert await store.allocate_producer_ids(1000) == 1000
    assert await store.cluster_id() == (await store.view()).cluster_id


# ---------------------------------------------------------------------------------------------
# Performance and failures

async def test_commit_wal_latency(store):
    e = await store.register_node(1, "h", 1, ttl_s=30)
    t = await topic_led_by(store, 1, e, partitions=100)
    ends = [0] * 100
    report = {}
    for n in (1, 10, 100):
        samples = []
        for _ in range(15):
            o = obj(*[rng(t.topic_id, p, ends[p], 5, states=[ProducerStateUpdate(p, 0, b"s" * 40)])
                      for p in range(n)])
            started = time.perf_counter()
            [out] = await store.commit_wal(1, e, [o])
            samples.append(time.perf_counter() - started)
            assert all(accepted(out))
            for p in range(n):
                ends[p] += 5
        report[n] = statistics.median(samples) * 1000
    print("\ncommit_wal median latency: " + ", ".join(
        f"{n} ranges {ms:.2f} ms" for n, ms in report.items()))
    assert report[100] < 200


async def test_unavailable_while_server_stopped_then_recovers(pg_server, pg_url, aio_loop):
    store = await ToolMetadataStore.open(pg_url, min_size=2, max_size=4, timeout=1.0, op_timeout=8.0)
    try:
        e = await store.register_node(1, "h", 1, ttl_s=60)
        t = await topic_led_by(store, 1, e)
        async with store.listen() as wakeups:
            await trio.to_thread.run_sync(pg_server.stop, "fast")
            try:
                for op in (store.live_nodes,
                           lambda: store.commit_wal(1, e, [obj(rng(t.topic_id, 0, 0))]),
                           lambda: store.register_node(2, "h", 2)):
                    started = time.monotonic()
                    with pytest.raises(MetadataUnavailable):
                        await op()
                    assert time.monotonic() - started < 5.0
                assert not wakeups.connected
            finally:
                await trio.to_thread.run_sync(pg_server.start)
            # the same store works again, without being reopened
            with trio.fail_after(15):
                while True:
                    try:
                        nodes = await store.live_nodes()
                        break
                    except MetadataUnavailable:
                        await trio.sleep(0.2)
            assert [n.node_id for n in nodes] == [1]
            [out] = await store.commit_wal(1, e, [obj(rng(t.topic_id, 0, 0))])
            assert out.committed
            with trio.fail_after(10):
                assert await wakeups.wait() is None   # reconnected: re-read the change log
            assert wakeups.connected
    finally:
        await store.aclose()


async def test_commit_timeout_is_an_unknown_outcome_then_settled(pg_url, aio_loop):
    """A commit that cannot finish within op_timeout: OutcomeUnknown (never a guess); the
    read-back settles it, and a late repeat of it can no longer succeed."""
    store = await ToolMetadataStore.open(pg_url, timeout=2.0, op_timeout=0.5)
    try:
        e = await store.register_node(1, "h", 1, ttl_s=30)
        t = await topic_led_by(store, 1, e)
        o = obj(rng(t.topic_id, 0, 0))
        with psycopg.connect(pg_url) as blocker:   # holds the partition row lock
            blocker.execute("SELECT 1 FROM partitions WHERE topic_id = %s FOR UPDATE",
                            (t.topic_id,))
            started = time.monotonic()
            with pytest.raises(OutcomeUnknown):
                await store.commit_wal(1, e, [o])
            assert time.monotonic() - started < 5.0
            blocker.rollback()
        assert await store.commit_outcome([o.key]) == {o.key: None}
        [late] = await store.commit_wal(1, e, [o])
        assert not late.committed and late.reason == "abandoned"
        assert (await store.stream_state(t.topic_id, 0)).committed_end == 0
        # the store is fine afterwards
        [out] = await store.commit_wal(1, e, [obj(rng(t.topic_id, 0, 0))])
        assert out.committed
    finally:
        await store.aclose()


async def test_concurrent_create_topic_one_wins(store):
    results = []

    async def create(i):
        try:
            results.append(await store.create_topic("same", 1, {}, [i]))
        except TopicExists:
            results.append(None)

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(create, i)
    assert sum(r is not None for r in results) == 1
    assert len((await store.view()).topics) == 1


async def test_cancelled_operation_returns_its_connection(pg_url, aio_loop):
    """The caller's deadline (trio cancellation) interrupts a blocked commit; the pool keeps
    its only connection and the outcome is then read back and settled."""
    store = await ToolMetadataStore.open(pg_url, min_size=1, max_size=1, timeout=2.0)
    try:
        e = await store.register_node(1, "h", 1, ttl_s=30)
        t = await topic_led_by(store, 1, e)
        o = obj(rng(t.topic_id, 0, 0))
        with psycopg.connect(pg_url) as blocker:
            blocker.execute("SELECT 1 FROM partitions WHERE topic_id = %s FOR UPDATE",
                            (t.topic_id,))
            with trio.move_on_after(0.3) as scope:
                await store.commit_wal(1, e, [o])
            assert scope.cancelled_caught
            blocker.rollback()
        for _ in range(3):
            assert [n.node_id for n in await store.live_nodes()] == [1]
        assert await store.commit_outcome([o.key]) == {o.key: None}
    finally:
        await store.aclose()
