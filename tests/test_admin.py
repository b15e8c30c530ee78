"""The admin HTTP listener: /healthz, /readyz and /metrics of real nodes."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

import pytest
import trio

from mink.broker.config import ConfigError, load_config
from mink.storage.embedded_postgres import free_port
from tests.support.nodes import node_config, start_node
from tests.support.postgres import via_proxy


def _get_blocking(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def http_get(url: str) -> tuple[int, bytes]:
    return await trio.to_thread.run_sync(_get_blocking, url)


async def wait_for_status(url: str, status: int, timeout: float) -> dict:
    with trio.fail_after(timeout):
        while True:
            got, body = await http_get(url)
            if got == status:
                return json.loads(body)
            await trio.sleep(0.05)


def test_admin_listener_is_a_setting_off_by_default():
    assert load_config(env={}).admin_listener is None
    config = load_config(env={"MINK_ADMIN_LISTENER": "127.0.0.1:9644",
                              "MINK_LOG_FORMAT": "json"})
    assert config.admin_address() == ("127.0.0.1", 9644)
    assert config.log_format == "json"
    with pytest.raises(ConfigError):
        load_config(env={"MINK_ADMIN_LISTENER": "nonsense"})
    with pytest.raises(ConfigError):
        load_config(env={"MINK_LOG_FORMAT": "xml"})


async def test_routes_and_methods(pg_url, store_url, nursery):
    port = free_port()
    await start_node(nursery, node_config(pg_url, store_url,
                                          admin_listener=f"127.0.0.1:{port}"))
    base = f"http://127.0.0.1:{port}"
    status, body = await http_get(base + "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    ready = await wait_for_status(base + "/readyz", 200, 10)
    assert ready["ready"] and ready["node_epoch"] >= 1
    status, _ = await http_get(base + "/nothing-here")
    assert status == 404

    def post() -> int:
        request = urllib.request.Request(base + "/healthz", data=b"x", method="POST")
        try:
            return urllib.request.urlopen(request, timeout=5).status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert await trio.to_thread.run_sync(post) == 405


async def test_readyz_is_not_ready_while_self_fenced_and_ready_after(pg_url, pg_proxy,
                                                                     store_url, nursery):
    """PostgreSQL paused through the proxy: the node self-fences within lease_ttl, /readyz
    says 503 (not_fenced false) while /healthz keeps answering 200 (it never touches
    PostgreSQL); resumed, the node registers again and /readyz is 200 at a higher epoch."""
    ttl = 3.0
    port = free_port()
    await start_node(nursery, node_config(via_proxy(pg_url, pg_proxy), store_url,
                                          lease_ttl=ttl, coordinator_tick=0.5,
                                          admin_listener=f"127.0.0.1:{port}"))
    base = f"http://127.0.0.1:{port}"
    before = await wait_for_status(base + "/readyz", 200, 10)
    pg_proxy.stall()
    try:
        fenced = await wait_for_status(base + "/readyz", 503, ttl + 5)
        assert not fenced["not_fenced"] and fenced["registered"]
        status, _ = await http_get(base + "/healthz")
        assert status == 200
    finally:
        pg_proxy.resume()
    after = await wait_for_status(base + "/readyz", 200, 30)
    assert after["node_epoch"] > before["node_epoch"]


# -- /metrics ---------------------------------------------------------------------------------

def parse_metrics(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample, keyed (sample name, sorted labels), through prometheus-client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


async def scrape(base: str) -> dict[tuple[str, tuple], float]:
    status, body = await http_get(base + "/metrics")
    assert status == 200
    return parse_metrics(body.decode())


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples, name: str, **labels) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == w for k, w in labels.items()))


async def wait_for_metric(base: str, predicate, timeout: float, what: str):
    with trio.fail_after(timeout):
        while True:
            samples = await scrape(base)
            if predicate(samples):
                return samples
            await trio.sleep(0.1)


N, SIZE, TOPIC, GROUP = 2000, 200, "metered", "metered-group"


def _produce(address: str, count: int, start: int = 0) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "linger.ms": 5,
                         "compression.type": "none", "acks": "all"})
    for i in range(start, start + count):
        producer.produce(TOPIC, value=b"%0*d" % (SIZE, i), partition=0)
    assert producer.flush(60) == 0


def _consume_and_commit(address: str, count: int) -> int:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": address, "group.id": GROUP,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    got = 0
    try:
        import time

        deadline = time.monotonic() + 60
        while got < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got += 1
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


async def test_metrics_move_with_real_clients(pg_url, store_url, nursery):
    """Counters move by what was produced and consumed (bytes within batch framing),
    histograms fill, and the group's lag falls to 0 when the consumer caught up and grows by
    what is produced once it stopped."""
    port = free_port()
    address = await start_node(nursery, node_config(
        pg_url, store_url, admin_listener=f"127.0.0.1:{port}", consumer_lag_refresh_ms=200,
        group_initial_rebalance_delay_ms=0, offsets_topic_num_partitions=3))
    base = f"http://127.0.0.1:{port}"
    before = await scrape(base)
    await trio.to_thread.run_sync(_produce, address, N)
    after = await scrape(base)

    assert value(after, "mink_broker_topic_messages_in_total", topic=TOPIC) == N
    bytes_in = value(after, "mink_broker_topic_bytes_in_total", topic=TOPIC)
    # Each record carries its value plus a few bytes of framing; each batch 61 bytes.
    assert N * SIZE < bytes_in < N * (SIZE + 16) + 61 * N / 10, bytes_in
    produce_count = total(after, "mink_request_latency_seconds_count", api="Produce")
    assert produce_count > total(before, "mink_request_latency_seconds_count", api="Produce")
    assert total(after, "mink_request_latency_seconds_bucket", api="Produce",
                 le="+Inf") == produce_count
    assert value(after, "mink_wal_flush_size_bytes_count") >= 1
    assert value(after, "mink_wal_flush_size_bytes_sum") >= bytes_in
    assert value(after, "mink_wal_commit_latency_seconds_count") >= 1
    assert value(after, "mink_wal_commit_ranges_total", outcome="committed", reason="") >= 1
    assert value(after, "mink_object_store_request_latency_seconds_count",
                 operation="create") >= 1
    assert value(after, "mink_partitions_led") >= 1
    assert value(after, "mink_node_leading") == 1 and value(after, "mink_node_epoch") >= 1
    assert value(after, "mink_view_version") >= 0
    assert value(after, "mink_connections") >= 0
    assert value(after, "mink_connections_accepted_total") >= 1

    got = await trio.to_thread.run_sync(_consume_and_commit, address, N)
    assert got == N
    lag_labels = dict(group=GROUP, topic=TOPIC, partition="0")
    caught_up = await wait_for_metric(
        base, lambda s: ("mink_consumergroup_lag", tuple(sorted(lag_labels.items()))) in s
        and value(s, "mink_consumergroup_lag", **lag_labels) == 0, 20, "lag 0")
    assert value(caught_up, "mink_consumergroup_committed_offset", **lag_labels) == N
    assert value(caught_up, "mink_broker_topic_messages_out_total", topic=TOPIC) >= N
    assert value(caught_up, "mink_broker_topic_bytes_out_total", topic=TOPIC) >= bytes_in
    assert total(caught_up, "mink_request_latency_seconds_count", api="Fetch") >= 1
    assert total(caught_up, "mink_group_rebalances_total") >= 1
    # KIP-394: a new member's first JoinGroup is answered MEMBER_ID_REQUIRED.
    assert total(caught_up, "mink_request_errors_total", api="JoinGroup",
                 error="MEMBER_ID_REQUIRED") >= 1

    more = 300
    await trio.to_thread.run_sync(_produce, address, more, N)
    await wait_for_metric(base, lambda s: value(s, "mink_consumergroup_lag", **lag_labels)
                          == more, 20, "lag grows by what was produced")

    # `mink cluster status` shows the same lag, from PostgreSQL.
    status = await trio.run_process(
        [sys.executable, "-m", "mink.cli", "cluster", "status", "--postgres-url", pg_url,
         "--json"], capture_stdout=True)
    groups = {g["group"]: g for g in json.loads(status.stdout)["consumer_groups"]}
    assert groups[GROUP]["lag"] == more
    assert groups[GROUP]["partitions"] == [{"topic": TOPIC, "partition": 0,
                                            "committed_offset": N, "high_watermark": N + more,
                                            "lag": more}]


async def test_metrics_are_per_node_in_one_process(pg_url, store_url, nursery):
    """Two in-process nodes: each /metrics shows its own node only (a registry per node)."""
    ports = [free_port(), free_port()]
    for node_id, port in zip((1, 2), ports):
        await start_node(nursery, node_config(pg_url, store_url, node_id=node_id,
                                              admin_listener=f"127.0.0.1:{port}"))
    epochs = []
    for port in ports:
        samples = await scrape(f"http://127.0.0.1:{port}")
        assert value(samples, "mink_node_epoch") >= 1
        epochs.append(samples)
    assert all(len([k for k in s if k[0] == "mink_node_epoch"]) == 1 for s in epochs)


async def test_no_admin_listener_no_metrics(pg_url, store_url, nursery):
    from mink.broker.admin.metrics import NULL_METRICS
    from mink.broker.node import run_node

    nodes = []
    config = node_config(pg_url, store_url)
    await nursery.start(lambda task_status: run_node(config, on_started=nodes.append,
                                                     task_status=task_status))
    assert nodes[0].metrics is NULL_METRICS


def test_commit_outcomes_are_counted_by_reason():
    """The WAL's reports (mink.storage.observer) as series: committed, refused per reason,
    in doubt, flush sizes."""
    from prometheus_client import CollectorRegistry, generate_latest

    from mink.broker.admin.metrics import _StorageMeters

    registry = CollectorRegistry()
    meters = _StorageMeters(registry)
    meters.wal_uploaded(5000, 0.01, False)
    meters.wal_uploaded(7000, 0.02, True)
    meters.wal_committed(0.004, 3, ["not_open_by_node", "not_open_by_node", "stale_node_epoch"])
    meters.wal_commit_in_doubt()
    samples = parse_metrics(generate_latest(registry).decode())
    assert value(samples, "mink_wal_commit_ranges_total", outcome="committed", reason="") == 3
    assert value(samples, "mink_wal_commit_ranges_total", outcome="refused",
                 reason="not_open_by_node") == 2
    assert value(samples, "mink_wal_commit_ranges_total", outcome="refused",
                 reason="stale_node_epoch") == 1
    assert value(samples, "mink_wal_commits_in_doubt_total") == 1
    assert value(samples, "mink_wal_flush_failures_total") == 1
    assert value(samples, "mink_wal_flush_size_bytes_count") == 1
    assert value(samples, "mink_wal_flush_size_bytes_sum") == 5000
    assert value(samples, "mink_wal_commit_latency_seconds_count") == 1
