"""Request decoding and response encoding, with kio; and the gaps of kio, wrapped in one place.

kio's gaps (0.6.5): its reader refuses writable buffers (we hand it read-only memoryviews);
an unknown tagged field raises KeyError instead of being skipped (we treat the request as
malformed); it has no schema for some old versions (Produce v0-2), which we answer elsewhere;
it copies every records field (Produce is decoded by produce_decoding instead).
"""

from __future__ import annotations

import functools
import io
import struct
from dataclasses import dataclass
from typing import Any

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from .fetch_encoding import encode_fetch_response
from .framing import size_prefix
from .produce_decoding import FIRST_VERSION as _PRODUCE_FIRST
from .produce_decoding import LAST_VERSION as _PRODUCE_LAST
from .produce_decoding import ProduceDecodeError, decode_produce_request

_HEADER_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id: every header version


class MalformedRequest(Exception):
    """The bytes do not decode as the request they claim to be; close the connection."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    body: Any  # a kio request payload


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id) without decoding the rest."""
    if len(frame) < _HEADER_PREFIX.size:
        raise MalformedRequest(f"a {len(frame)}-byte frame is too short for a request header")
    return _HEADER_PREFIX.unpack_from(frame)


_CLIENT_ID_LENGTH = struct.Struct(">h")


def peek_client_id(frame: bytes) -> str | None:
    """The header's client id (a nullable int16-length string right after the correlation
    id, in every header version) without decoding the rest; None if absent or malformed."""
    start = _HEADER_PREFIX.size
    if len(frame) < start + 2:
        return None
    (length,) = _CLIENT_ID_LENGTH.unpack_from(frame, start)
    if length < 0 or len(frame) < start + 2 + length:
        return None
    return bytes(frame[start + 2:start + 2 + length]).decode("utf-8", "replace")


_readers: dict[tuple[int, int], tuple[Any, Any]] = {}


def _reader_pair(api_key: int, api_version: int) -> tuple[Any, Any]:
    pair = _readers.get((api_key, api_version))
    if pair is None:
        schema = load_request_schema(api_key, api_version)
        pair = (entity_reader(schema.__header_schema__), entity_reader(schema))
        _readers[(api_key, api_version)] = pair
    return pair


def decode_request(frame: bytes | bytearray) -> Request:
    """Decode a frame whose api key and version the caller has checked it serves.

    Produce is decoded by our own reader, its records left in the frame (produce_decoding)."""
    api_key, api_version, _ = peek_header(frame)
    if api_key == 0 and _PRODUCE_FIRST <= api_version <= _PRODUCE_LAST:
        try:
            fields, body = decode_produce_request(frame)
        except ProduceDecodeError as exc:
            raise MalformedRequest(f"cannot decode api 0 v{api_version}: {exc}") from None
        return Request(RequestHeader(*fields), body)
    try:
        read_header, read_body = _reader_pair(api_key, api_version)
    except KioIndexError:
        raise MalformedRequest(f"api {api_key} v{api_version} has no schema here") from None
    view = memoryview(frame).toreadonly()
    try:
        header, used = read_header(view, 0)
        body, body_size = read_body(view, used)
    except Exception as exc:  # kio raises assorted errors on bad input, KeyError included
        raise MalformedRequest(
            f"cannot decode api {api_key} v{api_version}: {type(exc).__name__}: {exc}"
        ) from None
    # Trailing bytes are ignored, as Kafka's own parser does: librdkafka 2.x sends some
    # after a Metadata v12 body.
    return Request(
        RequestHeader(api_key, api_version, header.correlation_id, header.client_id), body
    )


_writers: dict[type, tuple[Any, Any, Any]] = {}


@dataclass(frozen=True, slots=True)
class EncodedBody:
    """A response body encoded once and sent many times (e.g. a cached Metadata answer)."""

    schema: type
    payload: bytes


def _writers_for(body_type: type) -> tuple[Any, Any, Any]:
    entry = _writers.get(body_type)
    if entry is None:
        header_schema = body_type.__header_schema__
        entry = (header_schema, entity_writer(header_schema), entity_writer(body_type))
        _writers[body_type] = entry
    return entry


def encode_body(body: Any) -> EncodedBody:
    buffer = io.BytesIO()
    _writers_for(type(body))[2](buffer, body)
    return EncodedBody(type(body), buffer.getvalue())


def encode_response_frame(correlation_id: int, body: Any) -> bytes | list:
    """The frame to send: bytes, or for a Fetch response a list of buffers to send in order
    (fetch_encoding: the stored batches are not copied into the frame)."""
    if _is_fetch_response(body):
        return encode_fetch_response(correlation_id, type(body).__version__, body)
    if isinstance(body, EncodedBody):
        # the body encoded ahead (a cached Metadata answer, megabytes for 100,000
        # partitions) is sent as it is, after its header: not copied into each frame
        header_schema, write_header, _ = _writers_for(body.schema)
        head = io.BytesIO()
        write_header(head, header_schema(correlation_id=correlation_id))
        header = head.getvalue()
        return [size_prefix(len(header) + len(body.payload)) + header, body.payload]
    return encode_response(correlation_id, body)


def _is_fetch_response(body: Any) -> bool:
    kind = type(body)
    return getattr(kind, "__api_key__", None) == 1 and kind.__name__ == "FetchResponse"


def encode_response(correlation_id: int, body: Any) -> bytes:
    """The whole response frame, size prefix included."""
    if _is_fetch_response(body):  # its records may be a list of buffers
        return b"".join(encode_fetch_response(correlation_id, type(body).__version__, body))
    encoded = body if isinstance(body, EncodedBody) else None
    header_schema, write_header, write_body = _writers_for(
        encoded.schema if encoded else type(body))
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    write_header(buffer, header_schema(correlation_id=correlation_id))
    if encoded is not None:
        buffer.write(encoded.payload)
    else:
        write_body(buffer, body)
    out = buffer.getbuffer()
    out[0:4] = size_prefix(len(out) - 4)
    del out
    return buffer.getvalue()


@functools.cache
def response_schema(api_key: int, api_version: int) -> type:
    # kio resolves the class by its dotted name on every call (2.7 us against 0.1 us
    # cached, once per response); a KioIndexError is not cached: it raises again.
    return load_response_schema(api_key, api_version)


_field_names: dict[type, frozenset[str]] = {}


def build(schema: type, **values: Any) -> Any:
    """Construct a kio entity from the values its version has; the others are dropped.

    Lets one handler build every version of a response: fields a version lacks (say,
    `leader_epoch` before Metadata v7) are simply not set.
    """
    names = _field_names.get(schema)
    if names is None:
        names = frozenset(schema.__dataclass_fields__) - {
            "__type__", "__version__", "__flexible__", "__api_key__", "__header_schema__"}
        _field_names[schema] = names
    return schema(**{k: v for k, v in values.items() if k in names})


def nested(schema: type, name: str) -> type:
    """The nested entity `name` of the same API version as `schema` (e.g. its topics' type)."""
    import sys

    return getattr(sys.modules[schema.__module__], name)


# -- the client side: Mink's own tools (forwarding, the CLI) and the tests talk Kafka too --


def encode_request(api_key: int, api_version: int, correlation_id: int, body: Any,
                   client_id: str | None = "mink") -> bytes:
    """A whole request frame, size prefix included."""
    schema = type(body)
    header_schema = schema.__header_schema__
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    entity_writer(header_schema)(buffer, header_schema(
        request_api_key=api_key, request_api_version=api_version,
        correlation_id=correlation_id, client_id=client_id))
    entity_writer(schema)(buffer, body)
    out = buffer.getbuffer()
    out[0:4] = size_prefix(len(out) - 4)
    del out
    return buffer.getvalue()


class MalformedResponse(Exception):
    pass


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, body) of a response frame without its size prefix."""
    schema = load_response_schema(api_key, api_version)
    view = memoryview(frame).toreadonly()
    try:
        header, used = entity_reader(schema.__header_schema__)(view, 0)
        body, _ = entity_reader(schema)(view, used)
    except Exception as exc:  # kio raises assorted errors on bad input
        raise MalformedResponse(f"cannot decode api {api_key} v{api_version}: {exc}") from None
    return header.correlation_id, body
