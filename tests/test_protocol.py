"""Framing and request/response codecs, with plain bytes (no I/O)."""

import datetime
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.broker.server.handlers.api_versions import unsupported_version_response
from mink.protocol import messages
from mink.protocol.apis import ADVERTISED, ApiKey
from mink.protocol.framing import FrameError, FrameReader, frame
from mink.protocol.messages import (
    MalformedRequest,
    build,
    decode_request,
    encode_response,
    nested,
    response_schema,
)


def encode_request(api_key: int, version: int, correlation_id: int, body) -> bytes:
    """A request without its size prefix, as decode_request takes it."""
    return messages.encode_request(api_key, version, correlation_id, body, "test")[4:]


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(1, 50))
def test_frames_survive_any_split(payloads, chunk):
    stream = b"".join(frame(p) for p in payloads)
    reader = FrameReader(max_frame_bytes=1000)
    out = []
    for start in range(0, len(stream), chunk):
        reader.feed(stream[start:start + chunk])
        while (f := reader.next_frame()) is not None:
            out.append(f)
    assert out == payloads


@given(st.lists(st.sampled_from([0, 1, 100, FrameReader.LARGE_FRAME - 1, FrameReader.LARGE_FRAME,
                                  70_000, 200_000]), max_size=8),
       st.lists(st.integers(1000, 150_000), min_size=1, max_size=8))
@settings(max_examples=60, deadline=None)
def test_frames_received_into_the_reader_survive_any_split(sizes, reads):
    """As the connection reads (recv_into the reader's buffer), frames small and large and
    reads of any size; and whole batches fed at once (a client's feed)."""
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    stream = memoryview(b"".join(frame(p) for p in payloads))
    reader = FrameReader()
    out, position, turn = [], 0, 0
    while position < len(stream):
        target = reader.receive_buffer()
        assert target.nbytes > 0
        # every third read 1-3 bytes (sizes split anywhere), the others up to 150 KB
        want = reads[turn % len(reads)]
        want = want % 3 + 1 if turn % 3 == 2 else want
        count = min(target.nbytes, want, len(stream) - position)
        target[:count] = stream[position:position + count]
        reader.received(count)
        position += count
        turn += 1
        while (f := reader.next_frame()) is not None:
            out.append(f)
    assert out == payloads
    fed = FrameReader()
    fed.feed(stream)
    assert list(iter(fed.next_frame, None)) == payloads


def test_a_large_frame_is_received_into_its_own_buffer():
    payload = bytes(range(256)) * 400  # 100 KiB
    stream = frame(payload)
    reader = FrameReader()
    reader.feed(stream[:1000])  # the size and a little of the frame, through the buffer
    target = reader.receive_buffer()
    assert target.nbytes == len(payload) - 996  # exactly the rest of this frame
    target[:] = stream[1000:]
    reader.received(target.nbytes)
    result = reader.next_frame()
    assert result == payload and isinstance(result, bytearray)
    assert target.obj is result  # the bytes went where the frame is: no copy after


def test_an_announced_huge_frame_costs_only_the_bytes_sent():
    """A frame over EAGER_FRAME is not allocated when its size is read: the buffer grows
    as its bytes arrive, and shrinks back once the frame is taken."""
    size = 3 * FrameReader.EAGER_FRAME
    reader = FrameReader()
    reader.feed(struct.pack(">i", size) + b"x" * 1000)
    assert reader.receive_buffer().nbytes <= FrameReader.BUFFER_BYTES
    assert reader.next_frame() is None
    rest = bytes(range(256)) * ((size - 1000) // 256) + b"y" * ((size - 1000) % 256)
    reader.feed(rest)
    assert reader.next_frame() == b"x" * 1000 + rest
    assert reader.receive_buffer().nbytes == FrameReader.BUFFER_BYTES


def test_oversized_frame_refused_before_buffering():
    reader = FrameReader(max_frame_bytes=1024)
    reader.feed(struct.pack(">i", 1025))
    with pytest.raises(FrameError, match="socket.request.max.bytes"):
        reader.next_frame()


def test_negative_frame_size_refused():
    reader = FrameReader()
    reader.feed(struct.pack(">i", -5))
    with pytest.raises(FrameError):
        reader.next_frame()


# Requests as clients put them on the wire, written out by hand from the Kafka protocol
# guide (not by kio, so the decoder is checked against something other than itself).
GOLDEN_METADATA = {
    # v0: header v1 (api key, version, correlation id, client id), topics: array of 0
    0: (struct.pack(">hhih4si", 3, 0, 42, 4, b"test", 0), ()),
    # v12: header v2 (+ empty tagged fields), topics: null compact array, allow auto
    # creation true, include topic authorized operations false, empty tagged fields
    12: (struct.pack(">hhih4s", 3, 12, 42, 4, b"test") + b"\x00" + b"\x00\x01\x00\x00", None),
}


@pytest.mark.parametrize("version", sorted(GOLDEN_METADATA))
def test_metadata_request_decoded_from_golden_bytes(version):
    data, topics = GOLDEN_METADATA[version]
    request = decode_request(data)
    assert (request.header.api_key, request.header.api_version,
            request.header.correlation_id, request.header.client_id) == (3, version, 42, "test")
    assert request.body.topics == topics
    if version >= 4:
        assert request.body.allow_auto_topic_creation is True
    # and our encoder writes exactly these bytes
    assert encode_request(ApiKey.METADATA, version, 42, request.body) == data


@pytest.mark.parametrize("version", range(0, 13))
def test_metadata_request_round_trip(version):
    schema = load_request_schema(ApiKey.METADATA, version)
    body = build(schema, topics=None if version >= 1 else (), allow_auto_topic_creation=True,
                 include_cluster_authorized_operations=False,
                 include_topic_authorized_operations=False)
    request = decode_request(encode_request(ApiKey.METADATA, version, 42, body))
    assert request.header.correlation_id == 42
    assert request.header.api_version == version
    assert request.body == body


def test_trailing_bytes_are_ignored_as_kafka_does():
    schema = load_request_schema(ApiKey.API_VERSIONS, 3)
    body = schema(client_software_name="a", client_software_version="1")
    data = encode_request(ApiKey.API_VERSIONS, 3, 1, body)
    assert decode_request(data + b"\1\0\0").body == body


def test_truncated_body_is_malformed():
    schema = load_request_schema(ApiKey.API_VERSIONS, 3)
    data = encode_request(ApiKey.API_VERSIONS, 3, 1, schema(client_software_name="abc",
                                                            client_software_version="1"))
    with pytest.raises(MalformedRequest):
        decode_request(data[:-3])


@given(st.binary(max_size=200))
def test_garbage_never_escapes_as_another_error(data):
    """Any bytes after a valid api key and version either decode into a request carrying
    that header, or are refused as MalformedRequest with a reason; nothing else escapes
    (another exception type would take the connection's task down)."""
    prefix = struct.pack(">hhi", ApiKey.METADATA, 9, 1)
    try:
        request = decode_request(prefix + data)
    except MalformedRequest as exc:
        assert str(exc)
    else:
        assert (request.header.api_key, request.header.api_version,
                request.header.correlation_id) == (ApiKey.METADATA, 9, 1)


def test_garbage_is_refused_as_malformed():
    # Metadata v9 (flexible): a client id length of 100 with 3 bytes behind it.
    with pytest.raises(MalformedRequest, match="cannot decode"):
        decode_request(struct.pack(">hhih", ApiKey.METADATA, 9, 1, 100) + b"abc")


def test_api_versions_v3_response_uses_v0_header():
    schema = response_schema(ApiKey.API_VERSIONS, 3)
    body = build(schema, error_code=ErrorCode.none, api_keys=(),
                 throttle_time=datetime.timedelta(0))
    framed = encode_response(7, body)
    size, correlation_id = struct.unpack_from(">ii", framed)
    assert size == len(framed) - 4 and correlation_id == 7
    # v0 header: the body's error code follows the correlation id directly.
    assert framed[8:10] == b"\0\0"


def test_unknown_api_versions_version_answered_in_v0_form():
    framed = unsupported_version_response(9)
    size, correlation_id, error, count = struct.unpack_from(">iihi", framed)
    assert (correlation_id, error, count) == (9, 35, len(ADVERTISED))
    keys = [struct.unpack_from(">hhh", framed, 14 + 6 * i) for i in range(count)]
    assert {k: (lo, hi) for k, lo, hi in keys} == ADVERTISED


def test_build_drops_fields_a_version_lacks():
    v0 = response_schema(ApiKey.METADATA, 0)
    partition = build(nested(v0, "MetadataResponsePartition"), error_code=ErrorCode.none, partition_index=0,
                      leader_id=1, leader_epoch=5, replica_nodes=(1,), isr_nodes=(1,))
    assert not hasattr(partition, "leader_epoch")


def test_a_body_encoded_ahead_is_sent_as_it_is_after_its_header():
    """A cached answer (EncodedBody, megabytes of Metadata) is not copied into each frame:
    the frame is [size prefix + header, the very payload], the same bytes as encoded whole."""
    from mink.protocol.messages import EncodedBody, encode_body, encode_response_frame

    schema = response_schema(18, 3)
    body = build(schema, error_code=ErrorCode.none, api_keys=(),
                 throttle_time=datetime.timedelta(0),
                 supported_features=(), finalized_features_epoch=-1, finalized_features=(),
                 zk_migration_ready=False)
    encoded = encode_body(body)
    cached = EncodedBody(encoded.schema, encoded.payload)
    frame = encode_response_frame(7, cached)
    assert isinstance(frame, list) and frame[1] is cached.payload
    assert b"".join(frame) == encode_response(7, cached) == encode_response(7, body)
