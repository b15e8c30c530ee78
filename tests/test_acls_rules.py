"""Kafka's ACL rules (mink/broker/security/acls.py), pure: one row per rule."""

from __future__ import annotations

import pytest

from mink.broker.security.acls import (
    AclBinding,
    AclFilter,
    AclIndex,
    InvalidAcl,
    parse_super_users,
    validate_binding,
)
from mink.broker.security.operations import AclOperation as Op

TOPIC, GROUP, CLUSTER, TXN = 2, 3, 4, 5
LITERAL, PREFIXED = 3, 4
DENY, ALLOW = 2, 3


def acl(name, op, permission=ALLOW, *, kind=TOPIC, pattern=LITERAL, principal="User:alice",
        host="*"):
    return AclBinding(kind, name, pattern, principal, host, op, permission)


RULES = [
    # (ACLs, principal, host, operation, topic, allow_if_no_acl, allowed)
    ([], "User:alice", "1.2.3.4", Op.READ, "t", False, False),
    ([], "User:alice", "1.2.3.4", Op.READ, "t", True, True),
    # ACLs on the topic for someone else: no longer "no ACL found"
    ([acl("t", Op.READ, principal="User:bob")], "User:alice", "h", Op.READ, "t", True, False),
    ([acl("t", Op.READ)], "User:alice", "h", Op.READ, "t", False, True),
    ([acl("t", Op.READ)], "User:alice", "h", Op.WRITE, "t", False, False),
    # READ, WRITE, DELETE, ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS
    ([acl("t", Op.READ)], "User:alice", "h", Op.DESCRIBE, "t", False, True),
    ([acl("t", Op.WRITE)], "User:alice", "h", Op.DESCRIBE, "t", False, True),
    ([acl("t", Op.DELETE)], "User:alice", "h", Op.DESCRIBE, "t", False, True),
    ([acl("t", Op.ALTER)], "User:alice", "h", Op.DESCRIBE, "t", False, True),
    ([acl("t", Op.CREATE)], "User:alice", "h", Op.DESCRIBE, "t", False, False),
    ([acl("t", Op.ALTER_CONFIGS)], "User:alice", "h", Op.DESCRIBE_CONFIGS, "t", False, True),
    ([acl("t", Op.DESCRIBE)], "User:alice", "h", Op.READ, "t", False, False),
    # ALL matches every operation, allowed or denied
    ([acl("t", Op.ALL)], "User:alice", "h", Op.DELETE, "t", False, True),
    ([acl("t", Op.ALL), acl("t", Op.ALL, DENY)], "User:alice", "h", Op.READ, "t", False,
     False),
    # DENY beats ALLOW; a denied READ still describes
    ([acl("t", Op.READ), acl("t", Op.READ, DENY)], "User:alice", "h", Op.READ, "t", False,
     False),
    ([acl("t", Op.READ), acl("t", Op.READ, DENY)], "User:alice", "h", Op.DESCRIBE, "t",
     False, True),
    ([acl("*", Op.READ), acl("t", Op.READ, DENY)], "User:alice", "h", Op.READ, "t", False,
     False),
    # wildcard resource, wildcard principal, hosts
    ([acl("*", Op.READ)], "User:alice", "h", Op.READ, "anything", False, True),
    ([acl("t", Op.READ, principal="User:*")], "User:zed", "h", Op.READ, "t", False, True),
    ([acl("t", Op.READ, host="10.0.0.1")], "User:alice", "10.0.0.2", Op.READ, "t", False,
     False),
    ([acl("t", Op.READ, host="10.0.0.1")], "User:alice", "10.0.0.1", Op.READ, "t", False,
     True),
    # prefixed patterns
    ([acl("logs-", Op.WRITE, pattern=PREFIXED)], "User:alice", "h", Op.WRITE, "logs-a", False,
     True),
    ([acl("logs-", Op.WRITE, pattern=PREFIXED)], "User:alice", "h", Op.WRITE, "log", False,
     False),
    ([acl("logs-", Op.WRITE, pattern=PREFIXED), acl("logs-x", Op.WRITE, DENY)], "User:alice",
     "h", Op.WRITE, "logs-x", False, False),
    # a literal "logs-" is not a prefix
    ([acl("logs-", Op.WRITE)], "User:alice", "h", Op.WRITE, "logs-a", False, False),
]


@pytest.mark.parametrize("acls,principal,host,op,topic,allow_if_none,allowed", RULES)
def test_rules(acls, principal, host, op, topic, allow_if_none, allowed):
    index = AclIndex(acls)
    assert index.authorize(principal, host, op, TOPIC, topic, allow_if_none) is allowed


def test_idempotent_write_by_any_topic_write():
    # KIP-679: WRITE on some topic, unless a DENY covers it
    assert AclIndex([acl("t", Op.WRITE)]).any_allowed("User:alice", "h", Op.WRITE, TOPIC)
    assert AclIndex([acl("p-", Op.WRITE, pattern=PREFIXED)]).any_allowed(
        "User:alice", "h", Op.WRITE, TOPIC)
    assert not AclIndex([acl("t", Op.READ)]).any_allowed("User:alice", "h", Op.WRITE, TOPIC)
    assert not AclIndex([acl("t", Op.WRITE), acl("*", Op.WRITE, DENY)]).any_allowed(
        "User:alice", "h", Op.WRITE, TOPIC)
    assert not AclIndex([acl("t", Op.WRITE), acl("t", Op.WRITE, DENY)]).any_allowed(
        "User:alice", "h", Op.WRITE, TOPIC)
    assert not AclIndex([acl("p-a", Op.WRITE), acl("p-", Op.WRITE, DENY, pattern=PREFIXED)]
                        ).any_allowed("User:alice", "h", Op.WRITE, TOPIC)


@pytest.mark.parametrize("bad,message", [
    (acl("t", Op.ANY), "Invalid operation ANY"),
    (acl("t", Op.READ, 1), "Invalid permissionType ANY"),
    (acl("t", Op.READ, pattern=2), "Invalid patternType MATCH"),
    (acl("t", Op.READ, kind=1), "Invalid resourceType ANY"),
    (acl("", Op.READ), "Resource name should not be empty"),
    (acl("c", Op.ALTER, kind=CLUSTER), "The only valid name for the CLUSTER resource is"),
    (acl("t", Op.READ, principal="alice"), "Could not parse principal"),
])
def test_invalid_bindings(bad, message):
    with pytest.raises(InvalidAcl, match=message):
        validate_binding(bad)


def test_filters():
    bindings = [acl("logs-", Op.WRITE, pattern=PREFIXED), acl("logs-a", Op.READ),
                acl("*", Op.READ, kind=GROUP), acl("other", Op.READ, principal="User:bob")]
    match = AclFilter(TOPIC, "logs-a", 2, None, None, 1, 1)
    assert [b for b in bindings if match.matches(b)] == bindings[:2]
    exact = AclFilter(1, "logs-", 3, None, None, 1, 1)
    assert [b for b in bindings if exact.matches(b)] == []
    by_principal = AclFilter(1, None, 1, "User:bob", None, 1, 1)
    assert [b for b in bindings if by_principal.matches(b)] == bindings[3:]
    with pytest.raises(InvalidAcl):
        AclFilter(0, None, 1, None, None, 1, 1).validate()


def test_super_users_parsed_as_kafka():
    assert parse_super_users("User:admin; User:other;;") == {"User:admin", "User:other"}
    assert parse_super_users("") == frozenset()
