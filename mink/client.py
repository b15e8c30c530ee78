"""The one Kafka client Mink's own code speaks with: forwarding between nodes, `mink topics`
and the tests.

The logic (correlation ids, encoding with kio, decoding, version negotiation with
ApiVersions) lives in `_Exchange`; `KafkaClient` carries it over a trio stream and
`BlockingKafkaClient` over a blocking socket, for command-line tools and synchronous tests.
Both speak the listeners' security protocols (`ClientSecurity`: TLS, SASL PLAIN and
SCRAM-SHA-256/512), so the tools reach secured nodes too.
"""

from __future__ import annotations

import itertools
import socket
import ssl
from dataclasses import dataclass
from typing import Any

import trio
from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from mink.protocol.apis import ApiKey
from mink.protocol.framing import FrameReader
from mink.protocol.messages import MalformedResponse, build, decode_response, encode_request
from mink.protocol.scram import MECHANISMS, ScramClient, ScramError

__all__ = ["BlockingKafkaClient", "ClientSecurity", "KafkaClient", "KafkaClientError",
           "MalformedResponse"]


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


@dataclass(frozen=True)
class ClientSecurity:
    """How to reach a listener: librdkafka's settings (security.protocol, sasl.mechanism,
    sasl.username, sasl.password, ssl.ca.location, ssl.certificate.location,
    ssl.key.location)."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "SCRAM-SHA-512"
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> ClientSecurity:
        return cls(protocol=props.get("security.protocol", "PLAINTEXT").upper(),
                   mechanism=props.get("sasl.mechanism",
                                       props.get("sasl.mechanisms", "SCRAM-SHA-512")).upper(),
                   username=props.get("sasl.username"), password=props.get("sasl.password"),
                   ca_file=props.get("ssl.ca.location"),
                   cert_file=props.get("ssl.certificate.location"),
                   key_file=props.get("ssl.key.location"))

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


class _SaslDialog:
    """The tokens of one SASL login: `tokens(server_bytes)` is fed each SaslAuthenticate
    answer and gives the next token, None when done."""

    def __init__(self, security: ClientSecurity, address: str) -> None:
        if security.username is None or security.password is None:
            raise KafkaClientError(f"{address}: SASL needs sasl.username and sasl.password")
        self.mechanism = security.mechanism
        self.address = address
        self._scram = None
        if self.mechanism in MECHANISMS:
            self._scram = ScramClient(MECHANISMS[self.mechanism], security.username,
                                      security.password)
            self._step = 0
        elif self.mechanism == "PLAIN":
            self._plain = f"\0{security.username}\0{security.password}".encode()
        else:
            raise KafkaClientError(f"SASL mechanism {self.mechanism} is not supported here")

    def first(self) -> bytes:
        return self._scram.first() if self._scram else self._plain

    def next(self, answer: Any) -> bytes | None:
        if answer.error_code != ErrorCode.none:
            raise KafkaClientError(f"{self.address} refused the login: "
                                   f"{ErrorCode(answer.error_code).name.upper()} "
                                   f"({answer.error_message})")
        if self._scram is None:
            return None
        try:
            self._step += 1
            if self._step == 1:
                return self._scram.final(bytes(answer.auth_bytes))
            self._scram.verify(bytes(answer.auth_bytes))
            return None
        except (ScramError, ValueError) as exc:
            raise KafkaClientError(f"{self.address}: SCRAM failed: {exc}") from None


def _handshake_body(mechanism: str) -> Any:
    return build(load_request_schema(ApiKey.SASL_HANDSHAKE, 1), mechanism=mechanism)


def _authenticate_body(token: bytes) -> Any:
    return build(load_request_schema(ApiKey.SASL_AUTHENTICATE, 1), auth_bytes=token)


def _check_handshake(address: str, response: Any) -> None:
    if response.error_code != ErrorCode.none:
        raise KafkaClientError(f"{address} refused SaslHandshake: "
                               f"{ErrorCode(response.error_code).name.upper()} "
                               f"(offers {', '.join(response.mechanisms)})")


def _lifetime_ms(answer: Any) -> int:
    lifetime = getattr(answer, "session_lifetime", None)
    return int(lifetime.total_seconds() * 1000) if lifetime else 0


def _api_versions_request() -> Any:
    return build(load_request_schema(ApiKey.API_VERSIONS, 0))


class KafkaClient:
    """One trio connection to a broker. `send`/`receive` allow pipelining; `call` is one
    round trip; `request` negotiates the version first (`connect(negotiate=True)`)."""

    def __init__(self, stream: trio.SocketStream, address: str, client_id: str) -> None:
        self.stream = stream
        self.exchange = _Exchange(address, client_id)
        # KIP-368: the SASL session's lifetime the broker told (SaslAuthenticate v1), 0 when
        # it does not end; a long-lived connection reconnects before it ends.
        self.session_lifetime_ms = 0

    @classmethod
    async def connect(cls, address: str, *, client_id: str = "mink",
                      negotiate: bool = False,
                      security: ClientSecurity | None = None) -> KafkaClient:
        host, port = address.rsplit(":", 1)
        try:
            stream = await trio.open_tcp_stream(host, int(port))
        except OSError as exc:
            raise KafkaClientError(f"cannot reach {address}: {exc}") from None
        if security is not None and security.tls:
            stream = trio.SSLStream(stream, security.ssl_context(), server_hostname=host)
            try:
                await stream.do_handshake()
            except trio.BrokenResourceError as exc:
                await trio.aclose_forcefully(stream)
                raise KafkaClientError(f"TLS with {address} failed: {exc.__cause__}") \
                    from None
        client = cls(stream, address, client_id)
        try:
            if negotiate or (security is not None and security.sasl):
                client.exchange.negotiated(
                    await client.call(ApiKey.API_VERSIONS, 0, _api_versions_request()))
            if security is not None and security.sasl:
                dialog = _SaslDialog(security, address)
                _check_handshake(address, await client.call(
                    ApiKey.SASL_HANDSHAKE, 1, _handshake_body(dialog.mechanism)))
                token: bytes | None = dialog.first()
                while token is not None:
                    answer = await client.call(ApiKey.SASL_AUTHENTICATE, 1,
                                               _authenticate_body(token))
                    token = dialog.next(answer)
                    client.session_lifetime_ms = _lifetime_ms(answer)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
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

    def __init__(self, address: str, timeout: float, *, client_id: str = "mink",
                 security: ClientSecurity | None = None) -> None:
        host, port = address.rsplit(":", 1)
        self.exchange = _Exchange(address, client_id)
        self.timeout = timeout
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        except OSError as exc:
            raise KafkaClientError(f"cannot reach {address}: {_reason(exc)}") from None
        try:
            if security is not None and security.tls:
                try:
                    self.sock = security.ssl_context().wrap_socket(self.sock,
                                                                   server_hostname=host)
                except (ssl.SSLError, OSError) as exc:
                    raise KafkaClientError(f"TLS with {address} failed: {exc}") from None
            self.exchange.negotiated(
                self.call(ApiKey.API_VERSIONS, 0, _api_versions_request()))
            if security is not None and security.sasl:
                dialog = _SaslDialog(security, address)
                _check_handshake(address, self.call(
                    ApiKey.SASL_HANDSHAKE, 1, _handshake_body(dialog.mechanism)))
                token: bytes | None = dialog.first()
                while token is not None:
                    token = dialog.next(self.call(ApiKey.SASL_AUTHENTICATE, 1,
                                                  _authenticate_body(token)))
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
