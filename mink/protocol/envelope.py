"""What an Envelope (API 58, KIP-590) carries besides the request: the original principal
and the original client's address, as Kafka writes them.

The principal is Kafka's DefaultKafkaPrincipalBuilder serialization: an int16 version,
then the DefaultPrincipalData message (type, name, token authenticated) at that version.
The client address is the raw IPv4 (4 bytes) or IPv6 (16 bytes) address, as Java's
`InetAddress.getAddress` gives it. No I/O here.
"""

from __future__ import annotations

import io
import ipaddress
import struct

from kio.schema.default_principal_data.v0 import DefaultPrincipalData
from kio.serial import entity_reader, entity_writer

_VERSION = struct.Struct(">h")
PRINCIPAL_DATA_VERSION = 0  # DefaultPrincipalData's only version
_write_principal = entity_writer(DefaultPrincipalData)
_read_principal = entity_reader(DefaultPrincipalData)


class MalformedEnvelope(Exception):
    """The principal or the client address of an Envelope does not decode."""


def serialize_principal(principal_type: str, name: str,
                        token_authenticated: bool = False) -> bytes:
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(PRINCIPAL_DATA_VERSION))
    _write_principal(buffer, DefaultPrincipalData(
        type_=principal_type, name=name, token_authenticated=token_authenticated))
    return buffer.getvalue()


def deserialize_principal(data: bytes | None) -> tuple[str, str, bool]:
    """(type, name, token authenticated), or MalformedEnvelope."""
    if data is None or len(data) < _VERSION.size:
        raise MalformedEnvelope("no principal in the envelope")
    (version,) = _VERSION.unpack_from(data)
    if version != PRINCIPAL_DATA_VERSION:
        raise MalformedEnvelope(f"invalid principal data version {version}")
    try:
        decoded, _ = _read_principal(memoryview(bytes(data)).toreadonly(), _VERSION.size)
    except Exception as exc:  # kio raises assorted errors on bad input
        raise MalformedEnvelope(f"cannot decode the principal: {type(exc).__name__}") from None
    if not decoded.type_ or not decoded.name:
        raise MalformedEnvelope("the principal has no type or no name")
    return decoded.type_, decoded.name, bool(decoded.token_authenticated)


def address_bytes(host: str) -> bytes:
    """The raw address of `host` (an IP address as text); the unspecified IPv4 address for
    anything else (a test's in-memory stream has no peer address)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).packed
    except ValueError:
        return bytes(4)


def address_text(data: bytes) -> str:
    """The client address as text, or MalformedEnvelope (neither 4 nor 16 bytes)."""
    if len(data) not in (4, 16):
        raise MalformedEnvelope(f"a client address of {len(data)} bytes")
    address = ipaddress.ip_address(bytes(data))
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


__all__ = ["MalformedEnvelope", "address_bytes", "address_text", "deserialize_principal",
           "serialize_principal"]
