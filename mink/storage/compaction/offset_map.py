"""The cleaner's offset map (Kafka's OffsetMap / SkimpyOffsetMap): key digest -> offset of the
key's latest record in the dirty section of one pass, in a table of fixed size, so a pass's
memory does not grow with the partition's keys: when the dirty section has more keys than
fit, the pass cleans only up to where the map filled (Kafka's cleaner does the same) and the
next pass goes on from there.

Packed arrays (`array` module, no Python object per key) of an open-addressing table with
double hashing, at most `MAX_LOAD` full (Kafka's log.cleaner.io.buffer.load.factor, 0.9):
16 bytes of key digest (BLAKE2b, as Kafka's 16 bytes of MD5) and 8 bytes of offset per slot,
24 bytes a slot, about 27 a key when full. The digest is 16 bytes, not the KV tablet's 8: a
collision here is not caught by reading the record (as a tablet lookup does), it would drop
the latest record of one of the two keys, so its odds must be Kafka's (about 1e-27 for a
million keys a pass), not 3e-8.

`limit`: only entries below it supersede (`superseded`). A pass that learns late that it
must stop lower (an open transaction: the last stable offset; the map filled while a
committed transaction's records were applied) lowers it instead of rebuilding the map:
an entry at or above it may hide an earlier one of its key below it, so a record it would
have superseded is kept, which is never wrong (a later pass drops it).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import struct
from array import array

MAX_LOAD = 0.9
SLOT_BYTES = 24
MIN_SLOTS = 64
_DIGEST = struct.Struct("<QQ")
NO_LIMIT = 2**63 - 1


_blake2b = hashlib.blake2b


def digest(key: bytes | memoryview) -> tuple[int, int]:
    """The key's 128-bit digest as two words; the first is never 0 (0 marks an empty slot)."""
    hi, lo = _DIGEST.unpack(_blake2b(key, digest_size=16).digest())
    return hi or 1, lo


def slots_for(buffer_bytes: int, keys_at_most: int | None = None) -> int:
    """The slots (a power of two) of a map within `buffer_bytes`, and no larger than
    `keys_at_most` keys need (a bound known before the pass: its dirty section's offsets)."""
    most = max(MIN_SLOTS, buffer_bytes // SLOT_BYTES)
    most = 1 << (most.bit_length() - 1)  # the largest power of two within the buffer
    if keys_at_most is not None:
        need = 1 << max(0, int(keys_at_most / MAX_LOAD) + 1).bit_length()
        most = min(most, max(MIN_SLOTS, need))
    return most


class OffsetMap:
    __slots__ = ("_hi", "_lo", "_offsets", "_mask", "count", "max_entries", "limit",
                 "latest_offset")

    def __init__(self, slots: int = MIN_SLOTS) -> None:
        if slots < 1 or slots & (slots - 1):
            raise ValueError(f"an offset map's slots are a power of two, not {slots}")
        self._hi = array("Q", [0]) * slots  # (no temporary bytes of the same size)
        self._lo = array("Q", [0]) * slots
        self._offsets = array("q", [0]) * slots
        self._mask = slots - 1
        self.count = 0
        self.max_entries = max(1, int(slots * MAX_LOAD))
        self.limit = NO_LIMIT
        self.latest_offset = -1  # the largest offset put (Kafka's latestOffset)

    @classmethod
    def sized(cls, buffer_bytes: int, keys_at_most: int | None = None) -> OffsetMap:
        return cls(slots_for(buffer_bytes, keys_at_most))

    @property
    def slots(self) -> int:
        return self._mask + 1

    def nbytes(self) -> int:
        return SLOT_BYTES * self.slots

    def __len__(self) -> int:
        return self.count

    @property
    def full(self) -> bool:
        return self.count >= self.max_entries

    def _slot(self, hi: int, lo: int) -> int:
        """The slot holding the digest, or the empty slot where it would go."""
        his, los, mask = self._hi, self._lo, self._mask
        i, step = lo & mask, hi | 1  # an odd step visits every slot of a power-of-two table
        while True:
            found = his[i]
            if found == 0 or (found == hi and los[i] == lo):
                return i
            i = (i + step) & mask

    def put_digest(self, hi: int, lo: int, offset: int) -> bool:
        """Record `offset` as the digest's latest; False (nothing changes) if the digest is
        new and the map is full. (Once per dirty record: `_slot` inlined.)"""
        his, los, mask = self._hi, self._lo, self._mask
        i, step = lo & mask, hi | 1
        while True:
            found = his[i]
            if found == 0:
                if self.count >= self.max_entries:
                    return False
                his[i] = hi
                los[i] = lo
                self.count += 1
                break
            if found == hi and los[i] == lo:
                break
            i = (i + step) & mask
        self._offsets[i] = offset
        if offset > self.latest_offset:
            self.latest_offset = offset
        return True

    def put(self, key: bytes | memoryview, offset: int) -> bool:
        return self.put_digest(*digest(key), offset)

    def get(self, key: bytes | memoryview) -> int | None:
        i = self._slot(*digest(key))
        return self._offsets[i] if self._hi[i] else None

    def superseded(self, key: bytes | memoryview, offset: int) -> bool:
        """Whether a record of `key` at `offset` has a later one in the map, below `limit`.
        (Once per record of a pass: `digest` and `_slot` inlined.)"""
        hi, lo = _DIGEST.unpack(_blake2b(key, digest_size=16).digest())
        hi = hi or 1
        his, los, mask = self._hi, self._lo, self._mask
        i, step = lo & mask, hi | 1
        while True:
            found = his[i]
            if found == 0:
                return False
            if found == hi and los[i] == lo:
                return offset < self._offsets[i] < self.limit
            i = (i + step) & mask


__all__ = ["MAX_LOAD", "NO_LIMIT", "OffsetMap", "SLOT_BYTES", "digest", "slots_for"]
