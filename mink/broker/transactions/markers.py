"""Transaction markers: each partition's leader writes the markers decided for it.

A decided transaction (PrepareCommit / PrepareAbort in PostgreSQL) leaves one row per
partition in `txn_markers`. Every node writes the rows of the partitions it leads: a control
batch appended through its WAL like any batch, whose producer state tells PostgreSQL, in the
WAL commit's transaction, that the marker is durable (the row goes; the transaction completes
with its last marker). A new leader finds the rows left by the old one at its next round, so
a failover between the decision and the markers loses nothing and writes nothing twice.

A decision NOTIFYs `mink_txn_markers` (in 0012's mink_txn_write): every node LISTENs and
looks for its markers at once, so a partition led by a node that did not decide gets its
marker within a round trip, not at the next poll; the poll stays as the fallback (a lost
LISTEN connection, a leader that opened the partition after the decision).

A marker for a group's partition of `__consumer_offsets` is no batch: that partition's leader
is the group's coordinator, which applies the offsets the decision committed to its cache.
"""

from __future__ import annotations

import logging
import time

import trio

from mink.protocol.records import Record, build_batch
from mink.protocol.topics import OFFSETS_TOPIC
from mink.storage import controlplane as md
from mink.storage.controlplane.groups import Fence
from mink.storage.controlplane.transactions import NotTransactionCoordinator, PendingMarker
from mink.storage.log import AppendInDoubt, LogError
from mink.storage.producer_state import ABORT, COMMIT, ProducerAppend

log = logging.getLogger(__name__)

POLL_S = 0.5  # fallback: how often a node looks for markers without a NOTIFY
MARKERS_CHANNEL = "mink_txn_markers"  # NOTIFYed by a decision (0012_transactions.sql)
WRITE_TIMEOUT_S = 30.0
CONTROL_ABORT, CONTROL_COMMIT = 0, 1  # Kafka's ControlRecordType


def control_batch(producer_id: int, producer_epoch: int, commit: bool,
                  coordinator_epoch: int) -> bytes:
    """Kafka's end-transaction marker: one control record, key (version 0, type), value
    (version 0, coordinator epoch)."""
    key = (0).to_bytes(2, "big") + (CONTROL_COMMIT if commit else CONTROL_ABORT).to_bytes(
        2, "big")
    value = (0).to_bytes(2, "big") + coordinator_epoch.to_bytes(4, "big", signed=True)
    return build_batch([Record(0, 0, key, value)], producer_id=producer_id,
                       producer_epoch=producer_epoch, is_transactional=True, is_control=True)


class MarkerWriter:
    def __init__(self, node) -> None:
        self.node = node
        self._in_flight: set[tuple] = set()
        self._nursery: trio.Nursery | None = None
        # __consumer_offsets partition -> group markers being taken now
        self.group_markers_in_flight: dict[int, int] = {}
        self.written = 0  # markers made durable by this node (tests, metrics)

    def submit(self, markers: list[PendingMarker]) -> None:
        """Markers this node just decided: those of partitions it leads are written at once
        (the others wait for their leader's next round)."""
        nursery = self._nursery
        if nursery is None:
            return
        for marker in markers:
            key = (marker.topic_id, marker.partition, marker.producer_id)
            if key not in self._in_flight:
                self._in_flight.add(key)
                nursery.start_soon(self._write, marker, key)

    async def run(self) -> None:
        """Look for the markers due in the partitions this node leads at every NOTIFY of a
        decision and every POLL_S (those it decided itself were submitted at once)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                while True:
                    try:
                        async with self.node.metadata.listen(MARKERS_CHANNEL) as wakeups:
                            while True:
                                await self._round()
                                with trio.move_on_after(POLL_S):
                                    await wakeups.wait()
                    except* md.MetadataUnavailable as group:
                        log.warning("marker listener unavailable: %s", group.exceptions[0])
                    await self._round()
                    await trio.sleep(POLL_S)
        finally:
            self._nursery = None

    async def _round(self) -> None:
        try:
            markers = await self.node.transactions.store.pending_markers(self.node.node_id)
        except md.MetadataError as exc:
            log.debug("reading pending markers failed: %s", exc)
            return
        self.submit(markers)

    async def _write(self, marker: PendingMarker, key: tuple) -> None:
        try:
            topic = self.node.view.topic_by_id(marker.topic_id)
            if topic is None or not 0 <= marker.partition < len(topic.partitions):
                return
            partition_log = self.node.leader_log(topic, marker.partition)
            if partition_log is None:
                return  # not (yet) leading it: the next round, or the next leader
            if topic.name == OFFSETS_TOPIC:
                await self._group_marker(marker, partition_log)
                return
            batch = bytearray(control_batch(marker.producer_id, marker.producer_epoch,
                                            marker.commit, marker.coordinator_epoch))
            append = ProducerAppend(marker.producer_id, marker.producer_epoch, -1, -1,
                                    transactional=True,
                                    control=COMMIT if marker.commit else ABORT)
            pending = partition_log.append(batch, [1], int(time.time() * 1000), append)
            try:
                offset = await pending.wait(WRITE_TIMEOUT_S)
            except AppendInDoubt:
                # Its WAL object may still commit: looked for again now, the marker would be
                # written twice. It stays in flight until its outcome is known (never
                # guessed: the WAL writer reads it back if need be).
                log.info("marker of producer %d at %s-%d not durable after %.0f s: waiting "
                         "for its outcome", marker.producer_id, topic.name, marker.partition,
                         WRITE_TIMEOUT_S)
                await pending.done.wait()
                offset = await pending.wait()
            self.written += 1
            log.debug("%s marker of producer %d at %s-%d offset %d",
                      "commit" if marker.commit else "abort", marker.producer_id,
                      topic.name, marker.partition, offset)
        except LogError as exc:
            log.info("marker for %s-%d not written yet: %s", marker.topic_id,
                     marker.partition, exc)
        except (md.MetadataError, NotTransactionCoordinator, trio.TooSlowError) as exc:
            log.info("group marker not taken yet: %s", exc or "PostgreSQL did not answer")
        finally:
            self._in_flight.discard(key)

    async def _group_marker(self, marker: PendingMarker, partition_log) -> None:
        node = self.node
        fence = Fence(marker.topic_id, marker.partition, partition_log.leader_epoch,
                      node.node_id, node.membership.node_epoch)
        # From the moment PostgreSQL removes the pending offsets until the cache has them,
        # OffsetFetch(require_stable) must still answer UNSTABLE_OFFSET_COMMIT.
        self.group_markers_in_flight[marker.partition] = (
            self.group_markers_in_flight.get(marker.partition, 0) + 1)
        try:
            with trio.fail_after(WRITE_TIMEOUT_S):
                done = await node.transactions.store.group_marker(fence, marker.producer_id)
            node.groups.apply_transactional_offsets(done)
        finally:
            left = self.group_markers_in_flight.pop(marker.partition) - 1
            if left:
                self.group_markers_in_flight[marker.partition] = left
        self.written += 1
        log.debug("group marker of producer %d at %s-%d: %d offsets", marker.producer_id,
                  OFFSETS_TOPIC, marker.partition, len(done))
