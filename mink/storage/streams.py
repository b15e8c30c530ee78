"""The partitions this node has open, sharing one WAL writer and one set of read caches."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import trio

from mink.storage.controlplane import MetadataError
from mink.storage.lifecycle.store import mark_wal_settled, undecided_keys, wal_marks
from mink.storage.log import LogError, NotLeader, PartitionLog, ReadCaches
from mink.storage.objectstore.base import WAL_PREFIX
from mink.storage.observer import NO_OBSERVER, StorageObserver
from mink.storage.producer_state import RefusedSequences, decode_entry
from mink.storage.wal import WalWriter, wal_key

log = logging.getLogger(__name__)

# Keys settled per transaction at start-up (Streams.settle_orphans).
SETTLE_PAGE = 1000
# More unsettled earlier epochs than this (a node's first start since wal_settled existed):
# one listing of the node's whole prefix instead of one per epoch.
SETTLE_EPOCH_LISTINGS = 64


class Streams:
    def __init__(self, node_id: int, node_epoch: int, objects, metadata, *,
                 wal_max_bytes: int = 8 * 1024 * 1024, wal_max_delay: float = 0.0,
                 wal_max_uploads: int = 1, wal_concurrent_upload_min_bytes: int = 0,
                 commit_timeout: float = 10.0,
                 tail_cache_bytes: int = 256 * 1024 * 1024,
                 block_cache_bytes: int = 256 * 1024 * 1024,
                 on_node_fenced: Callable[[], None] | None = None,
                 observer: StorageObserver = NO_OBSERVER,
                 refused_sequences: RefusedSequences | None = None) -> None:
        self.node_id = node_id
        self.refused_sequences = (RefusedSequences() if refused_sequences is None
                                  else refused_sequences)
        self.observer = observer
        self.node_epoch = node_epoch
        self.metadata = metadata
        self.caches = ReadCaches(metadata, objects, tail_cache_bytes, block_cache_bytes)
        self.wal = WalWriter(node_id, node_epoch, objects, metadata, max_bytes=wal_max_bytes,
                             max_delay=wal_max_delay, max_uploads=wal_max_uploads,
                             concurrent_upload_min_bytes=wal_concurrent_upload_min_bytes,
                             commit_timeout=commit_timeout, on_fenced=self._on_fenced,
                             observer=observer)
        self.logs: dict[tuple[uuid.UUID, int], PartitionLog] = {}
        # Logs a refused commit closed (the partition moved, or its stream was taken), by
        # the leader epoch they were open at: their streams may still be marked open by this
        # node, which the sync undoes once the view shows where they went.
        self.closed_here: dict[tuple[uuid.UUID, int], int] = {}
        self.fenced = trio.Event()  # set when a commit was refused; the owner resyncs
        # Called when a commit says this node's epoch is stale: every partition is lost.
        self.on_node_fenced = on_node_fenced or (lambda: None)
        self._scope = trio.CancelScope()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.caches.run_read_ahead)  # stream object reads
                    await self.wal.run(task_status=task_status)
                    nursery.cancel_scope.cancel()
        finally:
            self._close_all()

    def stop(self) -> None:
        """Close every log now and stop the WAL writer (its in-flight commits finish or
        time out first: they are shielded)."""
        self.wal.stop()
        self._close_all()
        self._scope.cancel()

    def _close_all(self) -> None:
        for partition_log in list(self.logs.values()):
            partition_log.close(NotLeader("this node stopped leading"))
        self.logs.clear()

    def get(self, topic_id: uuid.UUID, partition: int) -> PartitionLog | None:
        return self.logs.get((topic_id, partition))

    async def open(self, topic_id: uuid.UUID, partition: int, leader_epoch: int) -> PartitionLog:
        """OpenStream at `leader_epoch`: the fence. Raises the metadata store's refusal."""
        current = self.logs.get((topic_id, partition))
        if current is not None and current.closed is None:
            if current.leader_epoch == leader_epoch:
                return current
            current.close(NotLeader("reopened at a new leader epoch"))
        # The producer states come from the same transaction as the open, after the
        # partition-row lock (a late commit of an earlier opener is in both or refused).
        state, producers = await self.metadata.open_stream_with_producers(
            topic_id, partition, leader_epoch, self.node_id, self.node_epoch)
        return self._opened(topic_id, partition, leader_epoch, state, producers)

    async def open_many(self, opens: list[tuple[uuid.UUID, int, int]],
                        fresh: set[tuple[uuid.UUID, int]] | frozenset = frozenset()
                        ) -> dict[tuple[uuid.UUID, int], PartitionLog | MetadataError]:
        """`open` for many (topic id, partition, leader epoch) in one round trip, those in
        `fresh` at a fresh leader epoch (relead_own_partition first, expecting the one
        given); each partition's refusal is its own entry. Those open at that epoch already
        stay."""
        out: dict[tuple[uuid.UUID, int], PartitionLog | MetadataError] = {}
        todo = []
        for topic_id, partition, leader_epoch in opens:
            current = self.logs.get((topic_id, partition))
            if current is not None and current.closed is None and (
                    current.leader_epoch == leader_epoch) and (topic_id, partition) not in fresh:
                out[(topic_id, partition)] = current
            else:
                todo.append((topic_id, partition, leader_epoch))
        if todo:
            results = await self.metadata.open_streams_with_producers(
                todo, self.node_id, self.node_epoch, fresh)
            for key, result in results.items():
                if isinstance(result, MetadataError):
                    out[key] = result
                else:
                    state, producers = result
                    out[key] = self._opened(key[0], key[1], state.open_leader_epoch, state,
                                            producers)
        return out

    def _opened(self, topic_id: uuid.UUID, partition: int, leader_epoch: int, state,
                producers) -> PartitionLog:
        """The log of a stream PostgreSQL just opened for this node at `leader_epoch`."""
        current = self.logs.get((topic_id, partition))
        if current is not None and current.closed is None:
            current.close(NotLeader("reopened at a new leader epoch"))
        opened = PartitionLog(topic_id, partition, leader_epoch, state.committed_end,
                              state.log_start_offset, self.wal, self.caches,
                              self.refused_sequences)
        opened.producers.load([decode_entry(s.producer_id, s.state) for s in producers])
        self.logs[(topic_id, partition)] = opened
        self.closed_here.pop((topic_id, partition), None)
        # One line per leadership change (here and in close / _on_fenced).
        log.info("leading %s-%d at leader epoch %d, offsets [%d, %d)", topic_id, partition,
                 leader_epoch, state.log_start_offset, state.committed_end,
                 extra={"event": "partition_opened", "topic_id": str(topic_id),
                        "partition": partition, "leader_epoch": leader_epoch})
        self.observer.partition_opened(topic_id, partition, leader_epoch)
        return opened

    def close(self, topic_id: uuid.UUID, partition: int, error: LogError | None = None) -> None:
        partition_log = self.logs.pop((topic_id, partition), None)
        if partition_log is not None:
            partition_log.close(error or NotLeader("partition closed on this node"))
            log.info("no longer leading %s-%d (leader epoch %d)", topic_id, partition,
                     partition_log.leader_epoch,
                     extra={"event": "partition_closed", "topic_id": str(topic_id),
                            "partition": partition,
                            "leader_epoch": partition_log.leader_epoch})
            self.observer.partition_closed(topic_id, partition, "moved")

    async def settle_orphans(self, objects) -> list[str]:
        """WAL objects this node uploaded under an earlier node epoch that were never
        committed (a crash between upload and commit): have them decided 'abandoned', so
        they can never become visible, and queued for deletion. Returns their keys.

        Only what PostgreSQL does not know is listed (wal_settled, sql/0009): epochs an
        earlier restart settled are skipped, and of the others only the objects after the
        sequence number their writer recorded as decided. So the cost follows the objects
        of the last seconds before a crash, not the history."""
        prefix = f"{WAL_PREFIX}{self.node_id}/"
        complete_through, marks = await wal_marks(self.metadata, self.node_id,
                                                  self.node_epoch)
        epochs = range(complete_through + 1, self.node_epoch)
        keys: list[str] = []
        if len(epochs) > SETTLE_EPOCH_LISTINGS:
            for key in await objects.list(prefix):
                epoch_text, _, seq_text = key[len(prefix):].partition("/")
                epoch = int(epoch_text)
                if epoch in epochs and int(seq_text or 0) > marks.get(epoch, 0):
                    keys.append(key)
        else:
            for epoch in epochs:
                after = marks.get(epoch, 0)
                keys += await objects.list(f"{prefix}{epoch}/",
                                           wal_key(self.node_id, epoch, after) if after else None)
        orphans: list[str] = []
        # Paged, and only what PostgreSQL has no decision for is settled (one advisory lock
        # per key, in one transaction per page).
        for start in range(0, len(keys), SETTLE_PAGE):
            undecided = await undecided_keys(self.metadata, keys[start:start + SETTLE_PAGE])
            if undecided:
                outcomes = await self.metadata.commit_outcome(undecided, settle=True)
                orphans += [key for key, outcome in outcomes.items() if outcome is None]
        if epochs:
            await mark_wal_settled(self.metadata, self.node_id, self.node_epoch - 1)
        if orphans:
            log.info("queued %d uncommitted WAL objects of earlier epochs for deletion",
                     len(orphans))
        return orphans

    def _on_fenced(self, partition_log: PartitionLog, reason: str) -> None:
        if self.logs.get(partition_log.key) is partition_log:
            del self.logs[partition_log.key]
            self.closed_here[partition_log.key] = partition_log.leader_epoch
            self.observer.partition_closed(partition_log.topic_id, partition_log.partition,
                                           reason)
        self.fenced.set()
        if reason == "stale_node_epoch":
            self.on_node_fenced()
