"""KIP-368: with connections_max_reauth_ms a SASL session lasts that long; a connection that
does not re-authenticate in time is closed at its next request, one that does goes on, and a
re-authentication may not change the principal. librdkafka re-authenticates by itself."""

from __future__ import annotations

import logging
import time

import pytest
import trio
from kio.schema.errors import ErrorCode

from tests.support.security import (
    closed_within,
    create_users,
    endpoints,
    metadata,
    raw_client,
    sasl_plain,
)

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
REAUTH_MS = 2500


@pytest.fixture
async def reauth(mink_postgres, store_url):
    from mink.testing import open_node

    async with open_node(mink_postgres, store_url=store_url, proxy=False,
                         listeners="PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                         connections_max_reauth_ms=REAUTH_MS) as running:
        where = endpoints(running)
        await trio.to_thread.run_sync(create_users, where["PLAINTEXT"], USERS)
        yield where


async def test_a_connection_that_does_not_reauthenticate_is_closed(reauth):
    async with raw_client(reauth["SASL_PLAINTEXT"]) as client:
        response = await sasl_plain(client, "alice", USERS["alice"])
        authenticated = trio.current_time()
        assert response.error_code == ErrorCode.none
        assert response.session_lifetime.total_seconds() * 1000 == REAUTH_MS
        assert len((await metadata(client)).brokers) == 1  # within the session
        await trio.sleep_until(authenticated + REAUTH_MS / 1000 + 0.2)
        with pytest.raises((EOFError, trio.BrokenResourceError)):
            await metadata(client)


async def test_reauthentication_renews_the_session_and_keeps_the_principal(reauth):
    async with raw_client(reauth["SASL_PLAINTEXT"]) as client:
        assert (await sasl_plain(client, "alice", USERS["alice"])).error_code == 0
        first = trio.current_time()
        await trio.sleep_until(first + REAUTH_MS / 1000 * 0.6)
        again = await sasl_plain(client, "alice", USERS["alice"])
        assert again.error_code == 0 and again.session_lifetime.total_seconds() > 0
        await trio.sleep_until(first + REAUTH_MS / 1000 + 0.2)  # the first session is over
        assert len((await metadata(client)).brokers) == 1
    async with raw_client(reauth["SASL_PLAINTEXT"]) as client:
        assert (await sasl_plain(client, "alice", USERS["alice"])).error_code == 0
        other = await sasl_plain(client, "bob", USERS["bob"])
        assert other.error_code == ErrorCode.sasl_authentication_failed
        assert "Cannot change principals" in other.error_message
        assert await closed_within(client, 5)


async def test_librdkafka_reauthenticates_and_keeps_producing(reauth, caplog):
    from confluent_kafka import Producer

    caplog.set_level(logging.DEBUG, logger="mink.broker.security.sasl")
    conf = {"bootstrap.servers": reauth["SASL_PLAINTEXT"],
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice", "sasl.password": USERS["alice"], "acks": "all"}

    def produce_for(seconds: float) -> tuple[int, list]:
        producer = Producer(conf)
        errors, delivered = [], []
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            producer.produce("reauth", b"%d" % i, on_delivery=lambda e, m: (
                errors.append(e) if e else delivered.append(m.offset())))
            i += 1
            producer.poll(0.05)
        producer.flush(30)
        return len(delivered), errors

    delivered, errors = await trio.to_thread.run_sync(produce_for, 2 * REAUTH_MS / 1000)
    assert not errors and delivered > 10
    assert "re-authenticated as User:alice" in caplog.text
