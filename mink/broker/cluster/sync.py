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
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace

import trio

from mink.broker.cluster.view import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from mink.storage import controlplane as md
from mink.storage.controlplane import MetadataUnavailable
from mink.storage.streams import Streams

log = logging.getLogger(__name__)

# Opens in flight at once in one sync (each a PostgreSQL round trip: a batch, or one open
# that fences or takes a fresh epoch first); partitions per batched open.
OPEN_CONCURRENCY = 8
OPEN_BATCH = 500
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
    partitions the view gives this node (seed 000, "Opening a bucket").

    Both follow what changed, not what exists (issue 22): a refresh reads the topics the
    change log names since the view's version (`MetadataStore.view_since`), and a sync looks
    at their partitions, the partitions still waiting to open here, and those whose log was
    closed by a refused commit; every partition only after a whole reload (the first, or
    when the change log no longer reaches back to the view's version) or a new incarnation."""

    def __init__(self, node) -> None:
        self.node = node
        # A stream still open by another live node is left to it for about two syncs, then
        # opened anyway: the epoch fence keeps that safe (seed 000, "HeldBy").
        self.held_by_grace = 2 * min(1.0, node.config.lease_ttl / 6)
        self._held_by: dict[tuple[uuid.UUID, int], float] = {}
        self._sync_lock = trio.Lock()
        self._view_lock = trio.Lock()  # deltas apply one after another, in version order
        # Brokers go on being listed in Metadata this long after they were last seen live.
        self.listing_grace = max(30.0, 2 * node.config.lease_ttl)
        self._last_live: dict[int, tuple[BrokerInfo, float]] = {}
        # Set (and replaced) when the view moved or partitions opened: what a request
        # waiting for a partition still opening here waits on (`wait_for_change`).
        self._changed = trio.Event()
        # What the next sync looks at: the partitions of topics that changed since the last
        # one (all of them after a whole reload), and those that should be open here and
        # are not yet (an open refused, failed or held by the previous leader).
        self._dirty: set[tuple[uuid.UUID, int]] = set()
        self._all_dirty = True
        self._pending: set[tuple[uuid.UUID, int]] = set()
        self._synced_streams: Streams | None = None  # the incarnation the last sync saw

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
        await self._apply_view_changes()
        await node.quotas.refresh(node.view.version)  # client quotas, when the view moved
        await node.authorizer.refresh(node.view.version)  # ACLs, likewise
        if await node.dynamic_configs.refresh(node.view.version):  # dynamic broker configs
            await self._fold_topic_defaults()
        await self.sync_partitions()
        self._announce_change()
        node.coordinator.on_view(node.view)  # a node draining: the holder ticks at once
        node.groups.on_view()  # load or drop the groups of __consumer_offsets partitions

    async def _apply_view_changes(self) -> None:
        """The view made current from what changed since its version. An unchanged view
        stays the same object (its memo of encoded answers with it)."""
        node = self.node
        async with self._view_lock:
            base = node.view
            delta = await node.metadata.view_since(base.version)
            defaults = node.dynamic_configs.topic_defaults
            brokers = _brokers(delta.nodes)
            listed = self._listed(brokers)
            if not delta.complete:
                node.view = ClusterView(
                    version=delta.version, cluster_id=delta.cluster_id, brokers=brokers,
                    topics={t.name: _topic_info(t, defaults) for t in delta.topics},
                    coordinator=delta.coordinator, listed_brokers=listed)
                self._all_dirty = True
                return
            if (not delta.changed and delta.version == base.version and brokers == base.brokers
                    and delta.coordinator == base.coordinator
                    and listed == base.listed_brokers):
                return
            topics = [_topic_info(t, defaults) for t in delta.topics]
            for topic_id in delta.changed:
                old = base.topic_by_id(topic_id)
                if old is not None:
                    self._dirty.update((topic_id, p.index) for p in old.partitions)
            for topic in topics:
                self._dirty.update((topic.topic_id, p.index) for p in topic.partitions)
            node.view = base.with_changes(delta.version, brokers, delta.coordinator, listed,
                                          delta.changed, topics)

    async def _fold_topic_defaults(self) -> None:
        """Every topic of the view with this node's topic defaults as they now are (they
        changed: a dynamic broker config). A new snapshot, so nothing computed from the old
        one (its memo, the compaction lists) outlives it."""
        node = self.node
        async with self._view_lock:
            defaults = node.dynamic_configs.topic_defaults
            view = node.view
            node.view = replace(
                view, topics={name: t.with_defaults(defaults) for name, t in view.topics.items()},
                memo={}, derived={})

    async def wait_for_change(self) -> None:
        """Until the view moves or this node opens partitions (callers bound the wait)."""
        await self._changed.wait()

    def _announce_change(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _listed(self, brokers: dict[int, BrokerInfo]) -> dict[int, BrokerInfo]:
        """The brokers Metadata lists: the live ones and those live within the grace."""
        now = trio.current_time()
        for broker in brokers.values():
            self._last_live[broker.node_id] = (broker, now)
        for node_id, (_, seen) in list(self._last_live.items()):
            if now - seen > self.listing_grace:
                del self._last_live[node_id]
        return {node_id: broker for node_id, (broker, _) in self._last_live.items()}

    def _candidates(self, streams: Streams) -> set[tuple[uuid.UUID, int]]:
        """The partitions this sync looks at (and forgets what made them dirty)."""
        view, me = self.node.view, self.node.node_id
        if self._all_dirty or streams is not self._synced_streams:
            self._all_dirty = False
            self._synced_streams = streams
            self._dirty.clear()
            return {(t.topic_id, p.index) for t in view.topics.values() for p in t.partitions
                    if p.leader == me} | set(streams.logs) | set(streams.closed_here)
        candidates = self._dirty | self._pending | set(streams.closed_here)
        self._dirty = set()
        return candidates

    async def sync_partitions(self) -> None:
        """Open the partitions the view says this node leads; close the others (seed 000,
        "Opening a bucket")."""
        node = self.node
        streams = node.streams
        if streams is None or not node.membership.leading:
            return
        async with self._sync_lock:
            view, me = node.view, node.node_id
            to_open: list[tuple[tuple[uuid.UUID, int], TopicInfo, PartitionInfo]] = []
            handed_over: list[tuple[tuple[uuid.UUID, int], int]] = []
            for key in self._candidates(streams):
                p = view.partition(*key)
                partition_log = streams.logs.get(key)
                if p is not None and p.leader == me:
                    if partition_log is None or partition_log.closed is not None or (
                            partition_log.leader_epoch < p.leader_epoch):
                        to_open.append((key, view.topic_by_id(key[0]), p))
                    continue
                if partition_log is not None:
                    handed_over.append((key, partition_log.leader_epoch))
                    streams.close(*key)
                elif key in streams.closed_here:
                    # Closed here by a refused commit (the partition moved before the view
                    # showed it): mark its stream closed too, or the new leader waits out
                    # the HeldBy grace.
                    handed_over.append((key, streams.closed_here[key]))
                streams.closed_here.pop(key, None)
            opening = {key for key, _, _ in to_open}
            self._pending = opening
            for key in [k for k in self._held_by if k not in opening]:
                del self._held_by[key]  # moved on meanwhile
            if handed_over:
                await self._close_streams(streams, handed_over)
            if to_open:
                await self._open_all(streams, to_open)
                self._pending = {key for key in opening if not self._is_open(streams, key)}
                node.tablets.partitions_opened()  # compacted ones get their tablets at once

    def _is_open(self, streams: Streams, key: tuple[uuid.UUID, int]) -> bool:
        partition_log = streams.logs.get(key)
        p = self.node.view.partition(*key)
        return partition_log is not None and partition_log.closed is None and (
            p is None or partition_log.leader_epoch >= p.leader_epoch)

    async def _close_streams(self, streams: Streams,
                             handed_over: list[tuple[tuple[uuid.UUID, int], int]]) -> None:
        """A clean hand-over: mark the streams closed, so the new leaders open them at once
        instead of waiting out the HeldBy grace. Safe at any time: the partition-row lock
        orders it with this node's commits (one landing after it is refused,
        not_open_by_node), and it changes nothing unless this incarnation opened it at that
        leader epoch. One statement for them all."""
        node = self.node
        try:
            with trio.move_on_after(node.config.lease_ttl / 3):
                await node.metadata.close_streams(
                    [(key[0], key[1], epoch) for key, epoch in handed_over], node.node_id,
                    streams.node_epoch)
        except md.MetadataError as exc:  # the new leaders open after the grace anyway
            log.info("closing the streams of %d partitions failed: %s", len(handed_over), exc)

    async def _open_all(self, streams: Streams, to_open: list) -> None:
        """Seed 000's "opening a bucket" for each partition, planned from its stream state
        read now (one statement per OPEN_BATCH): each dead opener fenced once, however many
        of its partitions come here (a failover moves thousands), then the opens in batches
        of OPEN_BATCH, one round trip each, those needing a fresh leader epoch included."""
        node = self.node
        membership = node.membership
        try:
            states = {}
            for start in range(0, len(to_open), OPEN_BATCH):
                states.update(await node.metadata.stream_states(
                    [key for key, _, _ in to_open[start:start + OPEN_BATCH]]))
        except md.MetadataError as exc:  # the next sync tries again
            log.warning("reading the stream states of %d partitions failed: %s",
                        len(to_open), exc)
            return
        now = trio.current_time()
        live_epochs = {b.node_id: b.epoch for b in node.view.brokers.values()}
        planned: list[tuple[tuple[uuid.UUID, int], TopicInfo, int, OpenPlan]] = []
        for key, topic, p in to_open:
            state = states.get(key)
            if state is None or state.leader_node != node.node_id:
                continue  # deleted or moved meanwhile: the view catches up
            stream = StreamInView(state.leader_epoch, state.stream_state == "open",
                                  state.opened_by_node, state.opened_by_epoch,
                                  state.open_leader_epoch)
            # A draining opener handed the partition over on purpose: no grace. Waiting
            # would buy nothing: its commits at the old leader epoch are refused anyway.
            opener = (node.view.brokers.get(state.opened_by_node)
                      if state.opened_by_node else None)
            grace = 0.0 if opener is not None and opener.draining else self.held_by_grace
            plan = plan_open(stream, node.node_id, membership.node_epoch, live_epochs,
                             now - self._held_by.get(key, now), grace)
            if plan.held_by:
                self._held_by.setdefault(key, now)  # the other node has not seen the move
                continue
            self._held_by.pop(key, None)
            planned.append((key, topic, state.leader_epoch, plan))
        # Opened by a dead node: fence its epoch first, so its late commits are refused.
        fenced = await self._fence({plan.fence for *_, plan in planned if plan.fence})
        ready = [(key, topic, epoch, plan.fresh_epoch) for key, topic, epoch, plan in planned
                 if plan.fence is None or plan.fence in fenced]
        limiter = trio.CapacityLimiter(OPEN_CONCURRENCY)
        async with trio.open_nursery() as nursery:
            for start in range(0, len(ready), OPEN_BATCH):
                nursery.start_soon(self._open_batch, limiter, streams,
                                   ready[start:start + OPEN_BATCH])

    async def _fence(self, fences: set[tuple[int, int]]) -> set[tuple[int, int]]:
        """fence_node for each (node, node epoch) once; those fenced (or past already)."""
        done = set()
        for fence in sorted(fences):
            try:
                await self.node.metadata.fence_node(*fence)
                done.add(fence)
            except md.NodeAlive:
                pass  # its opener came back to life: the next sync plans again
            except md.MetadataError as exc:
                log.warning("fencing node %d at epoch %d failed: %s", *fence, exc)
        return done

    async def _open_batch(self, limiter: trio.CapacityLimiter, streams: Streams,
                          batch: list[tuple[tuple[uuid.UUID, int], TopicInfo, int, bool]]
                          ) -> None:
        async with limiter:
            if not self._still(streams):
                return  # this node stopped leading meanwhile
            names = {key: topic.name for key, topic, _, _ in batch}
            # Opened before at this very epoch (by this node before a restart, or by the
            # node just fenced): a fresh leader epoch tells clients the log may differ. Its
            # own fenced operation (node epoch, leadership, expected leader epoch), not a
            # coordinator action: no coordinator action runs without its epoch.
            fresh = {key for key, _, _, is_fresh in batch if is_fresh}
            try:
                results = await streams.open_many(
                    [(key[0], key[1], epoch) for key, _, epoch, _ in batch], fresh)
            except md.MetadataError as exc:  # the next sync tries again
                log.warning("opening %d partitions failed: %s", len(batch), exc)
                return
            refused = {key: exc for key, exc in results.items() if isinstance(exc, Exception)}
            for key, exc in refused.items():
                log.info("not opening %s-%d: %s", names[key], key[1], exc)
            if len(refused) < len(results):
                self._announce_change()  # a Produce waiting for one goes on

    def _still(self, streams: Streams) -> bool:
        """Whether the incarnation that started an open is still the current one."""
        return self.node.membership.leading and self.node.streams is streams


def _brokers(nodes: list[md.NodeInfo]) -> dict[int, BrokerInfo]:
    return {n.node_id: BrokerInfo(n.node_id, n.host, n.port, n.rack, n.epoch,
                                  tuple((e[0], e[2], e[3]) for e in n.endpoints),
                                  n.draining is not None)
            for n in nodes}


def _topic_info(t: md.TopicView, defaults: dict[str, str]) -> TopicInfo:
    return TopicInfo(t.topic_id, t.name, tuple(
        PartitionInfo(p.partition, p.leader_node, p.leader_epoch) for p in t.partitions),
        dict(t.config)).with_defaults(defaults)


def view_from_snapshot(snapshot: md.View, defaults: dict[str, str] | None = None,
                       ) -> ClusterView:
    return ClusterView(
        version=snapshot.version,
        cluster_id=snapshot.cluster_id,
        brokers=_brokers(snapshot.nodes),
        topics={t.name: _topic_info(t, defaults or {}) for t in snapshot.topics},
        coordinator=snapshot.coordinator,
    )
