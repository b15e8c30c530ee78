"""The cluster coordinator's lifecycle loop (garbage collection). Its plans are tested
table by table in tests/test_cluster_rules.py."""


async def test_garbage_collection_deletes_objects_of_deleted_topics(pg_url, aio_loop, nursery):
    from types import SimpleNamespace

    from mink.broker.cluster.coordinator import ClusterCoordinator
    from mink.broker.cluster.lifecycle import LifecycleLoops
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
        # A reader may still hold an index row of the deleted topic: its objects wait
        # file.delete.delay.ms in the lifecycle's queue (mink/broker/cluster/lifecycle.py).
        assert await coordinator.collect_garbage() == 0
        assert set(await objects.list("wal/")) == before
        config = SimpleNamespace(file_delete_delay_ms=0, producer_id_expiration_ms=86_400_000)
        collector = LifecycleLoops(SimpleNamespace(metadata=metadata, objects=objects,
                                                   config=config))
        deleted = (await collector.collect())["objects"]
        after = set(await objects.list("wal/"))
        kept_keys = {r.object_key for r in await metadata.find_batches(kept.topic_id, 0, 0)}
        assert deleted == len(before - after) > 0
        assert kept_keys <= after, "an object another topic still uses was deleted"
        assert (await collector.collect())["objects"] == 0
        assert await coordinator.collect_garbage() == 0
        # Read the kept topic through the index and the object store, not the tail cache:
        # collection must have left every object an index row uses readable.
        kept_log.caches.drop_tail(kept_log)
        kept_log.caches._blocks.clear()
        assert not kept_log.tail
        assert [v for v in (await kept_log.read(0, 10**6))]
    finally:
        await metadata.aclose()
