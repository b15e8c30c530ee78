"""Several Mink nodes as subprocesses on one PostgreSQL and one S3 endpoint."""

from __future__ import annotations

import time

import psycopg
import pytest

from mink.storage.embedded_postgres import free_port
from tests.support.nodes import NodeProcess, PortTaken, node_config
from tests.support.s3 import s3_options

LEASE_TTL = 3.0
TICK = 0.5


class Cluster:
    def __init__(self, pg_url: str, store_url: str, store_options: dict, make_process):
        self.pg_url = pg_url
        self.store_url = store_url
        self.store_options = store_options
        self.make_process = make_process
        self.nodes: dict[int, NodeProcess] = {}

    def config(self, node_id: int, port: int | None = None, **overrides):
        values = dict(
            node_id=node_id, listener=f"127.0.0.1:{port or free_port()}", lease_ttl=LEASE_TTL,
            coordinator_tick=TICK, wal_max_delay_ms=5, log_level="INFO",
            s3_endpoint_url=self.store_options["endpoint_url"],
            s3_region=self.store_options["region"],
            s3_access_key_id=self.store_options["access_key_id"],
            s3_secret_access_key=self.store_options["secret_access_key"])
        values.update(overrides)
        return node_config(self.pg_url, self.store_url, **values)

    def start(self, node_id: int, **overrides) -> NodeProcess:
        previous = self.nodes.get(node_id)
        port = int(previous.address.rsplit(":", 1)[1]) if previous else None
        for attempt in range(3):
            process = self.make_process(self.config(node_id, port, **overrides))
            try:
                process.start()
                break
            except PortTaken:  # a freshly picked port taken meanwhile: pick another
                if port is not None or attempt == 2:
                    raise
        self.nodes[node_id] = process
        return process

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes.values()
                        if n.process and n.process.poll() is None)

    def query(self, sql: str, *params):
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def leaders(self, topic: str) -> dict[int, tuple[int | None, int]]:
        rows = self.query(
            "SELECT p.partition, p.leader_node, p.leader_epoch FROM partitions p "
            "JOIN topics t USING (topic_id) WHERE t.name = %s AND t.deleted_at IS NULL",
            topic)
        return {p: (leader, epoch) for p, leader, epoch in rows}

    def open_streams(self, topic: str) -> dict[int, tuple[int | None, int | None]]:
        rows = self.query(
            "SELECT p.partition, p.opened_by_node, p.open_leader_epoch FROM partitions p "
            "JOIN topics t USING (topic_id) WHERE t.name = %s AND p.stream_state = 'open' "
            "AND t.deleted_at IS NULL", topic)
        return {p: (node, epoch) for p, node, epoch in rows}

    def node_epoch(self, node_id: int) -> int:
        return self.query("SELECT epoch FROM nodes WHERE node_id = %s", node_id)[0][0]

    def live_nodes(self) -> set[int]:
        return {r[0] for r in self.query("SELECT node_id FROM nodes WHERE expires_at > now()")}

    def coordinator(self) -> int | None:
        rows = self.query("SELECT holder FROM leases WHERE scope = 'coordinator' "
                          "AND expires_at > now()")
        return rows[0][0] if rows else None

    def wait_for(self, condition, timeout: float = 30.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def cluster(pg_url, s3_endpoint, s3_bucket_url, node_processes) -> Cluster:
    return Cluster(pg_url, s3_bucket_url, s3_options(s3_endpoint), node_processes)
