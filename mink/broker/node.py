"""A Mink node: the stores it shares with the others, its membership, its view, its listener.

Everything the node runs lives in the nursery of `run_node`; cancelling it stops the node.
"""

from __future__ import annotations

import logging
import math

import trio
import trio_asyncio

from mink.broker.config import Config
from mink.broker.server import serve_kafka
from mink.broker.view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from mink.storage.metadata import MetadataStore, MetadataUnavailable, StaleEpoch
from mink.storage.objectstore import open_object_store

log = logging.getLogger(__name__)


class Node:
    def __init__(self, config: Config, metadata: MetadataStore, objects) -> None:
        self.config = config
        self.metadata = metadata
        self.objects = objects
        self.node_id = config.node_id
        self.node_epoch = 0
        self.view = ClusterView(version=-1, cluster_id="", brokers={}, topics={})
        self._view_changed = trio.Event()

    async def refresh_view(self) -> None:
        snapshot = await self.metadata.view()
        self.view = view_from_snapshot(snapshot)
        self._view_changed.set()
        self._view_changed = trio.Event()

    async def auto_create_topics(self, names: list[str]) -> None:
        """Topic auto-creation arrives with the Produce/Fetch issue; until then, nothing."""
        return None

    # -- background loops ---------------------------------------------------------------

    async def heartbeat_loop(self) -> None:
        interval = self.config.lease_ttl / 3
        while True:
            await trio.sleep(interval)
            try:
                await self.metadata.heartbeat(self.node_id, self.node_epoch,
                                              ttl_s=self.config.lease_ttl)
            except MetadataUnavailable as exc:
                log.warning("heartbeat failed, PostgreSQL unavailable: %s", exc)
            except StaleEpoch:
                log.error("heartbeat refused: node epoch %d is stale; registering again",
                          self.node_epoch)
                await self.register()

    async def sync_loop(self) -> None:
        """Tail the change log; NOTIFY is only a wake-up, the poll interval the backstop."""
        poll = min(1.0, self.config.lease_ttl / 6)
        while True:
            try:
                async with self.metadata.listen() as wakeups:
                    while True:
                        await self.refresh_view()
                        with trio.move_on_after(poll):
                            await wakeups.wait()
            except MetadataUnavailable as exc:
                log.warning("view refresh failed: %s", exc)
                await trio.sleep(poll)

    async def register(self) -> None:
        host, port = self.advertised
        self.node_epoch = await self.metadata.register_node(
            self.node_id, host, port, rack=self.config.rack, ttl_s=self.config.lease_ttl)
        log.info("node %d registered at epoch %d, advertising %s:%d", self.node_id,
                 self.node_epoch, host, port)


def view_from_snapshot(snapshot) -> ClusterView:
    return ClusterView(
        version=snapshot.version,
        cluster_id=snapshot.cluster_id,
        brokers={n.node_id: BrokerInfo(n.node_id, n.host, n.port, n.rack)
                 for n in snapshot.nodes},
        topics={
            t.name: TopicInfo(t.topic_id, t.name, tuple(
                PartitionInfo(p.partition, p.leader_node, p.leader_epoch)
                for p in sorted(t.partitions, key=lambda p: p.partition)), dict(t.config))
            for t in snapshot.topics
        },
        coordinator=snapshot.coordinator,
    )


async def run_node(config: Config, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Open the stores, register, serve until cancelled; reports the bound (host, port)."""
    async with trio_asyncio.open_loop():
        objects = open_object_store(
            config.object_store, endpoint_url=config.s3_endpoint_url, region=config.s3_region,
            access_key_id=config.s3_access_key_id,
            secret_access_key=config.s3_secret_access_key)
        try:
            await objects.check()
            metadata = await MetadataStore.open(config.postgres_url)
            try:
                node = Node(config, metadata, objects)
                await _serve(node, task_status)
            finally:
                with trio.CancelScope(shield=True):
                    await metadata.aclose()
        finally:
            with trio.CancelScope(shield=True):
                await objects.aclose()


async def _serve(node: Node, task_status) -> None:
    config = node.config
    host, port = config.listener_address()
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve_kafka, node, host, port,
                                    config.socket_request_max_bytes)
        adv_host, adv_port = config.advertised_address()
        node.advertised = (adv_host, bound[1] if adv_port == 0 else adv_port)
        await node.register()
        try:
            await node.refresh_view()
            nursery.start_soon(node.heartbeat_loop)
            nursery.start_soon(node.sync_loop)
            task_status.started(node.advertised)
            await trio.sleep(math.inf)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await node.metadata.leave(node.node_id, node.node_epoch)
                    log.info("node %d left the cluster", node.node_id)
                except Exception as exc:  # the lease expires by itself
                    log.warning("could not leave cleanly: %s", exc)
