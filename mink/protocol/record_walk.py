"""The record walk of Kafka's LogValidator, in pure Python: read every v2 record of a
(decompressed) records section the way DefaultRecord.readFrom does, check its framing and
the per-record rules, and compute the batch's max timestamp.

`mink/protocol/_record_walk.pyx` is the same function compiled (the produce hot path uses it
when it is built); this one is the fallback and the reference the tests compare it with.
Both must give identical results for every input, so change them together.

walk_records(data, count, base_timestamp, timestamp_low, timestamp_high,
             check_timestamps, require_key) -> (structure_error, max_timestamp, record_errors)

- structure_error: None, or why the bytes are not `count` well-formed records filling `data`
  exactly (Kafka's InvalidRecordException from the record iterator: the whole batch is bad).
- max_timestamp: the largest record timestamp (baseTimestamp + timestampDelta, in Java's
  wrapping 64-bit arithmetic), NO_TIMESTAMP (-1) when every record has -1 or less.
- record_errors: [(record index, kind, value)] for records that are well-formed but break a
  rule (Kafka's KIP-467 record errors), at most one per record, in Kafka's order:
  OFFSET_DELTA (value: the offsetDelta found; Kafka rewrites such a batch, Mink refuses it),
  MISSING_KEY (value 0), TIMESTAMP (value: the timestamp; checked only when
  `check_timestamps`, and only for timestamps other than -1, against
  [timestamp_low, timestamp_high]).

Varints are read as Java's ByteUtils reads them (at most 5 bytes for an int, 10 for a long,
then zigzag-decoded), except that a last byte carrying bits past 32 (64) is refused: Java drops
those bits and kafka-python keeps them, so the two would read different lengths (found by the
fuzz test: a header key length read as 36 by the walk and as -28 by kafka-python). Key, value and header-value lengths below -1
are refused (Kafka reads them as null; librdkafka refuses them, and consumers must read
every acknowledged batch), and so are header keys that are not UTF-8 (Kafka decodes them
with replacement characters; kafka-python and aiokafka consumers fail on them), and so are
record attributes with the top bit set (an unused int8 to Java and librdkafka, a varint to
kafka-python and aiokafka, which then read one byte more: found by the mangling test in
tests/test_log_validator.py, as a different offset and a null key read by kafka-python).
"""

from __future__ import annotations

OFFSET_DELTA = 1
MISSING_KEY = 2
TIMESTAMP = 3

_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


class _Malformed(Exception):
    pass


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    """A zigzag int32 varint (at most 5 bytes) -> (value, next pos)."""
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise _Malformed("premature end of the records")
        b = buf[pos]
        pos += 1
        if b < 0x80:
            if shift == 28 and b > 0x0F:  # bits past 32: readers would disagree on the value
                raise _Malformed("varint out of range")
            value = (value | (b << shift)) & _U32
            return (value >> 1) ^ -(value & 1), pos
        value |= (b & 0x7F) << shift
        shift += 7
        if shift > 28:
            raise _Malformed("varint is longer than 5 bytes")


def _varlong(buf, pos: int, end: int) -> tuple[int, int]:
    """A zigzag int64 varint (at most 10 bytes) -> (value, next pos)."""
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise _Malformed("premature end of the records")
        b = buf[pos]
        pos += 1
        if b < 0x80:
            if shift == 63 and b > 0x01:  # bits past 64: readers would disagree on the value
                raise _Malformed("varlong out of range")
            value = (value | (b << shift)) & _U64
            return (value >> 1) ^ -(value & 1), pos
        value |= (b & 0x7F) << shift
        shift += 7
        if shift > 63:
            raise _Malformed("varlong is longer than 10 bytes")


def _skip_bytes(buf, pos: int, end: int, what: str) -> int:
    length, pos = _varint(buf, pos, end)
    if length >= 0:
        pos += length
        if pos > end:
            raise _Malformed(f"{what} of {length} bytes runs past the end of the records")
    elif length != -1:
        raise _Malformed(f"invalid {what} length {length}")
    return pos


def walk_records(data, count: int, base_timestamp: int, timestamp_low: int,
                 timestamp_high: int, check_timestamps: bool, require_key: bool):
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    end = len(buf)
    pos = 0
    max_timestamp = -1
    errors: list[tuple[int, int, int]] = []
    index = 0
    try:
        while index < count:
            size, pos = _varint(buf, pos, end)
            if end - pos < size:
                raise _Malformed(f"invalid record size: expected {size} bytes in record "
                                 f"{index}, but only {end - pos} remain")
            start = pos
            if pos >= end:
                raise _Malformed("premature end of the records")
            if buf[pos] & 0x80:
                # Unused in v2 and an int8 to Java and librdkafka, but a varint to
                # kafka-python and aiokafka: with the top bit set they read the next byte too.
                raise _Malformed(f"invalid attributes 0x{buf[pos]:02x} in record {index}")
            pos += 1
            timestamp_delta, pos = _varlong(buf, pos, end)
            offset_delta, pos = _varint(buf, pos, end)
            key_length, pos = _varint(buf, pos, end)
            if key_length >= 0:
                pos += key_length
                if pos > end:
                    raise _Malformed(f"key of {key_length} bytes runs past the end of the records")
            elif key_length != -1:
                raise _Malformed(f"invalid key length {key_length}")
            pos = _skip_bytes(buf, pos, end, "value")
            header_count, pos = _varint(buf, pos, end)
            if header_count < 0:
                raise _Malformed(f"invalid number of record headers {header_count}")
            if header_count > end - pos:
                raise _Malformed(f"invalid number of record headers {header_count}: more than "
                                 "the bytes left")
            for _ in range(header_count):
                header_key_length, pos = _varint(buf, pos, end)
                if header_key_length < 0:
                    raise _Malformed("invalid negative header key size")
                key_start = pos
                pos += header_key_length
                if pos > end:
                    raise _Malformed("header key runs past the end of the records")
                try:
                    bytes(buf[key_start:pos]).decode("utf-8")
                except UnicodeDecodeError:
                    raise _Malformed(f"a header key of record {index} is not UTF-8") from None
                pos = _skip_bytes(buf, pos, end, "header value")
            if pos - start != size:
                raise _Malformed(f"invalid record size: record {index} says {size} bytes, "
                                 f"its fields take {pos - start}")
            timestamp = ((base_timestamp + timestamp_delta + 2**63) & _U64) - 2**63
            if timestamp > max_timestamp:
                max_timestamp = timestamp
            if offset_delta != index:
                errors.append((index, OFFSET_DELTA, offset_delta))
            elif require_key and key_length < 0:
                errors.append((index, MISSING_KEY, 0))
            elif (check_timestamps and timestamp != -1
                  and not timestamp_low <= timestamp <= timestamp_high):
                errors.append((index, TIMESTAMP, timestamp))
            index += 1
    except _Malformed as exc:
        return str(exc), max_timestamp, errors
    if pos != end:
        return (f"incorrect declared batch size: {end - pos} bytes remain after {count} records",
                max_timestamp, errors)
    return None, max_timestamp, errors
