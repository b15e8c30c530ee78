"""The lifecycle loops of a node (seed 000's "lifecycle loops", seed 001's "expiry" and
"collection"); the operations they run are in `mink/storage/lifecycle/`.

- Retention, every `log_retention_check_interval_ms`, for each topic whose writer lease
  this node holds (`leases.py`), fenced by that lease's epoch: the log start of each
  partition moves past what `retention.ms` / `retention.bytes` no longer keep.
- Log starts: a partition's leader learns a log start moved by retention on another node
  from a NOTIFY on 'mink_log_start' (a wake-up; no change-log row per partition) and reads
  the log starts of what it leads; a slow poll is the backstop. DeleteRecords runs on the
  leader itself.
- Collection, on the cluster coordinator (WAL objects hold the batches of many topics, so
  no one writer lease owns them): objects unreferenced for `file.delete.delay.ms` are
  queued, deleted from the store in batches, and the metadata rows that describe nothing
  retained any more are pruned.
"""

from __future__ import annotations

import logging

import trio

from mink.broker.cluster.leases import topic_of
from mink.broker.topics.config import (
    InvalidConfig,
    deletes_by_retention,
    effective_topic_setting,
)
from mink.storage import controlplane as md
from mink.storage.lifecycle import store as lifecycle
from mink.storage.objectstore import ObjectStoreError

log = logging.getLogger(__name__)

# The backstop poll of the leaders' log starts, in seconds (a missed NOTIFY).
LOG_START_POLL = 10.0
# Collection: keys per round trip, deletions in flight on stores without batch deletes.
COLLECT_BATCH = 1000
DELETE_CONCURRENCY = 16
# Metadata kept after the objects it describes are gone: WAL decisions for 5 minutes
# (CommitWal repeats come only from their writer, within its commit timeout; later ones carry
# a fenced node epoch), change-log versions for 5 minutes and at least the newest 100 (nodes
# follow the view by its deltas; one whose version is older than what is kept, e.g. after a
# long PostgreSQL outage, reads the whole view once instead).
DECISIONS_KEPT_S = 300.0
CHANGE_LOG_KEPT = 100


class LifecycleLoops:
    def __init__(self, node) -> None:
        self.node = node
        self.log_starts_learnt = 0  # how many times a leader moved a log start it learnt

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.retention_loop)
            nursery.start_soon(self.log_start_loop)
            nursery.start_soon(self.collection_loop)

    # -- retention (writer leases) ----------------------------------------------------------

    async def retention_loop(self) -> None:
        while True:
            await trio.sleep(self.node.config.log_retention_check_interval_ms / 1000)
            try:
                await self.retention_round()
            except md.MetadataUnavailable as exc:
                log.warning("retention round skipped: %s", exc)
            except Exception:  # a lifecycle loop's trouble must never take the node down
                log.exception("retention round failed")

    async def retention_round(self) -> dict[str, dict[int, int]]:
        """Retention of every topic this node holds the writer lease of. Returns topic name
        -> {partition: new log start} for what moved."""
        node = self.node
        moved_all: dict[str, dict[int, int]] = {}
        for scope, epoch in list(node.leases.held.items()):
            if not scope.startswith("writer/"):
                continue
            topic = node.view.topic_by_id(topic_of(scope))
            if topic is None or not deletes_by_retention(topic.config):
                continue  # cleanup.policy=compact alone: no retention by time or size
            try:
                retention_ms = effective_topic_setting(topic.config, "retention.ms", node.config)
                retention_bytes = effective_topic_setting(topic.config, "retention.bytes",
                                                          node.config)
            except InvalidConfig as exc:  # stored configs were validated: should not happen
                log.error("topic %s: retention not applied: %s", topic.name, exc)
                continue
            if retention_ms < 0 and retention_bytes < 0:
                continue
            try:
                moved = await lifecycle.apply_retention(
                    node.metadata, topic.topic_id, scope, node.node_id, epoch, retention_ms,
                    retention_bytes)
            except md.StaleEpoch:
                node.leases.held.pop(scope, None)  # the lease moved: its new holder does it
                continue
            if moved:
                moved_all[topic.name] = moved
                log.info("retention moved the log start of %s: %s", topic.name, moved)
                self._learn(topic.topic_id, moved)
        return moved_all

    def _learn(self, topic_id, moved: dict[int, int]) -> None:
        streams = self.node.streams
        if streams is None:
            return
        for partition, start in moved.items():
            partition_log = streams.get(topic_id, partition)
            if partition_log is not None and partition_log.advance_log_start(start):
                self.log_starts_learnt += 1

    # -- log starts (leaders) ---------------------------------------------------------------

    async def log_start_loop(self) -> None:
        while True:
            try:
                async with self.node.metadata.listen(lifecycle.LOG_START_CHANNEL) as wakeups:
                    while True:
                        try:
                            await self.refresh_log_starts()
                        except md.MetadataUnavailable as exc:
                            log.warning("log start refresh failed: %s", exc)
                        except Exception:
                            log.exception("log start refresh failed")
                        with trio.move_on_after(LOG_START_POLL):
                            await wakeups.wait()
            except* md.MetadataUnavailable as group:
                log.warning("log-start listener unavailable: %s", group.exceptions[0])
            except* Exception as group:
                log.error("log-start listener failed: %r", group.exceptions[0])
            await trio.sleep(1.0)

    async def refresh_log_starts(self) -> None:
        node = self.node
        streams = node.streams
        if streams is None or not node.membership.leading:
            return
        for topic_id, partition, start in await lifecycle.led_log_starts(node.metadata,
                                                                          node.node_id):
            partition_log = streams.get(topic_id, partition)
            if partition_log is not None and partition_log.advance_log_start(start):
                self.log_starts_learnt += 1

    # -- collection (cluster coordinator) ---------------------------------------------------

    async def collection_loop(self) -> None:
        while True:
            delay_ms = self.node.config.file_delete_delay_ms
            await trio.sleep(min(30.0, max(1.0, delay_ms / 4000)))
            if not self.node.coordinator.is_holder:
                continue
            try:
                await self.collect()
            except md.MetadataUnavailable as exc:
                log.warning("collection skipped: %s", exc)
            except ObjectStoreError as exc:
                log.warning("collection stopped: %s", exc)
            except Exception:
                log.exception("collection failed")

    async def collect(self) -> dict[str, int]:
        """One collection round; returns how many objects and metadata rows went."""
        node = self.node
        metadata, config = node.metadata, node.config
        queued = 0
        while True:
            keys = await lifecycle.queue_unreferenced(metadata, config.file_delete_delay_ms,
                                                      COLLECT_BATCH)
            queued += len(keys)
            if len(keys) < COLLECT_BATCH:
                break
        deleted = 0
        while keys := await lifecycle.due_deletions(metadata, COLLECT_BATCH):
            await delete_objects(node.objects, keys)
            await lifecycle.deletions_done(metadata, keys)
            deleted += len(keys)
            if len(keys) < COLLECT_BATCH:
                break
        pruned = await lifecycle.prune_metadata(
            metadata, keep_s=DECISIONS_KEPT_S, change_log_keep=CHANGE_LOG_KEPT,
            producer_expiration_ms=config.producer_id_expiration_ms, limit=10 * COLLECT_BATCH)
        if deleted or any(pruned.values()):
            log.info("collection: %d objects deleted; metadata rows pruned: %s", deleted,
                     {k: v for k, v in pruned.items() if v})
        return {"queued": queued, "objects": deleted, **pruned}


async def delete_objects(objects, keys: list[str]) -> None:
    """Delete keys from the store in batches (S3 DeleteObjects) where the store can, else a
    few at a time. Deleting an absent key is no error, so a repeat after a crash is safe."""
    delete_many = getattr(objects, "delete_many", None)
    if delete_many is not None:
        await delete_many(keys)
        return
    limiter = trio.CapacityLimiter(DELETE_CONCURRENCY)
    errors: list[Exception] = []

    async def one(key: str) -> None:
        async with limiter:
            try:
                await objects.delete(key)
            except ObjectStoreError as exc:
                errors.append(exc)

    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(one, key)
    if errors:
        raise errors[0]
