"""Kafka's listener model: `listeners`, `advertised.listeners` and
`listener.security.protocol.map` (pure parsing, no I/O).

A listener is NAME://HOST:PORT. Its security protocol is the map's entry for its name; a name
missing from the map must itself be a protocol name (PLAINTEXT://, SSL://, ...), as in Kafka.
An empty host binds every interface. Advertised listeners default to the listeners; each
advertised name must be a listener's, and 0.0.0.0 is never advertised (Kafka refuses it).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class SecurityProtocol(enum.Enum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


DEFAULT_PROTOCOL_MAP = "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"


class ListenerError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class KafkaListener:
    """One named listener: where it binds (listeners) or what it tells clients
    (advertised.listeners)."""

    name: str
    protocol: SecurityProtocol
    host: str
    port: int


_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_ENTRY = re.compile(r"^(?P<name>[^:/]+)://(?P<host>\[[^\]]*\]|[^:]*):(?P<port>\d+)$")


def parse_protocol_map(value: str) -> dict[str, SecurityProtocol]:
    out: dict[str, SecurityProtocol] = {}
    for item in _items(value):
        name, sep, protocol = item.partition(":")
        name = name.strip().upper()
        if not sep or not _NAME.match(name):
            raise ListenerError(f"listener_security_protocol_map: bad entry {item!r} "
                                "(expected NAME:PROTOCOL)")
        try:
            out[name] = SecurityProtocol(protocol.strip().upper())
        except ValueError:
            raise ListenerError(
                f"listener_security_protocol_map: unknown security protocol {protocol!r} for "
                f"{name} (one of {', '.join(p.value for p in SecurityProtocol)})") from None
    return out


def parse_listeners(value: str, protocol_map: dict[str, SecurityProtocol],
                    what: str = "listeners") -> list[KafkaListener]:
    out: list[KafkaListener] = []
    for item in _items(value):
        match = _ENTRY.match(item)
        if match is None:
            raise ListenerError(f"{what}: bad entry {item!r} (expected NAME://HOST:PORT)")
        name = match["name"].upper()
        if not _NAME.match(name):
            raise ListenerError(f"{what}: bad listener name {match['name']!r}")
        protocol = protocol_map.get(name)
        if protocol is None:
            try:
                protocol = SecurityProtocol(name)
            except ValueError:
                raise ListenerError(
                    f"{what}: listener {name} is not in listener_security_protocol_map and "
                    "is not a security protocol name") from None
        if any(existing.name == name for existing in out):
            raise ListenerError(f"{what}: listener name {name} appears twice")
        port = int(match["port"])
        if port > 65535:
            raise ListenerError(f"{what}: bad port in {item!r}")
        out.append(KafkaListener(name, protocol, match["host"].strip("[]"), port))
    if not out:
        raise ListenerError(f"{what}: no listener given")
    return out


def advertise(listeners: list[KafkaListener], advertised: list[KafkaListener] | None,
              fallback_host: str) -> list[KafkaListener]:
    """The advertised listeners: `advertised` checked against `listeners`, or the listeners
    themselves (an empty host or 0.0.0.0 advertised as `fallback_host`)."""
    names = {lst.name: lst for lst in listeners}
    if advertised is None:
        advertised = [KafkaListener(lst.name, lst.protocol,
                               fallback_host if lst.host in ("", "0.0.0.0", "::") else lst.host,
                               lst.port) for lst in listeners]
    for adv in advertised:
        bound = names.get(adv.name)
        if bound is None:
            raise ListenerError(f"advertised_listeners: {adv.name} is not one of the listeners "
                                f"({', '.join(names)})")
        if adv.protocol is not bound.protocol:
            raise ListenerError(f"advertised_listeners: {adv.name} has another protocol")
    return advertised


def check_advertised(advertised: list[KafkaListener]) -> None:
    for adv in advertised:
        if adv.host in ("0.0.0.0", "::"):
            raise ListenerError(f"advertised_listeners: {adv.name} advertises {adv.host}, "
                                "which clients cannot connect to")


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


__all__ = ["DEFAULT_PROTOCOL_MAP", "KafkaListener", "ListenerError", "SecurityProtocol",
           "advertise", "check_advertised", "parse_listeners", "parse_protocol_map"]
