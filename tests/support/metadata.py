"""A metadata store for tests and tools that act as the cluster coordinator.

No coordinator action runs unfenced (PostgreSQL refuses a missing coordinator epoch). Tests
that create topics or move leaders without running a coordinator use this store: a
coordinator action called without an epoch takes the coordinator lease for the call (held by
no node; reused if one is live already) and releases it when no such call is left running.
"""

from __future__ import annotations

import trio

from mink.storage.controlplane import MetadataStore
from mink.storage.controlplane.postgres import WRITE

_TAKE = """
INSERT INTO leases AS l (scope, holder, holder_epoch, epoch, acquired_at, expires_at)
VALUES ('coordinator', NULL, NULL, 1, now(), now() + interval '60 seconds')
ON CONFLICT (scope) DO UPDATE
    SET epoch = l.epoch + 1, holder = NULL, holder_epoch = NULL, acquired_at = now(),
        expires_at = now() + interval '60 seconds'
  WHERE l.expires_at <= now()
RETURNING epoch"""
_LIVE = "SELECT epoch FROM leases WHERE scope = 'coordinator' AND expires_at > now()"
_RELEASE = """
UPDATE leases SET expires_at = '-infinity'
 WHERE scope = 'coordinator' AND epoch = %s AND holder IS NULL RETURNING epoch"""


class ToolMetadataStore(MetadataStore):
    _tool_users = 0
    _tool_epoch: int | None = None
    _tool_owned = False

    async def _with_tool_epoch(self, call):
        if self._tool_users == 0:
            self._tool_users += 1
            try:
                for _ in range(100):
                    row = await self.fetch_one(WRITE, _LIVE)
                    if row is not None:
                        self._tool_epoch, self._tool_owned = row[0], False
                        break
                    row = await self.fetch_one(WRITE, _TAKE)
                    if row is not None:
                        self._tool_epoch, self._tool_owned = row[0], True
                        break
                    await trio.sleep(0.01)
                else:
                    raise RuntimeError("could not take the coordinator lease for a test")
            except BaseException:
                self._tool_users -= 1
                raise
        else:
            self._tool_users += 1
            while self._tool_epoch is None:
                await trio.sleep(0.001)
        try:
            return await call(self._tool_epoch)
        finally:
            self._tool_users -= 1
            if self._tool_users == 0:
                epoch, owned = self._tool_epoch, self._tool_owned
                self._tool_epoch, self._tool_owned = None, False
                if owned:
                    with trio.CancelScope(shield=True):
                        await self.fetch_one(WRITE, _RELEASE, (epoch,))

    async def create_topic(self, *args, coordinator_epoch=None, **kwargs):
        if coordinator_epoch is not None:
            return await super().create_topic(*args, coordinator_epoch=coordinator_epoch,
                                              **kwargs)
        return await self._with_tool_epoch(lambda epoch: super(ToolMetadataStore, self)
                                           .create_topic(*args, coordinator_epoch=epoch,
                                                         **kwargs))

    async def delete_topic(self, *args, coordinator_epoch=None, **kwargs):
        if coordinator_epoch is not None:
            return await super().delete_topic(*args, coordinator_epoch=coordinator_epoch,
                                              **kwargs)
        return await self._with_tool_epoch(lambda epoch: super(ToolMetadataStore, self)
                                           .delete_topic(*args, coordinator_epoch=epoch,
                                                         **kwargs))

    async def create_partitions(self, *args, coordinator_epoch=None, **kwargs):
        if coordinator_epoch is not None:
            return await super().create_partitions(*args, coordinator_epoch=coordinator_epoch,
                                                   **kwargs)
        return await self._with_tool_epoch(lambda epoch: super(ToolMetadataStore, self)
                                           .create_partitions(*args, coordinator_epoch=epoch,
                                                              **kwargs))

    async def lead_partition(self, topic_id, partition, node_id, coordinator_epoch=None,
                             **kwargs):
        if coordinator_epoch is not None:
            return await super().lead_partition(topic_id, partition, node_id,
                                                coordinator_epoch, **kwargs)
        return await self._with_tool_epoch(lambda epoch: super(ToolMetadataStore, self)
                                           .lead_partition(topic_id, partition, node_id, epoch,
                                                           **kwargs))

    async def lead_partitions(self, moves, coordinator_epoch=None):
        if coordinator_epoch is not None:
            return await super().lead_partitions(moves, coordinator_epoch)
        return await self._with_tool_epoch(lambda epoch: super(ToolMetadataStore, self)
                                           .lead_partitions(moves, epoch))
