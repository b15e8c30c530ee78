"""The tiering worker (seed 000): committed WAL data is rewritten into per-partition stream
objects so that WAL objects never pile up and a partition's history is a few large
sequential objects (the storage side, and every step of one stream object, is
`mink/storage/lifecycle/tiering.py`).

- Scheduled by the coordinator lease holder: every `tiering_delay_ms / 4` its schedule
  plans from the index (the rows still in WAL objects; a partition's rows wait for more
  data until their WAL object is half the delay old, so a committed WAL object is tiered
  within the delay) and hands each partition with due rows to its topic's writer-lease
  holder (seed 001), so the rewrite spreads over the nodes: an assignment row in PostgreSQL
  (`tiering_assignments`, sql/0014_tiering_writers.sql) names the holder and its writer lease
  epoch. Topics whose writer lease the coordinator holds, or nobody holds (its node died,
  the lease is not taken yet), are tiered by the coordinator itself.
- Every node, every interval, tiers what was assigned to it, for the topics whose writer
  lease it still holds at the assigned epoch.
- Every step of a round carries the coordinator lease epoch and the writer lease epoch (or,
  on the coordinator's own round of a topic without a writer, the fact that nobody holds
  it): a round of a node that lost either lease is refused at its next step and the current
  holder tiers the same rows again (seed 000, "Coordinator failover"). An upload of a round
  that died is deleted after `tiering_upload_timeout_ms` (the coordinator sweeps).
- Swapped WAL objects go to the lifecycle's collection (`lifecycle.py`), which deletes
  them after `file_delete_delay_ms`, as any other unreferenced object.

Why assignments in PostgreSQL rather than each writer planning on its own: the schedule
stays in one place (the coordinator's plan decides what is due), the coordinator knows
which topics have no writer and tiers those, and a writer needs nothing but its leases and
one indexed read per interval.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

import trio

from mink.broker.cluster.leases import writer_scope
from mink.broker.topics.config import (
    InvalidConfig,
    deletes_by_retention,
    effective_topic_setting,
)
from mink.storage import controlplane as md
from mink.storage.lifecycle import tiering, tiering_child
from mink.storage.objectstore import ObjectStoreError
from mink.storage.stream_object import StreamObjectError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TieringJob:
    plan: tiering.StreamObjectPlan
    coordinator_epoch: int
    writer: tiering.WriterFence | None


@dataclass(slots=True)
class RoundResult:
    swapped: int = 0
    bytes: int = 0
    failed: int = 0
    swept: int = 0
    assigned: int = 0
    refused: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"swapped": self.swapped, "bytes": self.bytes, "failed": self.failed,
                "swept": self.swept, "assigned": self.assigned, "refused": dict(self.refused)}


def hand_out(plans: list[tiering.StreamObjectPlan], coordinator_epoch: int,
             writers: dict[str, tuple[int, int]], me: int, held: dict[str, int]
             ) -> tuple[list[TieringJob], list[tuple[uuid.UUID, int, int, int]]]:
    """The coordinator's schedule, one rule per case of a plan's topic writer lease
    (`writers`: scope -> (holder, epoch) of the live ones; `held`: the leases this node
    believes it holds):

    | writer lease of the topic            | the plan                                       |
    | ------------------------------------ | ---------------------------------------------- |
    | nobody holds it (its node died, ...) | tiered here, no writer fence                   |
    | this node, at the epoch it holds     | tiered here, fenced by that epoch              |
    | this node, at another epoch          | waits (the lease round sorts it out first)     |
    | a live other node                    | handed to it: (topic, partition, holder, epoch)|

    Returns (jobs to run here, assignments; one per partition)."""
    jobs: list[TieringJob] = []
    handed: dict[tuple[uuid.UUID, int], tuple[int, int]] = {}
    for plan in plans:
        scope = writer_scope(plan.topic_id)
        lease = writers.get(scope)
        if lease is None:
            jobs.append(TieringJob(plan, coordinator_epoch, None))
        elif lease[0] == me:
            if held.get(scope) == lease[1]:
                jobs.append(TieringJob(plan, coordinator_epoch,
                                       tiering.WriterFence(me, lease[1])))
        else:
            handed[(plan.topic_id, plan.partition)] = lease
    return jobs, [(t, p, h, e) for (t, p), (h, e) in handed.items()]


class TieringWorker:
    def __init__(self, node) -> None:
        self.node = node
        # What this node's rounds did, for tests, tools and /metrics.
        self.rounds = 0
        self.stream_objects = 0
        self.bytes_tiered = 0
        self.refused: dict[str, int] = {}  # reason -> swaps (or begins) refused
        self.last_jobs_s = 0.0  # how long the last round's jobs took, together
        # file://: the walk and copy of stream objects, out of the node (tiering_child.py)
        self.children: tiering_child.TieringChildren | None = None

    @property
    def interval(self) -> float:
        return max(0.05, self.node.config.tiering_delay_ms / 4000)

    async def run(self) -> None:
        if self.node.config.tiering_delay_ms < 0:
            return
        async with tiering_child.TieringChildren() as self.children:
            while True:
                await trio.sleep(self.interval)
                for step in (self.schedule_round, self.assigned_round):
                    try:
                        await step()
                    except md.MetadataUnavailable as exc:
                        log.warning("tiering round skipped: %s", exc)
                    except Exception:  # a lifecycle loop must never take the node down
                        log.exception("tiering round failed")

    def kept_ms(self) -> dict[uuid.UUID, int]:
        """Per topic with a retention.ms: how long a row must still be kept to be planned.
        A round takes time (the last one's jobs: `last_jobs_s`); rows retention deletes
        meanwhile would have the swap refused whole, and a round that lags retention would
        be refused every time. So rows within a margin of retention wait for retention
        instead: the delay's share, or twice the last round's time, if longer."""
        config = self.node.config
        margin_ms = max(config.tiering_delay_ms / 2, 2000 * self.last_jobs_s)
        kept: dict[uuid.UUID, int] = {}
        for topic in self.node.view.topics.values():
            if not deletes_by_retention(topic.config):
                continue  # compact alone: retention never deletes its rows
            try:
                retention_ms = effective_topic_setting(topic.config, "retention.ms", config)
            except InvalidConfig:  # validated when stored; retention skips it too
                continue
            if retention_ms >= 0:
                kept[topic.topic_id] = int(retention_ms - margin_ms)
        return kept

    async def schedule_round(self) -> dict[str, object]:
        """On the coordinator lease holder: plan every partition's due rows; hand those of
        topics with a live other writer-lease holder to it, tier the rest here."""
        node, config = self.node, self.node.config
        epoch = node.coordinator.lease_epoch
        result = RoundResult()
        if epoch is None or not node.membership.leading:
            return result.as_dict()
        plans = await tiering.plan_round(
            node.metadata, config.tiering_delay_ms / 2000, config.tiering_stream_object_bytes,
            kept_ms=self.kept_ms())
        writers = {lease.scope: (lease.holder, lease.epoch)
                   for lease in await node.metadata.leases("writer/")
                   if lease.live and lease.holder is not None}
        jobs, handed = hand_out(plans, epoch, writers, node.node_id, node.leases.held)
        try:
            result.assigned = await tiering.assign(node.metadata, epoch, handed)
        except md.StaleEpoch:
            return result.as_dict()  # not the coordinator any more
        await self._run_jobs(jobs, result)
        try:
            result.swept = len(await tiering.sweep_uploads(
                node.metadata, epoch, config.tiering_upload_timeout_ms / 1000))
        except md.StaleEpoch:
            pass
        self._account(result, f"coordinator epoch {epoch}")
        return result.as_dict()

    async def assigned_round(self) -> dict[str, object]:
        """On every node: tier the partitions the coordinator handed to this node, for the
        topics whose writer lease it still holds at the assigned epoch."""
        node, config = self.node, self.node.config
        result = RoundResult()
        if not node.membership.leading:
            return result.as_dict()
        assignments = [a for a in await tiering.assigned_to(node.metadata, node.node_id)
                       if node.leases.held.get(writer_scope(a.topic_id)) == a.writer_epoch]
        if not assignments:
            return result.as_dict()
        by_partition = {(a.topic_id, a.partition): a for a in assignments}
        plans = await tiering.plan_round(
            node.metadata, config.tiering_delay_ms / 2000, config.tiering_stream_object_bytes,
            partitions=list(by_partition), kept_ms=self.kept_ms())
        jobs = []
        for plan in plans:
            a = by_partition[(plan.topic_id, plan.partition)]
            jobs.append(TieringJob(plan, a.coordinator_epoch,
                                   tiering.WriterFence(node.node_id, a.writer_epoch)))
        await self._run_jobs(jobs, result)
        await tiering.assignments_done(node.metadata, node.node_id, assignments)
        self._account(result, "writer leases")
        return result.as_dict()

    async def _run_jobs(self, jobs: list[TieringJob], result: RoundResult) -> None:
        node, config = self.node, self.node.config
        pace = tiering.round_pace([j.plan for j in jobs], self.interval,
                                  config.tiering_round_spread)
        limiter = trio.CapacityLimiter(1 if pace else max(1, config.tiering_concurrency))
        # Well inside the upload timeout: a job still running when its upload is swept
        # would find its swap refused, but its late PUT would leave an object behind.
        job_timeout = config.tiering_upload_timeout_ms / 2000
        fenced_topics: set[uuid.UUID] = set()
        metrics = node.metrics

        def refused(reason: str) -> None:
            result.refused[reason] = result.refused.get(reason, 0) + 1
            metrics.tiering_refused(reason)

        async def job(j: TieringJob, scope: trio.CancelScope) -> None:
            plan = j.plan
            async with limiter:
                if plan.topic_id in fenced_topics:
                    return
                try:
                    with trio.fail_after(job_timeout):
                        await tiering.write_stream_object(node.metadata, node.objects,
                                                          j.coordinator_epoch, plan,
                                                          writer=j.writer, pace=pace,
                                                          children=self.children)
                    result.swapped += 1
                    result.bytes += plan.size
                    metrics.tiering_swapped(plan.size)
                except md.StaleEpoch as exc:
                    refused(exc.reason)
                    if exc.reason == "stale_coordinator_epoch":
                        # The schedule is fenced whole: the new holder redoes it.
                        log.warning("tiering at coordinator epoch %d refused: %s",
                                    j.coordinator_epoch, exc)
                        scope.cancel()
                    else:  # this topic's writer lease moved: its holder does it now
                        log.info("tiering of topic %s stopped: %s", plan.topic_id, exc)
                        fenced_topics.add(plan.topic_id)
                except tiering.TieringRefused as exc:
                    refused(exc.reason)
                    log.info("stream object of %s-%d [%d, %d] refused: %s", plan.topic_id,
                             plan.partition, plan.base_offset, plan.last_offset, exc.reason)
                except (md.MetadataError, ObjectStoreError, StreamObjectError,
                        trio.TooSlowError) as exc:
                    result.failed += 1
                    log.warning("stream object of %s-%d [%d, %d] not written: %s",
                                plan.topic_id, plan.partition, plan.base_offset,
                                plan.last_offset, repr(exc))

        started = trio.current_time()
        with trio.CancelScope() as fenced:
            async with trio.open_nursery() as nursery:
                for j in jobs:
                    nursery.start_soon(job, j, fenced)
        if jobs:
            self.last_jobs_s = trio.current_time() - started

    def _account(self, result: RoundResult, under: str) -> None:
        self.rounds += 1
        self.stream_objects += result.swapped
        self.bytes_tiered += result.bytes
        for reason, n in result.refused.items():
            self.refused[reason] = self.refused.get(reason, 0) + n
        self.node.metrics.tiering_round()
        if result.swapped or result.failed or result.swept or result.refused:
            log.info("tiering round under %s: %s", under, result.as_dict(),
                     extra={"event": "tiering_round"})
