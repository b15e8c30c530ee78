"""Record batches for tests, including the bad ones a fuzzer sends: any records section
(garbage included) wrapped in a v2 header with a valid CRC."""

from __future__ import annotations

import struct
import time

from mink.protocol import compression as codecs
from mink.protocol.records import (
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    Record,
    encode_records,
    write_crc,
)

_HEADER = struct.Struct(">qiibIhiqqqhii")


def wrap_section(section: bytes, count: int, *, last_offset_delta: int | None = None,
                 compression: int = 0, base_timestamp: int | None = None,
                 max_timestamp: int | None = None, attributes: int = 0, producer_id: int = -1,
                 producer_epoch: int = -1, base_sequence: int = -1,
                 base_offset: int = 0) -> bytes:
    """A v2 batch around `section` (already compressed when `compression` is set) with a
    correct CRC, whatever the section holds."""
    if base_timestamp is None:
        base_timestamp = time.time_ns() // 1_000_000
    if max_timestamp is None:
        max_timestamp = base_timestamp
    if last_offset_delta is None:
        last_offset_delta = count - 1
    buf = bytearray(RECORD_BATCH_OVERHEAD + len(section))
    _HEADER.pack_into(buf, 0, base_offset, len(buf) - LOG_OVERHEAD, -1, 2, 0,
                      attributes | compression, last_offset_delta, base_timestamp,
                      max_timestamp, producer_id, producer_epoch, base_sequence, count)
    buf[RECORD_BATCH_OVERHEAD:] = section
    write_crc(buf)
    return bytes(buf)


def records_batch(records: list[Record], *, compression: int = 0, **header) -> bytes:
    """A batch of `records` with the header fields given (count and lastOffsetDelta follow
    the records unless given)."""
    header.setdefault("count", len(records))
    section = codecs.compress(compression, encode_records(records))
    return wrap_section(section, compression=compression, **header)


def values(n: int, size: int = 16) -> list[Record]:
    return [Record(i, i, None, (b"v%d-" % i).ljust(size, b"x")) for i in range(n)]
