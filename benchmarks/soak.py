"""Soak: does a node stay bounded under constant load with short retention?

    .venv/bin/python -m benchmarks.soak [--minutes 20] [--stores file,s3] [--rate-kib 256]
                                        [--retention-s 60] [--sample-s 60] [--out DIR]

Per store, one `mink serve` subprocess on a fresh embedded PostgreSQL database (fsync off),
a topic of 3 partitions with `retention.ms` = --retention-s, a confluent-kafka producer at a
constant rate (1 KiB values, acks=all) and a consumer reading along. Every --sample-s it
records: bytes and objects in the object store, rows per metadata table, the database's
size, the node's RSS, the produce p99 of the interval, how far the consumer lags, and the
node's restart time (SIGTERM, start, until Metadata shows every partition led: the
producer retries through it). Lifecycle timings: retention checked every 5 s,
file.delete.delay.ms 10 s.

Verdict: over the second half of the run, each series may grow by at most 10% (its last
value against the value at the half-way sample; restart time and p99 compare medians of
the two quarters). Results: `<out>/soak-<stamp>.json`, a Markdown summary with the tables'
sizes at the start and the end, and one PNG per store if matplotlib is installed.
"""

from __future__ import annotations

import argparse
import datetime as dt
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
from typing import Any

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

from benchmarks.storage import BUCKET, S3_KEY, S3_REGION, Moto, _boto3_client  # noqa: E402
from mink.storage.embedded_postgres import EmbeddedPostgres, free_port  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
TABLES = ["batch_index", "wal_objects", "objects_to_delete", "unreferenced_objects",
          "change_log", "producer_state", "leader_epochs", "partition_stats", "wal_settled",
          "partitions", "topics"]
GROWING = 9  # the tables that could grow with history (the verdict's series)
TOPIC = "soak"
PARTITIONS = 3


class NodeProcess:
    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.address = env["MINK_LISTENER"]

    def start(self) -> float:
        """Start and wait until Metadata shows every partition of the topic led; seconds."""
        started = time.monotonic()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([str(REPO / ".venv/bin/mink"), "serve"], env=self.env,
                                     stdout=log, stderr=log, cwd=str(REPO))
        log.close()
        wait_ready(self.address, started + 120)
        return time.monotonic() - started

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def rss_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0


def wait_ready(address: str, deadline: float) -> None:
    from confluent_kafka.admin import AdminClient

    while time.monotonic() < deadline:
        try:
            admin = AdminClient({"bootstrap.servers": address, "socket.timeout.ms": 2000,
                                 "log_level": 0})
            topics = admin.list_topics(timeout=2).topics
            topic = topics.get(TOPIC)
            if topic is None or (topic.error is None and len(topic.partitions) == PARTITIONS
                                 and all(p.leader >= 0 and p.error is None
                                         for p in topic.partitions.values())):
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.1)
    raise RuntimeError(f"node at {address} not ready")


class Load:
    """A producer at a constant rate and a consumer reading along, in threads."""

    def __init__(self, address: str, rate_bytes: int) -> None:
        self.address = address
        self.rate_bytes = rate_bytes
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.produced = 0
        self.errors = 0
        self.consumed = 0
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def take_latencies(self) -> list[float]:
        with self.lock:
            out, self.latencies = self.latencies, []
        return out

    def _produce(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.address, "linger.ms": 5, "acks": "all",
                             "enable.idempotence": True, "message.timeout.ms": 120000,
                             "log_level": 0})  # quiet while the node restarts
        value = os.urandom(1024)
        per_tick = max(1, self.rate_bytes // 1024 // 20)  # 20 ticks a second
        tick = time.monotonic()
        while not self.stop.is_set():
            for _ in range(per_tick):
                sent = time.monotonic()

                def done(err, _msg, sent=sent):
                    with self.lock:
                        if err:
                            self.errors += 1
                        else:
                            self.produced += 1
                            self.latencies.append(time.monotonic() - sent)
                try:
                    producer.produce(TOPIC, value=value, on_delivery=done)
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            tick += 0.05
            time.sleep(max(0.0, tick - time.monotonic()))
        producer.flush(30)

    def _consume(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer({"bootstrap.servers": self.address, "group.id": "soak-reader",
                             "auto.offset.reset": "earliest", "enable.auto.commit": True,
                             "log_level": 0})
        consumer.subscribe([TOPIC])
        try:
            while not self.stop.is_set():
                msg = consumer.poll(0.5)
                if msg is not None and not msg.error():
                    self.consumed += 1
        finally:
            consumer.close()


def store_usage(store: str, root: Path | None, endpoint: str, prefix: str) -> tuple[int, int]:
    if store == "file":
        assert root is not None
        sizes = [p.stat().st_size for p in root.rglob("*") if p.is_file()]
        return sum(sizes), len(sizes)
    client = _boto3_client(endpoint)
    total = count = 0
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                     Prefix=prefix + "/"):
            for item in page.get("Contents", ()):
                total += item["Size"]
                count += 1
    finally:
        client.close()
    return total, count


def metadata_sizes(db_url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        out = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
        out["database_bytes"] = conn.execute(
            "SELECT pg_database_size(current_database())").fetchone()[0]
    return out


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(0.99 * len(values)))]


def run_store(store: str, args, tmp: Path, pg: EmbeddedPostgres, moto: Moto | None) -> dict:
    import psycopg

    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE soak_{store}")
    db_url = pg.url_for(f"soak_{store}")
    root = None
    env = dict(os.environ)
    port = free_port()
    env.update({"MINK_NODE_ID": "1", "MINK_LISTENER": f"127.0.0.1:{port}",
                "MINK_POSTGRES_URL": db_url, "MINK_LOG_LEVEL": "WARNING",
                "MINK_LEASE_TTL": "6", "MINK_COORDINATOR_TICK": "1",
                "MINK_LOG_RETENTION_CHECK_INTERVAL_MS": "5000",
                "MINK_FILE_DELETE_DELAY_MS": "10000", "MINK_NUM_PARTITIONS": str(PARTITIONS)})
    if store == "file":
        root = tmp / "objects"
        root.mkdir()
        env["MINK_OBJECT_STORE"] = root.as_uri()
    else:
        assert moto is not None
        env.update({"MINK_OBJECT_STORE": f"s3://{BUCKET}/soak", "MINK_S3_ENDPOINT_URL":
                    moto.endpoint, "MINK_S3_REGION": S3_REGION, "MINK_S3_ACCESS_KEY_ID": S3_KEY,
                    "MINK_S3_SECRET_ACCESS_KEY": S3_KEY})
    node = NodeProcess(env, tmp / f"node-{store}.log")
    node.start()
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": node.address})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config={
        "retention.ms": str(args.retention_s * 1000)})])[TOPIC].result(timeout=60)
    load = Load(node.address, args.rate_kib * 1024)
    load.start()
    samples = []
    started = time.monotonic()
    try:
        for i in range(1, int(args.minutes * 60 // args.sample_s) + 1):
            time.sleep(max(0.0, started + i * args.sample_s - time.monotonic()))
            latencies = load.take_latencies()
            stored_bytes, stored_objects = store_usage(store, root, moto.endpoint if moto else "",
                                                       "soak")
            sample = {"t_s": round(time.monotonic() - started, 1),
                      "store_bytes": stored_bytes, "store_objects": stored_objects,
                      **metadata_sizes(db_url), "rss_bytes": node.rss_bytes(),
                      "produce_p99_ms": None if not latencies else round(p99(latencies) * 1000, 1),
                      "produced": load.produced, "consumed": load.consumed,
                      "produce_errors": load.errors}
            node.stop()
            sample["restart_s"] = round(node.start(), 2)
            samples.append(sample)
            print(f"[{store}] {sample}", flush=True)
    finally:
        load.stop.set()
        for thread in load.threads:
            thread.join(timeout=60)
        node.stop()
    return {"store": store, "samples": samples, "verdict": verdict(samples)}


SERIES = ["store_bytes", "store_objects", *TABLES[:GROWING], "database_bytes", "rss_bytes",
          "produce_p99_ms", "restart_s"]


def verdict(samples: list[dict]) -> dict[str, Any]:
    """Growth over the second half: the last value against the half-way one (medians of the
    last and third quarters for the noisy p99 and restart time). At most 10%."""
    out: dict[str, Any] = {}
    n = len(samples)
    if n < 4:
        return {"note": "too few samples for a verdict"}
    half = n // 2
    for name in SERIES:
        values = [s[name] for s in samples if s.get(name) is not None]
        if len(values) < 4:
            continue
        if name in ("produce_p99_ms", "restart_s"):
            quarter = max(1, len(values) // 4)
            before = statistics.median(values[half - quarter:half])
            after = statistics.median(values[-quarter:])
        else:
            before, after = values[half - 1], values[-1]
        # small absolute values (a handful of rows) are noise, not growth
        floor = {"produce_p99_ms": 20, "restart_s": 0.5}.get(name, 50)
        growth = (after - before) / max(before, floor)
        out[name] = {"half": before, "end": after, "growth": round(growth, 3),
                     "ok": growth <= 0.10}
    return out


def write_report(report: dict, out: Path, stamp: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"soak-{stamp}.json").write_text(json.dumps(report, indent=2))
    lines = [f"# Soak {stamp}", "", f"command: `{report['command']}`", ""]
    for run in report["runs"]:
        samples = run["samples"]
        if not samples:
            continue
        first, last = samples[0], samples[-1]
        lines += [f"## {run['store']}", "", "| series | first sample | half | end | growth | ok |",
                  "| --- | ---: | ---: | ---: | ---: | --- |"]
        for name in SERIES:
            v = run["verdict"].get(name, {})
            lines.append(f"| {name} | {first.get(name)} | {v.get('half')} | {v.get('end')} | "
                         f"{v.get('growth')} | {v.get('ok')} |")
        lines += ["", f"produced {last['produced']}, consumed {last['consumed']}, "
                  f"produce errors {last['produce_errors']}", ""]
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, axes = plt.subplots(4, 4, figsize=(16, 12))
            t = [s["t_s"] / 60 for s in samples]
            for ax, name in zip(axes.flat, SERIES):
                ax.plot(t, [s.get(name) for s in samples], marker=".")
                ax.set_title(name)
                ax.set_xlabel("minutes")
            fig.tight_layout()
            png = out / f"soak-{stamp}-{run['store']}.png"
            fig.savefig(png)
            lines.append(f"![{run['store']}]({png.name})")
        except ImportError:
            lines.append("(no plots: matplotlib is not installed)")
        lines.append("")
    (out / f"soak-{stamp}.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--stores", default="file,s3")
    parser.add_argument("--rate-kib", type=int, default=256, help="produce rate, KiB/s")
    parser.add_argument("--retention-s", type=int, default=60)
    parser.add_argument("--sample-s", type=float, default=60)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    tmp = Path(tempfile.mkdtemp(prefix="mink-soak-"))
    pg = EmbeddedPostgres(tmp / "pg" / "data", durable=False)
    moto = None
    report: dict[str, Any] = {"command": " ".join(["python -m benchmarks.soak", *sys.argv[1:]]),
                              "runs": []}
    try:
        pg.start()
        for store in args.stores.split(","):
            if store == "s3" and moto is None:
                moto = Moto("process", tmp / "moto.log")
                moto.start()
                client = _boto3_client(moto.endpoint)
                client.create_bucket(Bucket=BUCKET)
                client.close()
            store_tmp = tmp / store
            store_tmp.mkdir()
            report["runs"].append(run_store(store, args, store_tmp, pg, moto))
    finally:
        if moto is not None:
            moto.stop()
        if pg.running():
            pg.stop("immediate")
        write_report(report, args.out, stamp)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"results: {args.out}/soak-{stamp}.md")


if __name__ == "__main__":
    main()
