"""A raw Kafka client for tests that need exact control of the bytes sent."""

from __future__ import annotations

import itertools

import trio
from kio.index import load_request_schema

from mink.protocol.framing import FrameReader
from mink.protocol.messages import build, decode_response, encode_request, nested


class RawClient:
    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.reader = FrameReader()
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, address: str) -> RawClient:
        host, port = address.rsplit(":", 1)
        return cls(await trio.open_tcp_stream(host, int(port)))

    async def send(self, api_key: int, version: int, body) -> int:
        correlation_id = next(self._ids)
        await self.stream.send_all(encode_request(api_key, version, correlation_id, body,
                                                  "raw-test"))
        return correlation_id

    async def receive(self, api_key: int, version: int):
        while (frame := self.reader.next_frame()) is None:
            data = await self.stream.receive_some(1 << 20)
            if not data:
                raise EOFError("connection closed by the node")
            self.reader.feed(data)
        return decode_response(api_key, version, frame)

    async def call(self, api_key: int, version: int, body):
        sent = await self.send(api_key, version, body)
        received, response = await self.receive(api_key, version)
        assert received == sent
        return response

    async def aclose(self) -> None:
        await self.stream.aclose()


def produce_request(topic: str, partition: int, records: bytes, version: int = 9,
                    acks: int = -1, timeout_s: float = 10.0):
    import datetime

    schema = load_request_schema(0, version)
    partition_data = build(nested(schema, "PartitionProduceData"), index=partition,
                           records=records)
    topic_data = build(nested(schema, "TopicProduceData"), name=topic,
                       partition_data=(partition_data,))
    return build(schema, transactional_id=None, acks=acks,
                 timeout=datetime.timedelta(seconds=timeout_s), topic_data=(topic_data,))


def init_producer_id_request(version: int = 4, producer_id: int = -1, epoch: int = -1):
    import datetime

    return build(load_request_schema(22, version), transactional_id=None,
                 transaction_timeout=datetime.timedelta(seconds=60), producer_id=producer_id,
                 producer_epoch=epoch)


def produce_result(response) -> tuple[int, int]:
    """(error code, base offset) of a one-partition Produce response."""
    partition = response.responses[0].partition_responses[0]
    return int(partition.error_code), partition.base_offset
