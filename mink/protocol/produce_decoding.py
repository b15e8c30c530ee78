"""The Produce request decoder (v3-v11): kio's entities, with each partition's records a
memoryview of the frame rather than a copy (issue 23: produce with one copy at most).

kio's reader copies every `records` field into new bytes. This one hands out slices of the
frame instead: writable when the frame is a bytearray (as the connection receives it), so
the validator and the log patch a batch's max timestamp, base offset and leader epoch where
it lies; read-only when the frame is bytes (an Envelope's inner request), and the validator
copies then. Everything else is decoded as kio does and built into kio's own classes;
`tests/test_produce_decoding.py` compares the two on random requests of every version.

Unknown tagged fields are skipped, as Kafka's own parser does (kio refuses them).
"""

from __future__ import annotations

import datetime
import struct
import sys
from typing import Any

from kio.index import load_request_schema

FIRST_VERSION = 3
LAST_VERSION = 11
FIRST_FLEXIBLE = 9

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_HEADER = struct.Struct(">hhih")  # api key, version, correlation id, client id length
_ACKS_TIMEOUT = struct.Struct(">hi")


class ProduceDecodeError(Exception):
    """The bytes are not a Produce request of the version they claim."""


def _classes(version: int) -> tuple[type, type, type]:
    request = load_request_schema(0, version)
    module = sys.modules[request.__module__]
    return request, module.TopicProduceData, module.PartitionProduceData


_CLASSES = {v: _classes(v) for v in range(FIRST_VERSION, LAST_VERSION + 1)}


def decode_produce_request(frame) -> tuple[tuple[int, int, int, str | None], Any]:
    """((api key, version, correlation id, client id), kio ProduceRequest) of a frame
    without its size prefix. Raises ProduceDecodeError on anything malformed."""
    view = memoryview(frame)
    try:
        return _decode(view)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ProduceDecodeError(f"{type(exc).__name__}: {exc}") from None


def _decode(view: memoryview):
    end = len(view)
    api_key, version, correlation_id, length = _HEADER.unpack_from(view, 0)
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ProduceDecodeError(f"Produce v{version} is not decoded here")
    request_class, topic_class, partition_class = _CLASSES[version]
    pos = _HEADER.size
    client_id = None
    if length >= 0:
        client_id, pos = _text(view, pos, length, end)
    elif length != -1:
        raise ProduceDecodeError(f"client id length {length}")
    flexible = version >= FIRST_FLEXIBLE
    if flexible:
        pos = _skip_tags(view, pos, end)  # the header's

    length, pos = _length(view, pos, flexible, _INT16)  # transactional_id: nullable
    transactional_id = None
    if length >= 0:
        transactional_id, pos = _text(view, pos, length, end)
    elif length != -1:
        raise ProduceDecodeError(f"transactional id length {length}")
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(view, pos)
    pos += _ACKS_TIMEOUT.size

    topic_count, pos = _count(view, pos, flexible, "topic_data")
    topics = []
    for _ in range(topic_count):
        length, pos = _length(view, pos, flexible, _INT16)
        if length < 0:
            raise ProduceDecodeError("a null topic name")
        name, pos = _text(view, pos, length, end)
        partition_count, pos = _count(view, pos, flexible, "partition_data")
        partitions = []
        for _ in range(partition_count):
            (index,) = _INT32.unpack_from(view, pos)
            pos += 4
            length, pos = _length(view, pos, flexible, _INT32)
            records = None
            if length >= 0:
                if pos + length > end:
                    raise ProduceDecodeError("records past the end of the frame")
                records = view[pos:pos + length]
                pos += length
            elif length != -1:
                raise ProduceDecodeError(f"records length {length}")
            if flexible:
                pos = _skip_tags(view, pos, end)
            partitions.append(partition_class(index=index, records=records))
        if flexible:
            pos = _skip_tags(view, pos, end)
        topics.append(topic_class(name=name, partition_data=tuple(partitions)))
    if flexible:
        pos = _skip_tags(view, pos, end)
    if pos > end:
        raise ProduceDecodeError("the request runs past the end of the frame")
    # Trailing bytes are ignored, as Kafka's parser (and decode_request) does.
    body = request_class(transactional_id=transactional_id, acks=acks,
                         timeout=datetime.timedelta(milliseconds=timeout_ms),
                         topic_data=tuple(topics))
    return (api_key, version, correlation_id, client_id), body


def _text(view: memoryview, pos: int, length: int, end: int) -> tuple[str, int]:
    if pos + length > end:
        raise ProduceDecodeError("a string past the end of the frame")
    return str(view[pos:pos + length], "utf-8"), pos + length


def _length(view: memoryview, pos: int, flexible: bool, fixed: struct.Struct
            ) -> tuple[int, int]:
    """A length or count (-1: null): compact (unsigned varint of n + 1) in flexible
    versions, else `fixed` (int16 for strings, int32 for bytes and arrays)."""
    if flexible:
        value, pos = _uvarint(view, pos)
        return value - 1, pos
    (value,) = fixed.unpack_from(view, pos)
    return value, pos + fixed.size


def _count(view: memoryview, pos: int, flexible: bool, what: str) -> tuple[int, int]:
    count, pos = _length(view, pos, flexible, _INT32)
    if count < 0:
        raise ProduceDecodeError(f"a null {what} array")
    if count > len(view) - pos:  # every element takes a byte at least
        raise ProduceDecodeError(f"{what} of {count} elements in {len(view) - pos} bytes")
    return count, pos


def _uvarint(view: memoryview, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ProduceDecodeError("a varint longer than 5 bytes")


def _skip_tags(view: memoryview, pos: int, end: int) -> int:
    count, pos = _uvarint(view, pos)
    for _ in range(count):
        _, pos = _uvarint(view, pos)  # tag
        size, pos = _uvarint(view, pos)
        pos += size
        if pos > end:
            raise ProduceDecodeError("a tagged field past the end of the frame")
    return pos
