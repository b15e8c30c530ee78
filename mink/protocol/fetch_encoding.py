"""The Fetch response frame (v4-18), encoded around the stored batches instead of copying them.

kio's writer copies every record byte three times (the handler's join, its buffer, the
buffer's getvalue) and writes each field through a generic, per-field path. This encoder
writes the fixed parts of the frame into small buffers with `struct` and leaves each large
batch buffer as it is, so the frame goes to the socket as a list of buffers (scatter-gather)
and the records are copied once, by the kernel. Batches smaller than `INLINE_BYTES` are
copied into the fixed parts: a send per tiny buffer would cost more than the copy.

It takes the response kio would encode (the handler builds it with kio's schema), with one
difference: a partition's `records` may be a list or tuple of buffers, sent one after the
other. `tests/test_fetch_encoding.py` checks it byte for byte against kio's encoding of the
same response for every version advertised.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from typing import Any

INLINE_BYTES = 16 * 1024

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_PARTITION_HEAD = struct.Struct(">ihqq")  # partition_index, error_code, hw, last stable
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
_LEADER_TAG = struct.Struct(">BBiiB")  # tag 1, length 9, leader_id, leader_epoch, no tags
_ZERO_UUID = bytes(16)

FIRST_VERSION, LAST_VERSION = 4, 18


def uvarint(value: int) -> bytes:
    """Kafka's unsigned varint (compact lengths and counts of flexible versions)."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Frame:
    """Fixed parts accumulate in `head`; a large buffer closes it and goes in as it is."""

    __slots__ = ("parts", "head", "size")

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.head = bytearray(b"\0\0\0\0")  # the size prefix, patched at the end
        self.size = 0

    def buffer(self, data) -> None:
        if len(data) < INLINE_BYTES:
            self.head += data
            return
        self.size += len(self.head)
        self.parts.append(self.head)
        self.size += len(data)
        self.parts.append(data)
        self.head = bytearray()

    def finish(self) -> list[Any]:
        self.size += len(self.head)
        self.parts.append(self.head)
        first = self.parts[0]
        first[0:4] = _I32.pack(self.size - 4)
        return self.parts


def _records_size(records) -> tuple[int, Sequence]:
    if records is None:
        return -1, ()
    if isinstance(records, (bytes, bytearray, memoryview)):
        return len(records), (records,)
    return sum(len(r) for r in records), records


def _string(value: str, flexible: bool) -> bytes:
    data = value.encode()
    return (uvarint(len(data) + 1) if flexible else _I16.pack(len(data))) + data


def _nullable_string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\0" if flexible else _I16.pack(-1)
    return _string(value, flexible)


def _node_endpoints(endpoints) -> bytes:
    out = bytearray(uvarint(len(endpoints) + 1))
    for e in endpoints:
        out += _I32.pack(e.node_id)
        out += _string(e.host, True)
        out += _I32.pack(e.port)
        out += _nullable_string(e.rack, True)
        out += b"\0"  # no tagged fields
    return bytes(out)


def _milliseconds(value) -> int:
    return round(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


def encode_fetch_response(correlation_id: int, version: int, body: Any) -> list[Any]:
    """The whole frame, size prefix included, as a list of buffers to send in order."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ValueError(f"Fetch v{version} is not encoded here")
    flexible = version >= 12
    frame = _Frame()
    head = frame.head
    head += _I32.pack(correlation_id)
    if flexible:
        head += b"\0"  # response header v1: no tagged fields
    head += _I32.pack(_milliseconds(body.throttle_time))
    if version >= 7:
        head += _I16.pack(body.error_code)
        head += _I32.pack(body.session_id)
    topics = body.responses
    head += uvarint(len(topics) + 1) if flexible else _I32.pack(len(topics))
    for topic in topics:
        head = frame.head
        if version >= 13:
            head += topic.topic_id.bytes if isinstance(topic.topic_id, uuid.UUID) else _ZERO_UUID
        else:
            head += _string(topic.topic, flexible)
        partitions = topic.partitions
        head += uvarint(len(partitions) + 1) if flexible else _I32.pack(len(partitions))
        for p in partitions:
            head = frame.head
            head += _PARTITION_HEAD.pack(p.partition_index, p.error_code, p.high_watermark,
                                         p.last_stable_offset)
            if version >= 5:
                head += _I64.pack(p.log_start_offset)
            aborted = p.aborted_transactions
            if aborted is None:
                head += b"\0" if flexible else _I32.pack(-1)
            else:
                head += uvarint(len(aborted) + 1) if flexible else _I32.pack(len(aborted))
                for a in aborted:
                    head += _ABORTED.pack(a.producer_id, a.first_offset)
                    if flexible:
                        head += b"\0"
            if version >= 11:
                head += _I32.pack(p.preferred_read_replica)
            size, buffers = _records_size(p.records)
            if flexible:
                head += uvarint(size + 1)
            else:
                head += _I32.pack(size)
            for data in buffers:
                frame.buffer(data)
            if flexible:
                _partition_tags(frame, p)
        if flexible:
            frame.head += b"\0"  # topic: no tagged fields
    if flexible:
        endpoints = body.node_endpoints if version >= 16 else ()
        if endpoints:
            encoded = _node_endpoints(endpoints)
            frame.head += b"\x01\x00" + uvarint(len(encoded)) + encoded
        else:
            frame.head += b"\0"
    return frame.finish()


def _partition_tags(frame: _Frame, p) -> None:
    """Tagged fields written only when not at their defaults, as kio writes them; Mink sets
    current_leader only (diverging_epoch and snapshot_id are for replicas)."""
    tags = []
    if p.diverging_epoch.epoch != -1 or p.diverging_epoch.end_offset != -1:
        value = _I32.pack(p.diverging_epoch.epoch) + _I64.pack(p.diverging_epoch.end_offset)
        tags.append(b"\x00" + uvarint(len(value) + 1) + value + b"\0")
    leader = p.current_leader
    if leader.leader_id != -1 or leader.leader_epoch != -1:
        tags.append(_LEADER_TAG.pack(1, 9, leader.leader_id, leader.leader_epoch, 0))
    if p.snapshot_id.end_offset != -1 or p.snapshot_id.epoch != -1:
        value = _I64.pack(p.snapshot_id.end_offset) + _I32.pack(p.snapshot_id.epoch)
        tags.append(b"\x02" + uvarint(len(value) + 1) + value + b"\0")
    frame.head += uvarint(len(tags))
    for tag in tags:
        frame.head += tag
