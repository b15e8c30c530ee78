"""The coordinator's plans (seed 000, "Assignment"), without a cluster."""

import uuid
from collections import Counter

from mink.broker.coordinator import plan_orphan_moves, plan_rebalance
from mink.storage import metadata as md


def make_view(leaders: list[int | None], live: list[int]) -> md.View:
    partitions = [md.PartitionInfo(i, leader, 3, "open", leader, 1, 3)
                  for i, leader in enumerate(leaders)]
    return md.View(version=1, cluster_id="c", coordinator=live[0],
                   nodes=[md.NodeInfo(n, 1, "h", 9000 + n, None, None) for n in live],
                   topics=[md.TopicView(uuid.uuid4(), "t", {}, partitions)])


def loads_after(view: md.View, moves) -> Counter:
    leaders = {p.partition: p.leader_node for p in view.topics[0].partitions}
    for _, partition, target, expected_epoch in moves:
        assert expected_epoch == 3, "each move names the epoch it replaces"
        leaders[partition] = target
    return Counter(leaders.values())


def test_orphans_go_to_the_least_loaded_lowest_id_first():
    view = make_view([1, 1, 2, 9, 9, 9], live=[1, 2, 3])
    moves = plan_orphan_moves(view)
    assert [target for _, _, target, _ in moves] == [3, 2, 3]  # loads updated after each move
    assert loads_after(view, moves) == {1: 2, 2: 2, 3: 2}


def test_a_joining_node_gets_nothing_until_a_rebalance():
    view = make_view([1, 2, 3] * 4, live=[1, 2, 3, 4])
    assert plan_orphan_moves(view) == []
    after = loads_after(view, plan_rebalance(view))
    assert after == {1: 3, 2: 3, 3: 3, 4: 3}


def test_rebalance_ends_inside_the_band_and_moves_orphans_first():
    view = make_view([1] * 54 + [2] * 4 + [3] * 4 + [None] * 2, live=[1, 2, 3, 4])
    moves = plan_rebalance(view)
    assert moves[0][1] in (62, 63) and moves[1][1] in (62, 63), "orphans first"
    after = loads_after(view, moves)
    mean = 64 / 4
    assert all(0.9 * mean <= after[n] <= 1.1 * mean for n in (1, 2, 3, 4)), after


def test_a_balanced_cluster_moves_nothing():
    assert plan_rebalance(make_view([1, 2, 3, 4] * 3, live=[1, 2, 3, 4])) == []


async def test_garbage_collection_deletes_objects_of_deleted_topics(pg_url, aio_loop, nursery):
    from types import SimpleNamespace

    from mink.broker.coordinator import ClusterCoordinator
    from tests.support.metadata import ToolMetadataStore
    from mink.storage.objectstore import open_object_store
    from tests.test_wal import Node, append, make_topic

    metadata = await ToolMetadataStore.open(pg_url)
    try:
        objects = open_object_store("memory://")
        doomed = await make_topic(metadata, 1, name="doomed")
        kept = await make_topic(metadata, 1, name="kept")
        streams = await Node(metadata, objects, 1).start(nursery)
        doomed_log = await streams.open(doomed.topic_id, 0, 0)
        kept_log = await streams.open(kept.topic_id, 0, 0)
        for i in range(5):
            await append(doomed_log, [b"d%d" % i]).wait(timeout=10)
        shared = [append(doomed_log, [b"both"]), append(kept_log, [b"both"])]
        for pending in shared:
            await pending.wait(timeout=10)
        before = set(await objects.list("wal/"))
        coordinator = ClusterCoordinator(SimpleNamespace(metadata=metadata, objects=objects))
        assert await coordinator.collect_garbage() == 0, "everything is still referenced"
        streams.close(doomed.topic_id, 0)
        await metadata.delete_topic("doomed")
        deleted = await coordinator.collect_garbage()
        after = set(await objects.list("wal/"))
        kept_keys = {r.object_key for r in await metadata.find_batches(kept.topic_id, 0, 0)}
        assert deleted == len(before - after) > 0
        assert kept_keys <= after, "an object another topic still uses was deleted"
        assert await coordinator.collect_garbage() == 0
        # Read the kept topic through the index and the object store, not the tail cache:
        # collection must have left every object an index row uses readable.
        kept_log.caches.drop_tail(kept_log)
        kept_log.caches._blocks.clear()
        assert not kept_log.tail
        assert [v for v in (await kept_log.read(0, 10**6))]
    finally:
        await metadata.aclose()
