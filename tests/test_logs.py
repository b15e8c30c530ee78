"""Structured logs: node id and epoch on every line, fields where they apply, json lines."""

from __future__ import annotations

import io
import json
import logging

import trio

from mink.broker.logs import TextFormatter, bind_node, handler_for
from mink.broker.node import run_node
from tests.support.nodes import node_config


def _record(message: str, **extra) -> logging.LogRecord:
    record = logging.LogRecord("mink.x", logging.INFO, __file__, 1, message, (), None)
    record.__dict__.update(extra)
    return record


def test_text_lines_carry_the_node_and_the_fields():
    line = TextFormatter().format(_record("leading", node_id=3, node_epoch=7, topic="t",
                                          partition=2, leader_epoch=5))
    assert " INFO node=3/7 mink.x: leading topic=t partition=2 leader_epoch=5" in line
    # Outside a node's tasks: no node part.
    assert " INFO mink.x: plain" in TextFormatter().format(_record("plain"))


async def test_bind_node_reaches_the_tasks_it_starts():
    class FakeMembership:
        node_epoch = 9

    class FakeNode:
        node_id, membership = 4, FakeMembership()

    stream = io.StringIO()
    logger = logging.getLogger("mink.test_logs")
    logger.addHandler(handler_for("json", stream))
    logger.setLevel(logging.INFO)
    try:
        async def child():
            logger.info("from a child", extra={"group": "g"})

        async def node_task():
            bind_node(FakeNode())
            async with trio.open_nursery() as nursery:
                nursery.start_soon(child)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(node_task)
        logger.info("outside")
    finally:
        logger.handlers.clear()
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (first["node_id"], first["node_epoch"], first["group"]) == (4, 9, "g")
    assert first["message"] == "from a child" and first["level"] == "INFO"
    assert second["node_id"] is None


async def test_json_lines_through_a_failover(pg_url, store_url, nursery):
    """Two nodes; node 2 is killed (nothing released): node 1 logs the failover and its new
    leadership, each a json line with node id, node epoch, topic and partition fields."""
    from confluent_kafka import Producer

    stream = io.StringIO()
    handler = handler_for("json", stream)
    mink_logger = logging.getLogger("mink")
    level = mink_logger.level
    mink_logger.addHandler(handler)
    mink_logger.setLevel(logging.INFO)
    nodes: dict[int, object] = {}
    scopes: dict[int, trio.CancelScope] = {}

    async def run(config, task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as scope:
            scopes[config.node_id] = scope
            await run_node(config, freeze_heap=False,
                           on_started=lambda n: nodes.__setitem__(n.node_id, n),
                           task_status=task_status)

    try:
        addresses = []
        for node_id in (1, 2):
            host, port = await nursery.start(run, node_config(
                pg_url, store_url, node_id=node_id, lease_ttl=3.0, coordinator_tick=0.5,
                num_partitions=2, offsets_topic_num_partitions=1))
            addresses.append(f"{host}:{port}")

        def produce():
            producer = Producer({"bootstrap.servers": ",".join(addresses)})
            for partition in (0, 1):
                producer.produce("logged", b"x", partition=partition)
            assert producer.flush(30) == 0

        await trio.to_thread.run_sync(produce)
        leaders = {p.leader for p in nodes[1].view.topics["logged"].partitions}
        assert leaders == {1, 2}, leaders
        nodes[2].leave_on_stop = False  # as after SIGKILL
        scopes[2].cancel()

        def lines() -> list[dict]:
            return [json.loads(line) for line in stream.getvalue().splitlines()]

        with trio.fail_after(30):
            while not any(e.get("event") == "failover" and e.get("to_node") == 1
                          for e in lines()):
                await trio.sleep(0.1)
        with trio.fail_after(10):
            while not any(e.get("event") == "partition_opened" and e["node_id"] == 1
                          and e.get("partition") is not None and e["leader_epoch"] > 0
                          and e["ts"] >= failover_ts(lines()) for e in lines()):
                await trio.sleep(0.1)
    finally:
        mink_logger.removeHandler(handler)
        mink_logger.setLevel(level)
    entries = lines()
    node_lines = [e for e in entries if e["logger"].startswith(("mink.broker", "mink.storage"))]
    assert node_lines and all(e["node_id"] in (1, 2) for e in node_lines), [
        e for e in node_lines if e["node_id"] not in (1, 2)][:3]
    assert all(isinstance(e["node_epoch"], int) for e in node_lines)
    failover = next(e for e in entries if e.get("event") == "failover")
    assert failover["node_id"] == 1 and failover["node_epoch"] >= 1
    assert "topic_id" in failover and isinstance(failover["partition"], int)


def failover_ts(entries: list[dict]) -> str:
    return next(e["ts"] for e in entries if e.get("event") == "failover")
