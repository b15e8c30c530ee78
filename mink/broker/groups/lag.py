"""Consumer lag of the groups this node coordinates, for /metrics.

Lag = high watermark - committed offset, per group and partition. Only the group's
coordinator exports it (it holds the committed offsets in memory), so each (group,
partition) is one series in the whole cluster. It is recomputed every
`consumer_lag_refresh_ms`, never per scrape: high watermarks of partitions this node leads
come from their open logs, the others from PostgreSQL in one read per refresh.
"""

from __future__ import annotations

import logging

import trio
from prometheus_client.core import GaugeMetricFamily

from mink.storage.controlplane import MetadataError
from mink.storage.controlplane.lag import high_watermarks

log = logging.getLogger(__name__)

LABELS = ["group", "topic", "partition"]


class ConsumerLag:
    def __init__(self, node) -> None:
        self.node = node
        # (group, topic, partition, committed offset, high watermark)
        self.rows: list[tuple[str, str, int, int, int]] = []
        self.refreshes = 0

    async def run(self) -> None:
        interval = self.node.config.consumer_lag_refresh_ms / 1000
        while True:
            try:
                with trio.move_on_after(max(interval, 5.0)):
                    await self.refresh()
            except MetadataError as exc:  # the last figures stay until PostgreSQL answers
                log.info("consumer lag not refreshed: %s", exc)
            await trio.sleep(interval)

    async def refresh(self) -> None:
        node = self.node
        committed: list[tuple[str, str, int, int]] = []
        groups = [*node.groups.groups.values(), *node.groups.consumer.groups.values()]
        for group in groups:
            for (topic, partition), offset in group.offsets.items():
                committed.append((group.group_id, topic, partition, offset.offset))
        ends: dict[tuple[str, int], int] = {}
        remote: set[tuple[str, int]] = set()
        for _, topic, partition, _ in committed:
            info = node.view.topics.get(topic)
            if info is None or not 0 <= partition < len(info.partitions):
                continue
            partition_log = node.leader_log(info, partition)
            if partition_log is not None:
                ends[(topic, partition)] = partition_log.high_watermark
            else:
                remote.add((topic, partition))
        if remote:
            ends.update(await high_watermarks(node.metadata, sorted(remote)))
        self.rows = [(group_id, topic, partition, offset, ends[(topic, partition)])
                     for group_id, topic, partition, offset in committed
                     if (topic, partition) in ends]
        self.refreshes += 1

    def families(self):
        lag = GaugeMetricFamily(
            "mink_consumergroup_lag", "High watermark minus the group's committed offset, "
            "exported by the group's coordinator.", labels=LABELS)
        offsets = GaugeMetricFamily("mink_consumergroup_committed_offset",
                                    "The group's committed offset.", labels=LABELS)
        for group_id, topic, partition, offset, end in self.rows:
            labels = [group_id, topic, str(partition)]
            lag.add_metric(labels, max(0, end - offset))
            offsets.add_metric(labels, offset)
        yield lag
        yield offsets
