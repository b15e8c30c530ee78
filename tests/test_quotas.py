"""Client quotas (KIP-13, KIP-55, KIP-124, KIP-219, KIP-546): the rules, the admin APIs
(DescribeClientQuotas, AlterClientQuotas, `mink quotas`), and enforcement against real
clients over real sockets.

No installed client has a client-quotas admin API (confluent-kafka 2.16.1's AdminClient,
kafka-python 3.0.12's KafkaAdminClient and aiokafka 0.14's AIOKafkaAdminClient have none),
so the APIs are driven with raw requests laid out with kio, as `mink quotas` sends them.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
import urllib.request

import pytest
import trio
from confluent_kafka import Consumer, Producer
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.broker.quotas.entities import (
    ABSENT,
    DEFAULT,
    InvalidQuota,
    check_value,
    levels,
    named,
    parse_entity,
    resolve,
)
from mink.broker.quotas.rate import Rate, throttle_time
from mink.client import BlockingKafkaClient, KafkaClient
from mink.cli.quotas import alter_body, describe_body
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build
from mink.storage.embedded_postgres import free_port

TIMEOUT = 15.0


# -- the rules (pure) --------------------------------------------------------------------------

def test_rate_is_kafkas_windowed_rate():
    rate = Rate(samples=11, window=1.0)
    rate.record(1000, 0.0)
    # under samples - 1 whole windows the rate is taken over 10 s: no burst past the quota
    assert rate.window_size(0.5) == pytest.approx(10.5)
    assert rate.measure(0.5) == pytest.approx(1000 / 10.5)
    for t in range(1, 20):
        rate.record(1000, float(t))
    # 11 windows of 1000 each at t=19.5, the oldest started at 9.0
    assert rate.window_size(19.5) == pytest.approx(10.5)
    assert rate.measure(19.5) == pytest.approx(11000 / 10.5)
    # nothing recorded for a whole 11 windows: everything expired
    assert rate.measure(40.0) == 0.0


def test_throttle_time_brings_the_rate_back_to_the_bound():
    rate = Rate(samples=11, window=1.0)
    rate.record(20_000, 0.0)  # 20 kB over a 10 s window: 2000 B/s against 1000
    throttle = throttle_time(rate, 1000.0, 0.0)
    assert throttle == pytest.approx((2000 - 1000) / 1000 * 10.0)
    # O * W / (W + X) = T
    assert 20_000 / (10.0 + throttle) == pytest.approx(1000.0)
    assert throttle_time(rate, 5000.0, 0.0) == 0.0


def test_precedence_is_kip_55s_eight_levels():
    """Each row of Kafka's table: the most specific level that sets the key wins, and the
    sensor it is measured in (defaults still measure each user or client id apart)."""
    everything = {
        (named("alice"), named("app")): 1, (named("alice"), DEFAULT): 2,
        (named("alice"), ABSENT): 3, (DEFAULT, named("app")): 4, (DEFAULT, DEFAULT): 5,
        (DEFAULT, ABSENT): 6, (ABSENT, named("app")): 7, (ABSENT, DEFAULT): 8,
    }
    expected_tags = [("alice", "app"), ("alice", "app"), ("alice", ""), ("alice", "app"),
                     ("alice", "app"), ("alice", ""), ("", "app"), ("", "app")]
    limits = dict(everything)
    for level, (entity, _) in enumerate(levels("alice", "app"), start=1):
        assert resolve(limits, "alice", "app") == (level, expected_tags[level - 1]), level
        del limits[entity]
    assert resolve(limits, "alice", "app") is None
    # another user and client id only get the defaults
    assert resolve(everything, "bob", "other") == (5, ("bob", "other"))
    assert resolve({(ABSENT, DEFAULT): 8.0}, "ANONYMOUS", "x") == (8.0, ("", "x"))


def test_validation_is_kafkas():
    assert parse_entity([("user", "alice"), ("client-id", None)]) == (named("alice"), DEFAULT)
    for components, message in [
        ([], "Invalid empty client quota entity"),
        ([("group", "g")], "Unhandled client quota entity type: group"),
        ([("user", "a"), ("user", "b")], "duplicate entity entry user"),
        ([("user", "")], "Empty user not supported"),
        ([("ip", "1.2.3.4"), ("user", "a")], "IP entity should not be combined"),
    ]:
        with pytest.raises(InvalidQuota, match=message) as caught:
            parse_entity(components)
        assert caught.value.code == ErrorCode.invalid_request
    check_value("producer_byte_rate", 1024.0)
    check_value("request_percentage", 0.5)
    for key, value, message in [
        ("bytes_per_second", 1.0, "Invalid configuration key bytes_per_second"),
        ("producer_byte_rate", -1.0, "must be greater than 0"),
        ("consumer_byte_rate", 0.0, "must be greater than 0"),
        ("producer_byte_rate", 10.5, "cannot be a fractional value"),
        ("request_percentage", math.nan, "must be a finite number"),
        ("request_percentage", math.inf, "must be a finite number"),
    ]:
        with pytest.raises(InvalidQuota, match=message):
            check_value(key, value)


# -- the admin APIs ----------------------------------------------------------------------------

def raw(address: str, api_key: int, make_body, version: int | None = None,
        client_id: str = "quota-tests"):
    with BlockingKafkaClient(address, TIMEOUT, client_id=client_id) as conn:
        if version is None:
            version = conn.version(api_key)
        return conn.call(api_key, version, make_body(load_request_schema(api_key, version)))


def alter(address: str, entries, validate_only: bool = False, version: int | None = None):
    response = raw(address, ApiKey.ALTER_CLIENT_QUOTAS,
                   lambda s: alter_body(s, entries, validate_only), version)
    return [(e.error_code, e.error_message) for e in response.entries]


def describe(address: str, components=(), strict: bool = False, version: int | None = None):
    response = raw(address, ApiKey.DESCRIBE_CLIENT_QUOTAS,
                   lambda s: describe_body(s, list(components), strict), version)
    assert response.error_code == ErrorCode.none, response
    return {tuple((e.entity_type, e.entity_name) for e in entry.entity):
            {v.key: v.value for v in entry.values} for entry in response.entries}


async def in_thread(fn, *args):
    return await trio.to_thread.run_sync(fn, *args)


async def test_alter_and_describe_client_quotas(node):
    ok = (ErrorCode.none, None)
    for version in (0, 1):
        assert await in_thread(alter, node, [
            ([("user", "alice")], [("producer_byte_rate", 1024, False)]),
            ([("user", "alice"), ("client-id", None)], [("consumer_byte_rate", 2048, False),
                                                      ("request_percentage", 12.5, False)]),
            ([("client-id", "app")], [("producer_byte_rate", 4096, False)]),
            ([("user", None)], [("request_percentage", 50, False)]),
        ], False, version) == [ok, ok, ok, ok]
    every = await in_thread(describe, node)
    assert every == {
        (("user", "alice"),): {"producer_byte_rate": 1024.0},
        (("user", "alice"), ("client-id", None)): {"consumer_byte_rate": 2048.0,
                                                  "request_percentage": 12.5},
        (("client-id", "app"),): {"producer_byte_rate": 4096.0},
        (("user", None),): {"request_percentage": 50.0},
    }
    # KIP-546 filters: exact, default, any specified; strict leaves other parts out
    assert set(await in_thread(describe, node, [("user", 0, "alice")])) == {
        (("user", "alice"),), (("user", "alice"), ("client-id", None))}
    assert set(await in_thread(describe, node, [("user", 0, "alice")], True)) == {
        (("user", "alice"),)}
    assert set(await in_thread(describe, node, [("user", 1, None)])) == {(("user", None),)}
    assert set(await in_thread(describe, node, [("client-id", 2, None)])) == {
        (("user", "alice"), ("client-id", None)), (("client-id", "app"),)}
    for version in (0, 1):
        assert set(await in_thread(describe, node, [("client-id", 0, "app")], True,
                                   version)) == {(("client-id", "app"),)}
    # remove: a key, then the entity's last key (the entity goes)
    assert await in_thread(alter, node, [
        ([("user", "alice"), ("client-id", None)], [("request_percentage", 0, True)]),
        ([("client-id", "app")], [("producer_byte_rate", 0, True)]),
    ]) == [ok, ok]
    every = await in_thread(describe, node)
    assert every[(("user", "alice"), ("client-id", None))] == {"consumer_byte_rate": 2048.0}
    assert (("client-id", "app"),) not in every
    # validate_only stores nothing
    assert await in_thread(alter, node, [([("client-id", "new")],
                                          [("producer_byte_rate", 1, False)])], True) == [ok]
    assert (("client-id", "new"),) not in await in_thread(describe, node)
    # a bad filter
    response = await in_thread(raw, node, ApiKey.DESCRIBE_CLIENT_QUOTAS,
                               lambda s: describe_body(s, [("group", 0, "g")]))
    assert response.error_code == ErrorCode.invalid_request
    response = await in_thread(raw, node, ApiKey.DESCRIBE_CLIENT_QUOTAS,
                               lambda s: describe_body(s, [("user", 0, None)]))
    assert response.error_code == ErrorCode.invalid_request


async def test_alter_client_quotas_refuses_bad_input(node):
    """Kafka's error codes and messages, per entry; a bad entry stores nothing of its own
    and does not stop the good ones."""
    bad = [
        ([("user", "a")], [("no_such_quota", 1, False)]),          # unknown key
        ([("user", "a")], [("producer_byte_rate", -5, False)]),    # negative
        ([("user", "a")], [("consumer_byte_rate", 0, False)]),     # zero
        ([("user", "a")], [("producer_byte_rate", 1.5, False)]),   # fractional byte rate
        ([("user", "a")], [("request_percentage", math.nan, False)]),  # not a number
        ([("group", "g")], [("producer_byte_rate", 1, False)]),    # unknown entity type
        ([], [("producer_byte_rate", 1, False)]),                  # empty entity
        ([("user", "a"), ("user", "b")], [("producer_byte_rate", 1, False)]),
        ([("user", "")], [("producer_byte_rate", 1, False)]),      # empty name
        ([("user", "a")], [("producer_byte_rate", 1, False), ("producer_byte_rate", 2, False)]),
        ([("ip", "127.0.0.1")], [("connection_creation_rate", 1, False)]),  # not built
    ]
    good = ([("client-id", "fine")], [("producer_byte_rate", 100, False)])
    for validate_only in (True, False):
        results = await in_thread(alter, node, [*bad, good], validate_only)
        codes = [code for code, _ in results]
        assert codes[:-2] == [ErrorCode.invalid_request] * (len(bad) - 1), results
        assert codes[-2] == ErrorCode.unsupported_version, results
        assert results[-1] == (ErrorCode.none, None)
        messages = [message for _, message in results]
        assert messages[0] == "Invalid configuration key no_such_quota"
        assert "greater than 0" in messages[1] and "greater than 0" in messages[2]
        assert "cannot be a fractional value" in messages[3]
        assert "Unhandled client quota entity type: group" == messages[5]
        stored = await in_thread(describe, node)
        assert (("user", "a"),) not in stored and (("user", None),) not in stored
        assert ((("client-id", "fine"),) in stored) == (not validate_only)


async def mink_quotas(*args: str) -> tuple[int, str, str]:
    result = await trio.run_process(
        [sys.executable, "-m", "mink.cli", "quotas", *args], check=False,
        capture_stdout=True, capture_stderr=True)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_mink_quotas_cli(node):
    server = ("--bootstrap-server", node)
    code, out, err = await mink_quotas("describe", *server)
    assert (code, out.strip()) == (0, "No quotas."), err
    code, out, err = await mink_quotas(
        "alter", "--user", "alice", "--client-id-default",
        "--add-config", "producer_byte_rate=1048576,request_percentage=25", *server)
    assert code == 0 and "Altered quotas of user=alice client-id=<default>" in out, err
    code, out, err = await mink_quotas("describe", "--user", "alice", *server)
    assert code == 0, err
    assert "user=alice client-id=<default>: producer_byte_rate=1048576, " \
           "request_percentage=25" in out
    code, out, err = await mink_quotas("alter", "--user", "alice", "--client-id-default",
                                       "--delete-config", "request_percentage", *server)
    assert code == 0, err
    code, out, err = await mink_quotas("alter", "--client-id", "x",
                                       "--add-config", "producer_byte_rate=fast", *server)
    assert code == 1 and "must be a number" in err
    code, out, err = await mink_quotas("alter", "--client-id", "x",
                                       "--add-config", "producer_byte_rate=-1", *server)
    assert code == 1 and "INVALID_REQUEST" in err and "greater than 0" in err
    code, out, err = await mink_quotas("describe", *server)
    assert out.strip() == "user=alice client-id=<default>: producer_byte_rate=1048576"
