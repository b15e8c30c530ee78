"""Kafka's LogValidator for client appends: everything a Produce batch must pass before it
is acknowledged, as one pure function (no I/O, no clock: `now_ms` comes in the settings).

`validate_produce_records(records, api_version, settings)` returns either `ValidBatch` (the
batch, possibly patched, and its max timestamp computed from the records) or `Refusal` (the
Kafka error code, KIP-467 record errors, a message). In Kafka's order:

1. ProduceRequest.validateRecords and the client-append header checks
   (`records.parse_produce_records`): exactly one v2 batch, CRC, baseOffset 0,
   lastOffsetDelta = count - 1, no control batch, a sequence with a producer id; then
   max.message.bytes (MESSAGE_TOO_LARGE), before anything is decompressed.
   Transactional batches in a request without a transactional id are refused with
   TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka answers them (its authorization of a null
   transactional id fails).
2. Decompression of every codec (CORRUPT_MESSAGE when the payload does not decompress; Kafka
   answers a KafkaException there, which reaches the client as UNKNOWN_SERVER_ERROR), bounded
   by `max_decompressed_bytes` (MESSAGE_TOO_LARGE past it, found from the codec's headers or
   while decoding, never by allocating the whole output: a decompression bomb must not take
   the node's memory). Kafka streams records out of the decompressor and has no such limit;
   Mink decompresses the section whole, so it needs one. Framing some consumer would read
   otherwise is refused too (CORRUPT_MESSAGE), stricter than Kafka where a client is: a
   xerial snappy header other than snappy-java's (aiokafka), more than one gzip member
   (librdkafka reads the first), anything but one LZ4 frame with independent blocks
   (kafka-python, librdkafka, Kafka itself); zstd frames must fill the payload exactly, as
   librdkafka's one-shot ZSTD_decompress needs (cramjam refuses the rest already).
3. The record walk (`record_walk.walk_records`, compiled when built): framing and lengths of
   every record (and attributes without the top bit, which kafka-python reads as a varint), `count` records filling the section exactly (INVALID_RECORD, no record
   errors, as Kafka's InvalidRecordException from the iterator); then per record: offset
   deltas 0..count-1 (Kafka rebuilds a batch whose inner offsets are off; Mink refuses it with
   a record error), a key on compacted topics, timestamps within message.timestamp.before/
   after.max.ms on CreateTime topics (INVALID_TIMESTAMP), a client's LogAppendTime batch
   on a LogAppendTime topic (INVALID_TIMESTAMP).
4. The max timestamp written back into the header, with the CRC recomputed
   (DefaultRecordBatch.setMaxTimestamp, Kafka's in-place path): the computed maximum on
   CreateTime topics, `now_ms` on LogAppendTime topics.
5. The topic's compression.type: a batch in another codec is rebuilt in the topic's
   (`recompression.recompress`, Kafka's non-in-place path), and checked against
   max.message.bytes again; `producer` keeps the client's codec.
"""

from __future__ import annotations

from typing import NamedTuple

from mink.protocol import compression as codecs
from mink.protocol.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    RECORD_BATCH_OVERHEAD,
    BatchError,
    BatchHeader,
    decompressed_records,
    parse_produce_records,
    set_max_timestamp,
)
from mink.protocol import record_walk as _pure_walk
from mink.protocol.recompression import recompress

try:
    from mink.protocol._record_walk import walk_records as _compiled_walk_records
except ImportError:  # not built: the pure-Python walk gives the same results, slower
    _compiled_walk_records = None

walk_records = _compiled_walk_records or _pure_walk.walk_records
COMPILED = _compiled_walk_records is not None

__all__ = ["ValidationSettings", "ValidBatch", "RecordError", "Refusal",
           "validate_produce_records", "decompressed_size_limit", "walk_records", "COMPILED"]

# Kafka error codes answered here
CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
INVALID_TIMESTAMP = 32
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
INVALID_RECORD = 87

# The most a produced batch may decompress to: 64 MiB, or 16 times the topic's
# max.message.bytes when that is larger. A 1 MiB batch (Kafka's default max.message.bytes) of
# real text, JSON or logs compresses 3-20x, so 64x leaves room for the most repetitive data
# while keeping a bomb's cost to one transient 64 MiB buffer; a topic that accepts larger
# batches accepts proportionally larger sections.
DECOMPRESSED_FLOOR_BYTES = 64 << 20
DECOMPRESSED_PER_MESSAGE_BYTES = 16


def decompressed_size_limit(max_message_bytes: int) -> int:
    """The decompressed-size limit for a topic with this max.message.bytes."""
    return max(DECOMPRESSED_FLOOR_BYTES, DECOMPRESSED_PER_MESSAGE_BYTES * max_message_bytes)


_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
# Kafka reports every record error but its message shows at most three.
_ERRORS_IN_MESSAGE = 3
# A record error kind of our own, beside record_walk's: a client's LogAppendTime batch.
_TIMESTAMP_TYPE = 100


class ValidationSettings(NamedTuple):
    """The topic's settings that decide what is valid, and the broker's clock."""

    now_ms: int
    timestamp_type: int = CREATE_TIME  # message.timestamp.type
    timestamp_before_max_ms: int = _INT64_MAX  # message.timestamp.before.max.ms
    timestamp_after_max_ms: int = _INT64_MAX  # message.timestamp.after.max.ms
    max_message_bytes: int = _INT64_MAX  # max.message.bytes: checked before decompressing
    max_decompressed_bytes: int = DECOMPRESSED_FLOOR_BYTES  # see decompressed_size_limit
    compacted: bool = False  # cleanup.policy contains compact: every record needs a key
    validate_records: bool = True  # False: header checks only (benchmarks compare the cost)
    transactional_id: bool = False  # the Produce request names a transactional id
    target_compression: int | None = None  # compression.type's codec; None: the producer's


class ValidBatch(NamedTuple):
    header: BatchHeader  # as the client sent it (max timestamp as sent)
    # the batch to store, max timestamp and CRC patched when they changed: the request's own
    # bytes when they were writable (a view of the frame), else a copy
    batch: bytearray | memoryview
    max_timestamp: int  # computed from the records (now_ms on LogAppendTime topics)
    log_append_time: int | None  # now_ms on LogAppendTime topics, else None


class RecordError(NamedTuple):
    """KIP-467: which record of the batch, and why."""

    batch_index: int
    message: str


class Refusal(NamedTuple):
    error_code: int
    message: str
    record_errors: tuple[RecordError, ...] = ()


def validate_produce_records(records, api_version: int,
                             settings: ValidationSettings) -> ValidBatch | Refusal:
    """Validate one partition's `records` of a Produce request (see the module docstring)."""
    try:
        header, batch = parse_produce_records(records, api_version)
    except BatchError as exc:
        return Refusal(exc.error_code, str(exc))
    if header.size > settings.max_message_bytes:
        return Refusal(MESSAGE_TOO_LARGE,
                       f"batch of {header.size} bytes is over max.message.bytes")
    if header.is_transactional and not settings.transactional_id:
        return Refusal(TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                       "transactional batches need a transactional id")
    if header.has_producer_id and header.producer_epoch < 0:
        return Refusal(INVALID_RECORD, f"invalid producer epoch {header.producer_epoch} in a "
                                       f"record batch with producerId {header.producer_id}")
    log_append_time = settings.timestamp_type == LOG_APPEND_TIME
    if not settings.validate_records:
        max_timestamp = settings.now_ms if log_append_time else header.max_timestamp
        return _patched(header, batch, max_timestamp, log_append_time, settings.now_ms,
                        settings)

    if header.compression == codecs.NONE:
        section = batch[RECORD_BATCH_OVERHEAD:]
    else:
        try:
            section = decompressed_records(batch, settings.max_decompressed_bytes)
        except BatchError as exc:
            return Refusal(exc.error_code, str(exc))

    batch_log_append_time = header.timestamp_type == LOG_APPEND_TIME
    # Records of a LogAppendTime batch all carry its maxTimestamp (DefaultRecord.readFrom):
    # they are checked here, once, and the walk checks framing and keys only.
    check_timestamps = not log_append_time and not batch_log_append_time
    low = max(settings.now_ms - settings.timestamp_before_max_ms, _INT64_MIN)
    high = min(settings.now_ms + settings.timestamp_after_max_ms, _INT64_MAX)
    structure_error, max_timestamp, found = walk_records(
        section, header.records_count, header.base_timestamp, low, high, check_timestamps,
        settings.compacted)
    if structure_error is not None:
        return Refusal(INVALID_RECORD, f"invalid record batch: {structure_error}")
    if batch_log_append_time:
        max_timestamp = header.max_timestamp
        if log_append_time or max_timestamp == -1:
            found = found + _every_record(found, header.records_count, _TIMESTAMP_TYPE, 0)
        elif not low <= max_timestamp <= high:
            found = found + _every_record(found, header.records_count, _pure_walk.TIMESTAMP,
                                          max_timestamp)
    if found:
        return _refusal(found, low, high)
    if log_append_time:
        max_timestamp = settings.now_ms
    return _patched(header, batch, max_timestamp, log_append_time, settings.now_ms, settings,
                    section)


def _every_record(found, count: int, kind: int, value: int) -> list[tuple[int, int, int]]:
    """An error for each record that has none yet."""
    taken = {index for index, _, _ in found}
    return [(i, kind, value) for i in range(count) if i not in taken]


def _patched(header: BatchHeader, batch, max_timestamp: int, log_append_time: bool,
             now_ms: int, settings: ValidationSettings, section=None) -> ValidBatch | Refusal:
    target = settings.target_compression
    if target is not None and target != header.compression:
        # 5. the topic's compression.type (recompression.py), as Kafka's LogValidator
        try:
            stored = recompress(batch, header.compression, target, section,
                                settings.max_decompressed_bytes)
        except BatchError as exc:
            return Refusal(exc.error_code, str(exc))
        if len(stored) > settings.max_message_bytes:
            return Refusal(MESSAGE_TOO_LARGE,
                           f"batch of {len(stored)} bytes after recompression is over "
                           "max.message.bytes")
    elif isinstance(batch, memoryview) and not batch.readonly:
        stored = batch  # a view of the request's frame, patched where it lies: no copy
    else:
        stored = bytearray(batch)
    set_max_timestamp(stored, 0, LOG_APPEND_TIME if log_append_time else CREATE_TIME,
                      max_timestamp)
    return ValidBatch(header, stored, max_timestamp, now_ms if log_append_time else None)


def _refusal(found, low: int, high: int) -> Refusal:
    found = sorted(found)
    errors = tuple(RecordError(index, _describe(kind, value, low, high))
                   for index, kind, value in found)
    if any(kind in (_pure_walk.TIMESTAMP, _TIMESTAMP_TYPE) for _, kind, _ in found):
        return Refusal(INVALID_TIMESTAMP,
                       "One or more records have been rejected due to invalid timestamp",
                       errors)
    shown = ", ".join(f"record {e.batch_index}: {e.message}"
                      for e in errors[:_ERRORS_IN_MESSAGE])
    return Refusal(INVALID_RECORD,
                   f"One or more records have been rejected due to {len(errors)} record errors "
                   f"in total, and only showing the first three errors at most: {shown}",
                   errors)


def _describe(kind: int, value: int, low: int, high: int) -> str:
    if kind == _pure_walk.OFFSET_DELTA:
        return f"offsetDelta {value} where consecutive deltas from 0 were expected"
    if kind == _pure_walk.MISSING_KEY:
        return "Compacted topic cannot accept message without key"
    if kind == _TIMESTAMP_TYPE:
        return ("Invalid timestamp type: a producer must not set the timestamp type to "
                "LogAppendTime")
    return f"Timestamp {value} is out of range. The timestamp should be within [{low}, {high}]"
