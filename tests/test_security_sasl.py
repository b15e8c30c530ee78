"""SASL (PLAIN, SCRAM-SHA-256/512) over SASL_SSL and SASL_PLAINTEXT listeners with the real
clients; SCRAM users made with confluent-kafka's AdminClient; refusals (wrong password,
unknown user, requests before authentication, a plaintext client on a TLS port); KIP-368
session expiry."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.protocol.apis import ApiKey
from mink.protocol.messages import build
from tests.support.kafka_python import wait_for_partitions
from tests.support.nodes import require_tool
from tests.support.security import (
    client_tls_context,
    closed_within,
    create_users,
    endpoints,
    metadata,
    raw_client,
    sasl_plain,
    security_settings,
)
from tests.support.tls import make_certs

USERS = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path / "certs")


@pytest.fixture
async def secure(mink_postgres, store_url, certs):
    """A node with PLAINTEXT, SSL, SASL_SSL and SASL_PLAINTEXT listeners and two SCRAM-SHA-512
    users made over PLAINTEXT with confluent-kafka's AdminClient; yields listener -> address."""
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         **security_settings(certs)) as running:
        where = endpoints(running)
        await trio.to_thread.run_sync(create_users, where["PLAINTEXT"], USERS)
        yield where


def _confluent_conf(bootstrap, certs, user="alice", password=USERS["alice"],
                    mechanism="SCRAM-SHA-512"):
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
            "ssl.ca.location": str(certs.ca)}


def confluent_roundtrip(conf: dict, topic: str, count: int = 20) -> list[bytes]:
    from confluent_kafka import Consumer, Producer

    producer = Producer({**conf, "acks": "all", "enable.idempotence": True})
    errors = []
    for i in range(count):
        producer.produce(topic, b"v%d" % i, on_delivery=lambda e, m: e and errors.append(e))
    assert producer.flush(30) == 0 and not errors, errors
    consumer = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.value())
    consumer.close()
    return got


async def test_scram_users_made_and_described_with_confluent_admin(secure):
    from confluent_kafka.admin import AdminClient, ScramMechanism

    def describe():
        admin = AdminClient({"bootstrap.servers": secure["PLAINTEXT"]})
        result = admin.describe_user_scram_credentials(["alice", "bob"])
        return {user: future.result(timeout=30) for user, future in result.items()}

    described = await trio.to_thread.run_sync(describe)
    for user in USERS:
        infos = described[user].scram_credential_infos
        assert [(i.mechanism, i.iterations) for i in infos] == [
            (ScramMechanism.SCRAM_SHA_512, 4096)]


async def test_confluent_sasl_ssl_scram_sha_512(secure, certs):
    got = await trio.to_thread.run_sync(
        confluent_roundtrip, _confluent_conf(secure["SASL_SSL"], certs), "ck-scram")
    assert sorted(got) == sorted(b"v%d" % i for i in range(20))


async def test_confluent_sasl_ssl_scram_sha_256_and_plain(secure, certs):
    await trio.to_thread.run_sync(lambda: create_users(
        secure["PLAINTEXT"], {"carol": "carol-secret"}, "SCRAM-SHA-256", 8192))
    got = await trio.to_thread.run_sync(confluent_roundtrip, _confluent_conf(
        secure["SASL_SSL"], certs, "carol", "carol-secret", "SCRAM-SHA-256"), "ck-256")
    assert len(got) == 20
    # PLAIN is checked against the same salted credential (never a stored password)
    got = await trio.to_thread.run_sync(confluent_roundtrip, _confluent_conf(
        secure["SASL_SSL"], certs, "bob", USERS["bob"], "PLAIN"), "ck-plain")
    assert len(got) == 20


async def test_kafka_python_sasl_ssl_scram_sha_512(secure, certs):
    from kafka import KafkaConsumer, KafkaProducer

    conf = dict(bootstrap_servers=secure["SASL_SSL"], security_protocol="SASL_SSL",
                sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
                sasl_plain_password=USERS["alice"], ssl_cafile=str(certs.ca))

    def run():
        producer = KafkaProducer(acks="all", **conf)
        for i in range(10):
            producer.send("kp-scram", b"kp%d" % i).get(timeout=30)
        producer.close()
        consumer = KafkaConsumer("kp-scram", auto_offset_reset="earliest",
                                 consumer_timeout_ms=15000, group_id="kp", **conf)
        wait_for_partitions(consumer, "kp-scram")
        got = []
        for msg in consumer:
            got.append(msg.value)
            if len(got) == 10:
                break
        consumer.close()
        return got

    got = await trio.to_thread.run_sync(run)
    assert sorted(got) == sorted(b"kp%d" % i for i in range(10))


async def test_aiokafka_sasl_ssl_scram_sha_512(secure, certs):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    async def run():
        conf = dict(bootstrap_servers=secure["SASL_SSL"], security_protocol="SASL_SSL",
                    sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="bob",
                    sasl_plain_password=USERS["bob"],
                    ssl_context=create_ssl_context(cafile=str(certs.ca)))
        producer = AIOKafkaProducer(acks="all", **conf)
        await producer.start()
        try:
            for i in range(10):
                await producer.send_and_wait("aio-scram", b"aio%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("aio-scram", auto_offset_reset="earliest",
                                    group_id="aio", **conf)
        await consumer.start()
        got = []
        try:
            async with asyncio.timeout(30):
                async for msg in consumer:
                    got.append(msg.value)
                    if len(got) == 10:
                        break
        finally:
            await consumer.stop()
        return got

    got = await trio.to_thread.run_sync(lambda: asyncio.run(run()))
    assert sorted(got) == sorted(b"aio%d" % i for i in range(10))


async def test_kcat_sasl_ssl_scram_sha_512(secure, certs):
    kcat = require_tool("kcat")
    opts = ["-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=SCRAM-SHA-512",
            "-X", "sasl.username=alice", "-X", f"sasl.password={USERS['alice']}",
            "-X", f"ssl.ca.location={certs.ca}", "-b", secure["SASL_SSL"]]
    with trio.fail_after(60):
        await trio.run_process([kcat, *opts, "-P", "-t", "kcat-scram"],
                               stdin=b"one\ntwo\nthree\n")
        done = await trio.run_process([kcat, *opts, "-C", "-t", "kcat-scram", "-o",
                                       "beginning", "-c", "3", "-q"], capture_stdout=True)
    assert done.stdout.split() == [b"one", b"two", b"three"]


async def test_kafkajs_sasl_ssl_scram_sha_512(secure, certs, kafkajs_modules):
    script = Path(__file__).parent / "node" / "kafkajs_secure.js"

    def run():
        env = dict(os.environ, NODE_PATH=str(kafkajs_modules / "node_modules"))
        spec = {"broker": secure["SASL_SSL"], "topic": "kjs-scram", "ca": str(certs.ca),
                "sasl": {"mechanism": "scram-sha-512", "username": "bob",
                         "password": USERS["bob"]}}
        done = subprocess.run(["node", str(script), json.dumps(spec)], capture_output=True,
                              text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])["consumed"]

    consumed = await trio.to_thread.run_sync(run)
    assert sorted(consumed) == sorted(f"kjs-{i}" for i in range(10))


def _auth_error(conf: dict, seconds: float = 20.0) -> str | None:
    """The first authentication error librdkafka reports for `conf`, or None."""
    from confluent_kafka import KafkaError, Producer

    seen: list[str] = []

    def on_error(err):
        if err.code() == KafkaError._AUTHENTICATION:
            seen.append(err.str())

    producer = Producer({**conf, "error_cb": on_error})
    deadline = time.monotonic() + seconds
    while not seen and time.monotonic() < deadline:
        producer.poll(0.2)
    return seen[0] if seen else None


async def test_wrong_password_and_unknown_user_are_refused(secure, certs):
    wrong = await trio.to_thread.run_sync(
        _auth_error, _confluent_conf(secure["SASL_SSL"], certs, "alice", "not-it"))
    assert wrong is not None and "invalid credentials" in wrong, wrong
    unknown = await trio.to_thread.run_sync(
        _auth_error, _confluent_conf(secure["SASL_SSL"], certs, "mallory", "x"))
    assert unknown is not None and "invalid credentials" in unknown, unknown
    plain = await trio.to_thread.run_sync(_auth_error, _confluent_conf(
        secure["SASL_SSL"], certs, "alice", "not-it", "PLAIN"))
    assert plain is not None and "Invalid username or password" in plain, plain
    # and the node still serves
    got = await trio.to_thread.run_sync(
        confluent_roundtrip, _confluent_conf(secure["SASL_SSL"], certs), "after-refusals", 3)
    assert len(got) == 3


async def test_failed_authentication_answer_is_delayed_and_closes(secure):
    async with raw_client(secure["SASL_PLAINTEXT"]) as client:
        started = trio.current_time()
        response = await sasl_plain(client, "alice", "wrong")
        assert response.error_code == ErrorCode.sasl_authentication_failed
        assert trio.current_time() - started >= 0.05  # connection_failed_authentication_delay_ms
        assert await closed_within(client, 5)
    async with raw_client(secure["SASL_PLAINTEXT"]) as client:
        response = await sasl_plain(client, "alice", USERS["alice"])
        assert response.error_code == ErrorCode.none
        assert response.session_lifetime.total_seconds() == 0  # no reauth configured
        assert len((await metadata(client)).brokers) == 1


async def test_requests_before_authentication_close_the_connection(secure):
    async with raw_client(secure["SASL_PLAINTEXT"]) as client:
        versions = await client.call(ApiKey.API_VERSIONS, 0, build(
            load_request_schema(ApiKey.API_VERSIONS, 0)))
        assert versions.error_code == ErrorCode.none
        await client.send(ApiKey.METADATA, 12, build(
            load_request_schema(ApiKey.METADATA, 12), topics=None,
            allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        assert await closed_within(client, 5)
    async with raw_client(secure["SASL_PLAINTEXT"]) as client:
        response = await client.call(ApiKey.SASL_HANDSHAKE, 1, build(
            load_request_schema(ApiKey.SASL_HANDSHAKE, 1), mechanism="GSSAPI"))
        assert response.error_code == ErrorCode.unsupported_sasl_mechanism
        assert set(response.mechanisms) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
        assert await closed_within(client, 5)
    # v0 (raw tokens after it) is advertised for old librdkafka but refused
    async with raw_client(secure["SASL_PLAINTEXT"]) as client:
        response = await client.call(ApiKey.SASL_HANDSHAKE, 0, build(
            load_request_schema(ApiKey.SASL_HANDSHAKE, 0), mechanism="PLAIN"))
        assert response.error_code == ErrorCode.unsupported_version
        assert await closed_within(client, 5)
    # SaslHandshake on a listener without SASL: ILLEGAL_SASL_STATE, as Kafka
    async with raw_client(secure["PLAINTEXT"]) as client:
        response = await client.call(ApiKey.SASL_HANDSHAKE, 1, build(
            load_request_schema(ApiKey.SASL_HANDSHAKE, 1), mechanism="PLAIN"))
        assert response.error_code == ErrorCode.illegal_sasl_state


async def test_plaintext_client_on_tls_port_is_refused(secure, certs):
    for name in ("SASL_SSL", "SSL"):
        async with raw_client(secure[name]) as client:
            await client.send(ApiKey.API_VERSIONS, 0, build(
                load_request_schema(ApiKey.API_VERSIONS, 0)))
            assert await closed_within(client, 15)
    from confluent_kafka import Producer

    def plaintext_producer():
        producer = Producer({"bootstrap.servers": secure["SASL_SSL"],
                             "message.timeout.ms": 3000})
        outcome = []
        producer.produce("never", b"x", on_delivery=lambda err, msg: outcome.append(err))
        producer.flush(10)
        return outcome

    outcome = await trio.to_thread.run_sync(plaintext_producer)
    assert len(outcome) == 1 and outcome[0] is not None  # not delivered
    got = await trio.to_thread.run_sync(
        confluent_roundtrip, _confluent_conf(secure["SASL_SSL"], certs), "after-plain", 3)
    assert len(got) == 3


async def test_metadata_answers_the_endpoints_of_the_listener_asked(secure, certs):
    from confluent_kafka.admin import AdminClient

    def brokers(conf):
        meta = AdminClient(conf).list_topics(timeout=20)
        return {b.id: f"{b.host}:{b.port}" for b in meta.brokers.values()}

    assert await trio.to_thread.run_sync(
        brokers, {"bootstrap.servers": secure["PLAINTEXT"]}) == {1: secure["PLAINTEXT"]}
    assert await trio.to_thread.run_sync(
        brokers, _confluent_conf(secure["SASL_SSL"], certs)) == {1: secure["SASL_SSL"]}
    async with raw_client(secure["SASL_PLAINTEXT"]) as client:
        assert (await sasl_plain(client, "alice", USERS["alice"])).error_code == 0
        meta = await metadata(client)
        assert [(b.host, b.port) for b in meta.brokers] == [
            tuple(secure["SASL_PLAINTEXT"].rsplit(":", 1)[0:1]) + (
                int(secure["SASL_PLAINTEXT"].rsplit(":", 1)[1]),)]
        found = await client.call(ApiKey.FIND_COORDINATOR, 3, build(
            load_request_schema(ApiKey.FIND_COORDINATOR, 3), key="g", key_type=0))
        if found.error_code == 0:
            assert f"{found.host}:{found.port}" == secure["SASL_PLAINTEXT"]
        cluster = await client.call(ApiKey.DESCRIBE_CLUSTER, 0, build(
            load_request_schema(ApiKey.DESCRIBE_CLUSTER, 0),
            include_cluster_authorized_operations=False))
        assert [f"{b.host}:{b.port}" for b in cluster.brokers] == [secure["SASL_PLAINTEXT"]]


@pytest.mark.parametrize("mechanism, tokens", [
    ("SCRAM-SHA-512", [b"\xff\xfe"]),
    ("SCRAM-SHA-512", [b"garbage"]),
    ("SCRAM-SHA-512", [b"p=tls-unique,,n=alice,r=abc"]),
    ("SCRAM-SHA-512", [b"n,,n=alice,r=abc", b"c=biws,r=abc,p=!!notbase64"]),
    ("SCRAM-SHA-512", [b"n,,n=alice,r=abc", b"no proof here"]),
    ("SCRAM-SHA-256", [b"n,,n=alice,r=abc"]),  # alice has no SCRAM-SHA-256 credential
    ("PLAIN", [b"only\0two"]),
    ("PLAIN", [b"other\0alice\0alice-secret"]),  # authzid differs
])
async def test_malformed_sasl_exchanges_fail_cleanly(secure, mechanism, tokens):
    async with raw_client(secure["SASL_PLAINTEXT"]) as client:
        handshake = await client.call(ApiKey.SASL_HANDSHAKE, 1, build(
            load_request_schema(ApiKey.SASL_HANDSHAKE, 1), mechanism=mechanism))
        assert handshake.error_code == ErrorCode.none
        response = None
        for token in tokens:
            response = await client.call(ApiKey.SASL_AUTHENTICATE, 2, build(
                load_request_schema(ApiKey.SASL_AUTHENTICATE, 2), auth_bytes=token))
            if response.error_code:
                break
        assert response.error_code == ErrorCode.sasl_authentication_failed
        assert await closed_within(client, 5)
    async with raw_client(secure["SASL_PLAINTEXT"]) as client:  # the node still serves
        assert (await sasl_plain(client, "alice", USERS["alice"])).error_code == 0


async def test_sasl_authenticate_without_handshake_closes(secure):
    async with raw_client(secure["SASL_PLAINTEXT"]) as client:
        await client.send(ApiKey.SASL_AUTHENTICATE, 2, build(
            load_request_schema(ApiKey.SASL_AUTHENTICATE, 2), auth_bytes=b"\0a\0b"))
        assert await closed_within(client, 5)


async def test_authentications_are_counted_per_listener(mink_postgres, store_url):
    from mink.storage.embedded_postgres import free_port
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         listeners="PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                         admin_listener=f"127.0.0.1:{free_port()}",
                         connection_failed_authentication_delay_ms=0) as running:
        where = endpoints(running)
        await trio.to_thread.run_sync(create_users, where["PLAINTEXT"], USERS)
        for password in (USERS["alice"], "wrong", USERS["alice"]):
            async with raw_client(where["SASL_PLAINTEXT"]) as client:
                await sasl_plain(client, "alice", password)
        registry = running.node.metrics.registry

        def count(result: str) -> float | None:
            return registry.get_sample_value("mink_authentications_total", {
                "listener": "SASL_PLAINTEXT", "mechanism": "PLAIN", "result": result})

        assert (count("success"), count("failure")) == (2.0, 1.0)


async def test_a_changed_password_applies_to_the_next_login(secure):
    await trio.to_thread.run_sync(create_users, secure["PLAINTEXT"], {"alice": "new-secret"})
    async with raw_client(secure["SASL_PLAINTEXT"]) as client:
        assert (await sasl_plain(client, "alice", USERS["alice"])).error_code == (
            ErrorCode.sasl_authentication_failed)
    async with raw_client(secure["SASL_PLAINTEXT"]) as client:
        assert (await sasl_plain(client, "alice", "new-secret")).error_code == ErrorCode.none


async def test_minks_own_client_speaks_sasl_ssl(secure, certs):
    from mink.client import ClientSecurity, KafkaClient, KafkaClientError

    security = ClientSecurity("SASL_SSL", "SCRAM-SHA-256", "carol", "carol-secret",
                              ca_file=str(certs.ca))
    await trio.to_thread.run_sync(lambda: create_users(
        secure["PLAINTEXT"], {"carol": "carol-secret"}, "SCRAM-SHA-256"))
    async with await KafkaClient.connect(secure["SASL_SSL"], security=security) as client:
        assert len((await metadata(client)).brokers) == 1
    with pytest.raises(KafkaClientError, match="SASL_AUTHENTICATION_FAILED"):
        await KafkaClient.connect(secure["SASL_SSL"], security=ClientSecurity(
            "SASL_SSL", "SCRAM-SHA-256", "carol", "wrong", ca_file=str(certs.ca)))
