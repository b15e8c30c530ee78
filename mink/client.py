"""The one Kafka client Mink's own code speaks with: forwarding between nodes, `mink topics`
and the tests.

The logic (correlation ids, encoding with kio, decoding, version negotiation with
ApiVersions) lives in `_Exchange`; `KafkaClient` carries it over a trio stream and
`BlockingKafkaClient` over a blocking socket, for command-line tools and synchronous tests.
"""

from __future__ import annotations

import itertools
import socket
from typing import Any

import trio
from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from mink.protocol.apis import ApiKey
from mink.protocol.framing import FrameReader
from mink.protocol.messages import MalformedResponse, build, decode_response, encode_request

__all__ = ["BlockingKafkaClient", "KafkaClient", "KafkaClientError", "MalformedResponse"]


class KafkaClientError(Exception):
    """The broker could not be reached, closed the connection, answered out of turn, or
    does not speak an API in a version kio knows."""


class _Exchange:
    """Requests and responses of one connection, without I/O."""

    def __init__(self, address: str, client_id: str) -> None:
        self.address = address
        self.client_id = client_id
        self.reader = FrameReader()
        self.ranges: dict[int, tuple[int, int]] = {}
        self._ids = itertools.count(1)
        self.last_id = 0

    def encode(self, api_key: int, version: int, body: Any) -> tuple[int, bytes]:
        correlation_id = self.last_id = next(self._ids)
        return correlation_id, encode_request(api_key, version, correlation_id, body,
                                              self.client_id)

    def decode(self, api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
        return decode_response(api_key, version, frame)

    def negotiated(self, response: Any) -> None:
        if response.error_code != ErrorCode.none:
            raise KafkaClientError(f"{self.address} refused ApiVersions: "
                                   f"{ErrorCode(response.error_code).name.upper()}")
        self.ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}

    def version(self, api_key: int) -> int:
        """The highest version of `api_key` that both the broker and kio know."""
        low, high = self.ranges.get(api_key, (0, -1))
        for version in range(high, low - 1, -1):
            try:
                load_request_schema(api_key, version)
                load_response_schema(api_key, version)
                return version
            except KioIndexError:
                continue
        raise KafkaClientError(f"{self.address} does not support {ApiKey(api_key).name} "
                               f"in a version this client knows")

    def check_turn(self, sent: int, received: int) -> None:
        if sent != received:
            raise KafkaClientError(f"{self.address} answered out of turn "
                                   f"(correlation id {received}, expected {sent})")


def _api_versions_request() -> Any:
    return build(load_request_schema(ApiKey.API_VERSIONS, 0))


class KafkaClient:
    """One trio connection to a broker. `send`/`receive` allow pipelining; `call` is one
    round trip; `request` negotiates the version first (`connect(negotiate=True)`)."""

    def __init__(self, stream: trio.SocketStream, address: str, client_id: str) -> None:
        self.stream = stream
        self.exchange = _Exchange(address, client_id)

    @classmethod
    async def connect(cls, address: str, *, client_id: str = "mink",
                      negotiate: bool = False) -> KafkaClient:
        host, port = address.rsplit(":", 1)
        try:
            stream = await trio.open_tcp_stream(host, int(port))
        except OSError as exc:
            raise KafkaClientError(f"cannot reach {address}: {exc}") from None
        client = cls(stream, address, client_id)
        if negotiate:
            client.exchange.negotiated(
                await client.call(ApiKey.API_VERSIONS, 0, _api_versions_request()))
        return client

    async def send(self, api_key: int, version: int, body: Any) -> int:
        correlation_id, frame = self.exchange.encode(api_key, version, body)
        await self.stream.send_all(frame)
        return correlation_id

    async def receive(self, api_key: int, version: int) -> tuple[int, Any]:
        reader = self.exchange.reader
        while (frame := reader.next_frame()) is None:
            data = await self.stream.receive_some(1 << 20)
            if not data:
                raise EOFError(f"{self.exchange.address} closed the connection")
            reader.feed(data)
        return self.exchange.decode(api_key, version, frame)

    async def call(self, api_key: int, version: int, body: Any) -> Any:
        sent = await self.send(api_key, version, body)
        received, response = await self.receive(api_key, version)
        self.exchange.check_turn(sent, received)
        return response

    def version(self, api_key: int) -> int:
        return self.exchange.version(api_key)

    async def request(self, api_key: int, build_body) -> Any:
        """Send the body `build_body(schema)` makes for the negotiated version."""
        version = self.version(api_key)
        return await self.call(api_key, version,
                               build_body(load_request_schema(api_key, version)))

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> KafkaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class BlockingKafkaClient:
    """The same over a blocking socket, versions always negotiated."""

    def __init__(self, address: str, timeout: float, *, client_id: str = "mink") -> None:
        host, port = address.rsplit(":", 1)
        self.exchange = _Exchange(address, client_id)
        self.timeout = timeout
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        except OSError as exc:
            raise KafkaClientError(f"cannot reach {address}: {_reason(exc)}") from None
        try:
            self.exchange.negotiated(
                self.call(ApiKey.API_VERSIONS, 0, _api_versions_request()))
        except BaseException:
            self.sock.close()
            raise

    @property
    def address(self) -> str:
        return self.exchange.address

    def version(self, api_key: int) -> int:
        return self.exchange.version(api_key)

    def request(self, api_key: int, build_body) -> Any:
        version = self.version(api_key)
        return self.call(api_key, version, build_body(load_request_schema(api_key, version)))

    def call(self, api_key: int, version: int, body: Any) -> Any:
        sent, frame = self.exchange.encode(api_key, version, body)
        try:
            self.sock.sendall(frame)
            reader = self.exchange.reader
            while (response_frame := reader.next_frame()) is None:
                data = self.sock.recv(1 << 20)
                if not data:
                    raise KafkaClientError(f"{self.address} closed the connection "
                                           "(is it a Kafka broker?)")
                reader.feed(data)
        except TimeoutError:
            raise KafkaClientError(f"{self.address} did not answer within "
                                   f"{self.timeout:g} s") from None
        except OSError as exc:
            raise KafkaClientError(f"lost the connection to {self.address}: "
                                   f"{_reason(exc)}") from None
        try:
            received, response = self.exchange.decode(api_key, version, response_frame)
        except MalformedResponse as exc:
            raise KafkaClientError(f"cannot decode the answer of {self.address}: {exc}") \
                from None
        self.exchange.check_turn(sent, received)
        return response

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> BlockingKafkaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__
