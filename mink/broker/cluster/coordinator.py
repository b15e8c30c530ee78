"""The cluster coordinator (seed 000, "Assignment" and "Coordinator failover").

Every node competes for the coordinator lease in PostgreSQL; only its holder runs the tick.
The tick re-leads partitions whose leader is not live, or is draining (a clean stop, or
`mink cluster drain`), to the least-loaded live node that is not draining (lowest id on
ties, loads updated after each move) and serves `mink cluster rebalance` requests. Every
LeadBucket it issues carries the lease epoch, so a coordinator that lost the lease cannot
move anything. A draining node does not take the lease; a draining holder moves its own
partitions first, then releases the lease for another node to take.

A change of the view (a node draining, the lease released) wakes the tick at once instead of
at the next `coordinator_tick`: a controlled shutdown is done in well under a second.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter

import trio

from mink.storage import controlplane as md
from mink.storage.controlplane import MetadataUnavailable, StaleEpoch
from mink.storage.objectstore import ObjectStoreError

log = logging.getLogger(__name__)

COORDINATOR_LEASE = "coordinator"


Move = tuple[uuid.UUID, int, int, int]  # topic id, partition, new leader, expected epoch


def _partitions(view: md.View):
    for topic in view.topics:
        for p in topic.partitions:
            yield topic, p


def _targets(view: md.View) -> list[int]:
    """The nodes new leadership may go to: the live nodes not draining; every live node when
    all of them drain (orphans of dead nodes must still go somewhere)."""
    taking = sorted(n.node_id for n in view.nodes if n.draining is None)
    return taking or sorted(n.node_id for n in view.nodes)


def orphans_in(view) -> bool:
    """Whether the node's view (`ClusterView`) has a partition plan_orphan_moves would move:
    one without a leader, or led by a node that is not live or drains while another may
    take it. From the view's partitions-per-leader count, not a scan."""
    taking = set(view.assignable) or set(view.brokers)
    return bool(taking) and any(leader not in taking for leader in view.leader_counts())


def plan_orphan_moves(view: md.View, loads: Counter | None = None) -> list[Move]:
    """Partitions whose leader is not live, or drains, go to the least-loaded live node that
    does not drain. A draining node keeps its partitions while no other node may take them."""
    targets = _targets(view)
    if not targets:
        return []
    if loads is None:
        loads = Counter({node_id: 0 for node_id in targets})
        for _, p in _partitions(view):
            if p.leader_node in loads:
                loads[p.leader_node] += 1
    moves = []
    for topic, p in _partitions(view):
        if p.leader_node not in loads:  # dead, or draining while another node takes work
            target = min(targets, key=lambda n: (loads[n], n))
            loads[target] += 1
            moves.append((topic.topic_id, p.partition, target, p.leader_epoch))
    return moves


def plan_rebalance(view: md.View) -> list[Move]:
    """Orphans (and draining nodes' partitions) first, then from nodes above 110% of the mean
    load to nodes below 90%; draining nodes take no part."""
    live = _targets(view)
    if not live:
        return []
    loads = Counter({node_id: 0 for node_id in live})
    led: dict[int, list] = {node_id: [] for node_id in live}
    for topic, p in _partitions(view):
        if p.leader_node in loads:
            loads[p.leader_node] += 1
            led[p.leader_node].append((topic.topic_id, p.partition, p.leader_epoch))
    moves = plan_orphan_moves(view, loads)
    mean = sum(loads.values()) / len(live)
    high, low = 1.1 * mean, 0.9 * mean

    def move(source: int, target: int) -> None:
        topic_id, partition, epoch = led[source].pop()
        loads[source] -= 1
        loads[target] += 1
        moves.append((topic_id, partition, target, epoch))

    # Nodes above 110% of the mean give to the least loaded, and nodes below 90% take from
    # the most loaded, as long as no move pushes the other side out of the band.
    while True:
        source = max(live, key=lambda n: (loads[n], -n))
        target = min(live, key=lambda n: (loads[n], n))
        if not led[source] or loads[source] - loads[target] < 2:
            break
        if (loads[source] > high and loads[target] + 1 <= high) or (
                loads[target] < low and loads[source] - 1 >= low):
            move(source, target)
        else:
            break
    return moves


# The garbage collector (a lifecycle loop) runs every this many ticks.
COLLECT_EVERY_TICKS = 10
COLLECT_BATCH = 1000


class ClusterCoordinator:
    def __init__(self, node) -> None:
        self.node = node
        self.lease_epoch: int | None = None
        self._ticks = 0
        self._wake = trio.Event()  # set: tick now, not at the next coordinator_tick

    @property
    def is_holder(self) -> bool:
        return self.lease_epoch is not None

    async def run(self) -> None:
        while True:
            try:
                await self.hold_lease()
                if self.is_holder:
                    await self.tick()
                if (self.is_holder and self._draining() and self._leads_nothing()
                        and self.node.view.assignable):
                    # Its own partitions moved (by this very tick): hand the lease over.
                    await self.release()
                    log.info("node %d drains: coordinator lease released for another node",
                             self.node.node_id)
            except MetadataUnavailable as exc:
                log.warning("coordinator tick skipped: %s", exc)
            except md.MetadataError as exc:
                # e.g. this node's epoch was fenced while it registers again: not a holder.
                log.warning("coordinator tick refused: %s", exc)
                self.lease_epoch = None
            except ObjectStoreError as exc:
                log.warning("garbage collection stopped: %s", exc)
            with trio.move_on_after(self.node.config.coordinator_tick):
                await self._wake.wait()
            self._wake = trio.Event()

    def wake(self) -> None:
        """Tick now (a node drains, the lease was released), not at the next tick."""
        self._wake.set()

    def on_view(self, view) -> None:
        """Called by the sync at every view refresh (`ClusterView`): a holder that sees a
        draining node still leading something (and a node to move it to) ticks at once; a
        node that sees no holder tries to take the lease at once."""
        if self.is_holder:
            draining = {b.node_id for b in view.brokers.values() if b.draining}
            if draining and view.assignable and any(view.leads_any(n) for n in draining):
                self.wake()
        elif view.coordinator is None and (not self._draining() or not view.assignable):
            self.wake()

    def _draining(self) -> bool:
        return self.node.draining

    def _leads_nothing(self) -> bool:
        return not self.node.view.leads_any(self.node.node_id)

    async def hold_lease(self) -> None:
        node = self.node
        ttl = node.config.lease_ttl
        if not node.membership.leading:
            self.lease_epoch = None
            return
        if self.lease_epoch is None:
            if self._draining() and node.view.assignable:
                # A draining node takes no new work, coordinating included, while another
                # node may (when every live node drains, somebody must still coordinate).
                return
            self.lease_epoch = await node.metadata.acquire_lease(
                COORDINATOR_LEASE, node.node_id, node.membership.node_epoch, ttl_s=ttl)
            if self.lease_epoch is not None:
                log.info("node %d is the cluster coordinator (lease epoch %d)", node.node_id,
                         self.lease_epoch)
            return
        try:
            await node.metadata.renew_lease(COORDINATOR_LEASE, node.node_id, self.lease_epoch,
                                            ttl_s=ttl)
        except StaleEpoch:
            log.warning("node %d lost the coordinator lease", node.node_id)
            self.lease_epoch = None

    def drop(self) -> None:
        """Stop acting as coordinator (this node stopped leading)."""
        self.lease_epoch = None

    async def release(self) -> None:
        if self.lease_epoch is not None:
            epoch, self.lease_epoch = self.lease_epoch, None
            await self.node.metadata.release_lease(COORDINATOR_LEASE, self.node.node_id, epoch)

    async def tick(self) -> None:
        # The whole view is read from PostgreSQL only when the node's own (kept current by
        # deltas) shows a partition to move: an idle tick costs one look per leader.
        if orphans_in(self.node.view):
            view = await self.node.metadata.view()
            live = {n.node_id for n in view.nodes}
            moves = plan_orphan_moves(view)
            sources = {(t.topic_id, p.partition): p.leader_node for t, p in _partitions(view)}
            # Partitions of dead nodes, then those of draining nodes (a controlled shutdown
            # or `mink cluster drain`: logged as such).
            await self._apply([m for m in moves if sources[m[:2]] not in live], "orphaned")
            await self._apply([m for m in moves if sources[m[:2]] in live], "drain")
        for request_id in await self.node.metadata.pending_cluster_requests("rebalance"):
            moves = plan_rebalance(await self.node.metadata.view())
            if not await self._apply(moves, "rebalance"):
                return  # refused or deposed: the request stays pending for the next holder
            await self.node.metadata.finish_cluster_request(request_id, {"moves": len(moves)})
        self._ticks += 1
        if self._ticks % COLLECT_EVERY_TICKS == 1:
            await self.collect_garbage()

    async def move_leaders(self, moves: list[Move], why: str) -> bool:
        """Leadership moves asked for by an admin request (AlterPartitionReassignments,
        ElectLeaders), applied as a rebalance applies its own: one fenced LeadBucket each,
        all in one transaction, under the lease epoch. Whether they were applied."""
        return await self._apply(moves, why)

    async def collect_garbage(self) -> int:
        """Delete WAL objects no index row uses any more (their topics were deleted) and the
        uploads that were never committed (queued when their writer learnt it). Returns how
        many objects were deleted."""
        metadata, objects = self.node.metadata, self.node.objects
        unreferenced = await metadata.unreferenced_objects(COLLECT_BATCH)
        if unreferenced:
            await metadata.queue_for_deletion(unreferenced, "no index row uses it")
        deleted = 0
        while queued := await metadata.pending_deletions(COLLECT_BATCH):
            keys = [key for key, _ in queued]
            for key in keys:
                await objects.delete(key)  # idempotent: a repeat after a crash is harmless
            await metadata.deletions_done(keys)
            deleted += len(keys)
            if len(keys) < COLLECT_BATCH:
                break
        if deleted:
            log.info("garbage collection deleted %d objects", deleted)
        return deleted

    async def _apply(self, moves: list[Move], why: str) -> bool:
        """LeadBucket for every move, under the lease epoch; whether they were applied."""
        if not moves:
            return True
        # Read the epoch only now, after the awaits that planned the moves: drop() (this node
        # stopped leading meanwhile) leaves None, and a deposed coordinator must not act.
        # PostgreSQL refuses a missing epoch too (missing_coordinator_epoch).
        epoch = self.lease_epoch
        if epoch is None or not self.node.membership.leading:
            log.warning("%d %s moves not applied: this node is no longer the coordinator",
                        len(moves), why)
            return False
        try:
            await self.node.metadata.lead_partitions(moves, coordinator_epoch=epoch)
        except StaleEpoch as exc:
            # Lost the lease, or a partition moved meanwhile: the next tick starts afresh.
            log.warning("%s moves refused: %s", why, exc)
            if exc.reason in ("stale_coordinator_epoch", "missing_coordinator_epoch"):
                self.lease_epoch = None
            return False
        names = {t.topic_id: t.name for t in self.node.view.topics.values()}
        event = "failover" if why == "orphaned" else why
        for topic_id, partition, leader, _ in moves:  # one line per leadership move
            name = names.get(topic_id, str(topic_id))
            log.info("%s: %s-%d now led by node %d", event, name, partition, leader,
                     extra={"event": event, "topic": name, "topic_id": str(topic_id),
                            "partition": partition, "to_node": leader})
        await self.node.sync.refresh_view()
        return True
