"""KV tablets on the leaders of compacted partitions (seed 000 "Opening a bucket", "Failover"
step 4; the table is `mink/storage/compaction/tablet.py`).

For each partition of a compacted topic this node leads, one task: restore the newest
snapshot (none: an empty tablet from the log start), replay the committed log from its
offset to the high watermark, then mark the tablet caught up and follow the commits. Produce
and Fetch never wait for any of it: only key lookups do, so failover time does not grow with
the number of keys. Every `kv_snapshot_records` records or `kv_snapshot_interval_ms` (with
something new) the tablet is snapshotted to the object store and referenced under the
partition's leader epoch (sql/0021_kv_snapshots.sql). The task ends when the partition's log
closes (leadership moved); the next leader restores on its own.

A lookup (`lookup`) reflects every write acknowledged before it began: it waits until the
tablet has applied everything below the high watermark it saw at its start.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

import trio

from mink.broker.topics.config import is_compacted
from mink.protocol.records import iter_batches, iter_records
from mink.storage.compaction import snapshots
from mink.storage.compaction.tablet import KVTablet
from mink.storage.controlplane.postgres import IDEMPOTENT, READ
from mink.storage.log import LogError, OffsetOutOfRange

log = logging.getLogger(__name__)

READ_BYTES = 1 << 20
# How often the keeper looks for compacted partitions this node newly leads, besides when the
# partition sync tells it it opened some (`partitions_opened`): for a topic altered to compact.
TABLET_CHECK_INTERVAL_S = 0.5
SQL_PUBLISH_ADMIN = """
UPDATE nodes SET admin_host = %s, admin_port = %s WHERE node_id = %s RETURNING node_id"""
SQL_ADMIN_OF = """
SELECT admin_host, admin_port FROM nodes WHERE node_id = %s AND expires_at > now()"""


@dataclass(eq=False)
class PartitionTablet:
    partition_log: object
    tablet: KVTablet | None = None
    caught_up: trio.Event = field(default_factory=trio.Event)
    applied: trio.Event = field(default_factory=trio.Event)  # set at each step forward
    restored_from: int | None = None  # the snapshot's offset, None: from the log start
    snapshots: int = 0
    started_at: float | None = None       # trio clock, when its restore began
    restore_seconds: float | None = None  # from then to caught up


@dataclass(frozen=True)
class Lookup:
    status: str  # found, not_found, not_leader, loading, unknown_topic
    value: bytes | None = None
    offset: int | None = None
    leader: int | None = None


class TabletKeeper:
    def __init__(self, node) -> None:
        self.node = node
        self.tablets: dict[tuple[uuid.UUID, int], PartitionTablet] = {}
        self._opened = trio.Event()
        self._compacted_of = None  # the view snapshot _compacted was found in
        self._compacted: list = []

    def partitions_opened(self) -> None:
        """The partition sync opened partitions here: look for new compacted ones now."""
        self._opened.set()

    async def run(self) -> None:
        published_epoch = None
        async with trio.open_nursery() as nursery:
            while True:
                self._opened = trio.Event()  # (before the look: an open during it is seen)
                self._start_missing(nursery)
                epoch = self.node.membership.node_epoch
                if epoch and epoch != published_epoch:
                    published_epoch = epoch if await self._publish_admin_address() else None
                with trio.move_on_after(TABLET_CHECK_INTERVAL_S):
                    await self._opened.wait()

    async def _publish_admin_address(self) -> bool:
        """Record this node's admin listener in its nodes row, where a node forwarding a
        lookup finds it (sql/0021). True once written (or when there is no listener)."""
        node = self.node
        bound = getattr(node, "admin_address", None)
        if bound is None:
            return node.config.admin_address() is None
        host, port = bound
        if host in ("0.0.0.0", "::", ""):
            host = node.advertised[0]
        try:
            await node.metadata.fetch_all(IDEMPOTENT, SQL_PUBLISH_ADMIN,
                                          (host, port, node.node_id))
        except Exception as exc:  # noqa: BLE001 - retried at the next round
            log.info("admin address not published: %r", exc)
            return False
        return True

    async def admin_address_of(self, node_id: int) -> tuple[str, int] | None:
        row = await self.node.metadata.fetch_one(READ, SQL_ADMIN_OF, (node_id,))
        return None if row is None or row[0] is None else (row[0], row[1])

    def _compacted_topics(self) -> list:
        """The view's compacted topics, looked for once per view snapshot (a look every
        TABLET_CHECK_INTERVAL_S over 100,000 topics is not free)."""
        view = self.node.view
        if self._compacted_of is not view:
            self._compacted_of = view
            self._compacted = [t for t in view.topics.values() if is_compacted(t.config)]
        return self._compacted

    def _start_missing(self, nursery) -> None:
        streams = self.node.streams
        if streams is None:
            return
        for topic in self._compacted_topics():
            for p in range(len(topic.partitions)):
                partition_log = streams.get(topic.topic_id, p)
                key = (topic.topic_id, p)
                kept = self.tablets.get(key)
                if partition_log is None or partition_log.closed is not None:
                    continue
                if kept is not None and kept.partition_log is partition_log:
                    continue
                entry = PartitionTablet(partition_log)
                self.tablets[key] = entry
                nursery.start_soon(self._keep, key, entry)

    async def _keep(self, key: tuple[uuid.UUID, int], entry: PartitionTablet) -> None:
        node, partition_log = self.node, entry.partition_log
        topic_id, partition = key
        try:
            started = entry.started_at = trio.current_time()
            tablet = None
            try:
                tablet = await snapshots.restore_latest(node.metadata, node.objects, topic_id,
                                                        partition)
            except Exception as exc:  # noqa: BLE001 - an unreadable snapshot: replay it all
                log.warning("tablet snapshot of %s-%d not restored: %r", topic_id, partition,
                            exc)
            if tablet is None:
                tablet = KVTablet(next_offset=partition_log.log_start_offset)
            else:
                entry.restored_from = tablet.next_offset
            entry.tablet = tablet
            since_snapshot, last_snapshot = 0, time.monotonic()
            config = node.config
            while True:
                if partition_log.closed is not None:
                    return
                target = partition_log.committed_end
                if tablet.next_offset >= target:
                    if not entry.caught_up.is_set():
                        log.info("tablet of %s-%d caught up at %d in %.2f s (%d keys; "
                                 "snapshot at %s)", topic_id, partition, tablet.next_offset,
                                 trio.current_time() - started, len(tablet),
                                 entry.restored_from)
                        entry.restore_seconds = trio.current_time() - started
                        entry.caught_up.set()
                    due = (since_snapshot >= config.kv_snapshot_records or (
                        since_snapshot and time.monotonic() - last_snapshot
                        >= config.kv_snapshot_interval_ms / 1000))
                    if due:
                        await self._snapshot(key, entry)
                        since_snapshot, last_snapshot = 0, time.monotonic()
                    with trio.move_on_after(max(0.05, config.kv_snapshot_interval_ms / 1000)):
                        await partition_log.wait_for_data(tablet.next_offset)
                    continue
                try:
                    chunks = await partition_log.read(tablet.next_offset, READ_BYTES)
                except OffsetOutOfRange:
                    if tablet.next_offset < partition_log.log_start_offset:
                        tablet.next_offset = partition_log.log_start_offset
                        continue
                    raise
                if not chunks:
                    await trio.sleep(0.05)  # a gap the next read fills
                    continue
                for chunk in chunks:
                    for header, batch in iter_batches(chunk):
                        before = tablet.next_offset
                        tablet.apply(batch)
                        since_snapshot += max(0, tablet.next_offset - before)
                    await trio.lowlevel.checkpoint()
                entry.applied.set()
                entry.applied = trio.Event()
        except LogError as exc:
            log.info("tablet of %s-%d stops: %s", topic_id, partition, exc)
        finally:
            if self.tablets.get(key) is entry:
                del self.tablets[key]

    async def _snapshot(self, key, entry: PartitionTablet) -> None:
        node, partition_log = self.node, entry.partition_log
        try:
            status = await snapshots.write_snapshot(
                node.metadata, node.objects, key[0], key[1], partition_log.leader_epoch,
                node.node_id, node.membership.node_epoch, entry.tablet)
        except Exception as exc:  # noqa: BLE001 - the next one is due soon
            log.warning("tablet snapshot of %s-%d not written: %r", key[0], key[1], exc)
            return
        if status == "stored":
            entry.snapshots += 1

    # -- lookups ---------------------------------------------------------------------------

    async def lookup(self, topic_name: str, partition: int, key: bytes,
                     timeout: float = 10.0) -> Lookup:
        """The latest value of `key` in the partition, as of every write acknowledged
        before this call: found (value, offset), not_found, or why not (not_leader: ask
        `leader`; loading: the tablet is still restoring or replaying, retry)."""
        node = self.node
        topic = node.view.topics.get(topic_name)
        if topic is None or not 0 <= partition < len(topic.partitions) \
                or not is_compacted(topic.config):
            return Lookup("unknown_topic")
        entry = self.tablets.get((topic.topic_id, partition))
        if entry is None or entry.partition_log.closed is not None:
            leader = topic.partitions[partition].leader
            if leader == node.node_id:  # led here, the tablet not started yet: retriable
                return Lookup("loading")
            return Lookup("not_leader", leader=leader)
        if not entry.caught_up.is_set():
            return Lookup("loading")
        partition_log = entry.partition_log
        high_watermark = partition_log.committed_end  # every acknowledged write is below
        with trio.move_on_after(timeout):
            while entry.tablet.next_offset < high_watermark:
                await entry.applied.wait()
        if entry.tablet.next_offset < high_watermark:
            return Lookup("loading")
        found = entry.tablet.get(key)
        if found is None or found.tombstone:
            return Lookup("not_found")
        value = await _record_at(partition_log, found.offset, key)
        if value is _MISSING:  # compacted away meanwhile, or a digest collision
            return Lookup("not_found")
        return Lookup("found", value, found.offset)


_MISSING = object()


async def _record_at(partition_log, offset: int, key: bytes):
    """The value of the record at `offset` if its key is `key`, else _MISSING."""
    try:
        chunks = await partition_log.read(offset, 1)
    except OffsetOutOfRange:
        return _MISSING
    for chunk in chunks:
        for header, batch in iter_batches(chunk):
            if header.last_offset < offset:
                continue
            for record in iter_records(batch):
                if header.base_offset + record.offset_delta == offset:
                    return record.value if record.key == key else _MISSING
            return _MISSING
    return _MISSING


__all__ = ["Lookup", "PartitionTablet", "TabletKeeper"]
