"""Background work spread over the nodes by leases (seed 001, "Leases" and "Sharing").

Every lease_ttl / 3 each node applies the same rule: a topic's writer lease goes to the live
node that prefers it most. A node's preference for a lease is a hash of its id and the
lease's scope (rendezvous hashing): every node computes the same preferences. Each lease has
an epoch that PostgreSQL checks on every write made under it.

Work that writes a partition's stream stays on its leader. Under a writer lease a node keeps
the topic's statistics, applies its retention (`lifecycle.py`), compacts it (`compaction.py`)
and tiers the partitions the coordinator hands it (`tiering.py`).

Seed 001's partition leases (per-partition work that only reads streams) are not taken: no
work runs under them (a compacted partition's KV tablet lives on its leader), and holding one
per partition wrote a row per partition every round however idle the cluster (issue 22).
What a round writes follows what changed: one statement renews every lease the node holds,
a lease is taken only where it is free, statistics rows only where a figure moved.
"""

from __future__ import annotations

import hashlib
import logging
import uuid

import trio

from mink.storage import controlplane as md
from mink.storage.controlplane import MetadataUnavailable

log = logging.getLogger(__name__)


def preference(node_id: int, scope: str) -> int:
    digest = hashlib.blake2b(f"{node_id}/{scope}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def writer_scope(topic_id) -> str:
    return f"writer/{topic_id}"


def topic_of(scope: str) -> uuid.UUID:
    return uuid.UUID(scope.split("/")[1])


class BackgroundLeases:
    def __init__(self, node) -> None:
        self.node = node
        self.held: dict[str, int] = {}  # scope -> lease epoch
        # scope -> the node preferring it most, for the live set it was computed with
        self._preferred: dict[str, int] = {}
        self._preferred_for: tuple[int, ...] = ()

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
        """Take these free leases in one round trip (a lease another node holds stays
        its own)."""
        node = self.node
        epochs = await node.metadata.acquire_leases(scopes, node.node_id,
                                                    node.membership.node_epoch,
                                                    ttl_s=node.config.lease_ttl)
        for scope in scopes:
            epoch = epochs.get(scope)
            if epoch is not None:
                self.held[scope] = epoch

    async def _renew(self) -> None:
        """Every lease held, in one statement; those not renewed were lost."""
        node = self.node
        renewed = await node.metadata.renew_leases(dict(self.held), node.node_id,
                                                   node.membership.node_epoch,
                                                   ttl_s=node.config.lease_ttl)
        for scope in [s for s in self.held if s not in renewed]:
            del self.held[scope]
            log.info("lost lease %s", scope)

    async def _release(self, scope: str) -> None:
        epoch = self.held.pop(scope, None)
        if epoch is not None:
            await self.node.metadata.release_lease(scope, self.node.node_id, epoch)

    def _preferred_node(self, scope: str, live: tuple[int, ...]) -> int:
        if live != self._preferred_for:
            self._preferred, self._preferred_for = {}, live
        preferred = self._preferred.get(scope)
        if preferred is None:
            preferred = self._preferred[scope] = max(live, key=lambda n: preference(n, scope))
        return preferred

    async def round(self) -> None:
        node = self.node
        if not node.membership.leading:
            self.held.clear()  # they expire by themselves; a new incarnation starts afresh
            return
        view = node.view
        live = tuple(sorted(view.brokers))
        if node.node_id not in live:
            return
        await self._renew()
        wanted: list[str] = []
        scopes = set()
        for topic in view.topics.values():
            scope = writer_scope(topic.topic_id)
            scopes.add(scope)
            if self._preferred_node(scope, live) == node.node_id:
                if scope not in self.held:
                    wanted.append(scope)
            elif scope in self.held:
                await self._release(scope)  # give it to the node that prefers it most
        for scope in [s for s in self.held if s not in scopes]:
            await self._release(scope)  # the topic is gone
        if wanted:
            await self._acquire(wanted)
        await self._work()

    async def _work(self) -> None:
        """The work hosted by writer leases: each topic's statistics, fenced by the lease,
        in one statement for every topic held."""
        writers = {topic_of(scope): epoch for scope, epoch in self.held.items()
                   if scope.startswith("writer/")}
        if writers:
            await self.node.metadata.write_topics_stats(writers, self.node.node_id)
