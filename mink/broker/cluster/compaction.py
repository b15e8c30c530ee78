"""The log cleaner (Kafka's LogCleaner thread; seed 000's "assembly"): every
`log_cleaner_backoff_ms`, each node looks at the compacted topics (cleanup.policy contains
compact) whose writer lease it holds and runs a pass on each partition that is due (the
storage side, and what "due" means, is `mink/storage/compaction/store.py`).

Every step of a pass carries the writer lease epoch: a node that lost the lease is refused
at its next step (nothing changes) and the new holder cleans the partition. A topic's
settings are read at each pass, so a changed setting applies at the next one.
"""

from __future__ import annotations

import logging
import time

import trio

from mink.broker.cluster.leases import topic_of
from mink.broker.topics.config import InvalidConfig, is_compacted, topic_setting
from mink.storage import controlplane as md
from mink.storage.compaction import cleaner
from mink.storage.compaction import store as compaction
from mink.storage.lifecycle.tiering import WriterFence
from mink.storage.objectstore import ObjectStoreError
from mink.storage.stream_object import StreamObjectError

log = logging.getLogger(__name__)


def compaction_settings(config: dict[str, str]) -> compaction.CompactionSettings:
    return compaction.CompactionSettings(
        delete_retention_ms=topic_setting(config, "delete.retention.ms"),
        min_compaction_lag_ms=topic_setting(config, "min.compaction.lag.ms"),
        max_compaction_lag_ms=topic_setting(config, "max.compaction.lag.ms"),
        min_cleanable_dirty_ratio=topic_setting(config, "min.cleanable.dirty.ratio"))


class LogCleaner:
    def __init__(self, node) -> None:
        self.node = node
        # What this node's passes did, for tests, tools and the logs.
        self.passes = 0
        self.records_in = 0
        self.records_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.tombstones_dropped = 0
        self.bytes_read = 0       # from the object store, both scans of every pass
        self.objects_written = 0
        self.map_full_passes = 0  # passes that stopped where their offset map filled
        self.failures = 0         # passes that failed (store errors, undecodable data)
        self.refused: dict[str, int] = {}
        # (topic id, partition) -> its dirty ratio at this node's last look, of the
        # partitions whose writer lease it held then (a gauge per partition).
        self.dirty_ratios: dict[tuple, float] = {}
        # Per compacted partition led here: the passes whose swaps its caches have seen.
        self._passes_seen: dict[tuple, int] = {}

    async def run(self) -> None:
        backoff_ms = self.node.config.log_cleaner_backoff_ms
        if backoff_ms < 0:
            return
        while True:
            await trio.sleep(backoff_ms / 1000)
            try:
                await self.round()
            except md.MetadataUnavailable as exc:
                log.warning("log cleaner round skipped: %s", exc)
            except Exception:  # a background loop's trouble must never take the node down
                log.exception("log cleaner round failed")

    async def round(self) -> list[compaction.PassOutcome]:
        """One look at every compacted topic this node holds the writer lease of; then the
        tail caches of the compacted partitions it leads forget what was compacted."""
        node = self.node
        done: list[compaction.PassOutcome] = []
        if not node.membership.leading:
            return done
        await self._passes(done)
        await self.forget_compacted_tails()
        return done

    async def forget_compacted_tails(self) -> None:
        """A pass may run on another node (the writer-lease holder) than the partition's
        leader: the leader learns how far each of its compacted partitions was compacted
        from PostgreSQL, and its tail cache drops the records as produced below that, so a
        consumer from there reads the compacted objects."""
        node, streams = self.node, self.node.streams
        if streams is None:
            return
        led = []
        for topic in node.view.topics.values():
            if is_compacted(topic.config):
                led += [(topic.topic_id, p) for p in range(len(topic.partitions))
                        if streams.get(topic.topic_id, p) is not None]
        for key, (cleaned_to, passes) in (
                await compaction.cleaned_offsets(node.metadata, led)).items():
            partition_log = streams.get(*key)
            if partition_log is None or self._passes_seen.get(key) == passes:
                continue
            partition_log.forget_tail_below(cleaned_to)
            # The index rows a reader of this partition last used may be the ones a pass
            # swapped away (same offsets, another object): ask the index again.
            partition_log.caches.forget_rows(key)
            self._passes_seen[key] = passes

    async def _passes(self, done: list[compaction.PassOutcome]) -> None:
        node = self.node
        ratios: dict[tuple, float] = {}
        try:
            await self._held_passes(done, ratios)
        finally:
            self.dirty_ratios = ratios

    async def _held_passes(self, done: list[compaction.PassOutcome],
                           ratios: dict[tuple, float]) -> None:
        node = self.node
        for scope, epoch in list(node.leases.held.items()):
            if not scope.startswith("writer/"):
                continue
            topic = node.view.topic_by_id(topic_of(scope))
            if topic is None or not is_compacted(topic.config):
                continue
            try:
                settings = compaction_settings(topic.config)
            except InvalidConfig as exc:  # validated when stored: should not happen
                log.error("topic %s: not compacted: %s", topic.name, exc)
                continue
            fence = WriterFence(node.node_id, epoch)
            for partition in range(len(topic.partitions)):
                started = trio.current_time()

                def observe(ratio: float, key=(topic.topic_id, partition)) -> None:
                    ratios[key] = ratio

                try:
                    outcome = await compaction.compact_partition(
                        node.metadata, node.objects, topic.topic_id, partition, fence,
                        settings, int(time.time() * 1000),
                        object_bytes=node.config.tiering_stream_object_bytes,
                        map_bytes=node.config.log_cleaner_dedupe_buffer_size,
                        observe_ratio=observe)
                except md.StaleEpoch as exc:  # the lease moved: its new holder cleans
                    self._refused(exc.reason)
                    node.leases.held.pop(scope, None)
                    break
                except compaction.CompactionRefused as exc:
                    self._refused(exc.reason)
                    log.info("compaction of %s-%d refused: %s", topic.name, partition,
                             exc.reason)
                    continue
                except (md.MetadataError, ObjectStoreError, StreamObjectError,
                        cleaner.CleanerError) as exc:
                    self.failures += 1
                    log.warning("compaction of %s-%d failed: %r", topic.name, partition, exc)
                    continue
                if outcome is not None:
                    node.metrics.compaction_pass(trio.current_time() - started)
                    self._account(outcome)
                    done.append(outcome)
                    log.info("compacted %s-%d [%d, %d] to %d: %d -> %d records, %d -> %d "
                             "bytes in %d objects, %d tombstones dropped%s", topic.name,
                             partition, outcome.base_offset, outcome.last_offset,
                             outcome.cleaned_to, outcome.records_in, outcome.records_out,
                             outcome.bytes_in, outcome.bytes_out, outcome.objects,
                             outcome.tombstones_dropped,
                             " (offset map full)" if outcome.map_full else "",
                             extra={"event": "compaction_pass"})

    def _refused(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def _account(self, outcome: compaction.PassOutcome) -> None:
        self.passes += 1
        self.records_in += outcome.records_in
        self.records_out += outcome.records_out
        self.bytes_in += outcome.bytes_in
        self.bytes_out += outcome.bytes_out
        self.tombstones_dropped += outcome.tombstones_dropped
        self.bytes_read += outcome.read_bytes
        self.objects_written += outcome.objects
        self.map_full_passes += outcome.map_full
