"""ACLs and the authorizer (issue 24): CreateAcls, DescribeAcls and DeleteAcls with
confluent-kafka's and kafka-python's admin clients, and the checks of the handlers, with real
clients over real sockets against a node whose SASL_PLAINTEXT listener names the principal.

The node's PLAINTEXT listener is ANONYMOUS, made a super user here so the tests set up users
and ACLs through it; alice and bob log in with SASL PLAIN on the SASL_PLAINTEXT listener.
"""

from __future__ import annotations

import time

from contextlib import asynccontextmanager

import pytest
import trio
from kio.index import load_request_schema

from mink.client import ClientSecurity, KafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build
from tests.support.security import create_users, endpoints

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
LISTENERS = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"
SECURED = dict(listeners=LISTENERS, authorizer_enabled=True,
               super_users="User:ANONYMOUS;User:root",
               connection_failed_authentication_delay_ms=10)


@pytest.fixture
async def secured(mink_postgres, store_url):
    """A node with the authorizer on; yields listener name -> address."""
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         **SECURED) as running:
        where = endpoints(running)
        await trio.to_thread.run_sync(create_users, where["PLAINTEXT"], USERS)
        yield where


def user_conf(address: str, user: str = "alice") -> dict:
    return {"bootstrap.servers": address, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": USERS[user]}


@asynccontextmanager
async def as_user(address: str, user: str = "alice"):
    """Mink's own client logged in as `user` (SASL PLAIN): for the exact codes of raw
    requests."""
    security = ClientSecurity(protocol="SASL_PLAINTEXT", mechanism="PLAIN", username=user,
                              password=USERS[user])
    async with await KafkaClient.connect(address, client_id=f"test-{user}",
                                         security=security) as client:
        yield client


async def call(client: KafkaClient, api_key: int, version: int, **fields):
    return await client.call(api_key, version, build(load_request_schema(api_key, version),
                                                     **fields))


def binding(resource_type, name, principal, operation, permission="ALLOW",
            pattern="LITERAL", host="*"):
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kind = {"CLUSTER": "BROKER"}.get(resource_type, resource_type)  # librdkafka calls it BROKER
    return AclBinding(ResourceType[kind], name, ResourcePatternType[pattern],
                      principal, host, AclOperation[operation],
                      AclPermissionType[permission])


def create_acls(address: str, bindings, conf: dict | None = None) -> None:
    """Blocking: CreateAcls through confluent-kafka's AdminClient; raises on any error."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(conf or {"bootstrap.servers": address})
    for future in admin.create_acls(bindings, request_timeout=20).values():
        future.result(timeout=30)


def describe_all(address: str, conf: dict | None = None):
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient(conf or {"bootstrap.servers": address})
    return admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
        AclPermissionType.ANY), request_timeout=20).result(timeout=30)


def kafka_error_code(exc: BaseException) -> int:
    from confluent_kafka import KafkaException

    assert isinstance(exc, KafkaException), repr(exc)
    return exc.args[0].code()


# -- the ACL APIs -----------------------------------------------------------------------------

async def test_acls_created_described_deleted_with_confluent_admin(secured):
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    address = secured["PLAINTEXT"]
    made = [binding("TOPIC", "orders", "User:alice", "READ"),
            binding("TOPIC", "logs-", "User:alice", "WRITE", pattern="PREFIXED"),
            binding("GROUP", "*", "User:bob", "READ", "DENY", host="10.0.0.1"),
            binding("CLUSTER", "kafka-cluster", "User:bob", "DESCRIBE")]

    def run():
        create_acls(address, made)
        create_acls(address, made[:1])  # an existing binding is a success, stored once
        described = describe_all(address)
        admin = AdminClient({"bootstrap.servers": address})
        # MATCH: every binding that applies to the topic logs-app
        matched = admin.describe_acls(AclBindingFilter(
            ResourceType.TOPIC, "logs-app", ResourcePatternType.MATCH, None, None,
            AclOperation.ANY, AclPermissionType.ANY)).result(timeout=30)
        deleted = admin.delete_acls([AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob", None,
            AclOperation.ANY, AclPermissionType.ANY)], request_timeout=20)
        deleted = [list(f.result(timeout=30)) for f in deleted.values()]
        return described, matched, deleted, describe_all(address)

    described, matched, deleted, after = await trio.to_thread.run_sync(run)
    assert sorted(map(str, described)) == sorted(map(str, made))
    assert [str(b) for b in matched] == [str(made[1])]
    assert sorted(map(str, deleted[0])) == sorted(map(str, made[2:]))
    assert sorted(map(str, after)) == sorted(map(str, made[:2]))


async def test_invalid_acls_refused_with_invalid_request(secured):
    address = secured["PLAINTEXT"]

    def run(bad):
        try:
            create_acls(address, [bad])
        except Exception as exc:  # noqa: BLE001 - the code is what is checked
            return kafka_error_code(exc)
        return 0

    # a CLUSTER resource is called kafka-cluster; a principal has a type
    for bad in (binding("CLUSTER", "other", "User:alice", "ALTER"),
                binding("TOPIC", "t", "alice", "READ")):
        assert await trio.to_thread.run_sync(run, bad) == 42  # INVALID_REQUEST
    assert await trio.to_thread.run_sync(describe_all, address) == []


async def test_acl_apis_need_cluster_rights(secured):
    address = secured["SASL_PLAINTEXT"]
    creation = binding("TOPIC", "t", "User:alice", "READ")

    def create():
        try:
            create_acls(address, [creation], user_conf(address))
        except Exception as exc:  # noqa: BLE001
            return kafka_error_code(exc)
        return 0

    async def describe():
        async with as_user(address) as client:
            answer = await call(client, ApiKey.DESCRIBE_ACLS, 3, resource_type_filter=1,
                                resource_name_filter=None, pattern_type_filter=1,
                                principal_filter=None, host_filter=None, operation=1,
                                permission_type=1)
            return int(answer.error_code), len(answer.resources)

    assert await trio.to_thread.run_sync(create) == 31  # CLUSTER_AUTHORIZATION_FAILED
    assert await describe() == (31, 0)
    await trio.to_thread.run_sync(create_acls, secured["PLAINTEXT"], [
        binding("CLUSTER", "kafka-cluster", "User:alice", "ALTER")])
    # ALTER on the cluster allows CreateAcls, and implies DESCRIBE (DescribeAcls)
    assert await trio.to_thread.run_sync(create) == 0
    assert await describe() == (0, 2)


async def test_acl_apis_without_an_authorizer_answer_security_disabled(mink_postgres,
                                                                        store_url):
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False) as running:
        def create():
            try:
                create_acls(running.bootstrap, [binding("TOPIC", "t", "User:a", "READ")])
            except Exception as exc:  # noqa: BLE001
                return kafka_error_code(exc)
            return 0

        assert await trio.to_thread.run_sync(create) == 54  # SECURITY_DISABLED
        # (librdkafka's describe_acls drops the top-level error: asked raw)
        async with await KafkaClient.connect(running.bootstrap) as client:
            answer = await call(client, ApiKey.DESCRIBE_ACLS, 3, resource_type_filter=1,
                                resource_name_filter=None, pattern_type_filter=1,
                                principal_filter=None, host_filter=None, operation=1,
                                permission_type=1)
            assert answer.error_code == 54


async def test_acls_with_kafka_python_admin(secured):
    from kafka.admin import (
        ACLResourcePatternType,
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )


    def run():
        admin = KafkaAdminClient(bootstrap_servers=secured["PLAINTEXT"])
        try:
            acl = ACL("User:bob", "*", ACLOperation.WRITE, ACLPermissionType.ALLOW,
                      ResourcePattern(ResourceType.TOPIC, "kp-",
                                      ACLResourcePatternType.PREFIXED))
            created = admin.create_acls([acl])
            wanted = ACLFilter("User:bob", None, ACLOperation.ANY, ACLPermissionType.ANY,
                               ResourcePatternFilter(ResourceType.ANY, None,
                                                     ACLResourcePatternType.ANY))
            described, error = admin.describe_acls(wanted)
            deleted = admin.delete_acls([wanted])
            left, _ = admin.describe_acls(wanted)
            return created, described, error, deleted, left
        finally:
            admin.close()

    created, described, error, deleted, left = await trio.to_thread.run_sync(run)
    assert not created["failed"] and len(created["succeeded"]) == 1
    assert error.errno == 0
    assert [(a.principal, a.operation, a.resource_pattern.resource_name) for a in described] \
        == [("User:bob", 3 + 1, "kp-")]
    ((_, matches, filter_error),) = deleted
    assert filter_error.errno == 0 and len(matches) == 1
    assert left == []
