"""Three Mink nodes on one PostgreSQL and one object store, and a failover.

    .venv/bin/python examples/cluster_failover.py

Starts an embedded PostgreSQL and a file:// store in a temporary folder, three `mink serve`
nodes, creates a topic with six partitions (two per node), produces with an idempotent
producer, kills one node with SIGKILL, and shows its partitions led again by the others
with every acknowledged message still there.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mink.storage.embedded_postgres import EmbeddedPostgres, free_port

LEASE_TTL = 3


def wait_listening(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"node on port {port} did not start")


def leaders(admin: AdminClient, topic: str) -> dict[int, int]:
    metadata = admin.list_topics(topic, timeout=10)
    return {p.id: p.leader for p in metadata.topics[topic].partitions.values()}


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="mink-cluster-"))
    (work / "objects").mkdir()
    postgres = EmbeddedPostgres(work / "postgres")
    postgres.start()
    nodes: dict[int, subprocess.Popen] = {}
    ports = {node_id: free_port() for node_id in (1, 2, 3)}
    try:
        for node_id, port in ports.items():
            env = dict(os.environ, MINK_NODE_ID=str(node_id), MINK_LISTENER=f"127.0.0.1:{port}",
                       MINK_POSTGRES_URL=postgres.url, MINK_OBJECT_STORE=(work / "objects").as_uri(),
                       MINK_LEASE_TTL=str(LEASE_TTL), MINK_COORDINATOR_TICK="0.5",
                       MINK_LOG_LEVEL="WARNING")
            nodes[node_id] = subprocess.Popen([sys.executable, "-m", "mink.cli", "serve"],
                                              env=env)
            wait_listening(port)
            print(f"node {node_id} listening on 127.0.0.1:{port}")
        bootstrap = ",".join(f"127.0.0.1:{p}" for p in ports.values())
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("orders", 6, 1)])["orders"].result(30)
        print("topic 'orders' leaders by partition:", leaders(admin, "orders"))

        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        acked = []

        def produce(count: int, start: int) -> None:
            for i in range(start, start + count):
                producer.produce("orders", key=str(i), value=f"order {i}",
                                 on_delivery=lambda err, msg: err or acked.append(msg.value()))
            producer.flush(60)

        produce(1000, 0)
        print(f"{len(acked)} messages acknowledged")

        victim = leaders(admin, "orders")[0]
        print(f"killing node {victim} (SIGKILL), the leader of partition 0 ...")
        nodes[victim].send_signal(signal.SIGKILL)
        nodes[victim].wait()
        survivors = ",".join(f"127.0.0.1:{p}" for n, p in ports.items() if n != victim)
        admin = AdminClient({"bootstrap.servers": survivors})
        started = time.monotonic()
        while victim in leaders(admin, "orders").values():
            time.sleep(0.2)
        print(f"its partitions were led again after {time.monotonic() - started:.1f}s:",
              leaders(admin, "orders"))

        produce(1000, 1000)
        consumer = Consumer({"bootstrap.servers": survivors, "group.id": "example"})
        consumer.assign([TopicPartition("orders", p, 0) for p in range(6)])
        seen = set()
        deadline = time.monotonic() + 30
        while len(seen) < len(acked) and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and not message.error():
                seen.add(message.value())
        consumer.close()
        lost = set(acked) - seen
        print(f"{len(acked)} acknowledged, {len(seen)} read back, {len(lost)} lost")
    finally:
        for process in nodes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(20)
        postgres.stop("fast")


if __name__ == "__main__":
    main()
