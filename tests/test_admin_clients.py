"""Stock Kafka clients connect to a running node and list it (Metadata, ApiVersions)."""

import asyncio
import json

import trio

from tests.support.nodes import require_tool


async def test_kcat_lists_the_broker(node):
    kcat = require_tool("kcat")
    result = await trio.run_process([kcat, "-b", node, "-L", "-J", "-m", "10"],
                                    capture_stdout=True, capture_stderr=True)
    listing = json.loads(result.stdout)
    host, port = node.split(":")
    assert [(b["id"], b["name"]) for b in listing["brokers"]] == [(1, f"{host}:{port}")]
    assert listing["controllerid"] == 1


async def test_confluent_admin_list_topics(node):
    from confluent_kafka.admin import AdminClient

    def list_topics():
        admin = AdminClient({"bootstrap.servers": node})
        return admin.list_topics(timeout=10)

    metadata = await trio.to_thread.run_sync(list_topics)
    assert list(metadata.brokers) == [1]
    assert metadata.controller_id == 1
    assert metadata.cluster_id


async def test_kafka_python_admin_describe_cluster(node):
    from kafka import KafkaAdminClient

    def describe():
        admin = KafkaAdminClient(bootstrap_servers=node, request_timeout_ms=10000)
        try:
            return admin.describe_cluster(), admin.list_topics()
        finally:
            admin.close()

    cluster, topics = await trio.to_thread.run_sync(describe)
    assert [b["broker_id"] for b in cluster["brokers"]] == [1]
    assert cluster["controller_id"] == 1
    assert [t for t in topics if not t.startswith("__")] == []  # no user topics yet


async def test_aiokafka_admin_lists(node):
    from aiokafka.admin import AIOKafkaAdminClient

    async def describe():
        admin = AIOKafkaAdminClient(bootstrap_servers=node, request_timeout_ms=10000)
        await admin.start()
        try:
            return await admin.describe_cluster(), await admin.list_topics()
        finally:
            await admin.close()

    cluster, topics = await trio.to_thread.run_sync(lambda: asyncio.run(describe()))
    assert [b["node_id"] for b in cluster["brokers"]] == [1]
    assert [t for t in topics if not t.startswith("__")] == []  # no user topics yet
