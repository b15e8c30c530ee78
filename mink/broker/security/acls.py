"""Kafka's ACL rules, pure: bindings, their validation, filters, and the decision
(Kafka's AclAuthorizer / StandardAuthorizer).

A binding is a resource pattern (type, name, LITERAL or PREFIXED) and an entry (principal
`Type:name` or `User:*`, host `*` or an address, operation, ALLOW or DENY). The decision for
(principal, host, operation, resource):

- a super user is allowed everything;
- the ACLs that apply are those whose pattern matches the resource (the literal name, the
  literal wildcard `*`, or a prefix of the name) and whose principal and host match;
- any applicable DENY for the operation (or ALL) denies;
- otherwise an applicable ALLOW for the operation (or ALL) allows; DESCRIBE is also allowed
  by READ, WRITE, DELETE or ALTER, DESCRIBE_CONFIGS by ALTER_CONFIGS;
- with no ACL at all on the resource (any principal), `allow_everyone_if_no_acl_found`
  decides; otherwise denied.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from mink.broker.security.operations import AclOperation


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


WILDCARD = "*"  # the literal wildcard resource name and host
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"
STORED_RESOURCE_TYPES = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
                         ResourceType.TRANSACTIONAL_ID)

# operation -> the ALLOW operations that grant it (besides itself and ALL)
_IMPLIED_BY = {
    AclOperation.DESCRIBE: (AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE,
                            AclOperation.ALTER),
    AclOperation.DESCRIBE_CONFIGS: (AclOperation.ALTER_CONFIGS,),
}


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    def row(self) -> tuple[int, str, int, str, str, int, int]:
        return (self.resource_type, self.resource_name, self.pattern_type, self.principal,
                self.host, self.operation, self.permission_type)


class InvalidAcl(ValueError):
    """A binding or filter Kafka refuses with INVALID_REQUEST (the message is Kafka's)."""


def _known(enum_type, value: int):
    try:
        return enum_type(value)
    except ValueError:
        return enum_type(0)


def validate_binding(b: AclBinding) -> None:
    """Kafka's checks of a new ACL (AclControlManager.validateNewAcl and KafkaApis)."""
    rtype = _known(ResourceType, b.resource_type)
    if rtype not in STORED_RESOURCE_TYPES:
        raise InvalidAcl(f"Invalid resourceType {rtype.name}")
    if _known(PatternType, b.pattern_type) not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAcl(f"Invalid patternType {_known(PatternType, b.pattern_type).name}")
    op = _known(AclOperation, b.operation)
    if op in (AclOperation.UNKNOWN, AclOperation.ANY):
        raise InvalidAcl(f"Invalid operation {op.name}")
    if _known(AclPermissionType, b.permission_type) not in (AclPermissionType.DENY,
                                                            AclPermissionType.ALLOW):
        raise InvalidAcl("Invalid permissionType "
                         f"{_known(AclPermissionType, b.permission_type).name}")
    if not b.resource_name:
        raise InvalidAcl("Resource name should not be empty")
    if rtype == ResourceType.CLUSTER and b.resource_name != CLUSTER_NAME:
        raise InvalidAcl(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if ":" not in b.principal:
        raise InvalidAcl(f"Could not parse principal from `{b.principal}` (no colon is "
                         "present separating the principal type from the principal name)")
    if not b.host:
        raise InvalidAcl("Invalid empty host")


@dataclass(frozen=True, slots=True)
class AclFilter:
    """DescribeAcls / DeleteAcls filter: None (or ANY) matches anything; MATCH matches the
    bindings that would apply to the named resource."""

    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission_type: int

    def validate(self) -> None:
        for enum_type, value in ((ResourceType, self.resource_type),
                                 (PatternType, self.pattern_type),
                                 (AclOperation, self.operation),
                                 (AclPermissionType, self.permission_type)):
            if _known(enum_type, value) == enum_type(0):
                raise InvalidAcl(f"The filter contains an UNKNOWN element: "
                                 f"{enum_type.__name__}")

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != b.resource_type:
            return False
        if self.pattern_type == PatternType.MATCH:
            if self.resource_name is not None and not pattern_matches(
                    b.pattern_type, b.resource_name, self.resource_name):
                return False
        else:
            if self.pattern_type != PatternType.ANY and self.pattern_type != b.pattern_type:
                return False
            if self.resource_name is not None and self.resource_name != b.resource_name:
                return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != b.operation:
            return False
        return (self.permission_type == AclPermissionType.ANY
                or self.permission_type == b.permission_type)


def pattern_matches(pattern_type: int, pattern: str, name: str) -> bool:
    """Whether a stored pattern applies to the resource called `name`."""
    if pattern_type == PatternType.LITERAL:
        return pattern == name or pattern == WILDCARD
    if pattern_type == PatternType.PREFIXED:
        return name.startswith(pattern)
    return False


def parse_super_users(text: str) -> frozenset[str]:
    """Kafka's `super.users`: principals separated by semicolons (`User:a;User:b`)."""
    return frozenset(p.strip() for p in text.split(";") if p.strip())


class AclIndex:
    """The bindings by resource type, and the decision over them."""

    def __init__(self, bindings: Iterable[AclBinding] = ()) -> None:
        self.bindings: tuple[AclBinding, ...] = tuple(sorted(set(bindings)))
        self._by_type: dict[int, list[AclBinding]] = {}
        for b in self.bindings:
            self._by_type.setdefault(b.resource_type, []).append(b)

    def on_resource(self, resource_type: int, name: str) -> list[AclBinding]:
        """The bindings whose pattern applies to the resource (any principal)."""
        return [b for b in self._by_type.get(resource_type, ())
                if pattern_matches(b.pattern_type, b.resource_name, name)]

    def allowed_operations(self, principal: str, host: str, resource_type: int,
                           name: str, allow_if_no_acl: bool,
                           operations: Iterable[int]) -> set[int]:
        """The operations (of `operations`) the principal may perform on the resource."""
        on = self.on_resource(resource_type, name)
        if not on:
            return set(operations) if allow_if_no_acl else set()
        applicable = [b for b in on
                      if b.principal in (principal, WILDCARD_PRINCIPAL)
                      and b.host in (host, WILDCARD)]
        denied = {b.operation for b in applicable
                  if b.permission_type == AclPermissionType.DENY}
        granted = {b.operation for b in applicable
                   if b.permission_type == AclPermissionType.ALLOW}
        return {op for op in operations if _decide(op, denied, granted)}

    def authorize(self, principal: str, host: str, operation: int, resource_type: int,
                  name: str, allow_if_no_acl: bool) -> bool:
        return bool(self.allowed_operations(principal, host, resource_type, name,
                                            allow_if_no_acl, (operation,)))

    def any_allowed(self, principal: str, host: str, operation: int,
                    resource_type: int) -> bool:
        """Whether some resource of the type could be allowed the operation: an ALLOW for it
        (or an operation implying it) whose pattern no DENY of the principal covers
        wholesale. Kafka's authorizeByResourceType (KIP-679's idempotent-write fallback)."""
        applicable = [b for b in self._by_type.get(resource_type, ())
                      if b.principal in (principal, WILDCARD_PRINCIPAL)
                      and b.host in (host, WILDCARD)]
        grants = (operation, AclOperation.ALL, *_IMPLIED_BY.get(operation, ()))
        denies = (operation, AclOperation.ALL)
        deny_all = any(b.permission_type == AclPermissionType.DENY and b.operation in denies
                       and b.pattern_type == PatternType.LITERAL
                       and b.resource_name == WILDCARD for b in applicable)
        if deny_all:
            return False
        deny_literal = {b.resource_name for b in applicable
                        if b.permission_type == AclPermissionType.DENY
                        and b.operation in denies and b.pattern_type == PatternType.LITERAL}
        deny_prefix = [b.resource_name for b in applicable
                       if b.permission_type == AclPermissionType.DENY
                       and b.operation in denies and b.pattern_type == PatternType.PREFIXED]
        for b in applicable:
            if b.permission_type != AclPermissionType.ALLOW or b.operation not in grants:
                continue
            if any(b.resource_name.startswith(p) for p in deny_prefix):
                continue
            if b.pattern_type == PatternType.LITERAL and b.resource_name in deny_literal:
                continue
            return True
        return False


def _decide(op: int, denied: set[int], granted: set[int]) -> bool:
    if op in denied or AclOperation.ALL in denied:
        return False
    if op in granted or AclOperation.ALL in granted:
        return True
    return any(i in granted for i in _IMPLIED_BY.get(op, ()))


__all__ = ["AclBinding", "AclFilter", "AclIndex", "AclPermissionType", "InvalidAcl",
           "PatternType", "ResourceType", "parse_super_users", "pattern_matches",
           "validate_binding"]
