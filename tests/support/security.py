"""A node with every kind of listener, SCRAM users made with confluent-kafka's AdminClient,
and a raw SASL client for the tests that check the protocol itself."""

from __future__ import annotations

import ssl
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from kio.index import load_request_schema

from mink.client import KafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build

LISTENERS = ("PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0,"
             "SASL_PLAINTEXT://127.0.0.1:0")


def endpoints(minknode) -> dict[str, str]:
    """listener name -> host:port of a running harness node."""
    return {name: f"{host}:{port}" for name, _, host, port in minknode.node.endpoints}


def security_settings(certs, **extra) -> dict:
    return dict(listeners=LISTENERS, ssl_cert_file=str(certs.server_cert),
                ssl_key_file=str(certs.server_key), ssl_ca_file=str(certs.ca),
                ssl_client_auth="requested", connection_failed_authentication_delay_ms=50,
                **extra)


def create_users(bootstrap: str, users: dict[str, str], mechanism: str = "SCRAM-SHA-512",
                 iterations: int = 4096) -> None:
    """Blocking: SCRAM users through confluent-kafka's AdminClient.alter_user_scram_credentials."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    kind = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
            "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}[mechanism]
    futures = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion(user, ScramCredentialInfo(kind, iterations),
                                     password.encode())
        for user, password in users.items()])
    for future in futures.values():
        future.result(timeout=30)


def client_tls_context(ca: Path, cert: Path | None = None, key: Path | None = None):
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


@asynccontextmanager
async def raw_client(address: str, context: ssl.SSLContext | None = None):
    host, port = address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    if context is not None:
        stream = trio.SSLStream(stream, context, server_hostname=host)
        await stream.do_handshake()
    client = KafkaClient(stream, address, "raw-test")
    try:
        yield client
    finally:
        await trio.aclose_forcefully(stream)


async def sasl_plain(client: KafkaClient, user: str, password: str, version: int = 2):
    """SaslHandshake v1 + one SaslAuthenticate with PLAIN: the SaslAuthenticate response."""
    handshake = await client.call(ApiKey.SASL_HANDSHAKE, 1, build(
        load_request_schema(ApiKey.SASL_HANDSHAKE, 1), mechanism="PLAIN"))
    assert handshake.error_code == 0, handshake
    return await client.call(ApiKey.SASL_AUTHENTICATE, version, build(
        load_request_schema(ApiKey.SASL_AUTHENTICATE, version),
        auth_bytes=b"\0" + user.encode() + b"\0" + password.encode()))


async def metadata(client: KafkaClient, version: int = 12):
    return await client.call(ApiKey.METADATA, version, build(
        load_request_schema(ApiKey.METADATA, version), topics=None,
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))


async def closed_within(client: KafkaClient, seconds: float) -> bool:
    """Whether the broker closes the connection within `seconds` (nothing else arrives)."""
    with trio.move_on_after(seconds):
        try:
            data = await client.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return True
        return data == b""
    return False
