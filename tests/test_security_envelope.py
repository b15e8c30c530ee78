"""Forwarded requests in Envelopes (API 58, KIP-590), with the authorizer on: a node forwards
a coordinator action to the coordinator in an Envelope carrying the client's principal and
address, over the inter-broker listener as the inter-broker user; the coordinator accepts
Envelopes only there and only from a principal with CLUSTER_ACTION, and checks the request
inside as the original principal. The old client-id marker gains nothing.

Listeners: INTERNAL (SASL_PLAINTEXT, inter-broker, the nodes log in as `broker`, who has
CLUSTER_ACTION and nothing else), CLIENT (SASL_PLAINTEXT, alice and bob), PLAINTEXT
(ANONYMOUS, a super user, to set up users and ACLs).
"""

from __future__ import annotations

import datetime

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.envelope.v0 import EnvelopeRequest
from kio.schema.errors import ErrorCode

from mink.client import ClientSecurity, KafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.envelope import serialize_principal
from mink.protocol.messages import build, decode_response, encode_request, nested
from tests.support.security import closed_within, create_users, endpoints
from tests.test_acls import binding, create_acls

USERS = {"broker": "broker-pw", "alice": "alice-pw", "bob": "bob-pw"}
SETTINGS = dict(
    listeners="INTERNAL://127.0.0.1:0,CLIENT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
    listener_security_protocol_map="INTERNAL:SASL_PLAINTEXT,CLIENT:SASL_PLAINTEXT,"
                                   "PLAINTEXT:PLAINTEXT",
    inter_broker_listener_name="INTERNAL", inter_broker_sasl_mechanism="PLAIN",
    inter_broker_sasl_username="broker", inter_broker_sasl_password="broker-pw",
    authorizer_enabled=True, super_users="User:ANONYMOUS",
    connection_failed_authentication_delay_ms=10, offsets_topic_num_partitions=1)
TOPIC_AUTH = int(ErrorCode.topic_authorization_failed)


def login(user: str) -> ClientSecurity:
    return ClientSecurity(protocol="SASL_PLAINTEXT", mechanism="PLAIN", username=user,
                          password=USERS[user])


def create_topics_body(*names: str):
    schema = load_request_schema(ApiKey.CREATE_TOPICS, 5)
    return build(schema, topics=tuple(build(
        nested(schema, "CreatableTopic"), name=name, num_partitions=1,
        replication_factor=-1, assignments=(), configs=()) for name in names),
        timeout=datetime.timedelta(seconds=20), validate_only=False)


def codes(response) -> dict[str, int]:
    return {t.name: int(t.error_code) for t in response.topics}


async def setup(address: str) -> None:
    """Users, and CLUSTER_ACTION for the inter-broker user; alice may create `a-*` (and
    describe `a-auto`, for auto-creation)."""
    await trio.to_thread.run_sync(create_users, address, USERS)
    await trio.to_thread.run_sync(create_acls, address, [
        binding("CLUSTER", "kafka-cluster", "User:broker", "CLUSTER_ACTION"),
        binding("TOPIC", "a-", "User:alice", "CREATE", pattern="PREFIXED"),
        binding("TOPIC", "a-auto", "User:alice", "DESCRIBE")])


def envelope(inner_key: int, inner_version: int, inner_body, principal: bytes | None,
             address: bytes = bytes([127, 0, 0, 1]), client_id: str = "app"):
    return EnvelopeRequest(
        request_data=encode_request(inner_key, inner_version, 7, inner_body, client_id)[4:],
        request_principal=principal, client_host_address=address)


@pytest.fixture
async def single(mink_postgres):
    from mink.testing import open_node

    async with open_node(mink_postgres, proxy=False, **SETTINGS) as running:
        where = endpoints(running)
        await setup(where["PLAINTEXT"])
        yield running, where


async def test_a_create_through_another_node_is_checked_on_the_coordinator(
        mink_postgres, monkeypatch, caplog):
    """alice may create `a-*`: through the node that is not the coordinator (forwarded in
    an Envelope, as `broker`, who may not create anything) and through the coordinator.
    bob may create nothing, through either node; a mixed request is split per topic by the
    coordinator. Auto-creation through the other node is checked the same way."""
    from mink.broker.server import handlers
    from mink.testing import open_cluster

    envelopes = []  # the principals of the Envelopes every node accepted, as they arrive
    served = handlers.HANDLERS[ApiKey.ENVELOPE]

    async def counted(node, ctx, request):
        envelopes.append((node.node_id, str(ctx.principal)))
        return await served(node, ctx, request)

    monkeypatch.setitem(handlers.HANDLERS, ApiKey.ENVELOPE, counted)
    async with open_cluster(2, mink_postgres, proxy=False, **SETTINGS) as cluster:
        where = {n.node_id: endpoints(n) for n in cluster.nodes}
        await setup(where[1]["PLAINTEXT"])
        with trio.fail_after(20):
            while any(n.node.view.coordinator is None or len(n.node.view.brokers) < 2
                      for n in cluster.nodes):
                await trio.sleep(0.05)
        coordinator = cluster.nodes[0].node.view.coordinator
        other = next(n for n in cluster.nodes if n.node_id != coordinator)
        holder = next(n for n in cluster.nodes if n.node_id == coordinator)

        async with await KafkaClient.connect(endpoints(other)["CLIENT"],
                                             security=login("alice")) as alice:
            answer = await alice.call(ApiKey.CREATE_TOPICS, 5,
                                      create_topics_body("a-forwarded", "b-forwarded"))
            assert codes(answer) == {"a-forwarded": 0, "b-forwarded": TOPIC_AUTH}, answer
            # it went in an Envelope, from the inter-broker user
            assert envelopes == [(coordinator, "User:broker")]
            meta = await alice.call(ApiKey.METADATA, 12, build(
                load_request_schema(ApiKey.METADATA, 12), topics=(build(
                    nested(load_request_schema(ApiKey.METADATA, 12), "MetadataRequestTopic"),
                    topic_id=None, name="a-auto"),), allow_auto_topic_creation=True,
                include_topic_authorized_operations=False))
            assert meta.topics[0].error_code != TOPIC_AUTH
        with trio.fail_after(20):
            while not {"a-forwarded", "a-auto"} <= set(holder.node.view.topics):
                await trio.sleep(0.05)
        assert "b-forwarded" not in holder.node.view.topics
        for node in (other, holder):
            async with await KafkaClient.connect(endpoints(node)["CLIENT"],
                                                 security=login("bob")) as bob:
                answer = await bob.call(ApiKey.CREATE_TOPICS, 5,
                                        create_topics_body(f"a-bob-{node.node_id}"))
                assert codes(answer) == {f"a-bob-{node.node_id}": TOPIC_AUTH}, answer
        async with await KafkaClient.connect(endpoints(holder)["CLIENT"],
                                             security=login("alice")) as alice:
            answer = await alice.call(ApiKey.CREATE_TOPICS, 5, create_topics_body("a-direct"))
            assert codes(answer) == {"a-direct": 0}
        # forwarded once: an Envelope reaching a node that is not the coordinator is answered
        # there (NOT_CONTROLLER), never sent on
        seen = len(envelopes)
        async with await KafkaClient.connect(endpoints(other)["INTERNAL"],
                                             security=login("broker")) as node:
            answer = await node.call(ApiKey.ENVELOPE, 0, envelope(
                ApiKey.CREATE_TOPICS, 5, create_topics_body("a-twice"),
                serialize_principal("User", "alice")))
        _, inner = decode_response(ApiKey.CREATE_TOPICS, 5, answer.response_data)
        assert codes(inner) == {"a-twice": int(ErrorCode.not_controller)}
        assert envelopes[seen:] == [(other.node_id, "User:broker")]

        # the inter-broker user without CLUSTER_ACTION: the coordinator refuses the Envelope,
        # the node says why in its log and the client is told NOT_CONTROLLER (it retries)
        await trio.to_thread.run_sync(_revoke_cluster_action, where[1]["PLAINTEXT"])
        with trio.fail_after(10):  # until the coordinator has the revocation
            while any(b.principal == "User:broker"
                      for b in holder.node.authorizer.index.bindings):
                await trio.sleep(0.05)
        async with await KafkaClient.connect(endpoints(other)["CLIENT"],
                                             security=login("alice")) as alice:
            answer = await alice.call(ApiKey.CREATE_TOPICS, 5, create_topics_body("a-refused"))
        assert codes(answer) == {"a-refused": int(ErrorCode.not_controller)}
        assert "refused the envelope: CLUSTER_AUTHORIZATION_FAILED" in caplog.text


def _revoke_cluster_action(address: str) -> None:
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": address})
    for future in admin.delete_acls([AclBindingFilter(
            ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:broker",
            None, AclOperation.CLUSTER_ACTION, AclPermissionType.ALLOW)],
            request_timeout=20).values():
        assert future.result(timeout=30)


async def test_the_coordinator_checks_the_carried_principal(single):
    """A raw Envelope from `broker` on the inter-broker listener: the request inside is
    checked as the principal it carries, not as `broker`."""
    running, where = single
    async with await KafkaClient.connect(where["INTERNAL"], security=login("broker")) as node:
        refused = await node.call(ApiKey.ENVELOPE, 0, envelope(
            ApiKey.CREATE_TOPICS, 5, create_topics_body("a-as-bob"),
            serialize_principal("User", "bob")))
        assert refused.error_code == ErrorCode.none
        correlation_id, inner = decode_response(ApiKey.CREATE_TOPICS, 5,
                                                refused.response_data)
        assert correlation_id == 7
        assert codes(inner) == {"a-as-bob": TOPIC_AUTH}
        allowed = await node.call(ApiKey.ENVELOPE, 0, envelope(
            ApiKey.CREATE_TOPICS, 5, create_topics_body("a-as-alice"),
            serialize_principal("User", "alice")))
        _, inner = decode_response(ApiKey.CREATE_TOPICS, 5, allowed.response_data)
        assert codes(inner) == {"a-as-alice": 0}
        # broker itself may create nothing
        direct = await node.call(ApiKey.CREATE_TOPICS, 5, create_topics_body("a-as-broker"))
        assert codes(direct) == {"a-as-broker": TOPIC_AUTH}


async def test_the_carried_host_is_checked(single):
    """An ACL for alice from one host only: the Envelope's client address is what is
    matched, not the forwarding node's."""
    running, where = single
    await trio.to_thread.run_sync(create_acls, where["PLAINTEXT"], [
        binding("TOPIC", "h-", "User:alice", "CREATE", pattern="PREFIXED", host="10.1.2.3")])
    async with await KafkaClient.connect(where["INTERNAL"], security=login("broker")) as node:
        for address, name, code in ((bytes([10, 1, 2, 3]), "h-from-there", 0),
                                    (bytes([127, 0, 0, 1]), "h-from-here", TOPIC_AUTH)):
            answer = await node.call(ApiKey.ENVELOPE, 0, envelope(
                ApiKey.CREATE_TOPICS, 5, create_topics_body(name),
                serialize_principal("User", "alice"), address))
            assert codes(decode_response(ApiKey.CREATE_TOPICS, 5,
                                         answer.response_data)[1]) == {name: code}


async def test_envelopes_are_refused_without_cluster_action_or_off_the_listener(single):
    running, where = single
    alice_principal = serialize_principal("User", "alice")
    # alice on the inter-broker listener: no CLUSTER_ACTION
    async with await KafkaClient.connect(where["INTERNAL"], security=login("alice")) as alice:
        answer = await alice.call(ApiKey.ENVELOPE, 0, envelope(
            ApiKey.CREATE_TOPICS, 5, create_topics_body("a-smuggled"), alice_principal))
        assert answer.error_code == ErrorCode.cluster_authorization_failed
        assert answer.response_data is None
    # broker on a client listener: the connection is closed
    async with await KafkaClient.connect(where["CLIENT"], security=login("broker")) as node:
        await node.send(ApiKey.ENVELOPE, 0, envelope(
            ApiKey.CREATE_TOPICS, 5, create_topics_body("a-smuggled"), alice_principal))
        assert await closed_within(node, 5)
    assert "a-smuggled" not in running.node.view.topics


async def test_malformed_envelopes_get_kafkas_errors(single):
    """Bad principal bytes, a bad address, an Envelope inside an Envelope, an API that is
    not forwarded, an inner request that does not decode: each answered with its error;
    the connection stays open."""
    running, where = single
    alice = serialize_principal("User", "alice")
    inner_envelope = envelope(ApiKey.CREATE_TOPICS, 5, create_topics_body("a-x"), alice)
    metadata = build(load_request_schema(ApiKey.METADATA, 12), topics=None,
                     allow_auto_topic_creation=False,
                     include_topic_authorized_operations=False)
    cases = [
        (envelope(ApiKey.CREATE_TOPICS, 5, create_topics_body("a-x"), b"\0\0garbage"),
         ErrorCode.principal_deserialization_failure),
        (envelope(ApiKey.CREATE_TOPICS, 5, create_topics_body("a-x"), None),
         ErrorCode.principal_deserialization_failure),
        (envelope(ApiKey.CREATE_TOPICS, 5, create_topics_body("a-x"), b"\0\x07" + alice[2:]),
         ErrorCode.principal_deserialization_failure),
        (envelope(ApiKey.CREATE_TOPICS, 5, create_topics_body("a-x"), alice, b"\1\2\3"),
         ErrorCode.invalid_request),
        (envelope(ApiKey.ENVELOPE, 0, inner_envelope, alice), ErrorCode.invalid_request),
        (envelope(ApiKey.METADATA, 12, metadata, alice), ErrorCode.invalid_request),
        (EnvelopeRequest(request_data=b"\0\x13\0\5\0\0\0\7\xff", request_principal=alice,
                         client_host_address=bytes(4)), ErrorCode.unsupported_version),
        (EnvelopeRequest(request_data=b"\0\x13", request_principal=alice,
                         client_host_address=bytes(4)), ErrorCode.unsupported_version),
    ]
    async with await KafkaClient.connect(where["INTERNAL"], security=login("broker")) as node:
        for request, error in cases:
            answer = await node.call(ApiKey.ENVELOPE, 0, request)
            assert (answer.error_code, answer.response_data) == (error, None), request
    assert "a-x" not in running.node.view.topics


async def test_the_old_forwarding_marker_gains_nothing(single):
    """A client sending client id `mink-forwarded` on the inter-broker listener itself is
    neither exempt from the authorizer nor from quotas."""
    from tests.test_quotas import alter

    running, where = single
    assert await trio.to_thread.run_sync(alter, where["PLAINTEXT"], [
        ([("client-id", None)], [("request_percentage", 0.01, False)])]) == [
            (ErrorCode.none, None)]
    async with await KafkaClient.connect(where["INTERNAL"], client_id="mink-forwarded",
                                         security=login("alice")) as alice:
        answer = await alice.call(ApiKey.CREATE_TOPICS, 5, create_topics_body("b-marked"))
        assert codes(answer) == {"b-marked": TOPIC_AUTH}
        schema = load_request_schema(ApiKey.API_VERSIONS, 3)
        body = build(schema, client_software_name="t", client_software_version="1")
        throttled = False
        with trio.fail_after(10):
            while not throttled:
                response = await alice.call(ApiKey.API_VERSIONS, 3, body)
                throttled = response.throttle_time.total_seconds() > 0
    assert "b-marked" not in running.node.view.topics
