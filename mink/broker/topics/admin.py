"""Topic admin: creating and deleting topics and partitions, and auto-creation.

Topic and partition creation and deletion are coordinator actions (seed 000): done by the
coordinator lease holder under its lease epoch. Handlers forward them to the holder
(`mink.broker.server.forwarding`); these methods refuse with NotClusterCoordinator on any
other node. Auto-creation (auto.create.topics.enable) runs on any node: the holder creates,
any other node sends a CreateTopics request to the holder.

This room sits below `cluster/` and `server/` (both import topic rules from it), so it
imports neither: it reaches the coordinator through the node, and the node's wiring hands
it the forwarder.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from mink.broker.topics.config import validate_topic_config
from mink.protocol.topics import topic_name_error
from mink.storage import controlplane as md
from mink.storage.controlplane import MetadataUnavailable, StaleEpoch

log = logging.getLogger(__name__)


class NotClusterCoordinator(Exception):
    """A coordinator action reached a node that does not hold the coordinator lease."""


class TopicAdmin:
    def __init__(self, node,
                 forward_auto_create: Callable[[object, list[str], object], Awaitable[None]]
                 ) -> None:
        self.node = node
        # Sends auto-created names to the coordinator as a CreateTopics request in an
        # Envelope from the asking client
        # (`mink.broker.server.forwarding.auto_create_via_coordinator`).
        self._forward_auto_create = forward_auto_create

    def assign_leaders(self, partitions: int, first: int = 0) -> list[int]:
        """Seed 000: partition i goes to live node (i + start) % n, start from the clock so
        consecutive topics begin on different nodes. Draining nodes get none (unless every
        live node drains: then they all count, so a topic can still be created)."""
        node = self.node
        live = node.view.assignable or sorted(node.view.brokers) or [node.node_id]
        start = int(time.time() * 1000) % len(live)
        return [live[(first + i + start) % len(live)] for i in range(partitions)]

    def _coordinator_epoch(self) -> int:
        node = self.node
        if not node.coordinator.is_holder:
            raise NotClusterCoordinator(f"node {node.node_id} is not the cluster coordinator")
        return node.coordinator.lease_epoch

    async def _coordinator_action(self, action, refresh: bool = True):
        node = self.node
        try:
            result = await action(self._coordinator_epoch())
        except StaleEpoch as exc:
            if exc.reason == "stale_coordinator_epoch":
                node.coordinator.drop()
                raise NotClusterCoordinator("the coordinator lease moved") from None
            raise
        if refresh:
            await self.refresh_after_actions()
        return result

    async def refresh_after_actions(self) -> None:
        """The view with what the coordinator actions just did (their callers answer once
        this node shows it)."""
        try:
            await self.node.sync.refresh_view()
        except MetadataUnavailable as exc:  # done: the sync task catches up
            log.warning("view refresh after a coordinator action failed: %s", exc)

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str],
                           leaders: list[int] | None = None, *, refresh: bool = True):
        """`refresh=False`: the caller creates several and refreshes the view once after
        them (refresh_after_actions); a refresh reads the whole view, so one per topic of
        a 50-topic CreateTopics made creation grow with the partitions that exist."""
        metadata = self.node.metadata
        config = validate_topic_config(configs)
        leaders = leaders if leaders is not None else self.assign_leaders(partitions)
        return await self._coordinator_action(lambda epoch: metadata.create_topic(
            name, partitions, config, leaders, coordinator_epoch=epoch), refresh)

    async def create_partitions(self, name: str, total: int, leaders: list[int]):
        metadata = self.node.metadata
        return await self._coordinator_action(lambda epoch: metadata.create_partitions(
            name, total, leaders, coordinator_epoch=epoch))

    async def delete_topic(self, name: str | None = None, *, topic_id=None):
        metadata = self.node.metadata
        return await self._coordinator_action(lambda epoch: metadata.delete_topic(
            name, topic_id=topic_id, coordinator_epoch=epoch))

    async def auto_create_topics(self, names: list[str], ctx) -> None:
        """auto.create.topics.enable: unknown, valid names become topics of num.partitions,
        created by the coordinator (forwarded there from any other node, as the client of
        `ctx`, whose Metadata or Produce request asked for them)."""
        node = self.node
        if not node.config.auto_create_topics_enable:
            return
        missing = [n for n in dict.fromkeys(names)
                   if n not in node.view.topics and topic_name_error(n) is None]
        if not missing:
            return
        if not node.coordinator.is_holder:
            await self._forward_auto_create(node, missing, ctx)
            await self._try_refresh()
            return
        for name in missing:
            try:
                await self.create_topic(name, node.config.num_partitions, {})
                log.info("auto-created topic %s with %d partitions", name,
                         node.config.num_partitions)
            except md.TopicExists:
                await self._try_refresh()
            except (NotClusterCoordinator, MetadataUnavailable) as exc:
                log.warning("could not auto-create topic %s: %s", name, exc)

    async def _try_refresh(self) -> None:
        try:
            await self.node.sync.refresh_view()
        except MetadataUnavailable as exc:
            log.warning("view refresh failed: %s", exc)
