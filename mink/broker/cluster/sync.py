"""Sync: seed 000's "opening a bucket" as a pure function, and the loop that applies it.

Each node tails the view; for a partition it should lead but has not open, `plan_open`
decides from the stream state in the view what to do before opening (no I/O). The sync
loop (`PartitionSync`) applies the plan (fence, fresh epoch, open) with PostgreSQL's fenced
operations, and closes what the view no longer gives this node.

| stream state in the view                      | plan                                        |
| --------------------------------------------- | ------------------------------------------- |
| opened by another node that is live           | HeldBy: retry at the next sync              |
|   ... and still so after the grace            | open anyway (the epoch fence keeps it safe) |
| opened by a node that is dead                 | fence that node's epoch, then open          |
| opened by another incarnation of a live node  | that incarnation is dead: fence it, open    |
| opened by this node's own earlier epoch       | dead too (nothing to fence: re-registering  |
|                                               | raised the epoch), then as below            |
| opened or closed at the current leader epoch  | this node (or the opener) ran at this epoch |
|                                               | before: take a fresh leader epoch, open     |
| closed at an older epoch                      | open at the leader epoch of the view        |
"""

from __future__ import annotations

import logging
import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import trio

from mink.broker.cluster.view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from mink.storage import controlplane as md
from mink.storage.controlplane import MetadataUnavailable, StaleEpoch
from mink.storage.log import PartitionLog
from mink.storage.streams import Streams

log = logging.getLogger(__name__)

# Partitions opened at once by one sync (each open is a PostgreSQL round trip).
OPEN_CONCURRENCY = 8
# Seconds between syncs while a partition this node should open is still held by its
# previous leader (HeldBy).
HELD_BY_RETRY = 0.1


@dataclass(frozen=True)
class StreamInView:
    """What the view says of one partition's stream."""

    leader_epoch: int  # the partition's current leader epoch
    stream_open: bool
    opened_by_node: int | None
    opened_by_epoch: int | None
    open_leader_epoch: int | None  # the leader epoch it was last opened at


@dataclass(frozen=True)
class OpenPlan:
    held_by: bool = False  # leave it to its opener for now; retry at the next sync
    fence: tuple[int, int] | None = None  # (node, node epoch) to fence before opening
    fresh_epoch: bool = False  # take a new leader epoch (expecting the view's) before opening


HELD_BY = OpenPlan(held_by=True)


def plan_open(stream: StreamInView, node_id: int, node_epoch: int,
              live_epochs: Mapping[int, int], held_for: float, grace: float) -> OpenPlan:
    """The plan for opening `stream` on node (`node_id`, `node_epoch`).

    `live_epochs` maps each live node to its current epoch; `held_for` is how long this
    node has found the stream held by its live opener (0 the first time).
    """
    fence = None
    opener = (stream.opened_by_node, stream.opened_by_epoch)
    if stream.stream_open and opener != (node_id, node_epoch):
        other = stream.opened_by_node
        if other != node_id and live_epochs.get(other) == stream.opened_by_epoch:
            if held_for < grace:
                return HELD_BY  # the opener has not seen the move yet
        elif other != node_id and other is not None:
            fence = (other, stream.opened_by_epoch)  # its late commits must be refused
    fresh = stream.open_leader_epoch == stream.leader_epoch
    return OpenPlan(fence=fence, fresh_epoch=fresh)


class PartitionSync:
    """Tails the change log, keeps the node's view current and opens or closes the
    partitions the view gives this node (seed 000, "Opening a bucket")."""

    def __init__(self, node) -> None:
        self.node = node
        # A stream still open by another live node is left to it for about two syncs, then
        # opened anyway: the epoch fence keeps that safe (seed 000, "HeldBy").
        self.held_by_grace = 2 * min(1.0, node.config.lease_ttl / 6)
        self._held_by: dict[tuple[uuid.UUID, int], float] = {}
        self._sync_lock = trio.Lock()
        # Brokers go on being listed in Metadata this long after they were last seen live.
        self.listing_grace = max(30.0, 2 * node.config.lease_ttl)
        self._last_live: dict[int, tuple[BrokerInfo, float]] = {}
        # Set (and replaced) when the view moved or partitions opened: what a request
        # waiting for a partition still opening here waits on (`wait_for_change`).
        self._changed = trio.Event()

    async def run(self) -> None:
        """Tail the change log; NOTIFY is only a wake-up, the poll interval the backstop
        (liveness changes with time alone)."""
        poll = min(1.0, self.node.config.lease_ttl / 6)
        while True:
            try:
                async with self.node.metadata.listen() as wakeups:
                    while True:
                        try:
                            await self.refresh_view()
                        except MetadataUnavailable as exc:
                            log.warning("view refresh failed: %s", exc)
                        # A partition held by its previous leader is tried again soon:
                        # a clean hand-over closes the stream within milliseconds, and
                        # closing writes no change-log row that would wake this loop.
                        with trio.move_on_after(HELD_BY_RETRY if self._held_by else poll):
                            await wakeups.wait()
            except* MetadataUnavailable as group:
                log.warning("change-log listener unavailable: %s", group.exceptions[0])
            await trio.sleep(poll)

    async def refresh_view(self) -> None:
        node = self.node
        view = self._with_listed_brokers(view_from_snapshot(await node.metadata.view()))
        # An unchanged snapshot keeps its memo of encoded answers; an older one (a slower
        # concurrent refresh) never replaces a newer one.
        if view != node.view and view.version >= node.view.version:
            node.view = view
        await node.quotas.refresh(node.view.version)  # client quotas, when the view moved
        await node.authorizer.refresh(node.view.version)  # ACLs, likewise
        await self.sync_partitions()
        self._announce_change()
        node.coordinator.on_view(node.view)  # a node draining: the holder ticks at once
        node.groups.on_view()  # load or drop the groups of __consumer_offsets partitions

    async def wait_for_change(self) -> None:
        """Until the view moves or this node opens partitions (callers bound the wait)."""
        await self._changed.wait()

    def _announce_change(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _with_listed_brokers(self, view: ClusterView) -> ClusterView:
        now = trio.current_time()
        for broker in view.brokers.values():
            self._last_live[broker.node_id] = (broker, now)
        for node_id, (_, seen) in list(self._last_live.items()):
            if now - seen > self.listing_grace:
                del self._last_live[node_id]
        listed = {node_id: broker for node_id, (broker, _) in self._last_live.items()}
        return dataclasses.replace(view, listed_brokers=listed)

    async def sync_partitions(self) -> None:
        """Open the partitions the view says this node leads; close the others (seed 000,
        "Opening a bucket")."""
        node = self.node
        streams = node.streams
        if streams is None or not node.membership.leading:
            return
        async with self._sync_lock:
            wanted: set[tuple[uuid.UUID, int]] = set()
            to_open = []
            # Streams still marked open by this incarnation whose log is closed already (a
            # commit refused once the partition moved closes the log before the view shows
            # the move): mark them closed too, or the new leader waits out the HeldBy grace.
            left_open = []
            for topic in node.view.topics.values():
                for p in topic.partitions:
                    if (p.leader != node.node_id and p.stream_open
                            and p.opened_by_node == node.node_id
                            and p.opened_by_epoch == streams.node_epoch
                            and p.open_leader_epoch is not None
                            and (topic.topic_id, p.index) not in streams.logs):
                        left_open.append(((topic.topic_id, p.index), p.open_leader_epoch))
                    if p.leader == node.node_id:
                        wanted.add((topic.topic_id, p.index))
                        partition_log = streams.get(topic.topic_id, p.index)
                        if partition_log is None or partition_log.closed is not None or (
                                partition_log.leader_epoch < p.leader_epoch):
                            to_open.append((topic, p))
            opening = {(topic.topic_id, p.index) for topic, p in to_open}
            for key in [k for k in self._held_by if k not in opening]:
                del self._held_by[key]  # moved on meanwhile
            handed_over = left_open
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
                if to_open:  # compacted partitions among them get their tablets at once
                    node.tablets.partitions_opened()

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
        node = self.node
        async with limiter:
            try:
                with trio.move_on_after(node.config.lease_ttl / 3):
                    await node.metadata.close_stream(key[0], key[1], leader_epoch,
                                                     node.node_id, streams.node_epoch)
            except md.MetadataError as exc:  # the new leader opens after the grace anyway
                log.info("closing the stream of %s-%d failed: %s", key[0], key[1], exc)

    def _still(self, streams: Streams) -> bool:
        """Whether the incarnation that started an open is still the current one."""
        return self.node.membership.leading and self.node.streams is streams

    async def _open(self, streams: Streams, topic: TopicInfo,
                    p: PartitionInfo) -> PartitionLog | None:
        node = self.node
        membership = node.membership
        key = (topic.topic_id, p.index)
        leader_epoch = p.leader_epoch
        now = trio.current_time()
        stream = StreamInView(p.leader_epoch, p.stream_open, p.opened_by_node,
                              p.opened_by_epoch, p.open_leader_epoch)
        live_epochs = {b.node_id: b.epoch for b in node.view.brokers.values()}
        # A draining opener handed the partition over on purpose: no grace. Waiting would buy
        # nothing: its commits at the old leader epoch are refused since the move anyway.
        opener = node.view.brokers.get(p.opened_by_node) if p.opened_by_node else None
        grace = 0.0 if opener is not None and opener.draining else self.held_by_grace
        plan = plan_open(stream, node.node_id, membership.node_epoch, live_epochs,
                         now - self._held_by.get(key, now), grace)
        try:
            if plan.held_by:
                self._held_by.setdefault(key, now)
                return None  # HeldBy: the other node has not seen the move yet
            self._held_by.pop(key, None)
            if plan.fence is not None:
                # Opened by a dead node: fence its epoch so its late commits are refused.
                await node.metadata.fence_node(*plan.fence)
            if plan.fresh_epoch and self._still(streams):
                # Opened before at this very epoch (by this node before a restart, or by the
                # node just fenced): a fresh leader epoch tells clients the log may differ.
                # Its own fenced operation (node epoch, leadership, expected leader epoch),
                # not a coordinator action: no coordinator action runs without its epoch.
                leader_epoch = await node.metadata.relead_own_partition(
                    topic.topic_id, p.index, node.node_id, membership.node_epoch,
                    expected_leader_epoch=leader_epoch)
            if not self._still(streams):
                return None  # this node stopped leading meanwhile
            opened = await streams.open(topic.topic_id, p.index, leader_epoch)
            self._announce_change()  # a Produce waiting for it goes on (handlers/produce.py)
            return opened
        except md.NodeAlive:
            return None
        except (md.LeaderMoved, StaleEpoch, md.UnknownTopic) as exc:
            log.info("not opening %s-%d: %s", topic.name, p.index, exc)
            return None


def view_from_snapshot(snapshot: md.View) -> ClusterView:
    return ClusterView(
        version=snapshot.version,
        cluster_id=snapshot.cluster_id,
        brokers={n.node_id: BrokerInfo(n.node_id, n.host, n.port, n.rack, n.epoch,
                                       tuple((e[0], e[2], e[3]) for e in n.endpoints),
                                       n.draining is not None)
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
