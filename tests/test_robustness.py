"""A live node answers or closes connections with bad input, and keeps serving others."""

import random
import struct

import trio
from kio.index import load_request_schema

from mink.protocol.apis import ApiKey
from mink.protocol.framing import FrameReader
from mink.protocol.messages import encode_request


def api_versions_request(correlation_id: int, version: int = 3) -> bytes:
    schema = load_request_schema(ApiKey.API_VERSIONS, min(version, 3))
    body = schema(client_software_name="t", client_software_version="1")
    # The header names `version` even when it is one we do not know: the body is v3's.
    return encode_request(ApiKey.API_VERSIONS, version, correlation_id, body, "robustness")


class Client:
    """A raw Kafka connection: send bytes, read whole frames."""

    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.reader = FrameReader()

    async def send_all(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive_some(self, n: int) -> bytes:
        return await self.stream.receive_some(n)

    async def aclose(self) -> None:
        await self.stream.aclose()


async def connect(address: str) -> Client:
    host, port = address.split(":")
    return Client(await trio.open_tcp_stream(host, int(port)))


async def read_frame(client: Client) -> bytes | None:
    while (frame := client.reader.next_frame()) is None:
        data = await client.stream.receive_some(65536)
        if not data:
            return None
        client.reader.feed(data)
    return frame


async def well_behaved_client(address: str, stop: trio.Event, rounds: list[int]) -> None:
    stream = await connect(address)
    correlation_id = 0
    while not stop.is_set():
        correlation_id += 1
        await stream.send_all(api_versions_request(correlation_id))
        frame = await read_frame(stream)
        assert frame is not None, "the well-behaved client lost its connection"
        assert struct.unpack_from(">i", frame)[0] == correlation_id
        rounds.append(correlation_id)
        await trio.sleep(0.01)
    await stream.aclose()


async def send_and_expect_close_or_answer(address: str, data: bytes) -> None:
    stream = await connect(address)
    try:
        await stream.send_all(data)
        with trio.fail_after(2):
            while await stream.receive_some(65536):
                pass  # answers are fine; the node must close or answer, never hang or die
    except trio.BrokenResourceError:
        pass
    except trio.TooSlowError:
        pass  # an incomplete frame: the node waits for the rest, like Kafka
    finally:
        await stream.aclose()


async def test_bad_input_never_takes_the_node_down(node):
    rng = random.Random(1234)
    stop = trio.Event()
    rounds: list[int] = []
    bad_inputs = [
        struct.pack(">i", 2**31 - 1),  # a huge size prefix
        struct.pack(">i", -1),  # a negative size
        struct.pack(">i", 10) + b"\x00\x12",  # truncated frame, then close
        struct.pack(">ihhi", 8, 999, 0, 1),  # unknown api key
        struct.pack(">ihhi", 8, ApiKey.METADATA, 99, 1),  # unknown version
        struct.pack(">ihhi", 8, ApiKey.PRODUCE, 0, 1),  # Produce v0: not served
        struct.pack(">i", 3) + b"abc",  # too short for a header
        struct.pack(">ihhi", 12, ApiKey.METADATA, 12, 1) + b"\xff\xff\xff\xff",  # bad body
    ]
    bad_inputs += [rng.randbytes(rng.randrange(1, 400)) for _ in range(40)]
    bad_inputs += [struct.pack(">i", n) + rng.randbytes(n) for n in (8, 20, 100, 1000)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(well_behaved_client, node, stop, rounds)
        for data in bad_inputs:
            await send_and_expect_close_or_answer(node, data)
        before = len(rounds)
        with trio.fail_after(10):
            while len(rounds) < before + 5:
                await trio.sleep(0.01)
        stop.set()
    assert len(rounds) > 5


async def test_unknown_api_versions_version_gets_v0_answer(node):
    stream = await connect(node)
    await stream.send_all(api_versions_request(5, version=77))
    frame = await read_frame(stream)
    correlation_id, error_code = struct.unpack_from(">ih", frame)
    assert (correlation_id, error_code) == (5, 35)
    # The connection stays usable: the client retries at a version we know.
    await stream.send_all(api_versions_request(6, version=3))
    frame = await read_frame(stream)
    assert struct.unpack_from(">ih", frame) == (6, 0)
    await stream.aclose()


async def test_pipelined_requests_are_answered_in_order(node):
    stream = await connect(node)
    await stream.send_all(b"".join(api_versions_request(i) for i in range(1, 51)))
    for expected in range(1, 51):
        frame = await read_frame(stream)
        assert struct.unpack_from(">i", frame)[0] == expected
    await stream.aclose()
