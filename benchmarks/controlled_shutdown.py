"""Controlled shutdown: the time from SIGTERM to every partition of the stopped node led, and
open, on another node (issue 25), with and without the hand-over.

    .venv/bin/python -m benchmarks.controlled_shutdown [--partitions 24] [--repeat 3]
                                                       [--no-load] [--out DIR]

Three `mink serve` nodes with the default timing (lease_ttl 30 s, coordinator_tick 5 s) on
an embedded PostgreSQL (fsync off) and a file:// store; one topic of `--partitions`
partitions, spread, under an idempotent confluent-kafka producer (unless `--no-load`). Each
repetition stops a node (in turn) with SIGTERM, polls PostgreSQL every 5 ms until every
partition it led (the internal topics' too) is led by another node and open there at its new
leader epoch, waits for the process to exit, starts it again and rebalances. Two modes: the
controlled shutdown (the default), and `controlled_shutdown_timeout_ms=0` (the node leaves at
once; its partitions move at the coordinator's next tick). Reported: every time, the
medians, and the producer's delivery errors. Results: `results/controlled-shutdown-<ts>.*`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

import psycopg  # noqa: E402

from mink.storage.embedded_postgres import EmbeddedPostgres, free_port  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).with_name("results")

SQL_LED = """SELECT topic_id, partition FROM partitions p JOIN topics t USING (topic_id)
 WHERE t.deleted_at IS NULL AND leader_node = %s"""
SQL_NOT_WRITABLE_ELSEWHERE = """
SELECT count(*) FROM partitions p JOIN topics t USING (topic_id)
 WHERE t.deleted_at IS NULL
   AND (p.topic_id, p.partition) IN (SELECT * FROM unnest(%s::uuid[], %s::int[]))
   AND NOT (p.leader_node <> %s AND p.stream_state = 'open'
            AND p.opened_by_node = p.leader_node AND p.open_leader_epoch = p.leader_epoch)"""


class Node:
    def __init__(self, node_id: int, db_url: str, store: str, log_dir: Path, extra: dict):
        self.node_id = node_id
        self.address = f"127.0.0.1:{free_port()}"
        self.env = {**os.environ, "MINK_NODE_ID": str(node_id), "MINK_LISTENER": self.address,
                    "MINK_POSTGRES_URL": db_url, "MINK_OBJECT_STORE": store,
                    "MINK_LOG_LEVEL": "INFO",
                    **{f"MINK_{k.upper()}": str(v) for k, v in extra.items()}}
        self.log_path = log_dir / f"node-{node_id}.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "mink.cli", "serve"],
                                            env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        marker = f"listening for Kafka clients on {self.address}"
        while marker not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(self.log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


class Load:
    def __init__(self, bootstrap: str, topic: str):
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "linger.ms": 5, "topic.metadata.refresh.interval.ms": 1000})
        self.topic, self.acked, self.errors = topic, 0, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _delivered(self, err, msg):
        if err:
            self.errors.append(str(err))
        else:
            self.acked += 1

    def _run(self):
        i = 0
        while not self.stop.is_set():
            try:
                self.producer.produce(self.topic, key=b"%d" % i, value=b"v%08d" % i,
                                      on_delivery=self._delivered)
                i += 1
            except BufferError:
                pass
            self.producer.poll(0.002)
        self.producer.flush(60)

    def close(self):
        self.stop.set()
        self.thread.join(90)


def run_mode(pg: EmbeddedPostgres, tmp: Path, mode: str, args) -> dict:
    db = f"cs_{mode}"
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    db_url = pg.url_for(db)
    store = (tmp / f"objects-{mode}")
    store.mkdir()
    extra = {} if mode == "controlled" else {"controlled_shutdown_timeout_ms": 0}
    nodes = {i: Node(i, db_url, store.as_uri(), tmp, {**extra, "log_level": "INFO"})
             for i in (1, 2, 3)}
    conn = None
    load = None
    times, exits = [], []
    try:
        for node in nodes.values():
            node.start()
        conn = psycopg.connect(db_url, autocommit=True)
        wait_for(lambda: conn.execute("SELECT count(*) FROM nodes WHERE expires_at > now()")
                 .fetchone()[0] == 3, 60, "three live nodes")
        bootstrap = ",".join(n.address for n in nodes.values())
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("bench", args.partitions, 1)])["bench"].result(60)
        rebalance(db_url)
        if not args.no_load:
            load = Load(bootstrap, "bench")
            wait_for(lambda: load.acked > 1000, 60, "the producer going")
        for r in range(args.repeat):
            victim = nodes[1 + r % 3]
            led = conn.execute(SQL_LED, (victim.node_id,)).fetchall()
            keys = ([k[0] for k in led], [k[1] for k in led], victim.node_id)
            sent = time.monotonic()
            victim.process.send_signal(signal.SIGTERM)
            while conn.execute(SQL_NOT_WRITABLE_ELSEWHERE, keys).fetchone()[0]:
                if time.monotonic() - sent > 120:
                    raise RuntimeError("partitions not moved within 120 s")
                time.sleep(0.005)
            writable = time.monotonic() - sent
            victim.process.wait(60)
            exited = time.monotonic() - sent
            times.append(writable)
            exits.append(exited)
            print(f"{mode}: node {victim.node_id} ({len(led)} partitions): writable elsewhere "
                  f"after {writable:.3f} s, exited after {exited:.2f} s", flush=True)
            victim.start()
            wait_for(lambda: conn.execute(
                "SELECT count(*) FROM nodes WHERE expires_at > now()").fetchone()[0] == 3,
                60, "the node back")
            rebalance(db_url)
    finally:
        if load is not None:
            load.close()
        if conn is not None:
            conn.close()
        for node in nodes.values():
            node.stop()
    return {"mode": mode, "writable_s": times, "exit_s": exits,
            "median_writable_s": statistics.median(times),
            "max_writable_s": max(times), "median_exit_s": statistics.median(exits),
            "delivery_errors": len(load.errors) if load else None,
            "acked": load.acked if load else None}


def rebalance(db_url: str) -> None:
    out = subprocess.run([sys.executable, "-m", "mink.cli", "cluster", "rebalance",
                          "--postgres-url", db_url, "--timeout", "60"],
                         capture_output=True, text=True, timeout=90)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-load", action="store_true")
    parser.add_argument("--modes", default="controlled,at-once")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mink-cs-"))
    pg = EmbeddedPostgres(tmp / "pg" / "data", durable=False)
    runs = []
    try:
        pg.start()
        for mode in args.modes.split(","):
            runs.append(run_mode(pg, tmp, mode.replace("-", "_"), args))
    finally:
        if pg.running():
            pg.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"partitions": args.partitions, "repeat": args.repeat, "load": not args.no_load,
              "lease_ttl_s": 30, "coordinator_tick_s": 5, "runs": runs}
    (args.out / f"controlled-shutdown-{stamp}.json").write_text(json.dumps(result, indent=2))
    lines = [f"# Controlled shutdown, {stamp}", "",
             f"Three nodes, one topic of {args.partitions} partitions (plus the internal "
             f"topics), {'under an idempotent producer' if not args.no_load else 'no load'}; "
             "lease_ttl 30 s, coordinator_tick 5 s (the defaults). Time from SIGTERM to every "
             "partition of the stopped node led and open on another node.", "",
             "| mode | median writable elsewhere | max | median process exit | "
             "delivery errors |", "| --- | --- | --- | --- | --- |"]
    for run in runs:
        lines.append(f"| {run['mode']} | {run['median_writable_s']:.3f} s | "
                     f"{run['max_writable_s']:.3f} s | {run['median_exit_s']:.2f} s | "
                     f"{run['delivery_errors']} |")
    lines += ["", "Every time (s): " + "; ".join(
        f"{run['mode']}: " + ", ".join(f"{t:.3f}" for t in run["writable_s"]) for run in runs)]
    (args.out / f"controlled-shutdown-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
