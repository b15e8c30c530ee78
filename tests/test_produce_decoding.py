"""The Produce request decoder (mink/protocol/produce_decoding.py) against kio's reader on
the same bytes, for every version it decodes (issue 23: records stay in the frame)."""

from __future__ import annotations

import datetime
import random
import struct

import pytest
from kio.index import load_request_schema
from kio.serial import entity_reader

from mink.protocol.apis import ADVERTISED, ApiKey
from mink.protocol.messages import MalformedRequest, decode_request, encode_request, nested
from mink.protocol.produce_decoding import (
    FIRST_VERSION,
    LAST_VERSION,
    ProduceDecodeError,
    decode_produce_request,
)

VERSIONS = range(FIRST_VERSION, LAST_VERSION + 1)


def test_every_advertised_version_with_a_kio_schema_is_decoded():
    # v0-2 have no kio schema and are answered before decoding (UNSUPPORTED_VERSION)
    assert ADVERTISED[ApiKey.PRODUCE] == (0, LAST_VERSION)
    assert FIRST_VERSION == 3


def random_request(version: int, rng: random.Random):
    schema = load_request_schema(ApiKey.PRODUCE, version)
    topic_schema = nested(schema, "TopicProduceData")
    partition_schema = nested(schema, "PartitionProduceData")
    topics = tuple(
        topic_schema(name=rng.choice(["t", "orders", "ünïcode-topic", "x" * 249]),
                     partition_data=tuple(
                         partition_schema(index=rng.randint(0, 2**31 - 1), records=rng.choice(
                             [None, b"", rng.randbytes(rng.choice([1, 61, 300, 70_000]))]))
                         for _ in range(rng.randint(0, 4))))
        for _ in range(rng.randint(0, 3)))
    return schema(transactional_id=rng.choice([None, "", "tx-1", "ü" * 40]),
                  acks=rng.choice([-1, 0, 1, 7]),
                  timeout=datetime.timedelta(milliseconds=rng.randint(0, 2**31 - 1)),
                  topic_data=topics)


def kio_decode(frame: bytes):
    schema = load_request_schema(ApiKey.PRODUCE, struct.unpack_from(">h", frame, 2)[0])
    view = memoryview(frame).toreadonly()
    header, used = entity_reader(schema.__header_schema__)(view, 0)
    body, _ = entity_reader(schema)(view, used)
    return header, body


@pytest.mark.parametrize("version", VERSIONS)
def test_decoded_as_kio_decodes(version):
    rng = random.Random(version)
    for _ in range(40):
        request = random_request(version, rng)
        client_id = rng.choice([None, "", "rdkafka", "ç" * 10])
        frame = encode_request(ApiKey.PRODUCE, version, rng.randint(-2**31, 2**31 - 1),
                               request, client_id)[4:]
        header, body = kio_decode(frame)
        fields, ours = decode_produce_request(bytearray(frame))
        assert ours == body == request
        assert fields == (0, version, header.correlation_id, header.client_id)
        decoded = decode_request(bytearray(frame))
        assert decoded.body == body
        assert decoded.header.client_id == client_id


def test_records_are_views_of_the_frame():
    schema = load_request_schema(ApiKey.PRODUCE, 9)
    request = schema(transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=1),
                     topic_data=(nested(schema, "TopicProduceData")(name="t", partition_data=(
                         nested(schema, "PartitionProduceData")(index=0, records=b"abcdef"),)),))
    frame = bytearray(encode_request(ApiKey.PRODUCE, 9, 1, request)[4:])
    records = decode_request(frame).body.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and not records.readonly
    records[0:1] = b"A"  # written where it lies: the frame changes, no copy was made
    assert bytes(frame[-9:-3]) == b"Abcdef"
    # an immutable frame (an Envelope's inner request) gives read-only views
    readonly = decode_request(bytes(frame)).body.topic_data[0].partition_data[0].records
    assert readonly.readonly and bytes(readonly) == b"Abcdef"


def test_unknown_tagged_fields_are_skipped():
    schema = load_request_schema(ApiKey.PRODUCE, 11)
    partition = nested(schema, "PartitionProduceData")(index=3, records=b"xyz")
    request = schema(transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=2),
                     topic_data=(nested(schema, "TopicProduceData")(
                         name="t", partition_data=(partition,)),))
    frame = bytearray(encode_request(ApiKey.PRODUCE, 11, 5, request)[4:])
    # Every tagged-field section is one 0 byte here: the partition's is right after the
    # records; give it one unknown field (tag 7, 2 bytes).
    at = frame.index(b"xyz") + 3
    assert frame[at] == 0
    frame[at:at + 1] = b"\x01\x07\x02zz"
    body = decode_request(frame).body
    assert body.topic_data[0].partition_data[0].index == 3
    assert bytes(body.topic_data[0].partition_data[0].records) == b"xyz"


@pytest.mark.parametrize("version", [3, 8, 9, 11])
def test_every_truncation_is_malformed(version):
    rng = random.Random(version)
    schema = load_request_schema(ApiKey.PRODUCE, version)
    request = schema(transactional_id="tx", acks=-1, timeout=datetime.timedelta(seconds=1),
                     topic_data=(nested(schema, "TopicProduceData")(name="topic", partition_data=(
                         nested(schema, "PartitionProduceData")(index=0, records=rng.randbytes(40)),
                         nested(schema, "PartitionProduceData")(index=1, records=None))),))
    frame = encode_request(ApiKey.PRODUCE, version, 1, request, "c")[4:]
    for cut in range(8, len(frame)):
        with pytest.raises(MalformedRequest):
            decode_request(bytearray(frame[:cut]))


def test_garbage_is_malformed_never_a_crash():
    rng = random.Random(7)
    for version in VERSIONS:
        for _ in range(300):
            frame = bytearray(struct.pack(">hhi", 0, version, 1) + rng.randbytes(rng.randint(0, 60)))
            try:
                decode_request(frame)
            except MalformedRequest:
                pass


def test_huge_counts_are_refused_before_allocating():
    # v3: header, transactional id null, acks, timeout, then 2**31-1 topics in 4 bytes
    frame = bytearray(struct.pack(">hhihhhii", 0, 3, 1, -1, -1, -1, 1000, 2**31 - 1))
    with pytest.raises(ProduceDecodeError, match="topic_data"):
        decode_produce_request(frame)


def test_a_batch_patched_in_the_frame_is_forwarded_as_sent():
    """The validator and the log patch a batch where it lies in the request (max timestamp,
    timestamp type and CRC on a LogAppendTime topic; base offset and leader epoch); a part
    forwarded after its partition moved (handlers.produce._forward_moved) must go out as the
    client sent it, or the new leader would refuse it (baseOffset not 0, LogAppendTime)."""
    from mink.broker.server.handlers.produce import _as_sent, _PartitionResult
    from mink.protocol.log_validator import ValidationSettings, validate_produce_records
    from mink.protocol.records import LOG_APPEND_TIME, Record, patch_batch
    from tests.support.batches import records_batch

    sent = records_batch([Record(i, i, None, b"v%d" % i) for i in range(3)],
                         base_timestamp=1_700_000_000_000)
    schema = load_request_schema(ApiKey.PRODUCE, 9)
    request = schema(transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=1),
                     topic_data=(nested(schema, "TopicProduceData")(name="t", partition_data=(
                         nested(schema, "PartitionProduceData")(index=0, records=sent),)),))
    frame = bytearray(encode_request(ApiKey.PRODUCE, 9, 1, request)[4:])
    data = decode_request(frame).body.topic_data[0].partition_data[0]
    valid = validate_produce_records(data.records, 9, ValidationSettings(
        now_ms=1_800_000_000_000, timestamp_type=LOG_APPEND_TIME))
    result = _PartitionResult(0)
    result.sent_header = valid.header  # as the handler keeps it
    assert valid.batch.obj is frame  # patched where it lies, no copy
    patch_batch(valid.batch, 0, 1234, 7)
    assert bytes(data.records) != sent
    assert bytes(_as_sent(data, result).records) == sent
    assert _as_sent(data, _PartitionResult(0)) is data  # nothing patched: as it is
