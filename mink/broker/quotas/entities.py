"""Quota entities, keys and Kafka's precedence (KIP-55), with no I/O.

An entity is a pair of parts, each encoded as text the way `client_quotas` stores it
(sql/0015_quotas.sql): `ABSENT` (''), `DEFAULT` ('*', Kafka's <default>) or `'=' + name`.
Users are matched by the principal's name (`ANONYMOUS` until authentication exists), client
ids by the request header's client id.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from kio.schema.errors import ErrorCode

ABSENT = ""
DEFAULT = "*"

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"

# Kafka's QuotaConfig.userAndClientQuotaConfigs: key -> integral? (LONG keys refuse
# fractions, DOUBLE keys take any positive value)
QUOTA_KEYS: dict[str, bool] = {
    PRODUCER_BYTE_RATE: True,
    CONSUMER_BYTE_RATE: True,
    REQUEST_PERCENTAGE: False,
    CONTROLLER_MUTATION_RATE: False,  # stored and described; not enforced (no KIP-599)
}

Entity = tuple[str, str]  # (user part, client part)


def named(name: str) -> str:
    return "=" + name


def part_name(part: str) -> str | None:
    """The wire's entity_name of a present part: None for the default."""
    return None if part == DEFAULT else part[1:]


def entity_components(entity: Entity) -> list[tuple[str, str | None]]:
    """(entity_type, entity_name) pairs of an entity, user first, as Kafka lists them."""
    user, client = entity
    out = []
    if user != ABSENT:
        out.append((USER, part_name(user)))
    if client != ABSENT:
        out.append((CLIENT_ID, part_name(client)))
    return out


def levels(user: str, client_id: str) -> tuple[tuple[Entity, tuple[str, str]], ...]:
    """KIP-55's eight levels for a connection's user and client id, most specific first,
    each with the metric tags (user, client-id) its sensor is kept under (Kafka's
    DefaultQuotaCallback.quotaMetricTags): a default entity still measures each user or
    client id on its own."""
    u, c = named(user), named(client_id)
    return (
        ((u, c), (user, client_id)),                  # /config/users/<user>/clients/<client-id>
        ((u, DEFAULT), (user, client_id)),            # /config/users/<user>/clients/<default>
        ((u, ABSENT), (user, "")),                    # /config/users/<user>
        ((DEFAULT, c), (user, client_id)),            # /config/users/<default>/clients/<client-id>
        ((DEFAULT, DEFAULT), (user, client_id)),      # /config/users/<default>/clients/<default>
        ((DEFAULT, ABSENT), (user, "")),              # /config/users/<default>
        ((ABSENT, c), ("", client_id)),               # /config/clients/<client-id>
        ((ABSENT, DEFAULT), ("", client_id)),         # /config/clients/<default>
    )


def resolve(limits: Mapping[Entity, float], user: str,
            client_id: str) -> tuple[float, tuple[str, str]] | None:
    """The quota of one key that applies to (user, client id), and its sensor's tags; None
    when no level sets it (unlimited)."""
    for entity, tags in levels(user, client_id):
        limit = limits.get(entity)
        if limit is not None:
            return limit, tags
    return None


class InvalidQuota(Exception):
    """An AlterClientQuotas entry Kafka refuses: its error code and message."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.invalid_request) -> None:
        super().__init__(message)
        self.code = code


def parse_entity(components: Iterable[tuple[str, str | None]]) -> Entity:
    """An entity of AlterClientQuotas as Kafka's validateEntity and configKeysForEntityType
    check it (INVALID_REQUEST for each refusal, Kafka's messages)."""
    parts: dict[str, str] = {}
    seen: set[str] = set()
    for entity_type, name in components:
        if entity_type in seen:
            raise InvalidQuota(
                f"Invalid client quota entity, duplicate entity entry {entity_type}")
        seen.add(entity_type)
        if entity_type not in (USER, CLIENT_ID, IP):
            raise InvalidQuota(f"Unhandled client quota entity type: {entity_type}")
        if name is not None and name == "":
            raise InvalidQuota(f"Empty {entity_type} not supported")
        parts[entity_type] = DEFAULT if name is None else named(name)
    if not seen:
        raise InvalidQuota("Invalid empty client quota entity")
    if IP in parts:
        if len(parts) > 1:
            raise InvalidQuota("Invalid quota entity combination, IP entity should not be "
                               "combined with User or ClientId")
        # Kafka's connection_creation_rate per IP (KIP-612) is not built in Mink.
        raise InvalidQuota("ip quotas (connection_creation_rate) are not supported by Mink",
                           ErrorCode.unsupported_version)
    return parts.get(USER, ABSENT), parts.get(CLIENT_ID, ABSENT)


def check_value(key: str, value: float) -> None:
    """Kafka's validateQuotaKeyValue (INVALID_REQUEST, Kafka's messages); NaN and infinity,
    which no Kafka key takes, are refused too."""
    integral = QUOTA_KEYS.get(key)
    if integral is None:
        raise InvalidQuota(f"Invalid configuration key {key}")
    if math.isnan(value) or math.isinf(value):
        raise InvalidQuota(f"Quota {key} must be a finite number")
    if value <= 0.0:
        raise InvalidQuota(f"Quota {key} must be greater than 0")
    if integral:
        if value > 2**63 - 1:
            raise InvalidQuota(f"Proposed value for {key} is too large for a LONG.")
        if abs(value % 1.0) > 1e-6:
            raise InvalidQuota(f"{key} cannot be a fractional value.")


# DescribeClientQuotas (KIP-546) filter match types
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


def parse_filter(components: Iterable[tuple[str, int, str | None]]) -> dict[str, tuple[int, str | None]]:
    """entity type -> (match type, match) of a DescribeClientQuotas filter; InvalidQuota
    (INVALID_REQUEST) for what Kafka refuses."""
    out: dict[str, tuple[int, str | None]] = {}
    for entity_type, match_type, match in components:
        if entity_type not in (USER, CLIENT_ID, IP):
            raise InvalidQuota(f"Custom entity type '{entity_type}' not supported")
        if entity_type in out:
            raise InvalidQuota(f"Duplicate {entity_type} filter component entity type")
        if match_type == MATCH_EXACT and match is None:
            raise InvalidQuota(f"Exact match on {entity_type} requires a name to match")
        if match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            raise InvalidQuota(f"Unknown match type {match_type}")
        out[entity_type] = (match_type, match)
    return out


def matches(entity: Entity, wanted: Mapping[str, tuple[int, str | None]], strict: bool) -> bool:
    """Does a stored entity pass a DescribeClientQuotas filter (KIP-546)?"""
    present = {USER: entity[0], CLIENT_ID: entity[1]}
    for entity_type, (match_type, match) in wanted.items():
        part = present.get(entity_type, ABSENT)
        if part == ABSENT:
            return False
        if match_type == MATCH_EXACT and part != named(match or ""):
            return False
        if match_type == MATCH_DEFAULT and part != DEFAULT:
            return False
        # MATCH_SPECIFIED: any name or the default
    if strict:
        return all(entity_type in wanted for entity_type, part in present.items()
                   if part != ABSENT)
    return True
