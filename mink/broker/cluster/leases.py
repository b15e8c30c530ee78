"""Background work spread over the nodes by leases (seed 001, "Leases" and "Sharing").

Every lease_ttl / 3 each node applies the same rules:
- a topic's writer lease goes to the live node that prefers it most;
- a topic's partition share is ceil(partitions / live nodes); a node below its share takes
  free partition leases, most preferred first; a node above it gives back one lease of that
  topic per round; `max_partitions` caps the partition leases one node holds.
A node's preference for a lease is a hash of its id and the lease's scope (rendezvous
hashing): every node computes the same preferences. Each lease has an epoch that PostgreSQL
checks on every write made under it.

Work that writes a partition's stream stays on its leader. Under a writer lease a node keeps
the topic's statistics, applies its retention (`lifecycle.py`) and tiers the partitions the
coordinator hands it (`tiering.py`); partition
leases host per-partition work that only reads streams (none yet: KV tablet snapshots).
"""

from __future__ import annotations

import hashlib
import logging
import math
import uuid

import trio

from mink.storage import controlplane as md
from mink.storage.controlplane import MetadataUnavailable, StaleEpoch

log = logging.getLogger(__name__)


def preference(node_id: int, scope: str) -> int:
    digest = hashlib.blake2b(f"{node_id}/{scope}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def writer_scope(topic_id) -> str:
    return f"writer/{topic_id}"


def partition_scope(topic_id, partition: int) -> str:
    return f"partition/{topic_id}/{partition}"


def topic_of(scope: str) -> uuid.UUID:
    return uuid.UUID(scope.split("/")[1])


class BackgroundLeases:
    def __init__(self, node, max_partitions: int = 10_000) -> None:
        self.node = node
        self.max_partitions = max_partitions
        self.held: dict[str, int] = {}  # scope -> lease epoch

    async def run(self) -> None:
        interval = self.node.config.lease_ttl / 3
        while True:
            try:
                await self.round()
            except MetadataUnavailable as exc:
                log.warning("lease round skipped: %s", exc)
            except md.MetadataError as exc:
                log.warning("lease round refused: %s", exc)
                self.held.clear()
            await trio.sleep(interval)

    async def _acquire(self, scopes: list[str]) -> None:
        """Take (or renew) these leases in one round trip."""
        node = self.node
        epochs = await node.metadata.acquire_leases(scopes, node.node_id,
                                                    node.membership.node_epoch,
                                                    ttl_s=node.config.lease_ttl)
        for scope in scopes:
            epoch = epochs.get(scope)
            if epoch is None:
                if self.held.pop(scope, None) is not None:
                    log.info("lost lease %s", scope)
            else:
                self.held[scope] = epoch

    async def _release(self, scope: str) -> None:
        epoch = self.held.pop(scope, None)
        if epoch is not None:
            await self.node.metadata.release_lease(scope, self.node.node_id, epoch)

    async def round(self) -> None:
        node = self.node
        if not node.membership.leading:
            self.held.clear()  # they expire by themselves; a new incarnation starts afresh
            return
        view = node.view
        live = sorted(view.brokers)
        if node.node_id not in live:
            return
        holders = {lease.scope: lease.holder for lease in await node.metadata.leases()
                   if lease.live}
        await self._acquire(list(self.held))  # renew what we hold
        topics = {t.topic_id for t in view.topics.values()}
        for scope in [s for s in self.held if topic_of(s) not in topics]:
            await self._release(scope)  # the topic is gone
        wanted: list[str] = []
        for topic in view.topics.values():
            wanted += await self._writer_lease(topic, live, holders)
            wanted += await self._partition_leases(
                topic, live, holders, sum(1 for w in wanted if w.startswith("partition/")))
        await self._acquire(wanted)
        await self._work()

    async def _writer_lease(self, topic, live: list[int], holders: dict) -> list[str]:
        scope = writer_scope(topic.topic_id)
        preferred = max(live, key=lambda n: preference(n, scope))
        if preferred == self.node.node_id:
            if scope not in self.held and holders.get(scope) in (None, self.node.node_id):
                return [scope]
        elif scope in self.held:
            await self._release(scope)  # give it to the node that prefers it most
        return []

    async def _partition_leases(self, topic, live: list[int], holders: dict,
                                already_wanted: int) -> list[str]:
        me = self.node.node_id
        share = math.ceil(len(topic.partitions) / len(live))
        scopes = [partition_scope(topic.topic_id, p.index) for p in topic.partitions]
        mine = [s for s in scopes if s in self.held]
        if len(mine) > share:
            least = min(mine, key=lambda s: preference(me, s))
            await self._release(least)
            return []
        total_held = sum(1 for s in self.held if s.startswith("partition/")) + already_wanted
        free = sorted((s for s in scopes if s not in self.held and holders.get(s) is None),
                      key=lambda s: preference(me, s), reverse=True)
        return free[: max(0, min(share - len(mine), self.max_partitions - total_held))]

    async def _work(self) -> None:
        """The work hosted by writer leases: each topic's statistics, fenced by the lease."""
        for scope, epoch in list(self.held.items()):
            if not scope.startswith("writer/"):
                continue
            try:
                await self.node.metadata.write_topic_stats(topic_of(scope), scope,
                                                           self.node.node_id, epoch)
            except StaleEpoch:
                self.held.pop(scope, None)
