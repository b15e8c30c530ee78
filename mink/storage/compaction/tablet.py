"""A KV tablet (seed 000's primary-key bucket): per partition of a compacted topic, key digest
-> offset of the key's latest record and whether that record is a tombstone. Offsets, not
object locations: tiering and compaction move the data, never an offset.

Compact by construction: two packed arrays (`array` module, no Python object per key) of an
open-addressing hash table with linear probing, 8 bytes of key digest (BLAKE2b) and 8 bytes
of value (offset << 1 | tombstone) per slot, at most 70% full: 16 / 0.7..0.35 bytes per key,
about 34 at 1,000,000 keys (2**21 slots, 32 MiB). A digest collision (two keys among a
million: about 3e-8) makes the two keys share a slot; a lookup reads the record at the
offset and compares the key, so it answers "not found" rather than another key's value.

`apply` takes committed batches in offset order, as replay and the live tail give them:
plain records at once; a transaction's records when its commit marker arrives (dropped on
abort), so the tablet only ever points at committed data.

A snapshot is the arrays' bytes behind a small header with the offset it covers (`next`:
replay resumes there), so restoring is one decode and a replay of what came after.

Pure: no I/O here (where snapshots are stored and when is not built yet; docs/compaction.md).
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from typing import NamedTuple

from mink.protocol.records import iter_records, parse_batch_header

_HEADER = struct.Struct(">4sHqqq")  # magic, version, next offset, count, capacity
_MAGIC = b"MKVT"
_VERSION = 1
_CONTROL_KEY = struct.Struct(">hh")
MAX_LOAD = 0.7
_MIN_CAPACITY = 1024


class TabletError(Exception):
    """Bytes that are not a tablet snapshot."""


class Entry(NamedTuple):
    offset: int
    tombstone: bool


def key_digest(key: bytes) -> int:
    """The key's 64-bit digest; never 0 (0 marks an empty slot)."""
    digest = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return digest or 1


class KVTablet:
    __slots__ = ("_digests", "_values", "_mask", "count", "next_offset", "_pending")

    def __init__(self, capacity: int = _MIN_CAPACITY, next_offset: int = 0) -> None:
        capacity = max(_MIN_CAPACITY, 1 << (max(capacity, 1) - 1).bit_length())
        self._digests = array("Q", bytes(8 * capacity))
        self._values = array("q", bytes(8 * capacity))
        self._mask = capacity - 1
        self.count = 0
        self.next_offset = next_offset  # every record below it is applied
        # producer id -> its open transaction's first offset and (digest, value) records
        self._pending: dict[int, tuple[int, list[tuple[int, int]]]] = {}

    @property
    def capacity(self) -> int:
        return self._mask + 1

    def nbytes(self) -> int:
        """Bytes of the table's arrays (what a key costs: nbytes / count)."""
        return self._digests.itemsize * len(self._digests) + \
            self._values.itemsize * len(self._values)

    def __len__(self) -> int:
        return self.count

    # -- the table -------------------------------------------------------------------------

    def _put(self, digest: int, value: int) -> None:
        digests, mask = self._digests, self._mask
        i = digest & mask
        while True:
            found = digests[i]
            if found == digest:
                self._values[i] = value
                return
            if found == 0:
                digests[i] = digest
                self._values[i] = value
                self.count += 1
                if self.count > MAX_LOAD * (mask + 1):
                    self._grow()
                return
            i = (i + 1) & mask

    def _grow(self) -> None:
        old_digests, old_values = self._digests, self._values
        capacity = 2 * (self._mask + 1)
        self._digests = array("Q", bytes(8 * capacity))
        self._values = array("q", bytes(8 * capacity))
        self._mask = capacity - 1
        self.count = 0
        for digest, value in zip(old_digests, old_values):
            if digest:
                self._put(digest, value)

    def put(self, key: bytes, offset: int, tombstone: bool = False) -> None:
        self._put(key_digest(key), offset << 1 | tombstone)

    def get(self, key: bytes) -> Entry | None:
        digest = key_digest(key)
        digests, mask = self._digests, self._mask
        i = digest & mask
        while True:
            found = digests[i]
            if found == digest:
                value = self._values[i]
                return Entry(value >> 1, bool(value & 1))
            if found == 0:
                return None
            i = (i + 1) & mask

    # -- the log -----------------------------------------------------------------------------

    def apply(self, batch: bytes | memoryview) -> None:
        """One committed batch at or after next_offset (earlier ones are skipped: replay
        may start inside what a snapshot covers)."""
        header = parse_batch_header(batch)
        if header.last_offset < self.next_offset:
            return
        if header.is_control:
            _, pending = self._pending.pop(header.producer_id, (0, ()))
            if _commits(batch):
                for digest, value in pending:
                    self._put(digest, value)
        else:
            base = header.base_offset
            target = (self._pending.setdefault(header.producer_id, (base, []))[1]
                      if header.is_transactional else None)
            for record in iter_records(batch):
                offset = base + record.offset_delta
                if record.key is None or offset < self.next_offset:
                    continue
                item = (key_digest(bytes(record.key)), offset << 1 | (record.value is None))
                if target is None:
                    self._put(*item)
                else:
                    target.append(item)
        self.next_offset = header.last_offset + 1

    # -- snapshots -------------------------------------------------------------------------

    def snapshot_offset(self) -> int:
        """Where a restore of a snapshot taken now replays from: next_offset, or the first
        offset of a transaction still open (its records are not in the table yet). Replay
        in offset order is idempotent: records applied again leave the same table."""
        return min([self.next_offset, *(first for first, _ in self._pending.values())])

    def snapshot(self) -> list[bytes]:
        """The parts of a snapshot; it covers every offset below `snapshot_offset()`."""
        return [_HEADER.pack(_MAGIC, _VERSION, self.snapshot_offset(), self.count,
                             self.capacity),
                self._digests.tobytes(), self._values.tobytes()]

    @classmethod
    def restore(cls, data: bytes | memoryview) -> KVTablet:
        view = memoryview(data)
        if len(view) < _HEADER.size:
            raise TabletError("too short for a tablet snapshot")
        magic, version, next_offset, count, capacity = _HEADER.unpack_from(view)
        if magic != _MAGIC or version != _VERSION:
            raise TabletError(f"not a tablet snapshot (magic {magic!r}, version {version})")
        if capacity < 1 or capacity & (capacity - 1) or \
                len(view) != _HEADER.size + 16 * capacity:
            raise TabletError(f"tablet snapshot of {len(view)} bytes for {capacity} slots")
        tablet = cls.__new__(cls)
        tablet._digests = array("Q")
        tablet._digests.frombytes(view[_HEADER.size:_HEADER.size + 8 * capacity])
        tablet._values = array("q")
        tablet._values.frombytes(view[_HEADER.size + 8 * capacity:])
        tablet._mask = capacity - 1
        tablet.count = count
        tablet.next_offset = next_offset
        tablet._pending = {}
        return tablet


def _commits(batch) -> bool:
    for record in iter_records(batch):
        if record.key is not None and len(record.key) >= _CONTROL_KEY.size:
            return _CONTROL_KEY.unpack_from(record.key)[1] == 1
    return False


__all__ = ["Entry", "KVTablet", "TabletError", "key_digest"]
