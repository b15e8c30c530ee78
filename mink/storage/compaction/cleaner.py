"""Kafka's LogCleaner for one partition's batches, pure (no I/O, no clock: `now_ms` comes in).
The pass that runs them under the topic's writer lease, streaming the partition's objects
block by block through them, is `mink/storage/compaction/store.py`; the broker loop that
schedules it is `mink/broker/cluster/compaction.py`.

A pass has Kafka's two steps, each a stream fed the batches from the log start in offset
order, so that a pass holds only the map and the batches at hand:

1. `MapBuilder` (Kafka's buildOffsetMap): every transaction's decision (its marker), and over
   the dirty section (from the partition's cleaned-to offset up to the cleanable end), key
   -> offset of its latest record, in an `OffsetMap` of fixed size (offset_map.py); when a
   key does not fit, it stops there, and the pass cleans only up to that offset.
2. `BatchCleaner` / `clean_batch`, for every batch from the log start up to the cleanable
   end: a record is
   kept if no later record of its key is in the map; a batch whose records all stay is kept
   byte for byte; one that loses some is rebuilt with the records kept, at their offsets
   (gaps inside and between batches, as Kafka), the same base offset, last offset delta,
   producer id, epoch and base sequence, recompressed with its own codec, and checked by the
   record walk of the LogValidator before it is used; a batch that loses all goes.

Tombstones (a key with a null value) follow KIP-534: the first pass that keeps one sets the
batch's delete horizon (attribute bit 6; the base timestamp holds now + delete.retention.ms,
the records' timestamp deltas are rewritten against it so their timestamps stay); a later
pass after the horizon drops them.

Transactions, as Kafka's cleaner: a transactional batch is decided by its producer's next
marker (control batch) in the log. Committed data is cleaned like any other; aborted data
goes; undecided data (no marker yet: an open transaction) is left as it is, never
supersedes, and the cleanable end stops at its first offset (the last stable offset), so
nothing above an open transaction is cleaned. A marker stays while data of its transaction
does; once none is left it gets a delete horizon like a tombstone and goes after it
(delete.retention.ms after its data went).

`clean_batches` runs both steps over batches in memory (tests, the benchmark).
"""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Iterable
from typing import NamedTuple

from mink.protocol import compression as codecs
from mink.protocol import record_walk
from mink.protocol.records import (
    ATTRIBUTES_OFFSET,
    DELETE_HORIZON_FLAG_MASK,
    LAST_OFFSET_DELTA_OFFSET,
    LOG_APPEND_TIME,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Record,
    build_batch,
    decompressed_records,
    is_crc_valid,
    iter_batches,
    iter_records,
    parse_batch_header,
    write_crc,
)
from mink.storage.compaction.offset_map import OffsetMap, digest

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class CleanerError(Exception):
    """A batch could not be cleaned (it does not decode, or its rebuild failed the check)."""


# What becomes of a batch in a pass.
CLEAN = "clean"    # its records kept if not superseded (plain data, committed transactions)
KEEP = "keep"      # as it is (undecided transactional data, anything from the cleanable end)
DROP = "drop"      # gone (aborted transactional data)
MARKER = "marker"  # a transaction marker (control batch)

_CONTROL_KEY = struct.Struct(">hh")  # version, type (0: abort, 1: commit)


def marker_commits(batch: bytes | memoryview) -> bool:
    """Whether a control batch is a commit marker (False: an abort)."""
    for record in iter_records(batch):
        if record.key is not None and len(record.key) >= _CONTROL_KEY.size:
            return _CONTROL_KEY.unpack_from(record.key)[1] == 1
    return False


class Decisions:
    """The transaction markers a pass has seen, per producer in offset order (offset << 1 |
    commit, packed): a transactional batch is decided by its producer's next marker."""

    __slots__ = ("_markers",)

    def __init__(self) -> None:
        self._markers: dict[int, array] = {}

    def add(self, producer_id: int, offset: int, commits: bool) -> None:
        self._markers.setdefault(producer_id, array("q")).append(offset << 1 | commits)

    def mode(self, header: BatchHeader) -> str:
        if header.is_control:
            return MARKER
        if not header.is_transactional:
            return CLEAN
        markers = self._markers.get(header.producer_id)
        if markers is None:
            return KEEP
        i = bisect.bisect_right(markers, header.base_offset << 1 | 1)
        if i == len(markers):
            return KEEP  # no marker yet: undecided
        return CLEAN if markers[i] & 1 else DROP


class MapBuilder:
    """Kafka's buildOffsetMap as a stream: fed every batch from the log start in offset
    order (`feed`), it learns the transactions' decisions over the whole range and puts the
    dirty section's keys (plain records, and committed transactions' at their commit
    marker; an aborted transaction's are dropped) into a map of fixed size. When the map is
    full it stops (`feed` returns False); `finish` then gives the offset the pass cleans up
    to: the cleanable end, lowered to the first offset of a transaction still undecided
    (the last stable offset), and to the first record that did not fit in the map.

    `put`: False when the map is given already built (only the decisions are wanted)."""

    def __init__(self, offset_map: OffsetMap, dirty_from: int, end: int,
                 put: bool = True) -> None:
        self.map = offset_map
        self.dirty_from = dirty_from
        self.end = end
        self.decisions = Decisions()
        self.full_at: int | None = None  # the first offset whose record did not fit
        self.scanned_to = dirty_from     # every batch below it was fed
        self._put = put
        # per producer: the first offset of its transaction since its last marker
        self._open: dict[int, int] = {}
        # per producer: its open transaction's dirty records, (digest hi, lo, offset) packed
        self._pending: dict[int, tuple[array, array, array]] = {}
        self._pending_count = 0

    @property
    def full(self) -> bool:
        return self.full_at is not None

    def feed(self, batches: Iterable[bytes | memoryview]) -> bool:
        for batch in batches:
            if not self._feed(batch):
                return False
        return True

    def _room(self) -> bool:
        return self.map.count + self._pending_count < self.map.max_entries

    def _feed(self, batch: bytes | memoryview) -> bool:
        if self.full_at is not None:
            return False
        header = parse_batch_header(batch)
        if header.base_offset >= self.end:
            return True
        pid = header.producer_id
        if header.is_control:
            commits = marker_commits(batch)
            self.decisions.add(pid, header.base_offset, commits)
            self._open.pop(pid, None)
            pending = self._pending.pop(pid, None)
            if pending is not None:
                his, los, offsets = pending
                self._pending_count -= len(offsets)
                if commits:
                    for i, (hi, lo, offset) in enumerate(zip(his, los, offsets)):
                        if not self.map.put_digest(hi, lo, offset):
                            # what is left of the transaction does not fit: the map is
                            # good below its first record that did not
                            self.full_at = offset
                            return False
        elif header.last_offset >= self.dirty_from and self._put:
            if header.is_transactional:
                self._open.setdefault(pid, header.base_offset)
                target = self._pending.get(pid)
                if target is None:
                    target = self._pending[pid] = (array("Q"), array("Q"), array("q"))
            else:
                target = None
            base, end, dirty_from = header.base_offset, self.end, self.dirty_from
            for record in iter_records(batch):
                offset = base + record.offset_delta
                if record.key is None or offset < dirty_from or offset >= end:
                    continue
                hi, lo = digest(record.key)
                if target is not None:
                    if not self._room():
                        self.full_at = offset
                        return False
                    target[0].append(hi)
                    target[1].append(lo)
                    target[2].append(offset)
                    self._pending_count += 1
                elif not self.map.put_digest(hi, lo, offset):
                    self.full_at = offset
                    return False
        elif header.is_transactional:
            self._open.setdefault(pid, header.base_offset)
        self.scanned_to = header.last_offset + 1
        return True

    def finish(self) -> int:
        """The offset the pass cleans below (and sets the map's limit to)."""
        limit = min([self.end, *self._open.values()])
        if self.full_at is not None:
            limit = min(limit, self.full_at)
        self.map.limit = min(self.map.limit, limit)
        return limit


def build_offset_map(batches: Iterable[bytes | memoryview], start: int, end: int,
                     into: OffsetMap | None = None) -> OffsetMap:
    """The latest offset of every key among the records with start <= offset < end (of
    plain and committed data), in a map large enough for them all."""
    batches = list(batches)
    if into is None:
        into = OffsetMap.sized(
            2**62, sum(parse_batch_header(b).records_count for b in batches))
    builder = MapBuilder(into, start, end)
    builder.feed(batches)
    assert not builder.full, "a map sized for every record"
    builder.finish()
    return into


class Cleaned(NamedTuple):
    batch: bytes | memoryview | None  # the batch to keep (as it was, or rebuilt); None: gone
    records_in: int
    records_out: int
    tombstones_dropped: int
    rebuilt: bool
    horizon: int | None = None  # the delete horizon of the tombstones it keeps, if any


def clean_batch(batch: bytes | memoryview, offset_map: OffsetMap, *, now_ms: int,
                delete_retention_ms: int, end: int, keep_whole: bool = False,
                mode: str | None = None) -> Cleaned:
    """One batch of the cleaned range (its base offset below `end`, the cleanable end).
    `keep_whole`: the range's last batch, never dropped: when nothing of it stays it is kept
    as it was, so the range keeps its last offset (a rebuilt batch keeps its last offset
    delta anyway)."""
    header = parse_batch_header(batch)
    count = header.records_count
    if mode is None:  # alone: plain data is cleaned, anything transactional kept
        mode = KEEP if header.is_control or header.is_transactional else CLEAN
    if mode == DROP and not keep_whole:
        return Cleaned(None, count, 0, 0, False)
    if mode != CLEAN or header.last_offset >= end:
        return Cleaned(batch, count, count, 0, False)
    horizon_passed = header.has_delete_horizon_ms and header.base_timestamp <= now_ms
    kept: list[tuple[int, int, Record]] = []  # (offset, timestamp, record)
    tombstones_dropped = 0
    base = header.base_offset
    for record in iter_records(batch):
        offset = base + record.offset_delta
        if record.key is not None and offset_map.superseded(record.key, offset):
            continue
        if record.value is None and horizon_passed:
            tombstones_dropped += 1
            continue
        kept.append((offset, header.base_timestamp + record.timestamp_delta, record))
    has_tombstones = any(r.value is None for _, _, r in kept)
    needs_horizon = has_tombstones and not header.has_delete_horizon_ms
    if len(kept) == count and not needs_horizon:
        return Cleaned(batch, count, count, 0, False,
                       header.base_timestamp if has_tombstones else None)
    if not kept and not keep_whole:
        return Cleaned(None, count, 0, tombstones_dropped, False)
    if not kept:  # the last batch: kept whole, tombstones and all, until more data follows
        return Cleaned(batch, count, count, 0, False)
    horizon = None
    if has_tombstones:
        horizon = (header.base_timestamp if header.has_delete_horizon_ms
                   else now_ms + delete_retention_ms)
    rebuilt = rebuild_batch(header, kept, horizon)
    return Cleaned(rebuilt, count, len(kept), tombstones_dropped, True, horizon)


def rebuild_batch(header: BatchHeader, kept: list[tuple[int, int, Record]],
                  delete_horizon_ms: int | None) -> bytes:
    """The batch of `header` with only the records `kept` ((offset, timestamp, record) in
    offset order), at their offsets, in the batch's own codec; with a delete horizon, the
    base timestamp is the horizon (KIP-534) and the deltas are taken against it."""
    base_timestamp = header.base_timestamp if delete_horizon_ms is None else delete_horizon_ms
    records = [r._replace(offset_delta=offset - header.base_offset,
                          timestamp_delta=timestamp - base_timestamp)
               for offset, timestamp, r in kept]
    if header.timestamp_type == LOG_APPEND_TIME:
        max_timestamp = header.max_timestamp
    else:
        max_timestamp = max(timestamp for _, timestamp, _ in kept)
    out = bytearray(build_batch(
        records, base_offset=header.base_offset, compression=header.compression,
        producer_id=header.producer_id, producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence, timestamp_type=header.timestamp_type,
        base_timestamp=base_timestamp, max_timestamp=max_timestamp,
        partition_leader_epoch=header.partition_leader_epoch,
        is_transactional=header.is_transactional, is_control=header.is_control))
    # The batch keeps the offsets it covered: its last offset delta, so the producer's
    # last sequence and the next batch's offset stay what they were.
    _INT32.pack_into(out, LAST_OFFSET_DELTA_OFFSET, header.last_offset - header.base_offset)
    if delete_horizon_ms is not None:
        (attributes,) = _INT16.unpack_from(out, ATTRIBUTES_OFFSET)
        _INT16.pack_into(out, ATTRIBUTES_OFFSET, attributes | DELETE_HORIZON_FLAG_MASK)
    write_crc(out)
    check_rebuilt(bytes(out))
    return bytes(out)


def check_rebuilt(batch: bytes) -> None:
    """The LogValidator's checks a rebuilt batch must pass: CRC, the codec decompresses it,
    the record walk finds its framing and count whole and every record keyed; offset deltas
    only increasing and within the batch (they have gaps: the walk's consecutive-delta rule
    is for client batches)."""
    header = parse_batch_header(batch)
    if not is_crc_valid(batch) or header.size != len(batch):
        raise CleanerError(f"rebuilt batch at {header.base_offset} fails its CRC or length")
    section = (batch[RECORD_BATCH_OVERHEAD:] if header.compression == codecs.NONE
               else decompressed_records(batch))
    error, _, found = record_walk.walk_records(section, header.records_count,
                                               header.base_timestamp, 0, 0, False, True)
    if error is not None or any(kind != record_walk.OFFSET_DELTA for _, kind, _ in found):
        raise CleanerError(f"rebuilt batch at {header.base_offset}: {error or found[:3]}")
    deltas = [r.offset_delta for r in iter_records(batch)]
    last_delta = header.last_offset - header.base_offset
    if any(b <= a for a, b in zip(deltas, deltas[1:])) or deltas[0] < 0 \
            or deltas[-1] > last_delta:
        raise CleanerError(f"rebuilt batch at {header.base_offset}: offset deltas {deltas[:5]}")


class BatchCleaner:
    """Kafka's cleanInto as a stream: every batch from the log start up to the pass's
    cleanable end, in offset order, cleaned against the map (`clean`); what it did summed
    up as it goes. `last`: the range's last batch (never dropped)."""

    def __init__(self, offset_map: OffsetMap, decisions: Decisions, *, now_ms: int,
                 delete_retention_ms: int, end: int) -> None:
        self.map = offset_map
        self.decisions = decisions
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        self.end = end
        self.records_in = self.records_out = self.tombstones_dropped = self.rebuilt = 0
        self.batches_dropped = 0
        self.next_horizon: int | None = None
        # per producer: whether data of its transaction since its last marker is kept
        self._txn_alive: dict[int, bool] = {}

    def clean(self, batch: bytes | memoryview, last: bool = False
              ) -> bytes | memoryview | None:
        header = parse_batch_header(batch)
        mode = self.decisions.mode(header)
        if mode == MARKER:
            alive = self._txn_alive.pop(header.producer_id, False)
            kept = _clean_marker(batch, header, alive, self.now_ms, self.delete_retention_ms,
                                 self.end, keep_whole=last)
            cleaned = Cleaned(kept, 1, 0 if kept is None else 1, 0,
                              kept is not None and kept is not batch,
                              _horizon_of(kept) if kept is not None and not alive else None)
        else:
            cleaned = clean_batch(batch, self.map, now_ms=self.now_ms,
                                  delete_retention_ms=self.delete_retention_ms, end=self.end,
                                  keep_whole=last, mode=mode)
            if header.is_transactional:
                self._txn_alive[header.producer_id] = (
                    self._txn_alive.get(header.producer_id, False)
                    or cleaned.batch is not None)
        self.records_in += cleaned.records_in
        self.records_out += cleaned.records_out
        self.tombstones_dropped += cleaned.tombstones_dropped
        self.rebuilt += cleaned.rebuilt
        self.batches_dropped += cleaned.batch is None
        if cleaned.horizon is not None and cleaned.horizon > self.now_ms and (
                self.next_horizon is None or cleaned.horizon < self.next_horizon):
            self.next_horizon = cleaned.horizon
        return cleaned.batch


class PassResult(NamedTuple):
    batches: list[bytes | memoryview]
    records_in: int
    records_out: int
    tombstones_dropped: int
    batches_rebuilt: int
    # The earliest delete horizon still ahead (after now_ms) among the tombstones kept: the
    # pass due then drops them, dirty or not. None: no tombstone waits for its horizon.
    next_horizon: int | None = None
    end: int | None = None  # the cleanable end the pass used (lowered to the LSO)


def clean_batches(data: list[bytes | memoryview], offset_map: OffsetMap | None = None, *,
                  now_ms: int, delete_retention_ms: int, end: int,
                  dirty_from: int | None = None) -> PassResult:
    """Every batch of `data` (whole batches, offset order) cleaned in memory, the two
    streams of a pass one after the other (what `store.py` does over a partition's
    objects, block by block); the last batch is never dropped. Without `offset_map`, it is
    built here from `dirty_from`, large enough for every key."""
    batches = [b for chunk in data for _, b in iter_batches(chunk)]
    start = end if dirty_from is None else min(dirty_from, end)
    if offset_map is None:
        offset_map = OffsetMap.sized(2**62, sum(parse_batch_header(b).records_count
                                                for b in batches))
        builder = MapBuilder(offset_map, start, end)
    else:
        builder = MapBuilder(offset_map, start, end, put=False)
    builder.feed(batches)
    limit = builder.finish()
    pass_ = BatchCleaner(offset_map, builder.decisions, now_ms=now_ms,
                         delete_retention_ms=delete_retention_ms, end=limit)
    last = len(batches) - 1
    out = [pass_.clean(b, i == last) for i, b in enumerate(batches)]
    return PassResult([b for b in out if b is not None], pass_.records_in, pass_.records_out,
                      pass_.tombstones_dropped, pass_.rebuilt, pass_.next_horizon, limit)


def _horizon_of(batch) -> int | None:
    header = parse_batch_header(batch)
    return header.base_timestamp if header.has_delete_horizon_ms else None


def _clean_marker(batch, header: BatchHeader, has_data: bool, now_ms: int,
                  delete_retention_ms: int, end: int, keep_whole: bool):
    """A marker stays while data of its transaction does; then it gets a delete horizon and
    goes after it (Kafka keeps markers delete.retention.ms after their data is gone)."""
    if has_data or header.last_offset >= end:
        return batch
    if header.has_delete_horizon_ms:
        if header.base_timestamp <= now_ms and not keep_whole:
            return None
        return batch
    timestamp = header.base_timestamp
    kept = [(header.base_offset + r.offset_delta, timestamp + r.timestamp_delta, r)
            for r in iter_records(batch)]
    return rebuild_batch(header, kept, now_ms + delete_retention_ms)


__all__ = ["CLEAN", "DROP", "KEEP", "MARKER", "BatchCleaner", "Cleaned", "CleanerError",
           "Decisions", "MapBuilder", "OffsetMap", "PassResult", "build_offset_map",
           "check_rebuilt", "clean_batch", "clean_batches", "marker_commits",
           "rebuild_batch"]
