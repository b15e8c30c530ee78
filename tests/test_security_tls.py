"""SSL listeners with client certificates (mTLS): the real clients produce and consume with a
certificate signed by the node's CA; without one, or with one the CA did not sign, they are
refused; the principal is the certificate's subject DN mapped by
ssl_principal_mapping_rules."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest
import trio
from cryptography.x509.oid import NameOID
from kio.index import load_request_schema

from mink.protocol.apis import ApiKey
from mink.protocol.messages import build
from tests.support.nodes import require_tool
from tests.support.security import client_tls_context, endpoints, metadata, raw_client
from tests.support.tls import make_certs

ALICE = [(NameOID.COUNTRY_NAME, "NL"), (NameOID.ORGANIZATION_NAME, "Mink"),
         (NameOID.ORGANIZATIONAL_UNIT_NAME, "clients"), (NameOID.COMMON_NAME, "alice")]


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path / "certs")


@pytest.fixture
async def mtls(mink_postgres, store_url, certs):
    """A node whose SSL listener requires a client certificate; principals are the CN."""
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         listeners="PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                         ssl_cert_file=str(certs.server_cert),
                         ssl_key_file=str(certs.server_key), ssl_ca_file=str(certs.ca),
                         ssl_client_auth="required",
                         ssl_principal_mapping_rules="RULE:^CN=([^,]+),OU=clients,.*$/$1/L,"
                                                     "DEFAULT") as running:
        yield endpoints(running)["SSL"]


def _confluent(bootstrap, certs, cert, key) -> dict:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SSL",
            "ssl.ca.location": str(certs.ca), "ssl.certificate.location": str(cert),
            "ssl.key.location": str(key)}


def confluent_roundtrip(conf: dict, topic: str, count: int = 10) -> list[bytes]:
    from confluent_kafka import Consumer, Producer

    producer = Producer({**conf, "acks": "all"})
    errors = []
    for i in range(count):
        producer.produce(topic, b"m%d" % i, on_delivery=lambda e, m: e and errors.append(e))
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


async def test_confluent_mtls_and_the_principal_from_the_dn(mtls, certs, caplog):
    caplog.set_level(logging.DEBUG, logger="mink.broker.server.listener")
    cert, key = certs.client("alice", ALICE)
    got = await trio.to_thread.run_sync(
        confluent_roundtrip, _confluent(mtls, certs, cert, key), "ck-mtls")
    assert sorted(got) == sorted(b"m%d" % i for i in range(10))
    assert "is User:alice by its certificate" in caplog.text
    # DEFAULT: a DN the rule does not match is the principal as it is
    other, other_key = certs.client("svc", [(NameOID.ORGANIZATION_NAME, "Mink"),
                                            (NameOID.COMMON_NAME, "svc, the second")])
    async with raw_client(mtls, client_tls_context(certs.ca, other, other_key)) as client:
        assert len((await metadata(client)).brokers) == 1
    assert r"is User:CN=svc\, the second,O=Mink by its certificate" in caplog.text


async def test_kafka_python_mtls(mtls, certs):
    from kafka import KafkaConsumer, KafkaProducer

    cert, key = certs.client("alice", ALICE)
    conf = dict(bootstrap_servers=mtls, security_protocol="SSL", ssl_cafile=str(certs.ca),
                ssl_certfile=str(cert), ssl_keyfile=str(key))

    def run():
        producer = KafkaProducer(acks="all", **conf)
        for i in range(5):
            producer.send("kp-mtls", b"kp%d" % i).get(timeout=30)
        producer.close()
        consumer = KafkaConsumer("kp-mtls", auto_offset_reset="earliest",
                                 consumer_timeout_ms=15000, **conf)
        got = [m.value for _, m in zip(range(5), consumer)]
        consumer.close()
        return got

    assert sorted(await trio.to_thread.run_sync(run)) == [b"kp%d" % i for i in range(5)]


async def test_aiokafka_mtls(mtls, certs):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    cert, key = certs.client("alice", ALICE)

    async def run():
        context = create_ssl_context(cafile=str(certs.ca), certfile=str(cert),
                                     keyfile=str(key))
        conf = dict(bootstrap_servers=mtls, security_protocol="SSL", ssl_context=context)
        producer = AIOKafkaProducer(acks="all", **conf)
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait("aio-mtls", b"a%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("aio-mtls", auto_offset_reset="earliest", **conf)
        await consumer.start()
        got = []
        try:
            async with asyncio.timeout(30):
                async for msg in consumer:
                    got.append(msg.value)
                    if len(got) == 5:
                        break
        finally:
            await consumer.stop()
        return got

    got = await trio.to_thread.run_sync(lambda: asyncio.run(run()))
    assert sorted(got) == [b"a%d" % i for i in range(5)]


async def test_kcat_mtls(mtls, certs):
    kcat = require_tool("kcat")
    cert, key = certs.client("alice", ALICE)
    opts = ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={certs.ca}",
            "-X", f"ssl.certificate.location={cert}", "-X", f"ssl.key.location={key}",
            "-b", mtls]
    with trio.fail_after(60):
        await trio.run_process([kcat, *opts, "-P", "-t", "kcat-mtls"], stdin=b"x\ny\n")
        done = await trio.run_process([kcat, *opts, "-C", "-t", "kcat-mtls", "-o",
                                       "beginning", "-c", "2", "-q"], capture_stdout=True)
    assert done.stdout.split() == [b"x", b"y"]


async def test_kafkajs_mtls(mtls, certs, kafkajs_modules):
    cert, key = certs.client("alice", ALICE)
    script = Path(__file__).parent / "node" / "kafkajs_secure.js"

    def run():
        env = dict(os.environ, NODE_PATH=str(kafkajs_modules / "node_modules"))
        spec = {"broker": mtls, "topic": "kjs-mtls", "ca": str(certs.ca), "cert": str(cert),
                "key": str(key)}
        done = subprocess.run(["node", str(script), json.dumps(spec)], capture_output=True,
                              text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])["consumed"]

    assert sorted(await trio.to_thread.run_sync(run)) == sorted(f"kjs-{i}" for i in range(10))


async def test_without_a_trusted_certificate_the_handshake_is_refused(mtls, certs, caplog):
    caplog.set_level(logging.INFO, logger="mink.broker.server.listener")
    stranger, stranger_key = certs.client("stranger", ALICE, signed_by_ca=False)
    for context in (client_tls_context(certs.ca),  # no certificate at all
                    client_tls_context(certs.ca, stranger, stranger_key)):
        with trio.fail_after(15):
            with pytest.raises((trio.BrokenResourceError, EOFError)):
                async with raw_client(mtls, context) as client:
                    # TLS 1.3: the server's refusal arrives with the first read
                    await client.call(ApiKey.API_VERSIONS, 0, build(
                        load_request_schema(ApiKey.API_VERSIONS, 0)))
    assert caplog.text.count("failed authentication with") >= 2
    # and the node serves a trusted client afterwards
    cert, key = certs.client("alice", ALICE)
    async with raw_client(mtls, client_tls_context(certs.ca, cert, key)) as client:
        assert len((await metadata(client)).brokers) == 1
