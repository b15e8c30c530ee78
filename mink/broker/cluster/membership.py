"""Membership (seed 000, "Node membership"): a node registers (node epoch + 1), renews every
lease_ttl / 3, and stops acting as a leader once lease_ttl minus a margin has passed since it
sent its last successful renewal (self-fencing, on the monotonic clock). A refused renewal (its
epoch was fenced) makes it close everything, register again with a new epoch and resync,
without a process restart.

`Membership` holds what the node is in the cluster right now (its node epoch, whether it may
lead) and the two loops that keep it true: the renewal loop and the validity watchdog. Both
run in the node's nursery (`mink.broker.node`).
"""

from __future__ import annotations

import logging
import uuid

import trio

from mink.storage import controlplane as md
from mink.storage.controlplane import MetadataUnavailable, StaleEpoch
from mink.storage.streams import Streams

log = logging.getLogger(__name__)


class Membership:
    def __init__(self, node) -> None:
        self.node = node
        config = node.config
        self.node_epoch = 0
        # This process: a registration of this node id by another live process is refused.
        self.incarnation = uuid.uuid4()
        # False while this node may not act as a leader: before it registered, and after it
        # could not renew its membership in time (self-fencing).
        self.leading = False
        self.last_renewal_sent = 0.0  # trio clock: when the last successful renewal was sent
        # Others may take this node's partitions lease_ttl after its last successful renewal
        # was sent; it stops acting as a leader a margin before that (self-fencing).
        self.lease_margin = max(0.5, config.lease_ttl / 10)
        # Registrations and renewals go over a connection of their own (`open_store`), so
        # they never queue in the node's pool behind the data path's statements (index
        # lookups of a catch-up read, commits, tiering): a renewal waiting for a pooled
        # connection past its deadline fenced a busy node that PostgreSQL would have renewed.
        self.store: md.MetadataStore | None = None

    async def open_store(self) -> None:
        node = self.node
        self.store = await md.MetadataStore.open(
            node.metadata.conninfo, min_size=1, max_size=1, migrate=False,
            timeout=node.metadata.timeout, op_timeout=node.metadata.op_timeout,
            name="mink-membership")

    async def close_store(self) -> None:
        store, self.store = self.store, None
        if store is not None:
            await store.aclose()

    @property
    def _metadata(self) -> md.MetadataStore:
        return self.store if self.store is not None else self.node.metadata

    @property
    def valid_until(self) -> float:
        """Trio clock: the end of the validity of this node's membership, derived from the
        send time of its last successful renewal."""
        return self.last_renewal_sent + self.node.config.lease_ttl - self.lease_margin

    def may_lead(self) -> bool:
        """Whether this node may act as a leader right now. Checked by every handler without
        awaiting anything: the renewal loop (or a hung PostgreSQL call in it) cannot make
        the node act past its validity deadline."""
        return self.leading and trio.current_time() < self.valid_until

    async def renewal_loop(self) -> None:
        """Renew the membership every lease_ttl / 3. A node whose last successful renewal was
        sent more than lease_ttl minus a margin ago stops acting as a leader (others may
        take its partitions by then); once PostgreSQL answers again it registers anew.
        A refused renewal (its epoch was fenced) also makes it start again, without a
        process restart."""
        node = self.node
        ttl = node.config.lease_ttl
        while True:
            if self.leading:
                await trio.sleep_until(self.last_renewal_sent + ttl / 3)
            sent = trio.current_time()
            fence_at = self.valid_until
            was_leading = self.leading
            deadline = min(sent + ttl / 3, fence_at) if was_leading else sent + ttl / 3
            renewed = False
            with trio.move_on_at(deadline) as cut:
                try:
                    if was_leading:
                        await self._metadata.heartbeat(node.node_id, self.node_epoch,
                                                       ttl_s=ttl)
                        # A heartbeat that returned only after this node stopped leading (a
                        # hung call; the watchdog fenced it) renews nothing: register anew.
                        if self.leading:
                            self.last_renewal_sent = sent
                            renewed = True
                    else:
                        await self.register()  # only the registration races the deadline
                        renewed = True
                except StaleEpoch:
                    log.error("membership renewal refused: epoch %d was fenced",
                              self.node_epoch)
                    self.stop_leading("fenced")
                except MetadataUnavailable as exc:
                    log.warning("membership renewal failed: %s", exc)
                except md.NodeIdInUse as exc:
                    log.error("node id %d is in use by another live process (%s:%s, renewed "
                              "%.1fs ago); not registering while it lives", node.node_id,
                              exc.host, exc.port, exc.renewed_s_ago or 0.0)
            if cut.cancelled_caught:
                # A call PostgreSQL did not answer in time (a row lock held by a takeover, a
                # paused or restarting server) leaves no error of its own: say so.
                log.warning("membership %s unanswered after %.1fs: cut at its deadline",
                            "renewal" if was_leading else "registration",
                            trio.current_time() - sent)
            if renewed:
                if not self.leading:
                    try:
                        await self.start_streams()
                    except md.MetadataError as exc:  # leading already: the sync loop catches up
                        log.warning("reopening after registering again: %s", exc)
                continue
            if self.leading and trio.current_time() >= fence_at:
                self.stop_leading("membership not renewed within lease_ttl")
            await trio.sleep(min(1.0, ttl / 6))

    async def fencing_watchdog(self) -> None:
        """Stop leading at the validity deadline even while the renewal loop is stuck in a
        PostgreSQL call that does not return (a query cancel that blocks: move_on_at cannot
        bound it). Handlers check the deadline themselves (may_lead); this closes the
        partitions and stops the coordinator on time."""
        while True:
            if self.leading and trio.current_time() >= self.valid_until:
                self.stop_leading(
                    f"membership not renewed within lease_ttl minus {self.lease_margin:.1f}s "
                    "(validity deadline passed)")
            if self.leading:
                await trio.sleep_until(self.valid_until)
            else:
                await trio.sleep(0.05)

    def stop_leading(self, why: str) -> None:
        """Self-fencing: close every partition, stop coordinating; requests get retriable
        errors until this node registers again."""
        node = self.node
        if not self.leading:
            return
        log.error("node %d stops leading: %s", node.node_id, why,
                  extra={"event": "fence", "reason": why})
        self.leading = False
        node.coordinator.drop()
        if node.streams is not None:
            streams, node.streams = node.streams, None
            streams.stop()
            if node.nursery is not None:
                # Appends in WAL objects on their way get their real outcome, read back
                # once PostgreSQL answers, not a guess (or a REQUEST_TIMED_OUT).
                node.nursery.start_soon(streams.wal.settle_after_stop)

    async def start_streams(self) -> None:
        """Lead at the epoch just registered: a fresh `Streams` (its WAL writes under this
        node epoch) in the node's nursery, the coordinator lease tried, the view applied."""
        node = self.node
        config = node.config
        delay = config.effective_wal_max_delay_ms() / 1000
        node.streams = Streams(
            node.node_id, self.node_epoch, node.objects, node.metadata,
            wal_max_bytes=config.wal_max_bytes, wal_max_delay=delay,
            wal_max_uploads=config.effective_wal_max_concurrent_uploads(),
            wal_concurrent_upload_min_bytes=config.effective_wal_concurrent_upload_min_bytes(),
            commit_timeout=config.commit_timeout, observer=node.metrics.storage,
            refused_sequences=node.refused_sequences,
            on_node_fenced=lambda: self.stop_leading("a WAL commit found this node's epoch fenced"))
        await node.nursery.start(node.streams.run)
        node.nursery.start_soon(_settle_orphans, node, node.streams)
        self.leading = True
        await node.coordinator.hold_lease()
        await node.sync.refresh_view()

    async def register_at_start(self) -> None:
        """Register; while another incarnation of this node id looks alive, try again until
        it has not renewed for longer than the guard (a process restarted right after a
        crash gets in within about 1.5 renewal intervals). A process that keeps renewing is
        a real duplicate: NodeIdInUse is raised and this process does not start."""
        ttl = self.node.config.lease_ttl
        give_up_at = trio.current_time() + 1.5 * ttl / 3 + ttl / 3
        while True:
            try:
                await self.register()
                return
            except md.NodeIdInUse:
                if trio.current_time() >= give_up_at:
                    raise
                await trio.sleep(min(0.25, ttl / 12))

    async def register(self) -> None:
        node = self.node
        host, port = node.advertised
        sent = trio.current_time()
        ttl = node.config.lease_ttl
        # Another incarnation renewed within about 1.5 renewal intervals is alive: refused.
        # A crashed one stops renewing, so a restart after a SIGKILL is accepted soon.
        self.node_epoch = await self._metadata.register_node(
            node.node_id, host, port, rack=node.config.rack, ttl_s=ttl,
            incarnation=self.incarnation, guard_s=1.5 * ttl / 3)
        self.last_renewal_sent = sent
        log.info("node %d registered at epoch %d, advertising %s:%d", node.node_id,
                 self.node_epoch, host, port)


async def _settle_orphans(node, streams: Streams) -> None:
    try:
        await streams.settle_orphans(node.objects)
    except Exception as exc:  # garbage collection will find them later
        log.warning("could not settle uncommitted WAL objects of earlier epochs: %s", exc)
