"""The tiering worker (seed 000): on the cluster coordinator, committed WAL data is rewritten
into per-partition stream objects so that WAL objects never pile up and a partition's
history is a few large sequential objects (the storage side, and every step of one stream
object, is `mink/storage/lifecycle/tiering.py`).

- Scheduled by the coordinator lease holder: every `tiering_delay_ms / 4` a round plans
  from the index (the rows still in WAL objects) and writes stream objects of about
  `tiering_stream_object_bytes`; a partition's rows wait for more data until their WAL
  object is half the delay old, so a committed WAL object is tiered within the delay.
- Every round carries the coordinator lease epoch, read once at its start: each upload is
  recorded and each swap done under it, so a round of a holder that lost the lease is
  refused at its next step and the new holder tiers the same rows again (seed 000,
  "Coordinator failover"). An upload of a round that died is deleted after
  `tiering_upload_timeout_ms`.
- Swapped WAL objects go to the lifecycle's collection (`lifecycle.py`), which deletes
  them after `file_delete_delay_ms`, as any other unreferenced object.
"""

from __future__ import annotations

import logging

import trio

from mink.storage import controlplane as md
from mink.storage.lifecycle import tiering
from mink.storage.objectstore import ObjectStoreError
from mink.storage.stream_object import StreamObjectError

log = logging.getLogger(__name__)


class TieringWorker:
    def __init__(self, node) -> None:
        self.node = node
        # What this node's rounds did, for tests and tools.
        self.rounds = 0
        self.stream_objects = 0
        self.refused = 0

    @property
    def interval(self) -> float:
        return max(0.05, self.node.config.tiering_delay_ms / 4000)

    async def run(self) -> None:
        if self.node.config.tiering_delay_ms < 0:
            return
        while True:
            await trio.sleep(self.interval)
            if not self.node.coordinator.is_holder:
                continue
            try:
                await self.round()
            except md.MetadataUnavailable as exc:
                log.warning("tiering round skipped: %s", exc)
            except Exception:  # a lifecycle loop's trouble must never take the node down
                log.exception("tiering round failed")

    async def round(self) -> dict[str, int]:
        """One round under the coordinator epoch this node holds now: how many stream
        objects were swapped, refused, failed; and uploads swept."""
        node, config = self.node, self.node.config
        epoch = node.coordinator.lease_epoch
        done = {"swapped": 0, "refused": 0, "failed": 0, "swept": 0}
        if epoch is None or not node.membership.leading:
            return done
        plans = tiering.plan_stream_objects(
            await tiering.wal_rows(node.metadata, config.tiering_delay_ms / 2000),
            config.tiering_stream_object_bytes)
        limiter = trio.CapacityLimiter(max(1, config.tiering_concurrency))
        # Well inside the upload timeout: a job still running when its upload is swept
        # would find its swap refused, but its late PUT would leave an object behind.
        job_timeout = config.tiering_upload_timeout_ms / 2000

        async def job(plan: tiering.StreamObjectPlan, scope: trio.CancelScope) -> None:
            async with limiter:
                try:
                    with trio.fail_after(job_timeout):
                        await tiering.write_stream_object(node.metadata, node.objects,
                                                          epoch, plan)
                    done["swapped"] += 1
                except md.StaleEpoch as exc:
                    # The lease moved: the whole round is fenced; the new holder redoes it.
                    log.warning("tiering round at coordinator epoch %d refused: %s", epoch,
                                exc)
                    scope.cancel()
                except tiering.TieringRefused as exc:
                    done["refused"] += 1
                    log.info("stream object of %s-%d [%d, %d] refused: %s", plan.topic_id,
                             plan.partition, plan.base_offset, plan.last_offset, exc.reason)
                except (md.MetadataError, ObjectStoreError, StreamObjectError,
                        trio.TooSlowError) as exc:
                    done["failed"] += 1
                    log.warning("stream object of %s-%d [%d, %d] not written: %s",
                                plan.topic_id, plan.partition, plan.base_offset,
                                plan.last_offset, repr(exc))

        with trio.CancelScope() as fenced:
            async with trio.open_nursery() as nursery:
                for plan in plans:
                    nursery.start_soon(job, plan, fenced)
        if not fenced.cancelled_caught:
            try:
                done["swept"] = len(await tiering.sweep_uploads(
                    node.metadata, epoch, config.tiering_upload_timeout_ms / 1000))
            except md.StaleEpoch:
                pass
        self.rounds += 1
        self.stream_objects += done["swapped"]
        self.refused += done["refused"]
        if any(done.values()):
            log.info("tiering round at coordinator epoch %d: %s", epoch, done,
                     extra={"event": "tiering_round"})
        return done
