"""A compaction pass over one partition (Kafka's LogCleaner.doClean), the storage side: which
index rows are cleanable (`plan_pass`, a pure function of the rows and the topic's
settings), then stream the rows twice in ranged GETs, block by block, through the cleaner's
two steps (`cleaner.py`: the offset map, then the batches cleaned), upload the batches kept in
stream objects of at most `object_bytes` (tiering_stream_object_bytes), and swap the exact
rows read for all of their rows in one transaction fenced by the topic's writer lease
(`mink_swap_compacted_objects`, sql/0024_compaction_objects.sql). Memory: the offset map
(at most `map_bytes`), one object being written and two blocks, however large the range.

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
import struct
import uuid
from dataclasses import dataclass

import msgspec
import trio

from mink.protocol.records import LOG_OVERHEAD, RECORD_BATCH_OVERHEAD
from mink.storage.compaction import cleaner
from mink.storage.compaction.offset_map import OffsetMap
from mink.storage.controlplane import MetadataStore
from mink.storage.controlplane.postgres import IDEMPOTENT, READ
from mink.storage.lifecycle.tiering import (
    ABANDON_TIMEOUT_S,
    SQL_ABANDON,
    WriterFence,
)
from mink.storage.stream_object import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_INDEX_INTERVAL,
    StreamObjectError,
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
SELECT mink_swap_compacted_objects(%s::int, %s::bigint, %s::uuid, %s::int, %s::bigint,
                                   %s::bigint, %s::jsonb, %s::bigint, %s::bigint, %s::jsonb)"""
# Kafka's log.cleaner.dedupe.buffer.size (128 MiB) and the tiering target size.
DEFAULT_MAP_BYTES = 128 * 1024 * 1024
DEFAULT_OBJECT_BYTES = 32 * 1024 * 1024
_BATCH_LENGTH = struct.Struct(">i")

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


def cleanable_rows(rows: list[Row], now_ms: int, settings: CompactionSettings) -> list[Row]:
    """The rows from the log start up to the cleanable end (see plan_pass)."""
    cleanable: list[Row] = []
    for row in rows:
        if not is_stream_object(row.object_key):
            break  # still in a WAL object: tiering first
        if row.max_timestamp > now_ms - settings.min_compaction_lag_ms:
            break  # too young to compact
        if cleanable and row.base_offset != cleanable[-1].last_offset + 1:
            break  # a hole in the index (cannot happen; never clean across one)
        cleanable.append(row)
    return cleanable


def dirty_ratio(cleanable: list[Row], cleaned_to: int) -> float:
    """Dirty bytes (rows from the cleaner checkpoint on) / cleanable bytes (Kafka's
    cleanableRatio); 0 with nothing cleanable."""
    total = sum(r.size for r in cleanable)
    if not cleanable:
        return 0.0
    dirty = sum(r.size for r in cleanable if r.last_offset >= cleaned_to)
    return dirty / total if total else 1.0


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
    cleanable = cleanable_rows(rows, now_ms, settings)
    if not cleanable:
        return None
    end = cleanable[-1].last_offset + 1
    dirty = [r for r in cleanable if r.last_offset >= cleaned_to]
    horizon_due = tombstone_horizon is not None and tombstone_horizon <= now_ms
    if not dirty and not horizon_due:
        return None
    ratio = dirty_ratio(cleanable, cleaned_to)
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
    keys: tuple[str, ...]  # the objects written, in offset order
    base_offset: int
    last_offset: int       # the last offset of the rows swapped
    bytes_in: int          # of the rows swapped
    bytes_out: int
    records_in: int
    records_out: int
    tombstones_dropped: int
    cleaned_to: int        # the new first dirty offset
    map_full: bool         # the offset map filled: the pass stopped there (the next goes on)
    dirty_ratio: float
    read_bytes: int        # read from the object store (both scans)

    @property
    def objects(self) -> int:
        return len(self.keys)


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
                            now_ms: int, *, index_interval: int = DEFAULT_INDEX_INTERVAL,
                            object_bytes: int = DEFAULT_OBJECT_BYTES,
                            map_bytes: int = DEFAULT_MAP_BYTES,
                            block_bytes: int = DEFAULT_BLOCK_SIZE,
                            observe_ratio=None) -> PassOutcome | None:
    """One pass if one is due (None otherwise). Raises CompactionRefused (the swap's
    reason; nothing changed), StaleEpoch (the writer lease moved), the stores' errors, or
    cleaner.CleanerError. Whatever ends it short of its swap gives its uploads up.

    `object_bytes`: the largest object written (tiering_stream_object_bytes); `map_bytes`:
    the offset map's size (log_cleaner_dedupe_buffer_size); `block_bytes`: the ranged GETs
    the rows are read in. What a pass holds at once is about the map, one object being
    written and two blocks read (one being cleaned, the next in flight), whatever the size
    of the partition. `observe_ratio(ratio)`, if given, learns the partition's dirty ratio
    whether a pass is due or not."""
    rows, cleaned_to, horizon = await partition_rows(metadata, topic_id, partition)
    if observe_ratio is not None:
        observe_ratio(dirty_ratio(cleanable_rows(rows, now_ms, settings), cleaned_to))
    plan = plan_pass(rows, cleaned_to, now_ms, settings, horizon)
    if plan is None:
        return None
    out = _Output(metadata, objects, topic_id, partition, writer, plan.base_offset,
                  object_bytes, index_interval)
    try:
        return await _clean_and_swap(metadata, objects, topic_id, partition, writer, settings,
                                     now_ms, plan, out, map_bytes, block_bytes)
    except BaseException:
        with trio.CancelScope(shield=True), trio.move_on_after(ABANDON_TIMEOUT_S):
            for key in out.begun:
                try:
                    await metadata.fetch_all(IDEMPOTENT, SQL_ABANDON, (key,))
                except Exception as exc:  # noqa: BLE001 - the sweep gets it later
                    log.info("compaction upload %s left to the sweep: %r", key, exc)
        raise


class _Output:
    """The pass's objects, written one at a time as the cleaned batches come: an object is
    uploaded (after its begin: the sweep knows it) once the next batch would take it past
    `object_bytes`. Each covers the offsets from the previous one's last + 1 to its own
    last batch's last offset (the last object: to the range's last offset), so a reader at
    an offset in a gap finds the next batch in the same object."""

    def __init__(self, metadata: MetadataStore, objects, topic_id: uuid.UUID, partition: int,
                 writer: WriterFence, base_offset: int, object_bytes: int,
                 index_interval: int) -> None:
        self.metadata, self.objects = metadata, objects
        self.topic_id, self.partition, self.writer = topic_id, partition, writer
        self.object_bytes = object_bytes
        self.index_interval = index_interval
        self.next_base = base_offset
        self.current: StreamObjectWriter | None = None
        self.begun: list[str] = []
        self.written: list[dict] = []
        self.bytes_out = 0

    async def add(self, batch: bytes, range_last: int) -> None:
        current = self.current
        if current is not None and current.batch_count and \
                current.data_length + len(batch) > self.object_bytes:
            await self.flush(current.last_offset)
            current = None
        if current is None:
            current = self.current = StreamObjectWriter(
                self.topic_id, self.partition, index_interval=self.index_interval,
                covers=(self.next_base, range_last))
        current.add(batch)

    async def flush(self, last_offset: int) -> None:
        out, self.current = self.current, None
        assert out is not None and out.batch_count
        base = self.next_base
        out.covers = (base, last_offset)
        key = stream_object_key(self.topic_id, self.partition, base, last_offset,
                                f"c{self.writer.epoch}-{secrets.token_hex(4)}")
        self.begun.append(key)
        await self.metadata.fetch_one(IDEMPOTENT, SQL_BEGIN, (
            self.writer.node_id, self.writer.epoch, key, self.topic_id, self.partition, base,
            last_offset))
        await self.objects.create(key, out.finish())
        self.written.append({"key": key, "base_offset": base, "last_offset": last_offset,
                             "data_length": out.data_length, "batches": out.batch_count,
                             "max_timestamp": out.max_timestamp})
        self.bytes_out += out.data_length
        self.next_base = last_offset + 1


async def stream_batches(objects, rows: list[Row], block_bytes: int, on_batches) -> int:
    """The rows' batches, in offset order, block by block: `await on_batches(batches,
    final)` for the whole batches each block completes (`final`: the last call, the range's
    last batch is the last of them); the next block is read meanwhile. Stops when
    on_batches returns False. Returns the bytes read. A batch across blocks is carried to
    the next (a block holds at least its beginning); a row that ends inside a batch is a
    StreamObjectError."""
    blocks = [(row, start, min(start + block_bytes, row.byte_end))
              for row in rows for start in range(row.byte_start, row.byte_end, block_bytes)]
    if not blocks:
        return 0
    fetched: list[bytes] = []
    failed: list[Exception] = []

    async def fetch(i: int) -> None:
        try:
            row, start, end = blocks[i]
            data = await objects.get(row.object_key, start, end)
            if len(data) != end - start:
                raise StreamObjectError(f"{row.object_key} gave {len(data)} bytes for "
                                        f"[{start}, {end})")
            fetched.append(data)
        except Exception as exc:  # noqa: BLE001 - raised by the caller, as itself
            failed.append(exc)

    await fetch(0)
    if failed:
        raise failed[0]
    carry = b""
    read = 0
    for i, (row, _, end) in enumerate(blocks):
        data = fetched.pop()
        read += len(data)
        buffer = carry + data if carry else data
        data = b""
        view = memoryview(buffer)
        batches, position = [], 0
        while len(view) - position >= LOG_OVERHEAD:
            (size,) = _BATCH_LENGTH.unpack_from(view, position + 8)
            size += LOG_OVERHEAD
            if size < RECORD_BATCH_OVERHEAD:
                raise StreamObjectError(f"{row.object_key}: no batch at byte {position}")
            if position + size > len(view):
                break
            batches.append(view[position:position + size])
            position += size
        carry = bytes(view[position:])
        if end == row.byte_end and carry:
            raise StreamObjectError(f"{row.object_key} ends inside a batch")
        final = i == len(blocks) - 1
        # The next block is read while this one's batches are handled. Failures are raised
        # as themselves, not in an exception group, so the cleaner's handlers see the
        # store's error (as tiering's `_read_rows`).
        go_on, error = False, None
        async with trio.open_nursery() as nursery:
            if not final:
                nursery.start_soon(fetch, i + 1)
            try:
                go_on = await on_batches(batches, final)
            except Exception as exc:  # noqa: BLE001 - raised below
                error = exc
            if not go_on:
                nursery.cancel_scope.cancel()
        del batches, view
        if error is not None:
            raise error
        if not go_on:
            break
        if failed:
            raise failed[0]
    return read


def _rows_json(rows: list[Row]) -> str:
    return _json.encode([{"base_offset": r.base_offset, "last_offset": r.last_offset,
                          "object_key": r.object_key, "byte_start": r.byte_start,
                          "byte_end": r.byte_end} for r in rows]).decode()


async def _clean_and_swap(metadata: MetadataStore, objects, topic_id: uuid.UUID,
                          partition: int, writer: WriterFence, settings: CompactionSettings,
                          now_ms: int, plan: PassPlan, out: _Output, map_bytes: int,
                          block_bytes: int) -> PassOutcome:
    # Decoding and re-encoding records is CPU work: each block's in a worker thread, so
    # the node's Produce and Fetch go on meanwhile.
    offset_map = OffsetMap.sized(map_bytes, plan.end - plan.dirty_from)
    builder = cleaner.MapBuilder(offset_map, plan.dirty_from, plan.end)

    async def map_block(batches, final) -> bool:
        return await trio.to_thread.run_sync(builder.feed, batches)

    read = await stream_batches(objects, plan.rows, block_bytes, map_block)
    limit = builder.finish()
    cleaned_to = max(limit, plan.dirty_from)
    rows = plan.rows
    if builder.full:  # the rows up to the one holding the last offset the map covers
        rows = rows[:next((i for i, r in enumerate(rows) if r.last_offset >= cleaned_to - 1),
                          len(rows) - 1) + 1]
    range_last = rows[-1].last_offset
    pass_ = cleaner.BatchCleaner(offset_map, builder.decisions, now_ms=now_ms,
                                 delete_retention_ms=settings.delete_retention_ms, end=limit)

    def clean(batches, final) -> list[bytes]:
        last = len(batches) - 1 if final else -1
        kept = (pass_.clean(b, i == last) for i, b in enumerate(batches))
        # copies, so that the block read is freed once its batches are cleaned
        return [bytes(b) for b in kept if b is not None]

    async def clean_block(batches, final) -> bool:
        for batch in await trio.to_thread.run_sync(clean, batches, final):
            await out.add(batch, range_last)
        return True

    read += await stream_batches(objects, rows, block_bytes, clean_block)
    await out.flush(range_last)
    row = await metadata.fetch_one(IDEMPOTENT, SQL_SWAP, (
        writer.node_id, writer.epoch, topic_id, partition, rows[0].base_offset, range_last,
        _json.encode(out.written).decode(), cleaned_to, pass_.next_horizon, _rows_json(rows)))
    assert row is not None
    if row[0] != "swapped":
        raise CompactionRefused(row[0])
    return PassOutcome(tuple(o["key"] for o in out.written), rows[0].base_offset, range_last,
                       sum(r.size for r in rows), out.bytes_out, pass_.records_in,
                       pass_.records_out, pass_.tombstones_dropped, cleaned_to, builder.full,
                       plan.dirty_ratio, read)


__all__ = ["CompactionRefused", "CompactionSettings", "PassOutcome", "PassPlan", "Row",
           "cleanable_rows", "cleaned_offsets", "compact_partition", "dirty_ratio",
           "partition_rows", "plan_pass"]
