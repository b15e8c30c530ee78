"""A partition's log on its leader: offsets, pending appends, the tail cache, and reads.

`PartitionLog.append` is synchronous on purpose: offsets are assigned and the batch is in the
WAL buffer before the caller yields, so requests on one connection keep their order
(DESIGN, write path step 1). Durability is awaited separately on the returned `PendingAppend`.

Consumers only ever see committed data: the high watermark is the committed end offset, and
the tail cache holds committed ranges only.
"""

from __future__ import annotations

import collections
import logging
import math
import struct
import uuid
from dataclasses import dataclass, field
from typing import Protocol

import trio

from mink.protocol.records import iter_batches, iter_records, patch_batch
from mink.storage.controlplane import MetadataError, ProducerStateUpdate
from mink.storage.objectstore import ObjectNotFound, ObjectStoreError
from mink.storage.producer_state import (
    BatchMetadata,
    ProducerAppend,
    ProducerError,
    ProducerStateManager,
    RefusedSequences,
)
from mink.storage.stream_object import (
    StreamObjectError,
    StreamObjectReader,
    decode_footer,
    is_stream_object,
)


log = logging.getLogger(__name__)

_BATCH_POSITION = struct.Struct(">qi")  # baseOffset, batchLength
# Stream objects are read in blocks of this size or a little more (each from a batch start to
# a batch start: StreamObjectReader), cached, shared by readers of any size (a sequential
# reader reads ahead); their footers kept for this many objects.
STREAM_BLOCK_BYTES = 1024 * 1024
FOOTER_CACHE_ENTRIES = 4096
# Read-ahead of stream objects (ReadCaches.read_ahead): a sequential reader gets this many
# blocks after the one it read fetched in the background, at most this many such GETs in
# flight on the node (more are skipped, not queued: the reader then asks itself).
READ_AHEAD_BLOCKS = 2
READ_AHEAD_GETS = 8
# A cold read of WAL rows has the rows after it read ahead (ReadCaches._read_ahead_rows), this
# many times the read's byte budget: a consumer catching up asks for them next.
READ_AHEAD_FETCHES = 2
# A cold read of WAL rows (one small ranged GET each: a flush's share of one partition) asks
# the index for this many rows at most and GETs the rows it takes this many at a time; one
# after another, a catch-up read of S3-backed history paid a round trip per row.
COLD_READ_ROWS = 64
COLD_READ_GETS = 8
# The rows of each partition's last cold read are kept for its next (ReadCaches._cold_rows),
# this many rows on the node at most.
COLD_ROWS_KEPT = 64 * 1024
# A WAL row is read through the WAL_BLOCK_BYTES-aligned block holding it, so the rows of the
# other partitions in the same flush (a catch-up reader of several partitions reads them next)
# come from the block cache, not a GET each; a row of half a block or more is read as itself.
WAL_BLOCK_BYTES = 1024 * 1024
_LAST_OFFSET_DELTA = struct.Struct(">i")


class LogError(Exception):
    """Base of the reasons an append or a read cannot be served."""


class NotLeader(LogError):
    """This node does not (or no longer) lead the partition at this leader epoch."""


class StorageUnavailable(LogError):
    """The object store or PostgreSQL failed; nothing was written. Retriable."""


class AppendInDoubt(LogError):
    """The commit's outcome is not known yet. The batch may or may not become visible."""


class OffsetOutOfRange(LogError):
    pass


class ObjectGone(LogError):
    """An index row named an object the store no longer has (collected after retention
    moved the log start): the read re-resolves through the index once."""


class InvalidProducerEpoch(LogError):
    pass


class OutOfOrderSequence(LogError):
    pass


class InvalidTxnState(LogError):
    """A transactional batch outside an ongoing transaction of its producer (KIP-890)."""


_PRODUCER_ERRORS = {"invalid_producer_epoch": InvalidProducerEpoch,
                    "out_of_order_sequence_number": OutOfOrderSequence,
                    "invalid_txn_state": InvalidTxnState}


class DuplicateBatch(LogError):
    """The batch repeats one of the producer's last five: answer with the original offset
    (once `batch.pending`, if still in flight, has its outcome); write nothing."""

    def __init__(self, batch: BatchMetadata):
        super().__init__("duplicate batch")
        self.batch = batch

    async def base_offset(self, timeout: float = math.inf) -> int:
        if self.batch.pending is not None:
            return await self.batch.pending.wait(timeout)
        return self.batch.base_offset


@dataclass(eq=False)
class PendingAppend:
    """One append waiting for its WAL object to be uploaded and committed."""

    log: PartitionLog
    base_offset: int
    last_offset: int
    generation: int
    producer: ProducerAppend | None = None
    done: trio.Event = field(default_factory=trio.Event)
    error: LogError | None = None
    # In a WAL object being uploaded or committed: its outcome is no longer this log's.
    sealed: bool = False

    def resolve(self, error: LogError | None = None) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()
            if error is not None and self.producer is not None:
                self.log.refused_sequences.refused(self.log.topic_id, self.log.partition,
                                                   self.producer)

    async def wait(self, timeout: float = math.inf) -> int:
        """The base offset once durable; raises the LogError that failed it, or
        AppendInDoubt when `timeout` passes first (the append may still become visible)."""
        if not self.done.is_set():  # (a request's later partitions usually are)
            with trio.move_on_after(timeout):
                await self.done.wait()
        if not self.done.is_set():
            raise AppendInDoubt(f"not committed within {timeout:.1f}s")
        if self.error is not None:
            raise self.error
        return self.base_offset


@dataclass(slots=True)
class Chunk:
    """Committed batches of one partition, contiguous in offsets and bytes."""

    base_offset: int
    last_offset: int
    data: bytes | memoryview


class WalBuffer(Protocol):
    """What a partition log needs of the WAL writer (`mink.storage.wal.WalWriter`): a
    synchronous add of an append's batches to the open WAL buffer. The writer imports this
    module, never the other way round."""

    def add(self, log_: PartitionLog, pending: PendingAppend, data: bytearray,
            max_timestamp: int, batch_count: int,
            producer_states: list[ProducerStateUpdate]) -> None: ...


class PartitionLog:
    def __init__(self, topic_id: uuid.UUID, partition: int, leader_epoch: int,
                 committed_end: int, log_start_offset: int, wal: WalBuffer,
                 caches: ReadCaches, refused_sequences: RefusedSequences | None = None) -> None:
        self.topic_id = topic_id
        self.partition = partition
        self.leader_epoch = leader_epoch
        self.committed_end = committed_end  # the high watermark
        self.log_start_offset = log_start_offset
        self.next_offset = committed_end
        self.wal = wal
        self.caches = caches
        self.pending: collections.deque[PendingAppend] = collections.deque()
        # Grows at each reset; WAL ranges of an older generation are never committed.
        self.generation = 0
        self.closed: LogError | None = None
        self.frozen = False
        self.tail: collections.deque[Chunk] = collections.deque()
        self.producers = ProducerStateManager()
        # Node-wide: batches answered as not written, so gaps they leave are retried.
        self.refused_sequences = (RefusedSequences() if refused_sequences is None
                                  else refused_sequences)
        self._committed = trio.Event()
        # Long-polling fetches waiting on several partitions at once register one event here.
        self.waiters: set[trio.Event] = set()

    @property
    def key(self) -> tuple[uuid.UUID, int]:
        return (self.topic_id, self.partition)

    # -- writes -------------------------------------------------------------------------

    def append(self, records: bytearray, batch_counts: list[int], max_timestamp: int,
               producer: ProducerAppend | None = None) -> PendingAppend:
        """Assign offsets to the batches in `records` (patched in place) and queue them.

        `batch_counts` is the number of records of each batch, in order; `producer` the
        idempotent producer's id, epoch and sequences, checked here. No await here.
        """
        refusal: LogError | None = self.closed
        if refusal is None and self.frozen:
            refusal = StorageUnavailable("partition frozen until an in-doubt commit is "
                                         "resolved")
        if refusal is not None:
            if producer is not None:
                self.refused_sequences.refused(self.topic_id, self.partition, producer)
            raise refusal
        if producer is not None:
            try:
                duplicate = self.producers.check(producer)
            except ProducerError as exc:
                raise self._producer_refusal(producer, exc) from None
            if duplicate is not None:
                raise DuplicateBatch(duplicate)
            self.refused_sequences.accepted(self.topic_id, self.partition,
                                            producer.producer_id)
        base = self.next_offset
        position = 0
        offset = base
        for count in batch_counts:
            patch_batch(records, position, offset, self.leader_epoch)
            (_, length) = _BATCH_POSITION.unpack_from(records, position)
            position += length + 12
            offset += count
        pending = PendingAppend(self, base, offset - 1, self.generation, producer)
        self.next_offset = offset
        self.pending.append(pending)
        states = []
        if producer is not None:
            stored = self.producers.record(producer, base, offset - 1, pending)
            states.append(ProducerStateUpdate(producer.producer_id, producer.epoch, stored))
        self.wal.add(self, pending, records, max_timestamp, len(batch_counts), states)
        return pending

    def _producer_refusal(self, producer: ProducerAppend, exc: ProducerError) -> LogError:
        if exc.kind != "out_of_order_sequence_number":
            return _PRODUCER_ERRORS[exc.kind](str(exc))
        if exc.expected_seq is not None and self.refused_sequences.explains_gap(
                self.topic_id, self.partition, producer, exc.expected_seq):
            # The gap is ours (see RefusedSequences): retriable, never written.
            return StorageUnavailable(f"{exc}: sequence {exc.expected_seq} was answered "
                                      f"as not written here; it is due first")
        return OutOfOrderSequence(str(exc))

    def committed(self, chunks: list[Chunk]) -> None:
        """A WAL range of ours was committed: resolve its appends, publish it to readers."""
        last_offset = chunks[-1].last_offset
        self.committed_end = last_offset + 1
        while self.pending and self.pending[0].last_offset <= last_offset:
            pending = self.pending.popleft()
            if pending.producer is not None:
                self.producers.commit(pending.producer, pending.base_offset,
                                      pending.last_offset)
            pending.resolve()
        if self.closed is None:  # a closed log's bytes would serve no reader
            for chunk in chunks:
                self.caches.add_tail(self, chunk)
        self._wake()

    def _wake(self) -> None:
        self._committed.set()
        self._committed = trio.Event()
        for waiter in self.waiters:
            waiter.set()

    def reset(self, error: LogError, from_offset: int | None = None) -> None:
        """Fail every pending append (from `from_offset` on) and go back to the committed end."""
        self.generation += 1
        kept: collections.deque[PendingAppend] = collections.deque()
        for pending in self.pending:
            if from_offset is not None and pending.last_offset < from_offset:
                kept.append(pending)
            else:
                pending.resolve(error)
        self.pending = kept
        self.next_offset = kept[-1].last_offset + 1 if kept else self.committed_end
        self.producers.rebuild([(p.producer, p.base_offset, p.last_offset, p)
                                for p in kept if p.producer is not None])

    def close(self, error: LogError) -> None:
        """This node lost the partition (or is shutting down): fail everything pending that
        is not in a WAL object yet. Appends already in a WAL object on its way stay pending:
        their object's outcome answers them (the WAL writer, or after a stop the read-back of
        its outcome from PostgreSQL), never a guess; a handler whose deadline passes first
        answers in doubt."""
        if self.closed is None:
            self.closed = error
            for pending in self.pending:
                if not pending.sealed:
                    pending.resolve(error)
            self.generation += 1
            self.pending = collections.deque(p for p in self.pending if not p.done.is_set())
            self.next_offset = self.committed_end
            self.producers.rebuild([])
            self.caches.drop_tail(self)
            self._wake()

    def forget_tail_below(self, offset: int) -> int:
        """Compaction rewrote the log below `offset` (mink/storage/compaction/): the tail
        cache's chunks wholly below it go, so readers get the compacted objects through the
        index instead of the records as produced. Returns how many went."""
        return self.caches.drop_tail_below(self, offset)

    def advance_log_start(self, offset: int) -> bool:
        """Retention or DeleteRecords moved the log start in PostgreSQL: only forward, never
        past the high watermark this log knows. True if it moved."""
        offset = min(offset, self.committed_end)
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = offset
        return True

    async def _reresolve(self, offset: int) -> None:
        """A cold read found no index row (or no object) for an offset at or above the log
        start this log knew: retention, DeleteRecords or collection moved it meanwhile.
        Read the log start again; below it the answer is OFFSET_OUT_OF_RANGE."""
        try:
            state = await self.caches.metadata.stream_state(self.topic_id, self.partition)
        except MetadataError as exc:
            raise StorageUnavailable(f"reading the log start: {exc}") from exc
        if state is not None:
            self.advance_log_start(state.log_start_offset)
            if offset < state.log_start_offset:
                raise OffsetOutOfRange(f"offset {offset} is below the log start "
                                       f"{state.log_start_offset}")

    # -- reads --------------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self.committed_end

    @property
    def last_stable_offset(self) -> int:
        """Below the first offset of every committed open transaction (the LSO)."""
        first = self.producers.first_unstable_offset()
        return self.committed_end if first is None else min(first, self.committed_end)

    async def wait_for_data(self, offset: int) -> None:
        """Return once the committed end is past `offset` (or the log closes)."""
        while self.committed_end <= offset and self.closed is None:
            await self._committed.wait()

    async def offset_for_timestamp(self, timestamp: int) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) of the first record whose timestamp is at least
        `timestamp`, as Kafka's ListOffsets finds it; None when there is none."""
        row = await self.caches.metadata.offset_for_timestamp(self.topic_id, self.partition,
                                                             timestamp)
        if row is None:
            return None
        data = await self.caches.batches_reaching(row, timestamp)
        for header, batch in iter_batches(data):
            if header.max_timestamp < timestamp:
                continue
            for record in iter_records(batch):
                record_timestamp = header.record_timestamp(record)
                if record_timestamp >= timestamp:
                    return (header.record_offset(record), record_timestamp,
                            header.partition_leader_epoch)
        return None

    async def max_timestamp_offset(self) -> tuple[int, int, int] | None:
        """ListOffsets' MAX_TIMESTAMP (-3): the first record carrying the largest timestamp."""
        state = await self.caches.metadata.stream_state(self.topic_id, self.partition)
        if state is None or state.max_timestamp < 0:
            return None
        return await self.offset_for_timestamp(state.max_timestamp)

    def reads_cold(self, offset: int) -> bool:
        """Whether a read at `offset` goes to the index and the object store (below the tail
        cache), not to memory alone."""
        if self.closed is not None or not self.log_start_offset <= offset < self.committed_end:
            return False
        return offset < (self.tail[0].base_offset if self.tail else self.committed_end)

    async def read(self, offset: int, max_bytes: int) -> list[memoryview]:
        """Committed batches from the one holding `offset`, about `max_bytes` worth (the
        first batch always whole, KIP-74). Empty at the high watermark."""
        if self.closed is not None:
            raise self.closed
        if offset < self.log_start_offset or offset > self.committed_end:
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{self.log_start_offset}, {self.committed_end}]")
        if offset == self.committed_end:
            return []
        out: list[memoryview] = []
        size = 0
        tail_start = self.tail[0].base_offset if self.tail else self.committed_end
        chunks: list[Chunk] = []
        if offset < tail_start:
            try:
                chunks = await self.caches.read_cold(self, offset, max_bytes)
            except ObjectGone:
                chunks = []
            if not chunks or chunks[0].base_offset > offset:
                # The index row this offset needed is gone: re-resolve once, then read the
                # index again (a second miss is retriable, never garbage).
                await self._reresolve(offset)
                try:
                    chunks = await self.caches.read_cold(self, offset, max_bytes)
                except ObjectGone as exc:
                    raise StorageUnavailable(str(exc)) from exc
        for chunk in [*chunks, *self.tail]:
            if chunk.last_offset < offset:
                continue
            if chunk.base_offset > offset:
                break  # a gap between what the index gave and the tail: the next read fills it
            size, offset = _take(out, chunk, offset, size, max_bytes)
            if offset <= chunk.last_offset:
                break  # the budget ran out inside this chunk: never skip what is left of it
        return out


def _take(out: list[memoryview], chunk: Chunk, offset: int, size: int,
          max_bytes: int) -> tuple[int, int]:
    """Append the batches of `chunk` from the one holding `offset` while they fit in
    `max_bytes`; the very first batch of a read goes out whole even if larger (KIP-74).
    Returns the new size and the offset after the last batch taken."""
    data = memoryview(chunk.data)
    position = 0
    start = end = -1
    while position + 27 <= len(data):
        base, length = _BATCH_POSITION.unpack_from(data, position)
        (last_delta,) = _LAST_OFFSET_DELTA.unpack_from(data, position + 23)
        batch_end = position + 12 + length
        if base + last_delta >= offset:
            if start < 0:
                start = end = position
            taken = size + (end - start)
            if taken > 0 and taken + (batch_end - end) > max_bytes:
                break
            end = batch_end
            offset = base + last_delta + 1
        position = batch_end
    if end > start:
        out.append(data[start:end])
        size += end - start
    return size, offset


def _wal_row_blocks(row) -> list[tuple[int, int]]:
    """The ranges of a WAL row's object that ReadCaches.wal_row_bytes reads it through."""
    start, end = row.byte_start, row.byte_end
    if end - start >= WAL_BLOCK_BYTES // 2:
        return [(start, end)]
    first = start - start % WAL_BLOCK_BYTES
    if end <= first + WAL_BLOCK_BYTES:
        return [(first, first + WAL_BLOCK_BYTES)]
    middle = first + WAL_BLOCK_BYTES
    return [(first, middle), (middle, middle + WAL_BLOCK_BYTES)]


@dataclass(eq=False, slots=True)
class _BlockLoad:
    """A block being read from the store; readers of the same block wait for it."""

    done: trio.Event = field(default_factory=trio.Event)
    data: bytes | None = None
    waiters: int = 0  # readers waiting for it: a block read ahead for them is claimed


class ReadCaches:
    """The tail cache (recent committed ranges of every open log) and a block cache of
    ranged GETs, both bounded in bytes; cold reads go through the index in PostgreSQL."""

    def __init__(self, metadata, objects, tail_bytes: int = 256 * 1024 * 1024,
                 block_bytes: int = 256 * 1024 * 1024) -> None:
        self.metadata = metadata
        self.objects = objects
        # a block's read: file:// reads a kept block into memory of its own, no copy
        self._get_block_bytes = getattr(objects, "get_view", objects.get)
        self.tail_budget = tail_bytes
        self.tail_used = 0
        self._tail_order: collections.deque[tuple[PartitionLog, Chunk]] = collections.deque()
        self._stale = 0  # entries of _tail_order whose log dropped its tail
        self.block_budget = block_bytes
        self.block_used = 0
        self._blocks: collections.OrderedDict[tuple[str, int, int], bytes] = (
            collections.OrderedDict())
        # A reader per stream object (its footer and the lookups drawn from it), kept for
        # FOOTER_CACHE_ENTRIES objects; each read gets a fresh copy (StreamObjectReader.fresh).
        self._readers: collections.OrderedDict[str, StreamObjectReader] = (
            collections.OrderedDict())
        self._loading: dict[tuple[str, int, int], _BlockLoad] = {}
        # The index rows of each partition's last cold read, from the first it read on
        # (read_cold): a reader walking through history asks PostgreSQL once per
        # COLD_READ_ROWS rows, or once per stream object.
        self._cold_rows: collections.OrderedDict[tuple[uuid.UUID, int], list] = (
            collections.OrderedDict())
        self.cold_rows_kept = 0  # rows in _cold_rows, at most COLD_ROWS_KEPT
        # Read-ahead: the nursery its GETs run in (none: no read-ahead), the last block
        # read of each stream object, the read-ahead GETs in flight.
        self._read_ahead_nursery: trio.Nursery | None = None
        self._last_block: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.read_ahead_in_flight = 0
        self.read_ahead_gets = 0  # read-ahead GETs issued, for tests and benchmarks
        # Blocks read ahead that no reader has asked for yet, and their bytes: read-ahead
        # pauses while they are a quarter of the block cache, so that a consumer of many
        # partitions does not have its read-ahead evicted before it is read (read twice).
        self._unclaimed: dict[tuple[str, int, int], int] = {}
        self.unclaimed_bytes = 0

    def add_tail(self, log_: PartitionLog, chunk: Chunk) -> None:
        log_.tail.append(chunk)
        self._tail_order.append((log_, chunk))
        self.tail_used += len(chunk.data)
        while self.tail_used > self.tail_budget and self._tail_order:
            old_log, old_chunk = self._tail_order.popleft()
            if old_log.tail and old_log.tail[0] is old_chunk:
                old_log.tail.popleft()
                self.tail_used -= len(old_chunk.data)
            else:
                self._stale -= 1  # dropped with its log already

    def forget_rows(self, key: tuple[uuid.UUID, int]) -> None:
        """The partition's cached index rows are no longer trusted (compaction swapped rows
        of the same offsets): the next cold read asks the index."""
        self._drop_rows(key)

    def drop_tail_below(self, log_: PartitionLog, offset: int) -> int:
        """Forget the log's oldest chunks while they lie wholly below `offset` (their
        entries in the eviction order are skipped, as drop_tail's)."""
        dropped = 0
        while log_.tail and log_.tail[0].last_offset < offset:
            chunk = log_.tail.popleft()
            self.tail_used -= len(chunk.data)
            self._stale += 1
            dropped += 1
        return dropped

    def drop_tail(self, log_: PartitionLog) -> None:
        """Forget a closed log's chunks. Their entries in the eviction order are skipped
        when they come up (compacted once they are most of it): no scan per close."""
        for chunk in log_.tail:
            self.tail_used -= len(chunk.data)
        self._stale += len(log_.tail)
        log_.tail.clear()
        if self._stale > len(self._tail_order) // 2 + 1024:
            self._tail_order = collections.deque(
                (l, c) for l, c in self._tail_order if l.tail and c in l.tail)
            self._stale = 0

    async def read_cold(self, log_: PartitionLog, offset: int, max_bytes: int) -> list[Chunk]:
        try:
            chunks: list[Chunk] = []
            rows = self._cached_rows(log_.key, offset)
            cached = rows is not None
            at, size = offset, 0
            while True:
                if rows is None:
                    rows = await self.metadata.find_batches(log_.topic_id, log_.partition, at,
                                                            max_rows=COLD_READ_ROWS)
                    self._keep_rows(log_.key, rows)
                size, i = await self._read_rows(log_, rows, at, max_bytes, chunks, size)
                if not (cached and rows and i == len(rows) and size < max_bytes):
                    break
                # the cached rows ran out with budget left: the index may know more by now
                at, rows, cached = rows[-1].last_offset + 1, None, False
            # what the tail cache holds is read from there, not read ahead
            below = log_.tail[0].base_offset if log_.tail else log_.committed_end
            self._read_ahead_rows(rows[i:], READ_AHEAD_FETCHES * max_bytes, below)
            return chunks
        except ObjectNotFound as exc:
            self._drop_rows(log_.key)
            raise ObjectGone(f"reading offset {offset}: {exc}") from exc
        except StreamObjectError as exc:
            self._drop_rows(log_.key)
            raise StorageUnavailable(f"reading offset {offset}: {exc}") from exc
        except (MetadataError, ObjectStoreError) as exc:
            # Retriable for the client; reads of cached data go on meanwhile.
            raise StorageUnavailable(f"reading offset {offset} from the store: {exc}") from exc

    async def _read_rows(self, log_: PartitionLog, rows: list, offset: int, max_bytes: int,
                         chunks: list[Chunk], size: int) -> tuple[int, int]:
        """Read `rows` (index rows from the one holding `offset`) into `chunks` while the
        budget lasts. The new size, and the index of the first row not read to its end."""
        i = 0
        while i < len(rows) and size < max_bytes:
            row = rows[i]
            if is_stream_object(row.object_key):
                size, complete = await self._read_stream_row(log_, row, offset, max_bytes,
                                                             chunks, size)
                if not complete:
                    break
                i += 1
                continue
            # a run of WAL rows, as many as the budget takes (the first always), at once
            run = i
            while run < len(rows) and not is_stream_object(rows[run].object_key) and (
                    run == i or size < max_bytes):
                size += rows[run].byte_end - rows[run].byte_start
                run += 1
            chunks.extend(await self._get_rows(rows[i:run]))
            i = run
        return size, i

    async def _read_stream_row(self, log_: PartitionLog, row, offset: int, max_bytes: int,
                               chunks: list[Chunk], size: int) -> tuple[int, bool]:
        """A tiered row: only the batches wanted, through the object's footer, one chunk per
        block. The new size, and whether the read reached the row's end."""
        reader = await self.stream_reader(row)
        at = max(offset, row.base_offset)
        while True:  # a read ends at a block's end: one chunk per block
            base, last, data = await reader.read(at, max_bytes - size)
            chunks.append(Chunk(base, last, data))
            size += len(data)
            if size >= max_bytes or last >= row.last_offset or not data:
                break
            at = last + 1
        self.read_ahead(row.object_key, reader)
        return size, last >= row.last_offset

    def _cached_rows(self, key: tuple[uuid.UUID, int], offset: int) -> list | None:
        """The partition's cached index rows from the one holding `offset`; None when the
        offset is not in them (before them, or past them: the index knows more by now)."""
        rows = self._cold_rows.get(key)
        if rows is None:
            return None
        i = 0
        while i < len(rows) and rows[i].last_offset < offset:
            i += 1
        if i == len(rows) or rows[i].base_offset > offset:
            return None
        if i:
            rows = rows[i:]
            self._keep_rows(key, rows)
        else:
            self._cold_rows.move_to_end(key)
        return rows

    def _keep_rows(self, key: tuple[uuid.UUID, int], rows: list) -> None:
        """Committed index rows never change: tiering, compaction and retention replace or
        delete them, and their objects go only after file.delete.delay.ms, so a reader that
        finds one gone forgets them and asks again (ObjectGone)."""
        self._drop_rows(key)
        if not rows:
            return
        self._cold_rows[key] = rows
        self.cold_rows_kept += len(rows)
        while self.cold_rows_kept > COLD_ROWS_KEPT:
            _, old = self._cold_rows.popitem(last=False)
            self.cold_rows_kept -= len(old)

    def _drop_rows(self, key: tuple[uuid.UUID, int]) -> None:
        rows = self._cold_rows.pop(key, None)
        if rows is not None:
            self.cold_rows_kept -= len(rows)

    def _read_ahead_rows(self, rows: list, budget: int, below: int) -> None:
        """After a cold read: GET the WAL rows that follow it, about `budget` bytes (one row
        at least) of those starting below offset `below`, in the background, the same blocks
        a read of them asks for, so that the reader's next Fetch finds them in the block
        cache or on their way."""
        ahead = 0
        for row in rows:
            if ahead >= budget or row.base_offset >= below or is_stream_object(row.object_key):
                break  # (a stream object's reader reads ahead itself: read_ahead)
            ahead += row.byte_end - row.byte_start
            for start, end in _wal_row_blocks(row):
                if not self._read_ahead_soon(row.object_key, start, end):
                    return

    async def wal_row_bytes(self, row) -> bytes | memoryview:
        """A WAL row's batches: a row of half a block or more as itself, a smaller one from
        the aligned block(s) holding it (WAL_BLOCK_BYTES), as _wal_row_blocks says."""
        key, start, end = row.object_key, row.byte_start, row.byte_end
        blocks = _wal_row_blocks(row)
        first, first_end = blocks[0]
        block = await self.get_block(key, first, first_end)
        if len(blocks) == 1:
            return block if (first, first_end) == (start, end) else (
                memoryview(block)[start - first:end - first])
        # across a block boundary: the two pieces (together under half a block)
        after = await self.get_block(key, *blocks[1])
        return b"".join((memoryview(block)[start - first:], memoryview(after)[:end - first_end]))

    async def _get_rows(self, rows: list) -> list[Chunk]:
        """The WAL rows' bytes as chunks in their order, COLD_READ_GETS GETs at a time.
        The first error is raised as itself (not in an exception group)."""
        if len(rows) == 1:
            row = rows[0]
            return [Chunk(row.base_offset, row.last_offset, await self.wal_row_bytes(row))]
        data: list[bytes | memoryview | None] = [None] * len(rows)
        failure: list[Exception] = []
        limiter = trio.CapacityLimiter(COLD_READ_GETS)

        async def get(n: int, row) -> None:
            async with limiter:
                try:
                    data[n] = await self.wal_row_bytes(row)
                except Exception as exc:  # the first ends the read: the others are moot
                    failure.append(exc)
                    nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for n, row in enumerate(rows):
                nursery.start_soon(get, n, row)
        if failure:
            raise failure[0]
        return [Chunk(row.base_offset, row.last_offset, got) for row, got in zip(rows, data)]

    async def stream_reader(self, row) -> StreamObjectReader:
        """The reader of a stream object's row: its footer from the cache, or one ranged GET
        of the bytes after the row's data (the footer); the batches then come in the
        reader's blocks through the block cache."""
        key = row.object_key
        reader = self._readers.get(key)
        if reader is None:
            footer = decode_footer(await self.objects.get(key, row.byte_end), row.byte_end)

            async def block(start: int, end: int) -> bytes:
                return await self.get_block(key, start, end)

            reader = self._readers[key] = StreamObjectReader(footer, block, STREAM_BLOCK_BYTES)
            while len(self._readers) > FOOTER_CACHE_ENTRIES:
                self._readers.popitem(last=False)
        else:
            self._readers.move_to_end(key)
        return reader.fresh()

    # -- read-ahead of stream objects -------------------------------------------------------

    async def run_read_ahead(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Host the read-ahead GETs until cancelled (the owner's nursery runs this; its
        cancellation cancels every read-ahead in flight)."""
        try:
            async with trio.open_nursery() as nursery:
                self._read_ahead_nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._read_ahead_nursery = None

    def read_ahead(self, key: str, reader: StreamObjectReader) -> None:
        """After a read of a stream object: if it went on from where the previous read of
        this object ended (or started at its beginning), fetch the next blocks in the
        background, the same ranges every reader asks for, so they land in the block cache
        (or are waited on by a reader that needs them first)."""
        span = reader.blocks_read
        if span is None:
            return
        first, last = span
        previous = self._last_block.get(key)
        self._last_block[key] = last
        self._last_block.move_to_end(key)
        while len(self._last_block) > FOOTER_CACHE_ENTRIES:
            self._last_block.popitem(last=False)
        sequential = (first == 0 if previous is None
                      else first <= previous + 1 and last >= previous)
        if not sequential:
            return
        for n in range(last + 1, min(last + 1 + READ_AHEAD_BLOCKS, reader.blocks)):
            if not self._read_ahead_soon(key, *reader.block_range(n)):
                return

    def _read_ahead_soon(self, key: str, start: int, end: int) -> bool:
        """Start a background GET of a block not cached nor being read; False when
        read-ahead may not start one now (no nursery, READ_AHEAD_GETS in flight, or a
        quarter of the block cache unclaimed)."""
        block_key = (key, start, end)
        if block_key in self._blocks or block_key in self._loading:
            return True
        if (self._read_ahead_nursery is None or self.read_ahead_in_flight >= READ_AHEAD_GETS
                or self.unclaimed_bytes >= self.block_budget // 4):
            return False
        self.read_ahead_in_flight += 1
        self.read_ahead_gets += 1
        self._read_ahead_nursery.start_soon(self._read_ahead_block, key, start, end)
        return True

    async def _read_ahead_block(self, key: str, start: int, end: int) -> None:
        try:
            await self.get_block(key, start, end, ahead=True)
        except Exception as exc:  # a reader that needs the block asks again itself
            log.debug("read-ahead of %s [%d, %d) failed: %r", key, start, end, exc)
        finally:
            self.read_ahead_in_flight -= 1

    async def batches_reaching(self, row, timestamp: int) -> bytes | memoryview:
        """Batches of an index row from the first whose max timestamp reaches `timestamp`
        (ListOffsets): the whole row of a WAL object, the one batch a stream object's time
        index leads to."""
        if not is_stream_object(row.object_key):
            return await self.wal_row_bytes(row)
        try:
            found = await (await self.stream_reader(row)).first_batch_reaching(timestamp)
        except StreamObjectError as exc:
            raise StorageUnavailable(f"reading {row.object_key}: {exc}") from exc
        return b"" if found is None else found[1]

    async def get_block(self, key: str, start: int, end: int, *,
                        ahead: bool = False) -> bytes | memoryview:
        """A block through the cache. `ahead`: read ahead, for no reader yet."""
        block_key = (key, start, end)
        while True:
            data = self._blocks.get(block_key)
            if data is not None:
                self._blocks.move_to_end(block_key)
                if not ahead:
                    self._claim(block_key)
                return data
            # Readers missing the same block at once share one GET (catch-up readers of
            # one partition read the same blocks of its stream objects).
            loading = self._loading.get(block_key)
            if loading is None:
                break
            loading.waiters += not ahead
            await loading.done.wait()
            if loading.data is not None:
                return loading.data
            # the GET failed for its reader: this one tries itself
        loading = self._loading[block_key] = _BlockLoad()
        try:
            data = loading.data = await self._get_block_bytes(key, start, end)
        finally:
            del self._loading[block_key]
            loading.done.set()
        self._blocks[block_key] = data
        self.block_used += len(data)
        if ahead and not loading.waiters:
            self._unclaimed[block_key] = len(data)
            self.unclaimed_bytes += len(data)
        while self.block_used > self.block_budget and self._blocks:
            old_key, old = self._blocks.popitem(last=False)
            self.block_used -= len(old)
            self._claim(old_key)
        return data

    def _claim(self, block_key: tuple[str, int, int]) -> None:
        size = self._unclaimed.pop(block_key, None)
        if size is not None:
            self.unclaimed_bytes -= size
