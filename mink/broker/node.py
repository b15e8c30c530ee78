"""A Mink node: the stores it shares with the others, its membership, its view, the
partitions it leads, and its Kafka listener.

Everything the node runs lives in the nursery of `run_node`; cancelling it stops the node.
"""

from __future__ import annotations

import gc
import logging
import math
import time
import uuid

import trio
import trio_asyncio

from mink.broker.config import Config
from mink.broker.cluster.coordinator import ClusterCoordinator, NotCoordinator
from mink.broker.server.forwarding import auto_create_via_coordinator
from mink.broker.groups.coordinator import GroupCoordinator
from mink.broker.cluster.leases import BackgroundLeases
from mink.broker.cluster.lifecycle import LifecycleLoops
from mink.broker.transactions.producer_ids import ProducerIdBlock
from mink.broker.server.listener import serve_kafka
from mink.broker.topics.config import validate_topic_config
from mink.broker.cluster.view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from mink.protocol.topics import topic_name_error
from mink.storage import metadata as md
from mink.storage.log import PartitionLog
from mink.storage.metadata import MetadataStore, MetadataUnavailable, StaleEpoch
from mink.storage.objectstore import open_object_store
from mink.storage.streams import Streams

log = logging.getLogger(__name__)

# Partitions opened at once by one sync (each open is a PostgreSQL round trip).
OPEN_CONCURRENCY = 8


class Node:
    def __init__(self, config: Config, metadata: MetadataStore, objects) -> None:
        self.config = config
        self.metadata = metadata
        self.objects = objects
        self.node_id = config.node_id
        self.node_epoch = 0
        self.advertised: tuple[str, int] = config.advertised_address()
        self.view = ClusterView(version=-1, cluster_id="", brokers={}, topics={})
        self.streams: Streams | None = None
        self.producer_ids = ProducerIdBlock(metadata)
        self.coordinator = ClusterCoordinator(self)
        self.leases = BackgroundLeases(self, config.max_partitions)
        self.lifecycle = LifecycleLoops(self)  # retention, log starts, collection
        self.groups = GroupCoordinator(self)  # the consumer group coordinator
        # False while this node may not act as a leader: before it registered, and after it
        # could not renew its membership in time (self-fencing).
        self.leading = False
        # A stream still open by another live node is left to it for about two syncs, then
        # opened anyway: the epoch fence keeps that safe (seed 000, "HeldBy").
        self.held_by_grace = 2 * min(1.0, config.lease_ttl / 6)
        self._held_by: dict[tuple[uuid.UUID, int], float] = {}
        self._sync_lock = trio.Lock()
        self.last_renewal_sent = 0.0  # trio clock: when the last successful renewal was sent
        self.ready = trio.Event()  # registered and its view loaded: requests may be served
        self._nursery: trio.Nursery | None = None

    # -- the view and the partitions this node leads --------------------------------------

    async def refresh_view(self) -> None:
        view = view_from_snapshot(await self.metadata.view())
        # An unchanged snapshot keeps its memo of encoded answers; an older one (a slower
        # concurrent refresh) never replaces a newer one.
        if view != self.view and view.version >= self.view.version:
            self.view = view
        await self.sync_partitions()
        self.groups.on_view()  # load or drop the groups of __consumer_offsets partitions

    async def sync_partitions(self) -> None:
        """Open the partitions the view says this node leads; close the others (seed 000,
        "Opening a bucket")."""
        streams = self.streams
        if streams is None or not self.leading:
            return
        async with self._sync_lock:
            wanted: set[tuple[uuid.UUID, int]] = set()
            to_open = []
            for topic in self.view.topics.values():
                for p in topic.partitions:
                    if p.leader == self.node_id:
                        wanted.add((topic.topic_id, p.index))
                        partition_log = streams.get(topic.topic_id, p.index)
                        if partition_log is None or partition_log.closed is not None or (
                                partition_log.leader_epoch < p.leader_epoch):
                            to_open.append((topic, p))
            for key in [k for k in streams.logs if k not in wanted]:
                streams.close(*key)
            if to_open:
                # Several opens at once: a new 10,000-partition topic is one round trip each.
                limiter = trio.CapacityLimiter(OPEN_CONCURRENCY)
                async with trio.open_nursery() as nursery:
                    for topic, p in to_open:
                        nursery.start_soon(self._open_within, limiter, streams, topic, p)

    async def _open_within(self, limiter: trio.CapacityLimiter, streams: Streams,
                           topic: TopicInfo, p: PartitionInfo) -> None:
        async with limiter:
            try:
                await self._open(streams, topic, p)
            except md.MetadataError as exc:  # the next sync tries again
                log.warning("opening %s-%d failed: %s", topic.name, p.index, exc)
            except Exception:  # one partition's trouble must not take the node down
                log.exception("opening %s-%d failed", topic.name, p.index)

    def _still(self, streams: Streams) -> bool:
        """Whether the incarnation that started an open is still the current one."""
        return self.leading and self.streams is streams

    async def _open(self, streams: Streams, topic: TopicInfo,
                    p: PartitionInfo) -> PartitionLog | None:
        key = (topic.topic_id, p.index)
        leader_epoch = p.leader_epoch
        opener = (p.opened_by_node, p.opened_by_epoch)
        try:
            if p.stream_open and opener != (self.node_id, self.node_epoch):
                other = self.view.brokers.get(p.opened_by_node)
                if p.opened_by_node != self.node_id and other is not None and (
                        other.epoch == p.opened_by_epoch):
                    first_seen = self._held_by.setdefault(key, trio.current_time())
                    if trio.current_time() - first_seen < self.held_by_grace:
                        return None  # HeldBy: the other node has not seen the move yet
                elif p.opened_by_node != self.node_id:
                    # Opened by a dead node: fence its epoch so its late commits are refused.
                    await self.metadata.fence_node(p.opened_by_node, p.opened_by_epoch)
            self._held_by.pop(key, None)
            if p.open_leader_epoch == leader_epoch and self._still(streams):
                # Opened before at this very epoch (by this node before a restart, or by the
                # node just fenced): a fresh leader epoch tells clients the log may differ.
                leader_epoch = await self.metadata.lead_partition(
                    topic.topic_id, p.index, self.node_id, expected_leader_epoch=leader_epoch)
            if not self._still(streams):
                return None  # this node stopped leading meanwhile
            return await streams.open(topic.topic_id, p.index, leader_epoch)
        except md.NodeAlive:
            return None
        except (md.NotLeader, StaleEpoch, md.UnknownTopic) as exc:
            log.info("not opening %s-%d: %s", topic.name, p.index, exc)
            return None

    def leader_log(self, topic: TopicInfo, partition: int) -> PartitionLog | None:
        """The open log of a partition this node leads, or None (not the leader, or still
        opening): the caller answers NOT_LEADER_OR_FOLLOWER."""
        if self.streams is None or not self.leading:
            return None
        partition_log = self.streams.get(topic.topic_id, partition)
        if partition_log is None or partition_log.closed is not None:
            return None
        return partition_log

    # -- topics ----------------------------------------------------------------------------

    def assign_leaders(self, partitions: int, first: int = 0) -> list[int]:
        """Seed 000: partition i goes to live node (i + start) % n, start from the clock so
        consecutive topics begin on different nodes."""
        live = sorted(self.view.brokers) or [self.node_id]
        start = int(time.time() * 1000) % len(live)
        return [live[(first + i + start) % len(live)] for i in range(partitions)]

    # Topic and partition creation and deletion are coordinator actions (seed 000): done by the
    # coordinator lease holder under its lease epoch. Handlers forward them to the holder;
    # these methods refuse with NotCoordinator on any other node.

    def _coordinator_epoch(self) -> int:
        if not self.coordinator.is_holder:
            raise NotCoordinator(f"node {self.node_id} is not the cluster coordinator")
        return self.coordinator.lease_epoch

    async def _coordinator_action(self, action):
        try:
            result = await action(self._coordinator_epoch())
        except StaleEpoch as exc:
            if exc.reason == "stale_coordinator_epoch":
                self.coordinator.drop()
                raise NotCoordinator("the coordinator lease moved") from None
            raise
        try:
            await self.refresh_view()
        except MetadataUnavailable as exc:  # done: the sync task catches up
            log.warning("view refresh after a coordinator action failed: %s", exc)
        return result

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str],
                           leaders: list[int] | None = None):
        config = validate_topic_config(configs)
        leaders = leaders if leaders is not None else self.assign_leaders(partitions)
        return await self._coordinator_action(lambda epoch: self.metadata.create_topic(
            name, partitions, config, leaders, coordinator_epoch=epoch))

    async def create_partitions(self, name: str, total: int, leaders: list[int]):
        return await self._coordinator_action(lambda epoch: self.metadata.create_partitions(
            name, total, leaders, coordinator_epoch=epoch))

    async def delete_topic(self, name: str | None = None, *, topic_id=None):
        return await self._coordinator_action(lambda epoch: self.metadata.delete_topic(
            name, topic_id=topic_id, coordinator_epoch=epoch))

    async def auto_create_topics(self, names: list[str]) -> None:
        """auto.create.topics.enable: unknown, valid names become topics of num.partitions,
        created by the coordinator (forwarded there from any other node)."""
        if not self.config.auto_create_topics_enable:
            return
        missing = [n for n in dict.fromkeys(names)
                   if n not in self.view.topics and topic_name_error(n) is None]
        if not missing:
            return
        if not self.coordinator.is_holder:
            await auto_create_via_coordinator(self, missing)
            await self._try_refresh()
            return
        for name in missing:
            try:
                await self.create_topic(name, self.config.num_partitions, {})
                log.info("auto-created topic %s with %d partitions", name,
                         self.config.num_partitions)
            except md.TopicExists:
                await self._try_refresh()
            except (NotCoordinator, MetadataUnavailable) as exc:
                log.warning("could not auto-create topic %s: %s", name, exc)

    async def _try_refresh(self) -> None:
        try:
            await self.refresh_view()
        except MetadataUnavailable as exc:
            log.warning("view refresh failed: %s", exc)

    # -- background loops ------------------------------------------------------------------

    async def membership_loop(self) -> None:
        """Renew the membership every lease_ttl / 3. A node whose last successful renewal was
        sent more than lease_ttl minus a margin ago stops acting as a leader (others may
        take its partitions by then); once PostgreSQL answers again it registers anew.
        A refused renewal (its epoch was fenced) also makes it start again, without a
        process restart."""
        ttl = self.config.lease_ttl
        margin = max(0.5, ttl / 10)
        while True:
            if self.leading:
                await trio.sleep_until(self.last_renewal_sent + ttl / 3)
            sent = trio.current_time()
            fence_at = self.last_renewal_sent + ttl - margin
            deadline = min(sent + ttl / 3, fence_at) if self.leading else sent + ttl / 3
            renewed = False
            with trio.move_on_at(deadline):
                try:
                    if self.leading:
                        await self.metadata.heartbeat(self.node_id, self.node_epoch, ttl_s=ttl)
                        self.last_renewal_sent = sent
                    else:
                        await self.register()  # only the registration races the deadline
                    renewed = True
                except StaleEpoch:
                    log.error("membership renewal refused: epoch %d was fenced",
                              self.node_epoch)
                    self.stop_leading("fenced")
                except MetadataUnavailable as exc:
                    log.warning("membership renewal failed: %s", exc)
            if renewed:
                if not self.leading:
                    try:
                        await self.start_streams()
                    except md.MetadataError as exc:  # leading already: the sync loop catches up
                        log.warning("reopening after registering again: %s", exc)
                continue
            if self.leading and trio.current_time() >= fence_at:
                self.stop_leading("membership not renewed within lease_ttl")
            await trio.sleep(min(1.0, ttl / 6))

    def stop_leading(self, why: str) -> None:
        """Self-fencing: close every partition, stop coordinating; requests get retriable
        errors until this node registers again."""
        if not self.leading:
            return
        log.error("node %d stops leading: %s", self.node_id, why)
        self.leading = False
        self.coordinator.drop()
        if self.streams is not None:
            self.streams.stop()
            self.streams = None

    async def start_streams(self) -> None:
        config = self.config
        delay = config.effective_wal_max_delay_ms() / 1000
        uploads = 4 if config.object_store.startswith("s3://") else 1
        self.streams = Streams(
            self.node_id, self.node_epoch, self.objects, self.metadata,
            wal_max_bytes=config.wal_max_bytes, wal_max_delay=delay,
            wal_max_uploads=config.wal_max_concurrent_uploads or uploads,
            commit_timeout=config.commit_timeout,
            on_node_fenced=lambda: self.stop_leading("a WAL commit found this node's epoch fenced"))
        await self._nursery.start(self.streams.run)
        self._nursery.start_soon(_settle_orphans, self, self.streams)
        self.leading = True
        await self.coordinator.hold_lease()
        await self.refresh_view()

    async def sync_loop(self) -> None:
        """Tail the change log; NOTIFY is only a wake-up, the poll interval the backstop
        (liveness changes with time alone)."""
        poll = min(1.0, self.config.lease_ttl / 6)
        while True:
            try:
                async with self.metadata.listen() as wakeups:
                    while True:
                        try:
                            await self.refresh_view()
                        except MetadataUnavailable as exc:
                            log.warning("view refresh failed: %s", exc)
                        with trio.move_on_after(poll):
                            await wakeups.wait()
            except* MetadataUnavailable as group:
                log.warning("change-log listener unavailable: %s", group.exceptions[0])
            await trio.sleep(poll)

    async def register(self) -> None:
        host, port = self.advertised
        sent = trio.current_time()
        self.node_epoch = await self.metadata.register_node(
            self.node_id, host, port, rack=self.config.rack, ttl_s=self.config.lease_ttl)
        self.last_renewal_sent = sent
        log.info("node %d registered at epoch %d, advertising %s:%d", self.node_id,
                 self.node_epoch, host, port)


def view_from_snapshot(snapshot: md.View) -> ClusterView:
    return ClusterView(
        version=snapshot.version,
        cluster_id=snapshot.cluster_id,
        brokers={n.node_id: BrokerInfo(n.node_id, n.host, n.port, n.rack, n.epoch)
                 for n in snapshot.nodes},
        topics={
            t.name: TopicInfo(t.topic_id, t.name, tuple(
                PartitionInfo(p.partition, p.leader_node, p.leader_epoch,
                              p.stream_state == "open", p.opened_by_node, p.opened_by_epoch,
                              p.open_leader_epoch)
                for p in t.partitions), dict(t.config))
            for t in snapshot.topics
        },
        coordinator=snapshot.coordinator,
    )


async def run_node(config: Config, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Open the stores, register, serve until cancelled; reports the advertised (host, port)."""
    async with trio_asyncio.open_loop():
        objects = open_object_store(
            config.object_store, endpoint_url=config.s3_endpoint_url, region=config.s3_region,
            access_key_id=config.s3_access_key_id,
            secret_access_key=config.s3_secret_access_key)
        try:
            await objects.check()
            metadata = await MetadataStore.open(config.postgres_url)
            try:
                await _serve(Node(config, metadata, objects), task_status)
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
        node._nursery = nursery
        bound = await nursery.start(serve_kafka, node, host, port,
                                    config.socket_request_max_bytes)
        adv_host, adv_port = config.advertised_address()
        node.advertised = (adv_host, bound[1] if adv_port == 0 else adv_port)
        await node.register()
        try:
            await node.start_streams()
            node.ready.set()
            nursery.start_soon(node.membership_loop)
            nursery.start_soon(node.sync_loop)
            nursery.start_soon(node.coordinator.run)
            nursery.start_soon(node.leases.run)
            nursery.start_soon(node.lifecycle.run)
            await nursery.start(node.groups.run)
            task_status.started(node.advertised)
            # What start-up built lives as long as the node: keep it out of the collector's
            # full passes, which stop the event loop for as long as they scan (DESIGN,
            # "Performance notes").
            gc.collect()
            gc.freeze()
            await trio.sleep(math.inf)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await node.coordinator.release()
                    await node.metadata.leave(node.node_id, node.node_epoch)
                    log.info("node %d left the cluster", node.node_id)
                except Exception as exc:  # the membership expires by itself
                    log.warning("could not leave cleanly: %s", exc)


async def _settle_orphans(node: Node, streams: Streams) -> None:
    try:
        await streams.settle_orphans(node.objects)
    except Exception as exc:  # garbage collection will find them later
        log.warning("could not settle uncommitted WAL objects of earlier epochs: %s", exc)
