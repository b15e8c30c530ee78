"""The console in a real headless browser (Debian's chromium, driven by selenium): a
three-node cluster on PostgreSQL and S3, a topic, a consumer group with lag; after a SIGKILL
the page shows the new leaders."""

from __future__ import annotations

import os
import time

import pytest

from mink.storage.embedded_postgres import free_port
from tests.support.nodes import require_tool
from tests.test_cluster import create_topic

TOPIC, GROUP, PARTITIONS = "console", "console-group", 3


@pytest.fixture
def browser():
    chromium = require_tool("chromium")
    chromedriver = require_tool("chromedriver")
    pytest.importorskip("selenium")
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,1100"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=chromedriver),
                              options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _produce(bootstrap: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(TOPIC, value=b"m%d" % i, partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def _consume_and_commit(bootstrap: str, count: int) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    got, deadline = 0, time.monotonic() + 60
    while got < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got += 1
    assert got == count
    consumer.commit(asynchronous=False)
    consumer.close()


def _paced_load(bootstrap: str, seconds: float) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i in range(300):
            producer.produce(TOPIC, value=b"load-%d" % i, partition=i % PARTITIONS)
        producer.poll(0)
        time.sleep(0.1)
    producer.flush(30)


def _tail(bootstrap: str, seconds: float) -> None:
    """A consumer of another group, following the load (for the screenshot's members)."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "console-tail",
                         "auto.offset.reset": "latest", "client.id": "tailing-consumer"})
    consumer.subscribe([TOPIC])
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        consumer.poll(0.2)
    consumer.close()


def _page_rows(driver, table: str) -> list[dict[str, str]]:
    """Each row's data attributes and cell texts, read in the page in one call."""
    return driver.execute_script("""
        return Array.from(document.querySelectorAll('#' + arguments[0] + ' tbody tr')).map(
            tr => Object.assign({cells: Array.from(tr.children).map(td => td.textContent)},
                                tr.dataset));""", table)


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _lag_by_partition(cluster) -> dict[int, int]:
    """The checker's own lag: high watermark minus committed offset, from PostgreSQL."""
    rows = cluster.query(
        "SELECT o.partition, p.committed_end - o.committed_offset FROM group_offsets o "
        "JOIN topics t ON t.name = o.topic AND t.deleted_at IS NULL "
        "JOIN partitions p ON p.topic_id = t.topic_id AND p.partition = o.partition "
        "WHERE o.group_id = %s AND o.topic = %s", GROUP, TOPIC)
    return {partition: lag for partition, lag in rows}


def test_console_shows_the_cluster_and_follows_a_failover(cluster, browser):
    admin_port = free_port()
    for node_id in (1, 2, 3):
        extra = {"admin_listener": f"127.0.0.1:{admin_port}"} if node_id == 1 else {}
        cluster.start(node_id, **extra)
    cluster.wait_for(lambda: cluster.live_nodes() == {1, 2, 3}, what="three live nodes")
    cluster.wait_for(cluster.coordinator, what="a coordinator")
    create_topic(cluster.bootstrap, TOPIC, PARTITIONS)
    _produce(cluster.bootstrap, 300)
    _consume_and_commit(cluster.bootstrap, 300)
    _produce(cluster.bootstrap, 90)  # 30 behind on each partition
    expected_lag = _lag_by_partition(cluster)
    assert sum(expected_lag.values()) == 90, expected_lag

    browser.get(f"http://127.0.0.1:{admin_port}/console")
    nodes = _wait(lambda: [r for r in _page_rows(browser, "nodes") if r["cells"][2] == "live"]
                  and len(_page_rows(browser, "nodes")) == 3 and _page_rows(browser, "nodes"),
                  30, "three nodes on the page")
    assert sorted(int(r["node"]) for r in nodes if r["cells"][2] == "live") == [1, 2, 3]

    def page_leaders() -> dict[int, int]:
        return {int(r["partition"]): int(r["leader"]) for r in _page_rows(browser, "partitions")
                if r.get("topic") == TOPIC and r.get("leader")}

    leaders = {p: leader for p, (leader, _) in cluster.leaders(TOPIC).items()}
    _wait(lambda: page_leaders() == leaders, 20, f"the page's leaders to be {leaders}")

    def page_lag() -> dict[int, int]:
        return {int(r["partition"]): int(r["lag"]) for r in _page_rows(browser, "groups")
                if r.get("group") == GROUP and r.get("lag")}

    _wait(lambda: page_lag() == expected_lag, 20, f"the page's lag to be {expected_lag}")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    if os.environ.get("MINK_CONSOLE_SCREENSHOT"):  # for docs/: the page under load
        import threading

        threads = [threading.Thread(target=_paced_load, args=(cluster.bootstrap, 10)),
                   threading.Thread(target=_tail, args=(cluster.bootstrap, 10))]
        for thread in threads:
            thread.start()
        time.sleep(8)  # a few polls, so the page has rates and the tailing group's member
        browser.save_screenshot(os.environ["MINK_CONSOLE_SCREENSHOT"])
        for thread in threads:
            thread.join()

    victim = next(leader for leader in (2, 3) if leader in leaders.values())
    cluster.nodes[victim].kill()
    moved = cluster.wait_for(
        lambda: (lambda now: now if victim not in now.values() else None)(
            {p: leader for p, (leader, _) in cluster.leaders(TOPIC).items()}),
        timeout=30, what=f"node {victim}'s partitions to move")
    _wait(lambda: page_leaders() == moved, 20, f"the page's leaders to be {moved}")
    _wait(lambda: any(r["node"] == str(victim) and r["cells"][2] == "dead"
                      for r in _page_rows(browser, "nodes")), 20, f"node {victim} dead")
    _wait(lambda: any("failover" in r["cells"] for r in _page_rows(browser, "changes")), 20,
          "a failover in the recent changes")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_assigned_partitions_reads_the_consumer_protocol():
    import struct

    from mink.protocol.consumer_protocol import assigned_partitions

    def assignment(version: int, topics: dict[str, list[int]]) -> bytes:
        out = struct.pack(">hi", version, len(topics))
        for name, partitions in topics.items():
            out += struct.pack(">h", len(name)) + name.encode()
            out += struct.pack(">i", len(partitions)) + b"".join(
                struct.pack(">i", p) for p in partitions)
        return out + struct.pack(">i", -1)  # no user data

    for version in (0, 1, 3, 7):  # newer versions read as the newest known
        assert assigned_partitions(assignment(version, {"a": [2, 0], "b": [1]})) == {
            "a": [0, 2], "b": [1]}
    assert assigned_partitions(b"") is None
    assert assigned_partitions(b"\xff\xff") is None
    assert assigned_partitions(b"\x00\x00\x00\x00\x00\x09") is None  # truncated
