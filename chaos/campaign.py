"""One campaign run: start the cluster, run the workload under the fault schedule, heal, read
everything back, snapshot PostgreSQL's epoch records, check, report.

The cluster: PostgreSQL (optionally under libfaketime), moto behind the S3 fault proxy, three
`mink serve` nodes; node 3 reaches PostgreSQL through a TCP proxy (the "cut off from PostgreSQL
only" fault), node 2 runs under libfaketime (the "clock step on one node" fault).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from chaos import nemesis
from chaos.history import History
from chaos.services import (FakeClock, Moto, Node, Postgres, S3FaultProxy, faketime_available,
                            mink_command, remove_faketime_leftovers)
from chaos.workload import (ConfluentProducer, GroupConsumer, KafkaPythonProducer,
                            TransactionalProducer, final_read)

log = logging.getLogger("chaos")

TOPIC = "chaos"
TXN_TOPIC = "chaos-txn"  # the transactional producer's own topic (read_committed)
GROUP = "chaos-group"
BUCKET = "chaos"


class Campaign:
    def __init__(self, *, seed: int, duration: float, faults: list[str], out_dir: Path,
                 partitions: int = 6, rate: float = 60.0, lease_ttl: float = 3.0,
                 coordinator_tick: float = 0.5, keep_work_dir: bool = False) -> None:
        self.seed = seed
        self.duration = duration
        self.faults = faults
        self.out_dir = out_dir
        self.partitions = partitions
        self.rate = rate
        self.lease_ttl = lease_ttl
        self.coordinator_tick = coordinator_tick
        self.keep_work_dir = keep_work_dir
        self.stall_bound = lease_ttl + coordinator_tick + 10.0
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.name = f"chaos-{stamp}-seed{seed}"
        self.work_dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        out_dir.mkdir(parents=True, exist_ok=True)
        self.history = History(out_dir / f"{self.name}.history.jsonl")
        self.logs_dir = out_dir / f"{self.name}.logs"
        self.logs_dir.mkdir(exist_ok=True)
        handler = logging.FileHandler(self.logs_dir / "clients.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        for name in ("chaos.clients", "kafka"):
            client_log = logging.getLogger(name)
            client_log.addHandler(handler)
            client_log.propagate = False
        if os.environ.get("CHAOS_RDKAFKA_DEBUG"):  # librdkafka's debug lines are DEBUG
            logging.getLogger("chaos.clients").setLevel(logging.DEBUG)
        self.nodes: dict[int, Node] = {}
        self.workers: list[Any] = []
        self.consumers: list[GroupConsumer] = []
        self._closers: list[Any] = []
        self._stop = threading.Event()
        self.pg_proxy_node = 3
        self.clock_node = 2
        self.pg_clock: FakeClock | None = None
        self.started_at = time.time()  # libfaketime's leftovers since then are removed at close
        self.node_clock: FakeClock | None = None

    # -- helpers used by the faults ------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise KeyboardInterrupt

    def fault_start(self, name: str, detail: dict[str, Any]) -> None:
        self.history.record("fault", fault=name, phase="start", detail=detail)

    def fault_end(self, name: str, detail: dict[str, Any]) -> None:
        self.history.record("fault", fault=name, phase="end", detail=detail)

    def query(self, sql: str, params: tuple = (), timeout: float = 3.0) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.postgres.url("mink"), connect_timeout=max(1, int(timeout)),
                             options=f"-c statement_timeout={int(timeout * 1000)}") as conn:
            return conn.execute(sql, params).fetchall()

    def coordinator_node(self) -> int | None:
        try:
            rows = self.query("SELECT holder FROM leases WHERE scope = 'coordinator' "
                              "AND expires_at > now()")
        except Exception:
            return None
        return rows[0][0] if rows and rows[0][0] in self.nodes else None

    # -- set-up --------------------------------------------------------------------------------

    def start(self) -> None:
        clocks = any(f.startswith("clock-") for f in self.faults)
        if clocks and not faketime_available():
            raise RuntimeError("clock faults need libfaketime: apt-get install faketime")
        if clocks:
            self.pg_clock = FakeClock(self.work_dir / "pg-clock.rc")
            self.node_clock = FakeClock(self.work_dir / "node-clock.rc")

        self.postgres = Postgres(self.work_dir / "postgres", clock=self.pg_clock)
        self.postgres.init()
        self.postgres.start()
        self._closers.append(self.postgres.close)
        self._psql(f"CREATE DATABASE mink")

        self.moto = Moto(self.work_dir)
        self.moto.start()
        self._closers.append(self.moto.close)
        self.moto.create_bucket(BUCKET)
        self.s3_proxy = S3FaultProxy(self.moto.port, self.seed)
        self.s3_proxy.start()
        self._closers.append(self.s3_proxy.close)

        from mink.testing.proxy import TcpProxy  # the project's fault proxy (tests' too)

        stack = contextlib.ExitStack()
        self._closers.append(stack.close)
        self.pg_proxy = stack.enter_context(TcpProxy("127.0.0.1", self.postgres.port).in_thread())

        common = {
            "object_store": f"s3://{BUCKET}/mink",
            "s3_endpoint_url": self.s3_proxy.url,
            "s3_region": "us-east-1",
            "s3_access_key_id": "testing",
            "s3_secret_access_key": "testing",
            "lease_ttl": self.lease_ttl,
            "coordinator_tick": self.coordinator_tick,
            "group_initial_rebalance_delay_ms": 0,
            "offsets_topic_num_partitions": 6,
        }
        proxied_url = (f"postgresql://postgres@{self.pg_proxy.address[0]}:"
                       f"{self.pg_proxy.address[1]}/mink")
        self._closers.append(self._stop_nodes)
        for node_id in (1, 2, 3):
            settings = dict(common, postgres_url=(proxied_url if node_id == self.pg_proxy_node
                                                  else self.postgres.url("mink")))
            clock = self.node_clock if node_id == self.clock_node else None
            node = Node(node_id, self.work_dir, settings, clock=clock)
            self.nodes[node_id] = node
            node.start()
        self._wait(lambda: self.query("SELECT count(*) FROM nodes WHERE expires_at > now()")[0][0] == 3,
                   60, "three live nodes")
        for topic in (TOPIC, TXN_TOPIC):
            created = subprocess.run(mink_command() + ["topics", "create", topic, "--partitions",
                                                       str(self.partitions), "--bootstrap-server",
                                                       self.nodes[1].address, "--if-not-exists"],
                                     capture_output=True, text=True, timeout=60)
            if created.returncode != 0:
                raise RuntimeError(f"mink topics create failed: {created.stderr or created.stdout}")

    def _psql(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.postgres.url(), autocommit=True) as conn:
            conn.execute(sql)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes.values())

    def _wait(self, condition: Any, timeout: float, what: str) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    return True
            except Exception:
                pass
            self.sleep(0.5)
        log.warning("gave up waiting for %s after %s s", what, timeout)
        self.history.record("wait_timeout", what=what, seconds=timeout)
        return False

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> Path:
        rng = random.Random(self.seed)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent).stdout.strip()
        self.history.record("run", seed=self.seed, commit=commit or None, duration=self.duration, faults=self.faults,
                            stall_bound=self.stall_bound, lease_ttl=self.lease_ttl,
                            coordinator_tick=self.coordinator_tick, partitions=self.partitions,
                            rate=self.rate, topic=TOPIC, pg_proxy_node=self.pg_proxy_node,
                            clock_node=self.clock_node)
        log.info("seed %s, %s s, faults %s; work dir %s", self.seed, self.duration,
                 ",".join(self.faults) or "none", self.work_dir)
        self.start()
        bootstrap = self.bootstrap
        self.workers = [
            ConfluentProducer("idem", self.history, bootstrap, TOPIC, self.rate, idempotent=True),
            KafkaPythonProducer("kpy", self.history, bootstrap, TOPIC, self.rate),
            ConfluentProducer("plain", self.history, bootstrap, TOPIC, self.rate,
                              idempotent=False),
            TransactionalProducer("txn", self.history, bootstrap, TXN_TOPIC, self.rate,
                                  seed=self.seed),
        ]
        self.consumers = [GroupConsumer(f"consumer-{i}", self.history, bootstrap, TOPIC, GROUP)
                          for i in range(2)]
        for worker in self.workers + self.consumers:
            worker.start()
        self.history.record("workload_started")
        until = self.history.now() + self.duration
        nemesis.run_schedule(self, rng, self.faults, until)
        self.history.record("faults_over")
        self.heal()
        self._wait(self._healthy, 90, "a healthy cluster after the faults")
        for worker in self.workers:
            worker.stopping.set()
        for worker in self.workers:
            worker.join(90)
        self.history.record("producers_stopped")
        self._wait(self._consumers_caught_up, 60, "the consumers to catch up")
        self.history.record("consumers_stopped")
        for consumer in self.consumers:
            consumer.stopping.set()
        for consumer in self.consumers:
            consumer.join(30)
        self._dump_stuck_threads()
        final_read(self.history, bootstrap, TOPIC, self.partitions)
        final_read(self.history, bootstrap, TXN_TOPIC, self.partitions, label="txn_")
        self.snapshot_postgres()
        self.history.record("end", s3_proxy=self.s3_proxy.counts,
                            node_starts={n.node_id: n.starts for n in self.nodes.values()})
        self.history.close()
        return self.history.path

    def _dump_stuck_threads(self) -> None:
        """Where each worker that did not stop is blocked (a client call that never returns)."""
        import sys
        import traceback

        stuck = [w for w in self.workers + self.consumers if w.is_alive()]
        if not stuck:
            return
        frames = sys._current_frames()
        with open(self.logs_dir / "stuck-threads.txt", "a") as f:
            for worker in stuck:
                self.history.record("worker_stuck", worker=worker.name)
                f.write(f"--- {worker.name} at t={self.history.now():.1f}\n")
                frame = frames.get(worker.ident)
                if frame is not None:
                    f.write("".join(traceback.format_stack(frame)))

    def heal(self) -> None:
        """End every fault that might still be in force."""
        self.s3_proxy.heal()
        self.moto.resume()
        for method in (self.pg_proxy.restore, self.pg_proxy.resume,
                       lambda: self.pg_proxy.drop_replies(False)):
            method()
        for clock in (self.pg_clock, self.node_clock):
            if clock is not None:
                clock.set(0.0)
        self.postgres.resume()
        if not self.postgres.running():
            self.postgres.start()
        for node in self.nodes.values():
            node.resume()
            if not node.running():
                self.history.record("node_restarted_by_heal", node=node.node_id,
                                    returncode=node.process.returncode if node.process else None)
                node.start()

    def _healthy(self) -> bool:
        live = self.query("SELECT count(*) FROM nodes WHERE expires_at > now()")[0][0]
        orphans = self.query(
            "SELECT count(*) FROM partitions p JOIN topics t USING (topic_id) "
            "LEFT JOIN nodes n ON n.node_id = p.leader_node "
            "WHERE t.deleted_at IS NULL AND (n.node_id IS NULL OR n.expires_at <= now())")[0][0]
        return live == len(self.nodes) and orphans == 0

    def _consumers_caught_up(self) -> bool:
        rows = self.query("SELECT p.partition, p.committed_end FROM partitions p "
                          "JOIN topics t USING (topic_id) WHERE t.name = %s AND t.deleted_at IS NULL",
                          (TOPIC,))
        read: dict[int, int] = {}
        for consumer in self.consumers:
            for partition, position in list(consumer.read_up_to.items()):
                read[partition] = max(read.get(partition, 0), position)
        return all(read.get(p, 0) >= end for p, end in rows if end > 0)

    def snapshot_postgres(self) -> None:
        """The leader-epoch cache and the writer of every committed range (for fenced acks)."""
        topic_id = self.query("SELECT topic_id FROM topics WHERE name = %s AND deleted_at IS NULL",
                              (TOPIC,), timeout=30)[0][0]
        epochs: dict[int, list] = {}
        for partition, leader_epoch, start in self.query(
                "SELECT partition, leader_epoch, start_offset FROM leader_epochs "
                "WHERE topic_id = %s ORDER BY partition, leader_epoch", (topic_id,), timeout=30):
            epochs.setdefault(partition, []).append([leader_epoch, start])
        for partition, entries in sorted(epochs.items()):
            self.history.record("pg_epochs", partition=partition, epochs=entries)
        for partition, base, last, key, node, node_epoch in self.query(
                "SELECT b.partition, b.base_offset, b.last_offset, b.object_key, w.node_id, "
                "w.node_epoch FROM batch_index b LEFT JOIN wal_objects w ON w.key = b.object_key "
                "WHERE b.topic_id = %s ORDER BY b.partition, b.base_offset", (topic_id,),
                timeout=60):
            self.history.record("pg_range", partition=partition, base=base, last=last,
                                node=node, node_epoch=node_epoch, key=key)
        for node_id, epoch in self.query("SELECT node_id, epoch FROM nodes ORDER BY node_id"):
            self.history.record("pg_node", node=node_id, epoch=epoch)
        for version, kind, body, at in self.query(
                "SELECT version, kind, body, at FROM change_log WHERE kind LIKE 'node%%' "
                "ORDER BY version", timeout=30):
            self.history.record("pg_change", version=version, kind=kind, body=body, at=str(at))

    # -- tear-down -------------------------------------------------------------------------------

    def _stop_nodes(self) -> None:
        for node in self.nodes.values():
            node.resume()
        for node in self.nodes.values():
            node.stop(timeout=10)

    def close(self) -> None:
        self._stop.set()
        for worker in self.workers + self.consumers:
            worker.stopping.set()
        errors = []
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception as exc:  # keep closing the rest
                errors.append(repr(exc))
                log.exception("closing failed")
        self._closers.clear()
        try:
            self.history.close()
        except Exception:
            pass
        if self.pg_clock is not None or self.node_clock is not None:
            remove_faketime_leftovers(self.started_at)
        logs = self.logs_dir
        for path in list(self.work_dir.glob("*.log")) + list(self.work_dir.glob("postgres/*.log")):
            shutil.copy(path, logs / path.name)
        if not self.keep_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)
