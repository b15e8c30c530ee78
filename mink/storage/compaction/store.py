"""A compaction pass over one partition (Kafka's LogCleaner.doClean), the storage side: which
index rows are cleanable (`plan_pass`, a pure function of the rows and the topic's
settings), then read, clean (`cleaner.py`), upload one stream object, and swap the exact rows
read for its row in one transaction fenced by the topic's writer lease
(`mink_swap_compacted`, sql/0020_compaction.sql).

What a pass covers, as Kafka's cleaner:

- from the log start up to the cleanable end: the first index row that is still in a WAL
  object (not tiered yet: Kafka's active segment) or younger than min.compaction.lag.ms (its
  max timestamp) ends it. The newest data, above it, is never rewritten.
- the dirty section starts at the partition's cleaned-to offset (Kafka's cleaner
  checkpoint, `compaction_state`); the pass runs when dirty bytes / cleanable bytes reach
  min.cleanable.dirty.ratio, or the first dirty row's max timestamp is older than
  max.compaction.lag.ms.

Nothing here deletes an object: the rows swapped away release their objects to the
lifecycle's collection, which deletes them after file.delete.delay.ms (readers that found
the old row meanwhile still read it); a refused or abandoned upload is queued as tiering's.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from dataclasses import dataclass

import msgspec
import trio

from mink.storage.compaction import cleaner
from mink.storage.controlplane import MetadataStore
from mink.storage.controlplane.postgres import IDEMPOTENT, READ
from mink.storage.lifecycle.tiering import (
    ABANDON_TIMEOUT_S,
    SQL_ABANDON,
    WalRow,
    WriterFence,
    _read_rows,
)
from mink.storage.stream_object import (
    DEFAULT_INDEX_INTERVAL,
    StreamObjectWriter,
    is_stream_object,
    stream_object_key,
)

log = logging.getLogger(__name__)

SQL_ROWS = """
SELECT base_offset, last_offset, object_key, byte_start, byte_end, max_timestamp
  FROM batch_index WHERE topic_id = %s AND partition = %s ORDER BY base_offset"""
SQL_STATE = """
SELECT cleaned_to, tombstone_horizon FROM compaction_state
 WHERE topic_id = %s AND partition = %s"""
SQL_BEGIN = """
SELECT mink_begin_compaction(%s::int, %s::bigint, %s::text, %s::uuid, %s::int, %s::bigint,
                             %s::bigint)"""
SQL_SWAP = """
SELECT mink_swap_compacted(%s::int, %s::bigint, %s::text, %s::uuid, %s::int, %s::bigint,
                           %s::bigint, %s::bigint, %s::int, %s::bigint, %s::bigint,
                           %s::bigint, %s::jsonb)"""

_json = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Row:
    base_offset: int
    last_offset: int
    object_key: str
    byte_start: int
    byte_end: int
    max_timestamp: int

    @property
    def size(self) -> int:
        return self.byte_end - self.byte_start


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    """The topic's settings a pass obeys (Kafka's names)."""

    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    min_cleanable_dirty_ratio: float = 0.5


@dataclass(frozen=True, slots=True)
class PassPlan:
    rows: list[Row]       # every row from the log start to the cleanable end
    dirty_from: int       # the first dirty offset (the map is built from here)
    end: int              # the cleanable end: the first offset not cleaned
    dirty_ratio: float
    forced: bool          # due by max.compaction.lag.ms whatever the ratio

    @property
    def base_offset(self) -> int:
        return self.rows[0].base_offset

    @property
    def last_offset(self) -> int:
        return self.rows[-1].last_offset


def plan_pass(rows: list[Row], cleaned_to: int, now_ms: int,
              settings: CompactionSettings,
              tombstone_horizon: int | None = None) -> PassPlan | None:
    """The pass due on a partition with these index rows (offset order), or None.

    | the partition                                        | the pass              |
    | ---------------------------------------------------- | --------------------- |
    | no tiered row old enough (min.compaction.lag.ms)     | none                  |
    | nothing dirty below the cleanable end                | none                  |
    | dirty ratio below min.cleanable.dirty.ratio          | none, unless forced   |
    | first dirty row older than max.compaction.lag.ms     | forced                |
    | kept tombstones whose delete horizon has come        | forced (KIP-534)      |
    | one row, already a compacted object, nothing dirty   | none (covered above)  |
    """
    cleanable: list[Row] = []
    for row in rows:
        if not is_stream_object(row.object_key):
            break  # still in a WAL object: tiering first
        if row.max_timestamp > now_ms - settings.min_compaction_lag_ms:
            break  # too young to compact
        if cleanable and row.base_offset != cleanable[-1].last_offset + 1:
            break  # a hole in the index (cannot happen; never clean across one)
        cleanable.append(row)
    if not cleanable:
        return None
    end = cleanable[-1].last_offset + 1
    dirty = [r for r in cleanable if r.last_offset >= cleaned_to]
    horizon_due = tombstone_horizon is not None and tombstone_horizon <= now_ms
    if not dirty and not horizon_due:
        return None
    total = sum(r.size for r in cleanable)
    ratio = sum(r.size for r in dirty) / total if total else 1.0
    forced = horizon_due or (
        bool(dirty) and dirty[0].max_timestamp < now_ms - settings.max_compaction_lag_ms)
    if ratio < settings.min_cleanable_dirty_ratio and not forced:
        return None
    return PassPlan(cleanable, min(max(cleaned_to, cleanable[0].base_offset), end), end,
                    ratio, forced)


class CompactionRefused(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class PassOutcome:
    key: str
    base_offset: int
    last_offset: int
    bytes_in: int
    bytes_out: int
    records_in: int
    records_out: int
    tombstones_dropped: int


SQL_CLEANED = """
SELECT s.topic_id, s.partition, s.cleaned_to, s.passes
  FROM unnest(%s::uuid[], %s::int[]) AS p(topic_id, partition)
  JOIN compaction_state AS s ON s.topic_id = p.topic_id AND s.partition = p.partition"""


async def cleaned_offsets(metadata: MetadataStore, partitions: list[tuple[uuid.UUID, int]]
                          ) -> dict[tuple[uuid.UUID, int], tuple[int, int]]:
    """(topic, partition) -> (cleaned-to offset, passes swapped), of those of `partitions`
    ever compacted."""
    if not partitions:
        return {}
    rows = await metadata.fetch_all(READ, SQL_CLEANED, ([t for t, _ in partitions],
                                                        [p for _, p in partitions]))
    return {(t, p): (c, n) for t, p, c, n in rows}


async def partition_rows(metadata: MetadataStore, topic_id: uuid.UUID, partition: int
                         ) -> tuple[list[Row], int, int | None]:
    """The partition's index rows, its cleaned-to offset (0: never cleaned) and the delete
    horizon its kept tombstones wait for."""
    rows = [Row(*r) for r in await metadata.fetch_all(READ, SQL_ROWS, (topic_id, partition))]
    state = await metadata.fetch_one(READ, SQL_STATE, (topic_id, partition))
    return rows, *((state[0], state[1]) if state is not None else (0, None))


async def compact_partition(metadata: MetadataStore, objects, topic_id: uuid.UUID,
                            partition: int, writer: WriterFence, settings: CompactionSettings,
                            now_ms: int, *, index_interval: int = DEFAULT_INDEX_INTERVAL
                            ) -> PassOutcome | None:
    """One pass if one is due (None otherwise). Raises CompactionRefused (the swap's
    reason; nothing changed), StaleEpoch (the writer lease moved), the stores' errors, or
    cleaner.CleanerError. Whatever ends it short of its swap gives its upload up."""
    rows, cleaned_to, horizon = await partition_rows(metadata, topic_id, partition)
    plan = plan_pass(rows, cleaned_to, now_ms, settings, horizon)
    if plan is None:
        return None
    key = stream_object_key(topic_id, partition, plan.base_offset, plan.last_offset,
                            f"c{writer.epoch}-{secrets.token_hex(4)}")
    try:
        return await _clean_and_swap(metadata, objects, topic_id, partition, writer, settings,
                                     now_ms, plan, key, index_interval)
    except BaseException:
        with trio.CancelScope(shield=True), trio.move_on_after(ABANDON_TIMEOUT_S):
            try:
                await metadata.fetch_all(IDEMPOTENT, SQL_ABANDON, (key,))
            except Exception as exc:  # noqa: BLE001 - the sweep gets it later
                log.info("compaction upload %s left to the sweep: %r", key, exc)
        raise


def _clean(data: list[bytes], plan: PassPlan, now_ms: int,
           settings: CompactionSettings) -> cleaner.PassResult:
    return cleaner.clean_batches(data, now_ms=now_ms,
                                 delete_retention_ms=settings.delete_retention_ms,
                                 end=plan.end, dirty_from=plan.dirty_from)


async def _clean_and_swap(metadata: MetadataStore, objects, topic_id: uuid.UUID,
                          partition: int, writer: WriterFence, settings: CompactionSettings,
                          now_ms: int, plan: PassPlan, key: str,
                          index_interval: int) -> PassOutcome:
    await metadata.fetch_one(IDEMPOTENT, SQL_BEGIN, (
        writer.node_id, writer.epoch, key, topic_id, partition, plan.base_offset,
        plan.last_offset))
    data = [bytes(d) for d in await _read_rows(objects, [
        WalRow(r.base_offset, r.last_offset, r.object_key, r.byte_start, r.byte_end)
        for r in plan.rows])]
    # Decoding and re-encoding every record is CPU work: off the event loop, so the node's
    # Produce and Fetch go on meanwhile.
    result = await trio.to_thread.run_sync(_clean, data, plan, now_ms, settings)
    out = StreamObjectWriter(topic_id, partition, index_interval=index_interval,
                             covers=(plan.base_offset, plan.last_offset))
    for batch in result.batches:
        out.add(batch)
    await objects.create(key, out.finish())
    rows = [{"base_offset": r.base_offset, "last_offset": r.last_offset,
             "object_key": r.object_key, "byte_start": r.byte_start, "byte_end": r.byte_end}
            for r in plan.rows]
    row = await metadata.fetch_one(IDEMPOTENT, SQL_SWAP, (
        writer.node_id, writer.epoch, key, topic_id, partition, plan.base_offset,
        plan.last_offset, out.data_length, out.batch_count, out.max_timestamp,
        max(result.end, plan.dirty_from), result.next_horizon, _json.encode(rows).decode()))
    assert row is not None
    if row[0] != "swapped":
        raise CompactionRefused(row[0])
    return PassOutcome(key, plan.base_offset, plan.last_offset, sum(r.size for r in plan.rows),
                       out.data_length, result.records_in, result.records_out,
                       result.tombstones_dropped)


__all__ = ["CompactionRefused", "CompactionSettings", "PassOutcome", "PassPlan", "Row",
           "cleaned_offsets", "compact_partition", "partition_rows", "plan_pass"]
