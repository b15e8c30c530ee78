"""Kafka RecordBatch v2 (magic 2): header parsing, validation, patching, encoding.

On the produce path Mink reads the 61-byte batch header and checks it the way
Kafka does for client appends (here), then walks every record
(`log_validator.py`), overwrites baseOffset/partitionLeaderEpoch (outside the
CRC) and stores the batch as sent, compressed or not, with only maxTimestamp
(and the CRC) rewritten when the client's was wrong. Record-level decoding
(`iter_records`) and encoding (`build_batch`) are for everything off the hot path.

Layout (big-endian), offsets from the start of the batch:

    baseOffset int64 @0, batchLength int32 @8, partitionLeaderEpoch int32 @12,
    magic int8 @16, crc uint32 @17 (CRC-32C of bytes @21..end),
    attributes int16 @21, lastOffsetDelta int32 @23, baseTimestamp int64 @27,
    maxTimestamp int64 @35, producerId int64 @43, producerEpoch int16 @51,
    baseSequence int32 @53, recordsCount int32 @57, records @61.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from crc32c import crc32c as _crc32c

from mink.protocol import compression as codecs
from mink.protocol.compression import UnknownCodec

Buffer = bytes | bytearray | memoryview

# -- layout -------------------------------------------------------------------

BASE_OFFSET_OFFSET = 0
BATCH_LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
RECORDS_COUNT_OFFSET = 57
RECORD_BATCH_OVERHEAD = 61  # header size; also the smallest possible batch
LOG_OVERHEAD = 12  # baseOffset + batchLength: batch size = batchLength + 12
# Kafka's LegacyRecord.RECORD_OVERHEAD_V0: the smallest size field of any magic;
# ByteBufferLogInputStream calls anything smaller corrupt before looking at magic.
_MIN_SIZE_FIELD_ANY_MAGIC = 14
MAGIC_VALUE_V2 = 2

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == RECORD_BATCH_OVERHEAD
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT64 = struct.Struct(">q")
_PREFIX = struct.Struct(">qii")  # baseOffset, batchLength, partitionLeaderEpoch

# attributes bits
COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40
_KNOWN_ATTRIBUTES = (
    COMPRESSION_CODEC_MASK | TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG_MASK
    | CONTROL_FLAG_MASK | DELETE_HORIZON_FLAG_MASK
)

# timestampType
CREATE_TIME = 0
LOG_APPEND_TIME = 1

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1
_INT32_MAX = 2**31 - 1

# -- errors -------------------------------------------------------------------


class BatchError(Exception):
    """A batch Kafka would refuse; `error_code` is the Kafka error code to answer."""

    error_code: int = -1


class CorruptMessage(BatchError):
    """CORRUPT_MESSAGE: framing broken (bad length, truncation) or CRC mismatch."""

    error_code = 2


class UnsupportedMagic(BatchError):
    """Magic other than 2. Answered as CORRUPT_MESSAGE: Mink only speaks v2 batches."""

    error_code = 2


class InvalidRecord(BatchError):
    """INVALID_RECORD: well-formed bytes that break Kafka's batch rules."""

    error_code = 87


class RecordsTooLarge(BatchError):
    """MESSAGE_TOO_LARGE: the records decompress to more than the broker accepts (a
    decompression bomb, or a batch far more compressible than any real one)."""

    error_code = 10


class UnsupportedCompressionType(BatchError):
    """UNSUPPORTED_COMPRESSION_TYPE: zstd in a Produce request older than v7."""

    error_code = 76


# -- header -------------------------------------------------------------------


class BatchHeader(NamedTuple):
    """The 61-byte v2 header, field for field (a plain tuple: cheap to create)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        """CREATE_TIME (0) or LOG_APPEND_TIME (1)."""
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_MASK else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def has_delete_horizon_ms(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_FLAG_MASK)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        """baseSequence + lastOffsetDelta, wrapping past 2**31-1 to 0 (Kafka's
        DefaultRecordBatch.incrementSequence); NO_SEQUENCE stays NO_SEQUENCE."""
        base = self.base_sequence
        if base == NO_SEQUENCE:
            return NO_SEQUENCE
        delta = self.last_offset_delta
        if base > _INT32_MAX - delta:
            return delta - (_INT32_MAX - base) - 1
        return base + delta

    def record_offset(self, record: Record) -> int:
        return self.base_offset + record.offset_delta

    def record_timestamp(self, record: Record) -> int:
        """A record's timestamp as consumers see it: LogAppendTime batches give
        every record the batch's maxTimestamp."""
        if self.attributes & TIMESTAMP_TYPE_MASK:
            return self.max_timestamp
        return self.base_timestamp + record.timestamp_delta


_new_header = tuple.__new__  # skips NamedTuple.__new__'s argument handling


def parse_batch_header(buf: Buffer, offset: int = 0) -> BatchHeader:
    """Read the header of a batch at `offset` (e.g. one read back from storage).

    Checks only that 61 bytes are there and magic is 2; no CRC check.
    """
    if len(buf) - offset < RECORD_BATCH_OVERHEAD or offset < 0:
        raise CorruptMessage(f"need {RECORD_BATCH_OVERHEAD} bytes for a batch header at {offset}")
    fields = _HEADER.unpack_from(buf, offset)
    if fields[3] != MAGIC_VALUE_V2:
        raise UnsupportedMagic(f"unsupported record batch magic {fields[3]}")
    return _new_header(BatchHeader, fields)


# -- splitting and validation -------------------------------------------------


def _frame_error(view: memoryview, pos: int) -> BatchError:
    """Explain why the bytes at `pos` are not a whole v2 batch, in the order of
    Kafka's ByteBufferLogInputStream: length field, truncation, magic, size."""
    remaining = len(view) - pos
    if remaining < LOG_OVERHEAD:
        return CorruptMessage(f"{remaining} trailing bytes are not a record batch")
    (batch_length,) = _INT32.unpack_from(view, pos + BATCH_LENGTH_OFFSET)
    if batch_length < _MIN_SIZE_FIELD_ANY_MAGIC:
        return CorruptMessage(f"record batch length {batch_length} is below the minimum")
    if batch_length + LOG_OVERHEAD > remaining:
        return CorruptMessage(
            f"record batch of {batch_length + LOG_OVERHEAD} bytes truncated to {remaining}"
        )
    magic = view[pos + MAGIC_OFFSET]
    if magic != MAGIC_VALUE_V2:
        return UnsupportedMagic(f"unsupported record batch magic {magic}")
    return CorruptMessage(f"record batch length {batch_length} is below the v2 minimum")


def _split(view: memoryview) -> list[tuple[tuple, int, int]]:
    """Frame `view` into (header fields, position, size) of whole v2 batches."""
    out = []
    pos, end = 0, len(view)
    unpack_from = _HEADER.unpack_from
    while pos < end:
        if end - pos < RECORD_BATCH_OVERHEAD:
            raise _frame_error(view, pos)
        fields = unpack_from(view, pos)
        size = fields[1] + LOG_OVERHEAD
        # One combined test keeps the common (valid) case to a single branch.
        if size < RECORD_BATCH_OVERHEAD or size > end - pos or fields[3] != MAGIC_VALUE_V2:
            raise _frame_error(view, pos)
        out.append((fields, pos, size))
        pos += size
    return out


def _validate_client_batch(fields: tuple, batch: memoryview) -> None:
    """Kafka's checks on a client append (UnifiedLog.analyzeAndValidateRecords,
    then LogValidator.validateBatch), in Kafka's order."""
    (base_offset, _, _, _, crc, attributes, last_offset_delta, _, _,
     producer_id, _, base_sequence, records_count) = fields  # fmt: skip
    if base_offset != 0:
        raise InvalidRecord(f"the baseOffset of a produced record batch must be 0, not {base_offset}")
    if _crc32c(batch[ATTRIBUTES_OFFSET:]) != crc:
        raise CorruptMessage(f"record batch is corrupt (stored crc = {crc})")
    if last_offset_delta < 0:
        raise InvalidRecord(f"record batch has an invalid lastOffsetDelta {last_offset_delta}")
    if records_count <= 0:
        raise InvalidRecord(f"invalid reported count for record batch: {records_count}")
    if last_offset_delta + 1 != records_count:
        raise InvalidRecord(
            f"inconsistent lastOffsetDelta {last_offset_delta} and count of records {records_count}"
        )
    if attributes & CONTROL_FLAG_MASK:
        raise InvalidRecord("clients are not allowed to write control records")
    if producer_id > NO_PRODUCER_ID and base_sequence < 0:
        raise InvalidRecord(
            f"invalid sequence number {base_sequence} in record batch with producerId {producer_id}"
        )
    if attributes & COMPRESSION_CODEC_MASK > codecs.ZSTD:
        raise InvalidRecord(f"unknown compression codec {attributes & COMPRESSION_CODEC_MASK}")


def parse_batches(data: Buffer) -> list[tuple[BatchHeader, memoryview]]:
    """Split a partition's Produce `records` into v2 batches, validating each as
    Kafka validates a client append. Returns (header, batch bytes) per batch;
    empty input gives []. How many batches to accept is the caller's call (see
    `parse_produce_records` for Kafka's exactly-one rule).

    Raises CorruptMessage (framing, CRC), UnsupportedMagic, InvalidRecord.
    """
    view = memoryview(data)
    out = []
    for fields, pos, size in _split(view):
        batch = view[pos : pos + size]
        _validate_client_batch(fields, batch)
        out.append((_new_header(BatchHeader, fields), batch))
    return out


def parse_produce_records(data: Buffer, api_version: int) -> tuple[BatchHeader, memoryview]:
    """Kafka's ProduceRequest.validateRecords (v3+) then the client-append
    checks: the records of one partition must be exactly one v2 batch."""
    view = memoryview(data)
    frames = _split(view)
    if not frames:
        raise InvalidRecord("produce requests must have at least one record batch per partition")
    fields, pos, size = frames[0]
    if api_version < 7 and fields[5] & COMPRESSION_CODEC_MASK == codecs.ZSTD:
        raise UnsupportedCompressionType(f"produce requests v{api_version} may not use zstd")
    if len(frames) > 1:
        raise InvalidRecord("produce requests may contain exactly one record batch per partition")
    batch = view[pos : pos + size]
    _validate_client_batch(fields, batch)
    return _new_header(BatchHeader, fields), batch


def iter_batches(data: Buffer) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Split stored, already-validated batches: framing and magic only, no CRC
    and no client rules (stored batches have real offsets, control batches...)."""
    view = memoryview(data)
    for fields, pos, size in _split(view):
        yield _new_header(BatchHeader, fields), view[pos : pos + size]


def compute_crc(batch: Buffer, pos: int = 0) -> int:
    """CRC-32C of the batch at `pos` as Kafka defines it (attributes to the end)."""
    (batch_length,) = _INT32.unpack_from(batch, pos + BATCH_LENGTH_OFFSET)
    end = pos + batch_length + LOG_OVERHEAD
    return _crc32c(memoryview(batch)[pos + ATTRIBUTES_OFFSET : end])


def is_crc_valid(batch: Buffer, pos: int = 0) -> bool:
    """Whether the stored CRC of the (whole, present) batch at `pos` matches."""
    header = parse_batch_header(batch, pos)
    if header.size < RECORD_BATCH_OVERHEAD or pos + header.size > len(batch):
        return False
    return compute_crc(batch, pos) == header.crc


def write_crc(buf: bytearray | memoryview, pos: int = 0) -> None:
    """Recompute and store the CRC of the batch at `pos` in a writable buffer."""
    _UINT32.pack_into(buf, pos + CRC_OFFSET, compute_crc(buf, pos))


# -- patching -----------------------------------------------------------------


def patch_batch(
    buf: bytearray | memoryview, offset_in_buf: int, base_offset: int, leader_epoch: int
) -> None:
    """Assign the batch's offsets and leader epoch in place. Both fields sit
    before the CRC-covered region, so the CRC stays valid."""
    _INT64.pack_into(buf, offset_in_buf + BASE_OFFSET_OFFSET, base_offset)
    _INT32.pack_into(buf, offset_in_buf + PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)


def patched_batch(batch: Buffer, base_offset: int, leader_epoch: int) -> bytes:
    """Copy of `batch` with baseOffset and partitionLeaderEpoch replaced: one
    copy of the read-only request bytes, no bytearray round trip."""
    view = memoryview(batch)
    (batch_length,) = _INT32.unpack_from(view, BATCH_LENGTH_OFFSET)
    return _PREFIX.pack(base_offset, batch_length, leader_epoch) + view[MAGIC_OFFSET:]


def write_batch_header(buf: bytearray | memoryview, header: BatchHeader, pos: int = 0) -> None:
    """Write a parsed header back, field for field (its CRC as it is)."""
    _HEADER.pack_into(buf, pos, *header)


def set_max_timestamp(
    buf: bytearray | memoryview, pos: int, timestamp_type: int, max_timestamp: int
) -> bool:
    """Kafka's DefaultRecordBatch.setMaxTimestamp: rewrite the timestampType
    attribute bit and maxTimestamp, then the CRC. Records keep their deltas.

    As in Kafka the attributes are rebuilt from the known flags (unknown high
    bits are dropped), and nothing is written when both values are already
    as asked. Returns whether the batch changed.
    """
    attributes, = _INT16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    current_type = LOG_APPEND_TIME if attributes & TIMESTAMP_TYPE_MASK else CREATE_TIME
    (current_max,) = _INT64.unpack_from(buf, pos + MAX_TIMESTAMP_OFFSET)
    if current_type == timestamp_type and current_max == max_timestamp:
        return False
    attributes &= _KNOWN_ATTRIBUTES & ~TIMESTAMP_TYPE_MASK
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    _INT16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes)
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, max_timestamp)
    write_crc(buf, pos)
    return True


def set_log_append_time(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> bool:
    """What Kafka does to a v2 batch on a LogAppendTime topic: timestampType =
    LogAppendTime, maxTimestamp = the append time, CRC recomputed. baseTimestamp
    and record deltas are untouched; readers use maxTimestamp for every record."""
    return set_max_timestamp(buf, pos, LOG_APPEND_TIME, timestamp_ms)


# -- records ------------------------------------------------------------------


class Record(NamedTuple):
    """One v2 record. Header keys are str (UTF-8 in Kafka); values are bytes or None."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] | list[tuple[str, bytes | None]] = ()


def _read_varint(buf: bytes, pos: int, max_bytes: int) -> tuple[int, int]:
    """Zigzag varint at `pos` -> (value, next pos). IndexError when truncated."""
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift >= 7 * max_bytes:
            raise InvalidRecord("varint is too long")
    return (result >> 1) ^ -(result & 1), pos


def _decode_records(data: bytes, count: int) -> Iterator[Record]:
    """Kafka's DefaultRecord.readFrom, `count` times, then nothing may remain."""
    pos, end = 0, len(data)
    for _ in range(count):
        try:
            size, pos = _read_varint(data, pos, 5)
            body_end = pos + size
            if size < 0 or body_end > end:
                raise InvalidRecord(f"invalid record size {size}")
            pos += 1  # attributes: unused in v2
            timestamp_delta, pos = _read_varint(data, pos, 10)
            offset_delta, pos = _read_varint(data, pos, 5)
            key_length, pos = _read_varint(data, pos, 5)
            key = None
            if key_length >= 0:
                key = data[pos : pos + key_length]
                pos += key_length
            value_length, pos = _read_varint(data, pos, 5)
            value = None
            if value_length >= 0:
                value = data[pos : pos + value_length]
                pos += value_length
            header_count, pos = _read_varint(data, pos, 5)
            if header_count < 0:
                raise InvalidRecord(f"invalid number of record headers {header_count}")
            headers = []
            for _ in range(header_count):
                hkey_length, pos = _read_varint(data, pos, 5)
                if hkey_length < 0:
                    raise InvalidRecord("invalid negative header key size")
                # surrogateescape: never fails, and build_batch restores the bytes
                hkey = data[pos : pos + hkey_length].decode("utf-8", "surrogateescape")
                pos += hkey_length
                hvalue_length, pos = _read_varint(data, pos, 5)
                hvalue = None
                if hvalue_length >= 0:
                    hvalue = data[pos : pos + hvalue_length]
                    pos += hvalue_length
                headers.append((hkey, hvalue))
                if pos > body_end:
                    break
        except IndexError:
            raise InvalidRecord("found invalid record structure") from None
        if pos != body_end:
            raise InvalidRecord(f"record body is not the {size} bytes its size field says")
        yield Record(offset_delta, timestamp_delta, key, value, tuple(headers))
    if pos != end:
        raise InvalidRecord("incorrect declared batch size, records still remaining")


def decompressed_records(batch: Buffer, max_size: int | None = None) -> bytes:
    """The records section of a batch, decompressed. CorruptMessage if the
    codec is unknown or the payload does not decompress; with `max_size`,
    RecordsTooLarge if it would decompress to more (found without allocating it)."""
    view = memoryview(batch)
    header = parse_batch_header(view)
    if header.size > len(view) or header.size < RECORD_BATCH_OVERHEAD:
        raise CorruptMessage("record batch is truncated")
    body = view[RECORD_BATCH_OVERHEAD : header.size]
    codec = header.compression
    if codec == codecs.NONE:
        return bytes(body)
    try:
        return codecs.decompress(codec, body, max_size)
    except UnknownCodec as e:
        raise InvalidRecord(str(e)) from None
    except codecs.DecompressedTooLarge as e:
        raise RecordsTooLarge(str(e)) from None
    except Exception as e:  # cramjam.DecompressionError, ValueError from xerial framing
        raise CorruptMessage(f"cannot decompress {codecs.CODEC_NAMES[codec]} records: {e}") from None


def iter_records(batch: Buffer) -> Iterator[Record]:
    """Decode a batch's records (decompressing first). Header and codec errors
    raise here; malformed records raise InvalidRecord while iterating."""
    view = memoryview(batch)
    header = parse_batch_header(view)
    return _decode_records(decompressed_records(view), header.records_count)


def _put_varint(out: bytearray, value: int) -> None:
    value = (value << 1) ^ (value >> 63)  # zigzag
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        _put_varint(out, -1)
    else:
        _put_varint(out, len(data))
        out += data


def encode_records(records: Iterable[Record]) -> bytes:
    """The uncompressed records section for `records`."""
    out = bytearray()
    body = bytearray()
    for record in records:
        body.clear()
        body.append(0)  # attributes
        _put_varint(body, record.timestamp_delta)
        _put_varint(body, record.offset_delta)
        _put_bytes(body, record.key)
        _put_bytes(body, record.value)
        _put_varint(body, len(record.headers))
        for hkey, hvalue in record.headers:
            _put_bytes(body, hkey.encode("utf-8", "surrogateescape"))
            _put_bytes(body, hvalue)
        _put_varint(out, len(body))
        out += body
    return bytes(out)


def build_batch(
    records: Iterable[Record],
    *,
    base_offset: int = 0,
    compression: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    timestamp_type: int = CREATE_TIME,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    is_transactional: bool = False,
    is_control: bool = False,
) -> bytes:
    """Encode one v2 batch. `base_timestamp` defaults to now (ms);
    `max_timestamp` to base + the largest record timestamp_delta."""
    records = list(records)
    if not records:
        raise ValueError("a record batch needs at least one record")
    if base_timestamp is None:
        base_timestamp = time.time_ns() // 1_000_000
    if max_timestamp is None:
        max_timestamp = base_timestamp + max(r.timestamp_delta for r in records)
    payload = codecs.compress(compression, encode_records(records))
    attributes = compression
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if is_transactional:
        attributes |= TRANSACTIONAL_FLAG_MASK
    if is_control:
        attributes |= CONTROL_FLAG_MASK
    buf = bytearray(RECORD_BATCH_OVERHEAD + len(payload))
    _HEADER.pack_into(
        buf,
        0,
        base_offset,
        len(buf) - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC_VALUE_V2,
        0,  # crc, below
        attributes,
        records[-1].offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    buf[RECORD_BATCH_OVERHEAD:] = payload
    write_crc(buf)
    return bytes(buf)

