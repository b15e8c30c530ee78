"""The control plane's work follows what changed, not what exists (issue 22), on in-process
nodes: a failover of many partitions fences the dead node once and opens in batches; an idle
node reads only the nodes and what the change log names, and writes nothing per partition.
The figures at 100,000 partitions are benchmarks/control_plane.py's."""

from __future__ import annotations

import trio

from mink.storage.controlplane.postgres import MetadataStore

PARTITIONS = 120


async def test_a_failover_of_many_partitions_fences_once_and_opens_in_batches(
        mink_postgres, monkeypatch):
    from mink.broker.cluster import sync
    from mink.testing import open_cluster

    monkeypatch.setattr(sync, "OPEN_BATCH", 50)
    calls: dict[str, list] = {"fence_node": [], "open_streams_with_producers": [],
                              "open_stream_with_producers": []}
    for name, record in calls.items():
        original = getattr(MetadataStore, name)

        def counted(self, *args, original=original, record=record, **kwargs):
            record.append(args)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(MetadataStore, name, counted)
    async with open_cluster(2, mink_postgres, proxy=False, lease_ttl=2.0,
                            coordinator_tick=0.2) as cluster:
        await cluster.create_topic("many", partitions=PARTITIONS)
        mine = [p for p, leader in cluster.leaders("many").items() if leader == 2]
        assert len(mine) >= PARTITIONS // 2 - 1
        for record in calls.values():
            record.clear()
        await cluster.kill(2)
        with trio.fail_after(30):
            while set(cluster.leaders("many", seen_by=1).values()) != {1} or not all(
                    cluster.node(1).node.leader_log(
                        cluster.node(1).node.view.topics["many"], p) for p in mine):
                await trio.sleep(0.05)
        assert len(calls["fence_node"]) == 1, "the dead node fenced once, not per partition"
        assert not calls["open_stream_with_producers"], "no partition opened on its own"
        opened = sum(len(args[0]) for args in calls["open_streams_with_producers"])
        assert opened >= len(mine)
        assert len(calls["open_streams_with_producers"]) <= -(-len(mine) // 50) + 2
