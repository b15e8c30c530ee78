"""The Fetch response encoder (mink/protocol/fetch_encoding.py), byte for byte against kio's
encoding of the same response, for every version Mink advertises (issue 23)."""

from __future__ import annotations

import datetime
import random
import uuid

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from mink.protocol.apis import ADVERTISED, ApiKey
from mink.protocol.fetch_encoding import FIRST_VERSION, INLINE_BYTES, LAST_VERSION, \
    encode_fetch_response
from mink.protocol.messages import build, encode_response, nested


def test_every_advertised_version_is_encoded():
    low, high = ADVERTISED[ApiKey.FETCH]
    assert (low, high) == (FIRST_VERSION, LAST_VERSION)


def random_response(version: int, rng: random.Random, *, as_parts: bool):
    """A response with what Mink's handler sets: errors, leaders, aborted transactions,
    empty and large records (as one buffer for kio, or as several for the encoder)."""
    schema = load_response_schema(ApiKey.FETCH, version)
    partition_schema = nested(schema, "PartitionData")
    aborted_schema = nested(schema, "AbortedTransaction")
    topics = []
    for t in range(rng.randint(0, 4)):
        partitions = []
        for index in range(rng.randint(0, 5)):
            extra = {}
            if version >= 12 and rng.random() < 0.3:
                extra["current_leader"] = nested(schema, "LeaderIdAndEpoch")(
                    leader_id=rng.randint(0, 9), leader_epoch=rng.randint(0, 2**31 - 1))
            chunks = [rng.randbytes(rng.choice([0, 61, 900, INLINE_BYTES - 1, INLINE_BYTES,
                                                70_000]))
                      for _ in range(rng.randint(0, 3))]
            partitions.append(build(
                partition_schema, partition_index=index,
                error_code=ErrorCode(rng.choice([0, 1, 6, 74])), high_watermark=rng.randint(-1, 2**40),
                last_stable_offset=rng.randint(-1, 2**40),
                log_start_offset=rng.randint(-1, 2**40),
                aborted_transactions=tuple(
                    aborted_schema(producer_id=rng.randint(0, 2**50),
                                   first_offset=rng.randint(0, 2**40))
                    for _ in range(rng.choice([0, 0, 2]))),
                preferred_read_replica=-1,
                records=tuple(memoryview(c) for c in chunks) if as_parts else b"".join(chunks),
                **extra))
        name = {"topic_id": uuid.UUID(int=rng.getrandbits(128))} if version >= 13 else {
            "topic": f"topic-{t}-é"}
        topics.append(build(nested(schema, "FetchableTopicResponse"), **name,
                            partitions=tuple(partitions)))
    endpoints = ()
    if version >= 16 and rng.random() < 0.5:
        endpoint = nested(schema, "NodeEndpoint")
        endpoints = tuple(endpoint(node_id=i, host=f"node-{i}.example", port=9092 + i,
                                   rack=rng.choice([None, "rack-a"])) for i in range(2))
    return build(schema, throttle_time=datetime.timedelta(milliseconds=rng.randint(0, 5000)),
                 error_code=ErrorCode(rng.choice([0, 0, 70])), session_id=rng.randint(0, 2**31 - 1),
                 responses=tuple(topics), node_endpoints=endpoints)


@pytest.mark.parametrize("version", range(FIRST_VERSION, LAST_VERSION + 1))
def test_the_frame_is_kios_byte_for_byte(version):
    for seed in range(40):
        expected = encode_response(seed, random_response(version, random.Random(seed),
                                                         as_parts=False))
        parts = encode_fetch_response(seed, version, random_response(
            version, random.Random(seed), as_parts=True))
        assert b"".join(parts) == expected, f"v{version} seed {seed}"


def test_large_batches_are_sent_as_they_are_and_small_ones_inline():
    schema = load_response_schema(ApiKey.FETCH, 17)
    big, small = memoryview(bytes(INLINE_BYTES)), memoryview(b"x" * 100)
    partition = build(nested(schema, "PartitionData"), partition_index=0,
                      error_code=ErrorCode.none,
                      high_watermark=1, last_stable_offset=1, log_start_offset=0,
                      aborted_transactions=(), preferred_read_replica=-1, records=(small, big))
    body = build(schema, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                 session_id=0,
                 responses=(build(nested(schema, "FetchableTopicResponse"),
                                  topic_id=uuid.uuid4(), partitions=(partition,)),))
    parts = encode_fetch_response(7, 17, body)
    assert len(parts) == 3 and parts[1] is big, "the large batch is not copied"
    assert bytes(small) in bytes(parts[0])


async def test_a_frame_of_many_buffers_arrives_whole_through_partial_sends():
    """send_frame on a socket with a small send buffer: writev sends part of the buffers
    at a time (more than _IOV_MAX of them, some split), and the reader gets them all in
    order."""
    import socket

    import trio

    from mink.broker.server.connection import send_frame

    rng = random.Random(5)
    parts = [rng.randbytes(rng.choice([1, 100, 5000, 70_000])) for _ in range(1500)]
    left, right = socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sender = trio.SocketStream(trio.socket.from_stdlib_socket(left))
    receiver = trio.SocketStream(trio.socket.from_stdlib_socket(right))
    expected = b"".join(parts)
    received = bytearray()

    async def receive():
        while len(received) < len(expected):
            received.extend(await receiver.receive_some(1 << 16))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await send_frame(sender, [memoryview(p) for p in parts])
    assert bytes(received) == expected
    await sender.aclose()
    await receiver.aclose()


async def test_a_frame_the_kernel_takes_at_once_does_not_go_through_the_scheduler():
    """A response the socket's buffer has room for is written at once, bytes or buffers:
    no trip through trio's scheduler (its own sends make one after every call). A frame
    larger than the buffer waits for room, and arrives whole."""
    import socket

    import trio
    import trio.testing

    from mink.broker.server.connection import send_frame

    left, right = socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sender = trio.SocketStream(trio.socket.from_stdlib_socket(left))
    receiver = trio.SocketStream(trio.socket.from_stdlib_socket(right))
    with trio.testing.assert_no_checkpoints():
        await send_frame(sender, b"")
        await send_frame(sender, [b"", b""])
        await send_frame(sender, b"small")
        await send_frame(sender, [b"two ", memoryview(b"parts")])
    assert await receiver.receive_some(100) == b"smalltwo parts"
    large = random.Random(7).randbytes(1 << 20)
    received = bytearray()

    async def receive():
        while len(received) < len(large):
            received.extend(await receiver.receive_some(1 << 16))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await send_frame(sender, large)
    assert bytes(received) == large
    await sender.aclose()
    await receiver.aclose()


async def test_a_frame_to_a_client_gone_is_a_broken_stream_not_an_os_error():
    """A write to a client that closed its socket raises BrokenPipeError; the connection's
    run ends quietly on trio's BrokenResourceError (what the stream's own sends raise), so
    send_frame raises that, and the node logs no traceback for a client going away."""
    import socket

    import pytest
    import trio

    from mink.broker.server.connection import send_frame

    left, right = socket.socketpair()
    sender = trio.SocketStream(trio.socket.from_stdlib_socket(left))
    right.close()
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(3):  # the first send may still be buffered
            await send_frame(sender, [b"x" * 100_000, memoryview(b"y" * 100_000)])
    await sender.aclose()
