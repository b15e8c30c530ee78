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


# -- enforcement -------------------------------------------------------------------------------

ADMIN_PORT = free_port()
# Kafka's rate allows up to quota x window size (10-11 s) in a burst once the oldest window
# expires, so a client with a backlog sends in bursts 11 s apart (quota.window.num x
# quota.window.size.seconds): a 30 s span holding three bursts reads ~10% over the quota with
# Kafka's own algorithm. The rate is therefore taken over 33 s, three whole quota windows; the
# 30 s figure is printed beside it.
MEASURE_S = 33.0


@pytest.fixture
def node_settings() -> dict:
    return {"admin_listener": f"127.0.0.1:{ADMIN_PORT}", "wal_max_delay_ms": 0}


def scrape(name: str) -> dict[str, float]:
    """Samples of one metric family from the node's /metrics: labels text -> value."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{ADMIN_PORT}/metrics",
                                  timeout=TIMEOUT).read().decode()
    out = {}
    for line in body.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


class Stats:
    """confluent-kafka's statistics (stats_cb): the largest broker throttle seen."""

    def __init__(self) -> None:
        self.throttle_max_ms = 0
        self.throttle_cnt = 0

    def __call__(self, text: str) -> None:
        for broker in json.loads(text).get("brokers", {}).values():
            throttle = broker.get("throttle") or {}
            self.throttle_max_ms = max(self.throttle_max_ms, throttle.get("max", 0))
            self.throttle_cnt += throttle.get("cnt", 0) if throttle.get("max", 0) else 0


def produce_for(bootstrap: str, client_id: str, topic: str, seconds: float, stats: Stats,
                size: int = 10_000, stop_bytes: float = math.inf) -> list[tuple[float, int]]:
    """Produce as fast as the broker lets this client for `seconds` (or until `stop_bytes`
    are acknowledged); (ack time, bytes)."""
    acked: list[tuple[float, int]] = []
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id,
                         "linger.ms": 5, "acks": 1, "batch.size": 16384, "statistics.interval.ms": 1000,
                         "stats_cb": stats})

    def delivered(err, msg):
        if err is None:
            acked.append((time.monotonic(), len(msg.value())))

    value = b"q" * size
    end = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < end and sent < stop_bytes:
        if len(producer) < 200:
            sent += size
            producer.produce(topic, value, on_delivery=delivered)
            producer.poll(0)
        else:
            producer.poll(0.01)
    producer.flush(1.0 if stop_bytes == math.inf else TIMEOUT)  # what is left is not counted
    producer.poll(1.5)  # one more statistics interval
    return acked


def rate_over(events: list[tuple[float, int]], seconds: float) -> float:
    """Bytes per second in the `seconds` from the first event on."""
    if not events:
        return 0.0
    start = events[0][0]
    return sum(n for t, n in events if t - start <= seconds) / seconds


async def test_produce_quota_holds_one_client_id_and_spares_another(node):
    """producer_byte_rate on client id `slow`: over 30 s from its first message its rate is
    within 10% of the quota, while `fast` on the same node runs unthrottled; librdkafka's
    statistics show the throttle, and so do the node's metrics."""
    quota = 300_000
    assert await in_thread(alter, node, [
        ([("client-id", "slow")], [("producer_byte_rate", quota, False)])]) == [
            (ErrorCode.none, None)]
    slow_stats, fast_stats = Stats(), Stats()
    results = {}

    async def run(client_id, stats):
        results[client_id] = await trio.to_thread.run_sync(
            produce_for, node, client_id, "produce-quota", MEASURE_S + 1, stats)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "slow", slow_stats)
        nursery.start_soon(run, "fast", fast_stats)
    slow, fast = rate_over(results["slow"], MEASURE_S), rate_over(results["fast"], MEASURE_S)
    print(f"produce quota {quota} B/s over 30 s: slow "
          f"{rate_over(results['slow'], 30.0) / quota:.3f} of it")
    print(f"produce quota {quota} B/s: slow {slow:.0f} B/s ({slow / quota:.3f} of it), "
          f"fast {fast:.0f} B/s; librdkafka throttle max {slow_stats.throttle_max_ms} ms "
          f"(fast: {fast_stats.throttle_max_ms} ms)")
    assert abs(slow - quota) <= 0.10 * quota, (slow, quota)
    assert fast > 4 * quota, fast
    assert slow_stats.throttle_max_ms > 0  # librdkafka saw throttle_time_ms
    assert fast_stats.throttle_max_ms == 0
    throttled = await in_thread(scrape, "mink_quota_throttle_time_seconds_count")
    assert throttled.get('{quota="produce"}', 0) > 0, throttled
    assert await in_thread(scrape, "mink_quota_throttle_time_seconds_sum")


def consume_for(bootstrap: str, client_id: str, topic: str, seconds: float,
                stop_at_bytes: int, stats: Stats) -> list[tuple[float, int]]:
    from confluent_kafka import TopicPartition

    got: list[tuple[float, int]] = []
    consumer = Consumer({"bootstrap.servers": bootstrap, "client.id": client_id,
                         "group.id": f"g-{client_id}", "enable.auto.commit": False,
                         "statistics.interval.ms": 1000, "stats_cb": stats})
    consumer.assign([TopicPartition(topic, 0, 0)])
    total = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end and total < stop_at_bytes:
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            got.append((time.monotonic(), len(msg.value())))
            total += len(msg.value())
    finally:
        consumer.close()
    return got


async def test_fetch_quota_holds_one_consumer_and_spares_another(node):
    """consumer_byte_rate on client id `slow-reader`: over 30 s from its first message it
    reads within 10% of the quota; `fast-reader` reads the whole topic meanwhile."""
    quota = 300_000
    loaded = await trio.to_thread.run_sync(produce_for, node, "loader", "fetch-quota", 60.0,
                                           Stats(), 10_000, 2.5 * quota * MEASURE_S)
    total = sum(n for _, n in loaded)
    assert total > 2 * quota * MEASURE_S, total  # more than the slow reader may read
    assert await in_thread(alter, node, [
        ([("client-id", "slow-reader")], [("consumer_byte_rate", quota, False)])]) == [
            (ErrorCode.none, None)]
    results = {}
    stats = {"slow-reader": Stats(), "fast-reader": Stats()}

    async def run(client_id):
        results[client_id] = await trio.to_thread.run_sync(
            consume_for, node, client_id, "fetch-quota", MEASURE_S + 1, total,
            stats[client_id])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "slow-reader")
        nursery.start_soon(run, "fast-reader")
    slow = rate_over(results["slow-reader"], MEASURE_S)
    print(f"fetch quota {quota} B/s over 30 s: slow-reader "
          f"{rate_over(results['slow-reader'], 30.0) / quota:.3f} of it")
    fast_bytes = sum(n for _, n in results["fast-reader"])
    fast_s = results["fast-reader"][-1][0] - results["fast-reader"][0][0]
    print(f"fetch quota {quota} B/s: slow-reader {slow:.0f} B/s ({slow / quota:.3f} of it); "
          f"fast-reader read {fast_bytes} B in {fast_s:.1f} s")
    assert abs(slow - quota) <= 0.10 * quota, (slow, quota)
    assert fast_bytes == total
    assert stats["slow-reader"].throttle_max_ms > 0  # librdkafka's statistics show it
    throttled = await in_thread(scrape, "mink_quota_throttle_time_seconds_count")
    assert throttled.get('{quota="fetch"}', 0) > 0, throttled


async def api_versions_for(address: str, client_id: str, seconds: float):
    """Sequential ApiVersions v3 requests for `seconds`, ignoring throttle_time_ms as a
    misbehaving client would: (count, the throttles answered, the longest wait for an
    answer after a throttled one)."""
    async with await KafkaClient.connect(address, client_id=client_id) as client:
        schema = load_request_schema(ApiKey.API_VERSIONS, 3)
        body = build(schema, client_software_name="quota-tests",
                     client_software_version="1")
        count, throttles, waited_after_throttle = 0, [], 0.0
        previous_throttle = 0.0
        end = trio.current_time() + seconds
        while trio.current_time() < end:
            sent = trio.current_time()
            response = await client.call(ApiKey.API_VERSIONS, 3, body)
            if previous_throttle:
                waited_after_throttle = max(waited_after_throttle, trio.current_time() - sent)
            previous_throttle = response.throttle_time.total_seconds()
            if previous_throttle:
                throttles.append(previous_throttle)
            count += 1
        return count, throttles, waited_after_throttle


async def test_request_quota_throttles_a_client_sending_many_small_requests(node):
    """request_percentage 1 (1% of the event loop) on (user ANONYMOUS, client id chatty):
    the principal of an unauthenticated connection is matched as the user. chatty sends
    small requests back to back and is throttled; the connection is muted for the throttle
    even though chatty ignores the field; calm, without a quota, is not."""
    assert await in_thread(alter, node, [
        ([("user", "ANONYMOUS"), ("client-id", "chatty")], [("request_percentage", 1, False)]),
    ]) == [(ErrorCode.none, None)]
    calm_count, calm_throttles, _ = await api_versions_for(node, "calm", 3.0)
    chatty_count, chatty_throttles, waited = await api_versions_for(node, "chatty", 6.0)
    print(f"request quota 1%: chatty {chatty_count / 6.0:.0f} requests/s, "
          f"{len(chatty_throttles)} throttled (max {max(chatty_throttles, default=0):.3f} s), "
          f"longest wait after a throttle {waited:.3f} s; calm {calm_count / 3.0:.0f} "
          f"requests/s, {len(calm_throttles)} throttled")
    assert not calm_throttles
    assert chatty_throttles
    assert chatty_count / 6.0 < calm_count / 3.0 / 3
    assert waited >= min(chatty_throttles) * 0.9  # muted: the next answer waited
    # a Metadata answer is encoded once and cached; its throttle_time_ms is set all the same
    async with await KafkaClient.connect(node, client_id="chatty") as client:
        for _ in range(2):
            metadata = await client.call(ApiKey.METADATA, 12, build(
                load_request_schema(ApiKey.METADATA, 12), topics=None,
                allow_auto_topic_creation=False, include_topic_authorized_operations=False))
            assert metadata.throttle_time.total_seconds() > 0
    throttled = await in_thread(scrape, "mink_quota_throttle_time_seconds_count")
    assert throttled.get('{quota="request"}', 0) > 0, throttled


async def test_quotas_reach_every_node_of_a_cluster_without_a_restart(mink_postgres):
    """Set on node 1, every node of three describes and enforces it within 2 s; removed on
    node 2, every node drops it within 2 s."""
    from mink.testing import open_cluster

    async with open_cluster(3, mink_postgres, proxy=False) as cluster:
        addresses = [cluster.node(i).bootstrap for i in (1, 2, 3)]
        entity = [("client-id", "everywhere")]
        started = trio.current_time()
        assert await in_thread(alter, addresses[0], [
            (entity, [("request_percentage", 0.01, False)])]) == [(ErrorCode.none, None)]

        async def seen_everywhere(wanted):
            while True:
                described = [await in_thread(describe, a, [("client-id", 0, "everywhere")])
                             for a in addresses]
                if all(d == wanted for d in described):
                    return trio.current_time() - started
                await trio.sleep(0.05)

        with trio.fail_after(2.0):
            took = await seen_everywhere({(("client-id", "everywhere"),):
                                          {"request_percentage": 0.01}})
        print(f"quota described by all three nodes {took:.2f} s after AlterClientQuotas")
        for address in addresses:  # and enforced on each
            _, throttles, _ = await api_versions_for(address, "everywhere", 1.0)
            assert throttles, address
        started = trio.current_time()
        assert await in_thread(alter, addresses[1], [
            (entity, [("request_percentage", 0, True)])]) == [(ErrorCode.none, None)]
        with trio.fail_after(2.0):
            took = await seen_everywhere({})
        print(f"removal seen by all three nodes {took:.2f} s after AlterClientQuotas")
        for i in (1, 2, 3):
            assert not cluster.node(i).node.quotas.request.limits


async def test_old_clients_get_the_response_held_back_new_ones_are_muted(node):
    """KIP-219: to a Produce v5 client the throttled response itself comes late; a Produce
    v9 client gets it at once with throttle_time_ms and its connection then waits that long
    before its next request is answered. clients/<default> measures each client id apart."""
    from tests.support.batches import records_batch, values
    from tests.support.raw import produce_request, produce_result

    batch = records_batch(values(10, 1000))
    probe = produce_request("kip-219", 0, batch, version=9, acks=1)
    async with await KafkaClient.connect(node, client_id="setup") as client:
        for _ in range(50):  # auto-creates the topic
            if produce_result(await client.call(ApiKey.PRODUCE, 9, probe))[0] == 0:
                break
            await trio.sleep(0.1)
    frame = len(client.exchange.encode(ApiKey.PRODUCE, 9, probe)[1]) - 4
    quota = round(frame / 11)  # one request is then ~1 s of throttle: S / Q - 10 windows
    assert await in_thread(alter, node, [
        ([("client-id", None)], [("producer_byte_rate", quota, False)])]) == [
            (ErrorCode.none, None)]

    async def produce_once(client_id: str, version: int):
        async with await KafkaClient.connect(node, client_id=client_id) as client:
            started = trio.current_time()
            response = await client.call(ApiKey.PRODUCE, version, produce_request(
                "kip-219", 0, batch, version=version, acks=1))
            answered = trio.current_time() - started
            assert produce_result(response)[0] == 0  # throttled, not refused
            throttle = response.throttle_time.total_seconds()
            started = trio.current_time()
            await client.call(ApiKey.API_VERSIONS, 3, build(
                load_request_schema(ApiKey.API_VERSIONS, 3), client_software_name="t",
                client_software_version="1"))
            return throttle, answered, trio.current_time() - started

    throttle, answered, next_answered = await produce_once("old-producer", 5)
    print(f"Produce v5: throttle {throttle:.2f} s, answered after {answered:.2f} s, "
          f"next request after {next_answered:.2f} s")
    assert throttle > 0.5 and answered >= throttle * 0.95 and next_answered < 0.5
    throttle, answered, next_answered = await produce_once("new-producer", 9)
    print(f"Produce v9: throttle {throttle:.2f} s, answered after {answered:.2f} s, "
          f"next request after {next_answered:.2f} s")
    assert throttle > 0.5 and answered < 0.5 and next_answered >= throttle * 0.95


async def test_the_old_forwarding_client_id_is_charged_like_any(node):
    """A default quota binds every client id, `mink-forwarded` (the marker nodes once
    forwarded with) too: only an Envelope accepted from another node is not charged."""
    assert await in_thread(alter, node, [
        ([("client-id", None)], [("request_percentage", 0.01, False)])]) == [
            (ErrorCode.none, None)]
    _, throttles, _ = await api_versions_for(node, "anyone", 1.0)
    assert throttles
    _, throttles, _ = await api_versions_for(node, "mink-forwarded", 1.0)
    assert throttles
