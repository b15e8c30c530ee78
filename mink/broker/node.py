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
from collections.abc import Callable

import trio
import trio_asyncio

from mink.broker.admin.http import serve_admin
from mink.broker.admin.metrics import node_metrics
from mink.broker.cluster.coordinator import ClusterCoordinator, NotClusterCoordinator
from mink.broker.cluster.leases import BackgroundLeases
from mink.broker.cluster.lifecycle import LifecycleLoops
from mink.broker.cluster.sync import StreamInView, plan_open
from mink.broker.cluster.view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from mink.broker.config import Config
from mink.broker.groups.coordinator import GroupCoordinator
from mink.broker.logs import bind_node
from mink.broker.server.forwarding import auto_create_via_coordinator
from mink.broker.server.listener import serve_kafka
from mink.broker.topics.config import validate_topic_config
from mink.broker.transactions.producer_ids import ProducerIdBlock
from mink.protocol.topics import topic_name_error
from mink.storage import controlplane as md
from mink.storage.log import PartitionLog
from mink.storage.controlplane import MetadataStore, MetadataUnavailable, StaleEpoch
from mink.storage.objectstore import open_object_store
from mink.storage.streams import Streams

log = logging.getLogger(__name__)

# Partitions opened at once by one sync (each open is a PostgreSQL round trip).
OPEN_CONCURRENCY = 8


class Node:
    def __init__(self, config: Config, metadata: MetadataStore, objects) -> None:
        self.config = config
        self.metrics = node_metrics(self)  # NULL_METRICS without an admin listener
        self.metadata = metadata
        self.objects = self.metrics.observe_object_store(objects)
        self.node_id = config.node_id
        self.node_epoch = 0
        # This process: a registration of this node id by another live process is refused.
        self.incarnation = uuid.uuid4()
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
        # Others may take this node's partitions lease_ttl after its last successful renewal
        # was sent; it stops acting as a leader a margin before that (self-fencing).
        self.lease_margin = max(0.5, config.lease_ttl / 10)
        self.ready = trio.Event()  # registered and its view loaded: requests may be served
        # False: stopping leaves the membership and the coordinator lease to expire, as after
        # a crash (the test harness's in-process "kill").
        self.leave_on_stop = True
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
            handed_over = []
            for key in [k for k in streams.logs if k not in wanted]:
                handed_over.append((key, streams.logs[key].leader_epoch))
                streams.close(*key)
            if to_open or handed_over:
                # Several opens at once: a new 10,000-partition topic is one round trip each.
                limiter = trio.CapacityLimiter(OPEN_CONCURRENCY)
                async with trio.open_nursery() as nursery:
                    for key, leader_epoch in handed_over:
                        nursery.start_soon(self._close_stream, limiter, streams, key,
                                           leader_epoch)
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

    async def _close_stream(self, limiter: trio.CapacityLimiter, streams: Streams,
                            key: tuple[uuid.UUID, int], leader_epoch: int) -> None:
        """A clean hand-over: mark the stream closed, so the new leader opens it at once
        instead of waiting out the HeldBy grace. Safe at any time: the partition-row lock
        orders it with this node's commits (one landing after it is refused,
        not_open_by_node), and it changes nothing unless this incarnation opened it at this
        leader epoch."""
        async with limiter:
            try:
                with trio.move_on_after(self.config.lease_ttl / 3):
                    await self.metadata.close_stream(key[0], key[1], leader_epoch,
                                                     self.node_id, streams.node_epoch)
            except md.MetadataError as exc:  # the new leader opens after the grace anyway
                log.info("closing the stream of %s-%d failed: %s", key[0], key[1], exc)

    def _still(self, streams: Streams) -> bool:
        """Whether the incarnation that started an open is still the current one."""
        return self.leading and self.streams is streams

    async def _open(self, streams: Streams, topic: TopicInfo,
                    p: PartitionInfo) -> PartitionLog | None:
        key = (topic.topic_id, p.index)
        leader_epoch = p.leader_epoch
        now = trio.current_time()
        stream = StreamInView(p.leader_epoch, p.stream_open, p.opened_by_node,
                              p.opened_by_epoch, p.open_leader_epoch)
        live_epochs = {b.node_id: b.epoch for b in self.view.brokers.values()}
        plan = plan_open(stream, self.node_id, self.node_epoch, live_epochs,
                         now - self._held_by.get(key, now), self.held_by_grace)
        try:
            if plan.held_by:
                self._held_by.setdefault(key, now)
                return None  # HeldBy: the other node has not seen the move yet
            self._held_by.pop(key, None)
            if plan.fence is not None:
                # Opened by a dead node: fence its epoch so its late commits are refused.
                await self.metadata.fence_node(*plan.fence)
            if plan.fresh_epoch and self._still(streams):
                # Opened before at this very epoch (by this node before a restart, or by the
                # node just fenced): a fresh leader epoch tells clients the log may differ.
                # Its own fenced operation (node epoch, leadership, expected leader epoch),
                # not a coordinator action: no coordinator action runs without its epoch.
                leader_epoch = await self.metadata.relead_own_partition(
                    topic.topic_id, p.index, self.node_id, self.node_epoch,
                    expected_leader_epoch=leader_epoch)
            if not self._still(streams):
                return None  # this node stopped leading meanwhile
            return await streams.open(topic.topic_id, p.index, leader_epoch)
        except md.NodeAlive:
            return None
        except (md.LeaderMoved, StaleEpoch, md.UnknownTopic) as exc:
            log.info("not opening %s-%d: %s", topic.name, p.index, exc)
            return None

    @property
    def valid_until(self) -> float:
        """Trio clock: the end of the validity of this node's membership, derived from the
        send time of its last successful renewal."""
        return self.last_renewal_sent + self.config.lease_ttl - self.lease_margin

    def may_lead(self) -> bool:
        """Whether this node may act as a leader right now. Checked by every handler without
        awaiting anything: the membership loop (or a hung PostgreSQL call in it) cannot make
        the node act past its validity deadline."""
        return self.leading and trio.current_time() < self.valid_until

    def leader_log(self, topic: TopicInfo, partition: int) -> PartitionLog | None:
        """The open log of a partition this node leads, or None (not the leader, still
        opening, or its membership is past its validity deadline): the caller answers
        NOT_LEADER_OR_FOLLOWER."""
        if self.streams is None or not self.may_lead():
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
    # these methods refuse with NotClusterCoordinator on any other node.

    def _coordinator_epoch(self) -> int:
        if not self.coordinator.is_holder:
            raise NotClusterCoordinator(f"node {self.node_id} is not the cluster coordinator")
        return self.coordinator.lease_epoch

    async def _coordinator_action(self, action):
        try:
            result = await action(self._coordinator_epoch())
        except StaleEpoch as exc:
            if exc.reason == "stale_coordinator_epoch":
                self.coordinator.drop()
                raise NotClusterCoordinator("the coordinator lease moved") from None
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
            except (NotClusterCoordinator, MetadataUnavailable) as exc:
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
        while True:
            if self.leading:
                await trio.sleep_until(self.last_renewal_sent + ttl / 3)
            sent = trio.current_time()
            fence_at = self.valid_until
            was_leading = self.leading
            deadline = min(sent + ttl / 3, fence_at) if was_leading else sent + ttl / 3
            renewed = False
            with trio.move_on_at(deadline):
                try:
                    if was_leading:
                        await self.metadata.heartbeat(self.node_id, self.node_epoch, ttl_s=ttl)
                        # A heartbeat that returned only after this node stopped leading (a
                        # hung call; the watchdog fenced it) renews nothing: register anew.
                        if self.leading:
                            self.last_renewal_sent = sent
                            renewed = True
                    else:
                        await self.register()  # only the registration races the deadline
                        renewed = True
                except StaleEpoch:
                    log.error("membership renewal refused: epoch %d was fenced",
                              self.node_epoch)
                    self.stop_leading("fenced")
                except MetadataUnavailable as exc:
                    log.warning("membership renewal failed: %s", exc)
                except md.NodeIdInUse as exc:
                    log.error("node id %d is in use by another live process (%s:%s, renewed "
                              "%.1fs ago); not registering while it lives", self.node_id,
                              exc.host, exc.port, exc.renewed_s_ago or 0.0)
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

    async def fencing_watchdog(self) -> None:
        """Stop leading at the validity deadline even while the membership loop is stuck in a
        PostgreSQL call that does not return (a query cancel that blocks: move_on_at cannot
        bound it). Handlers check the deadline themselves (may_lead); this closes the
        partitions and stops the coordinator on time."""
        while True:
            if self.leading and trio.current_time() >= self.valid_until:
                self.stop_leading(
                    f"membership not renewed within lease_ttl minus {self.lease_margin:.1f}s "
                    "(validity deadline passed)")
            if self.leading:
                await trio.sleep_until(self.valid_until)
            else:
                await trio.sleep(0.05)

    def stop_leading(self, why: str) -> None:
        """Self-fencing: close every partition, stop coordinating; requests get retriable
        errors until this node registers again."""
        if not self.leading:
            return
        log.error("node %d stops leading: %s", self.node_id, why,
                  extra={"event": "fence", "reason": why})
        self.leading = False
        self.coordinator.drop()
        if self.streams is not None:
            streams, self.streams = self.streams, None
            streams.stop()
            if self._nursery is not None:
                # Appends in WAL objects on their way get their real outcome, read back
                # once PostgreSQL answers, not a guess (or a REQUEST_TIMED_OUT).
                self._nursery.start_soon(streams.wal.settle_after_stop)

    async def start_streams(self) -> None:
        config = self.config
        delay = config.effective_wal_max_delay_ms() / 1000
        uploads = 4 if config.object_store.startswith("s3://") else 1
        self.streams = Streams(
            self.node_id, self.node_epoch, self.objects, self.metadata,
            wal_max_bytes=config.wal_max_bytes, wal_max_delay=delay,
            wal_max_uploads=config.wal_max_concurrent_uploads or uploads,
            commit_timeout=config.commit_timeout, observer=self.metrics.storage,
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

    async def register_at_start(self) -> None:
        """Register; while another incarnation of this node id looks alive, try again until
        it has not renewed for longer than the guard (a process restarted right after a
        crash gets in within about 1.5 renewal intervals). A process that keeps renewing is
        a real duplicate: NodeIdInUse is raised and this process does not start."""
        ttl = self.config.lease_ttl
        give_up_at = trio.current_time() + 1.5 * ttl / 3 + ttl / 3
        while True:
            try:
                await self.register()
                return
            except md.NodeIdInUse:
                if trio.current_time() >= give_up_at:
                    raise
                await trio.sleep(min(0.25, ttl / 12))

    async def register(self) -> None:
        host, port = self.advertised
        sent = trio.current_time()
        ttl = self.config.lease_ttl
        # Another incarnation renewed within about 1.5 renewal intervals is alive: refused.
        # A crashed one stops renewing, so a restart after a SIGKILL is accepted soon.
        self.node_epoch = await self.metadata.register_node(
            self.node_id, host, port, rack=self.config.rack, ttl_s=ttl,
            incarnation=self.incarnation, guard_s=1.5 * ttl / 3)
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


async def run_node(config: Config, *, objects=None, freeze_heap: bool = True,
                   migrate: bool = True, on_started: Callable[[Node], None] | None = None,
                   task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Open the stores, register, serve until cancelled; reports the advertised (host, port).

    For embedding (mink.testing): `objects` is a store the caller opened and closes (used
    instead of `config.object_store`); `freeze_heap=False` leaves the host process's garbage
    collector alone; `migrate=False` skips the migrations check, for a database the caller
    cloned from a template migrated by this same code; `on_started(node)` is called once the
    node serves."""
    async with trio_asyncio.open_loop():
        owned = objects is None
        if owned:
            objects = open_object_store(
                config.object_store, endpoint_url=config.s3_endpoint_url,
                region=config.s3_region, access_key_id=config.s3_access_key_id,
                secret_access_key=config.s3_secret_access_key)
        try:
            await objects.check()
            metadata = await MetadataStore.open(config.postgres_url, migrate=migrate)
            try:
                await _serve(Node(config, metadata, objects), task_status, freeze_heap,
                             on_started)
            finally:
                with trio.CancelScope(shield=True):
                    await metadata.aclose()
        finally:
            if owned:
                with trio.CancelScope(shield=True):
                    await objects.aclose()


async def _serve(node: Node, task_status, freeze_heap: bool = True,
                 on_started: Callable[[Node], None] | None = None) -> None:
    config = node.config
    host, port = config.listener_address()
    bind_node(node)  # every log line of this node's tasks names it (mink/broker/logs.py)
    async with trio.open_nursery() as nursery:
        node._nursery = nursery
        bound = await nursery.start(serve_kafka, node, host, port,
                                    config.socket_request_max_bytes)
        await nursery.start(serve_admin, node)  # off unless admin_listener is set
        adv_host, adv_port = config.advertised_address()
        node.advertised = (adv_host, bound[1] if adv_port == 0 else adv_port)
        await node.register_at_start()
        try:
            await node.start_streams()
            node.ready.set()
            nursery.start_soon(node.membership_loop)
            nursery.start_soon(node.fencing_watchdog)
            nursery.start_soon(node.producer_ids.run)
            nursery.start_soon(node.sync_loop)
            nursery.start_soon(node.coordinator.run)
            nursery.start_soon(node.leases.run)
            nursery.start_soon(node.lifecycle.run)
            await nursery.start(node.groups.run)
            if on_started is not None:
                on_started(node)
            task_status.started(node.advertised)
            if freeze_heap:
                # What start-up built lives as long as the node: keep it out of the
                # collector's full passes, which stop the event loop for as long as they scan
                # (DESIGN, "Performance notes").
                gc.collect()
                gc.freeze()
            await trio.sleep(math.inf)
        finally:
            if node.leave_on_stop:  # False after a harness kill: nothing is released
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
