"""Soak: does a node stay bounded under constant load with short retention?

    .venv/bin/python -m benchmarks.soak [--minutes 20] [--stores file,s3] [--rate-kib 256]
                                        [--retention-s 60] [--sample-s 10] [--restart-s 60]
                                        [--out DIR]
    .venv/bin/python -m benchmarks.soak --judge benchmarks/results/soak-<stamp>.json

Per store, one `mink serve` subprocess on a fresh embedded PostgreSQL database (fsync off),
a topic of 3 partitions with `retention.ms` = --retention-s, a confluent-kafka producer at a
constant rate (1 KiB values, acks=all) and a consumer reading along. Every --sample-s it
records: bytes and objects in the object store, rows per metadata table, the database's
size, the node's RSS and how many WAL objects were committed so far; every --restart-s also
the produce p99 of that interval and the node's restart time (SIGTERM, start, until Metadata
shows every partition led: the producer retries through it). Lifecycle timings: retention
checked every 5 s, file.delete.delay.ms 10 s, lease_ttl 15 s (--lease-ttl), a WAL flush
delay of 50 ms on both stores (--wal-max-delay-ms; see run_store), and a tiering delay of
20 s (--tiering-delay-ms): rows are tiered from 10 s old on, and those retention deletes
within the margin of a round (the larger of 10 s and twice the last round) are left to it,
so tiering runs all along. With the default 60 s and 60 s retention nothing would be tiered:
the data would be gone by the time it is due. Each sample also says where the store's bytes
are (WAL objects, indexed stream objects, uploads, queued or unknown; plotted, not judged).

Verdict (`verdict()`, a function of the recorded samples only, so `--judge` re-judges a saved
run without running it again): over the second half of the run, each series may grow by at
most 10%, growth being the trend of its second-half samples (a Theil-Sen line: the median
of the slopes between every two samples) extrapolated across the second half, relative
to the trend's value at the half-way point. Why a trend:
these series swing with retention and collection cycles (a retention step drops a minute of
rows at once, collection deletes in batches, the object rate follows the shared machine's
load), so "last value against half-way value" judges the phase of a swing, not growth. A
leak is a trend: a series growing steadily by 20% over the half has a trend of 20% and
fails, one swinging around a level has a trend near 0 and passes. A series counted in
objects or index rows may also pass by its window (the count divided by the node's object
rate, change_log's by the rate versions are written: see COUNTED), since those rates follow
the shared machine's load. The produce p99 is taken over messages sent at least
STEADY_AFTER_S after the node's last restart was ready, so a minute's p99 is not its
restart's (that one is kept as `produce_p99_restart_ms`, plotted, not judged).

Results: `<out>/soak-<stamp>.json` (every sample), a Markdown summary with the verdict and
the tables' sizes at the start and the end, and one PNG per store (a grid with one small plot
per series; needs matplotlib, the `bench` extra).
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
    import socket

    from confluent_kafka.admin import AdminClient

    # The listener first, by plain connects: a client that finds the port closed backs off
    # (librdkafka: 100 ms doubling), and a restart measured through it is rounded up by
    # its backoff, seconds at a time, instead of being the node's.
    host, port = address.rsplit(":", 1)
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            time.sleep(0.02)
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
        self.latencies: list[tuple[float, float]] = []  # (sent, latency)
        self.produced = 0
        self.errors = 0
        self.consumed = 0
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def take_latencies(self, steady_since: float) -> tuple[list[float], list[float]]:
        """The latencies since the last call: of messages sent from steady_since on, and of
        the rest (sent while the node restarted or just after)."""
        with self.lock:
            taken, self.latencies = self.latencies, []
        steady = [latency for sent, latency in taken if sent >= steady_since]
        restart = [latency for sent, latency in taken if sent < steady_since]
        return steady, restart

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
                            self.latencies.append((sent, time.monotonic() - sent))
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


def store_usage(store: str, root: Path | None, endpoint: str, prefix: str) -> dict[str, int]:
    """Every stored object's key (relative to the node's store root) and size."""
    if store == "file":
        assert root is not None
        return {p.relative_to(root).as_posix(): p.stat().st_size
                for p in root.rglob("*") if p.is_file()}
    client = _boto3_client(endpoint)
    sizes = {}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                     Prefix=prefix + "/"):
            for item in page.get("Contents", ()):
                sizes[item["Key"][len(prefix) + 1:]] = item["Size"]
    finally:
        client.close()
    return sizes


def store_breakdown(sizes: dict[str, int], db_url: str) -> dict[str, int]:
    """Where the store's bytes are, to tell a leak from a swing (plotted, not judged): WAL
    objects, stream objects the index points at, stream objects being written (an upload
    row), those on their way out (unreferenced or queued for deletion), and the rest:
    objects no table knows of (listed just before their row was written, or leaked)."""
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        indexed = {k for (k,) in conn.execute(
            "SELECT DISTINCT object_key FROM batch_index WHERE object_key NOT LIKE 'wal/%'")}
        uploading = {k for (k,) in conn.execute("SELECT key FROM stream_object_uploads")}
        # unreferenced (waiting out file.delete.delay.ms) or queued for deletion
        deleting = {k for (k,) in conn.execute(
            "SELECT key FROM objects_to_delete UNION SELECT key FROM unreferenced_objects")}
    out = {"store_wal_bytes": 0, "store_indexed_bytes": 0, "store_uploading_bytes": 0,
           "store_deleting_bytes": 0, "store_unknown_bytes": 0}
    for key, size in sizes.items():
        kind = ("wal" if key.startswith("wal/") else "indexed" if key in indexed
                else "uploading" if key in uploading else "deleting" if key in deleting
                else "unknown")
        out[f"store_{kind}_bytes"] += size
    return out


def metadata_sizes(db_url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        out = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
        out["database_bytes"] = conn.execute(
            "SELECT pg_database_size(current_database())").fetchone()[0]
        # the load's own measure, not a verdict series: WAL objects committed so far (a fresh
        # database, so the statistics' insert count is the run's), and how many of the
        # wal_objects rows still describe a stored object (the rest wait out the kept window)
        out["wal_objects_inserted"] = conn.execute(
            "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'wal_objects'"
        ).fetchone()[0]
        out["change_log_inserted"] = conn.execute(
            "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'change_log'"
        ).fetchone()[0]
        out["wal_objects_live"] = conn.execute(
            "SELECT count(*) FROM wal_objects WHERE gc_queued_at IS NULL").fetchone()[0]
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
                "MINK_POSTGRES_URL": db_url, "MINK_LOG_LEVEL": args.log_level,
                "MINK_LEASE_TTL": str(args.lease_ttl), "MINK_COORDINATOR_TICK": "1",
                "MINK_LOG_RETENTION_CHECK_INTERVAL_MS": "5000",
                "MINK_FILE_DELETE_DELAY_MS": "10000", "MINK_NUM_PARTITIONS": str(PARTITIONS),
                # the same flush delay on both stores (s3's default): with file://'s default
                # of 0 a flush starts when the last one ends, so the number of objects a
                # second (and every series counted in objects or index rows) follows how busy
                # the shared machine is, not the soak's constant load
                "MINK_WAL_MAX_DELAY_MS": str(args.wal_max_delay_ms),
                "MINK_TIERING_DELAY_MS": str(args.tiering_delay_ms)})
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
    ready_at = time.monotonic()
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": node.address})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config={
        "retention.ms": str(args.retention_s * 1000)})])[TOPIC].result(timeout=60)
    load = Load(node.address, args.rate_kib * 1024)
    load.start()
    samples = []
    started = time.monotonic()
    restart_every = max(1, round(args.restart_s / args.sample_s))
    try:
        for i in range(1, int(args.minutes * 60 // args.sample_s) + 1):
            time.sleep(max(0.0, started + i * args.sample_s - time.monotonic()))
            stored = store_usage(store, root, moto.endpoint if moto else "", "soak")
            sample = {"t_s": round(time.monotonic() - started, 1),
                      "store_bytes": sum(stored.values()), "store_objects": len(stored),
                      **store_breakdown(stored, db_url),
                      **metadata_sizes(db_url), "rss_bytes": node.rss_bytes(),
                      "produced": load.produced, "consumed": load.consumed,
                      "produce_errors": load.errors,
                      # the shared machine: its load and the node's self-fencings so far
                      # (membership not renewed in time), to tell a starved node from a leak
                      "loadavg_1m": round(os.getloadavg()[0], 2),
                      "node_fences": node.log_path.read_text(errors="replace").count(
                          "stops leading")}
            if i % restart_every == 0:
                steady, restart = load.take_latencies(ready_at + STEADY_AFTER_S)
                sample["produce_p99_ms"] = None if not steady else round(p99(steady) * 1000, 1)
                sample["produce_p99_restart_ms"] = (None if not restart
                                                    else round(p99(restart) * 1000, 1))
                node.stop()
                sample["restart_s"] = round(node.start(), 2)
                ready_at = time.monotonic()
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
# Plotted beside the verdict's series, not judged: the load itself.
LOAD_SERIES = ["wal_objects_live", "wal_objects_inserted", "change_log_inserted",
               "produce_p99_restart_ms", "consumed", "loadavg_1m",
               "node_fences", "store_wal_bytes", "store_indexed_bytes", "store_uploading_bytes",
               "store_deleting_bytes", "store_unknown_bytes"]
RATES = {"wal_objects_inserted": "WAL objects committed /s",
         "change_log_inserted": "versions written /s", "consumed": "consumed /s"}
MAX_GROWTH = 0.10
# The produce p99 counts messages sent this long after a restart was ready: the producer's
# backlog from the restart (sent while the node was down) has drained by then.
STEADY_AFTER_S = 10.0
# Below these levels a change is a handful of rows (or milliseconds), not growth: the
# growth is taken relative to at least this much.
FLOORS = {"produce_p99_ms": 20.0, "restart_s": 0.5}
DEFAULT_FLOOR = 50.0


def trend_growth(times: list[float], values: list[float], floor: float) -> tuple[float, float,
                                                                               float]:
    """The Theil-Sen line through (times, values): the median of the slopes between every
    two samples, through the median of the values less that slope. Returns its value at the
    first time, at the last, and the growth between them relative to max(first, floor).
    A least-squares line would do for steady swings, but one spike near the end (a
    collection batch caught in flight) tilts it; the median ignores a few spikes."""
    slopes = sorted((values[j] - values[i]) / (times[j] - times[i])
                    for i in range(len(times)) for j in range(i + 1, len(times))
                    if times[j] > times[i])
    slope = statistics.median(slopes) if slopes else 0.0
    offset = statistics.median(v - slope * t for t, v in zip(times, values))
    start, end = offset + slope * times[0], offset + slope * times[-1]
    return start, end, (end - start) / max(start, floor)


# Series counted in objects (or index rows, about a fixed number per object): by Little's
# law each is the object rate times how long an object stays, and only the second is what
# the lifecycle bounds. The object rate is the node's, not the soak's: it follows how fast
# the shared machine uploads and commits (see README). So each of these may also pass by
# its window: the series divided by the objects committed a second over the trailing time
# an object stays in it, judged by the same trend. A leak (objects or rows that stay) grows
# the window and fails both; a series that rose only because the node wrote more objects a
# second passes by its window. How long an object stays, with the soak's settings: in the
# store and the index, retention (60 s) + its check (5 s) + file.delete.delay.ms (10 s);
# unreferenced, the delay (10 s) + a collection tick; as a WAL decision, the store's time
# + the 300 s the decisions are kept (DECISIONS_KEPT_S).
# change_log counts views, not objects: its rows come at the rate versions are written
# (topics, leaders, memberships: each restart and each self-fencing adds some) and stay the
# 300 s the lifecycle keeps them (CHANGE_LOG_KEPT's newest 100 aside), plus a pruning tick.
COUNTED = {"store_objects": (75.0, "wal_objects_inserted"),
           "batch_index": (75.0, "wal_objects_inserted"),
           "wal_objects": (375.0, "wal_objects_inserted"),
           "unreferenced_objects": (15.0, "wal_objects_inserted"),
           "objects_to_delete": (15.0, "wal_objects_inserted"),
           "change_log": (330.0, "change_log_inserted")}


def object_rates(samples: list[dict], window_s: float,
                 inserted: str = "wal_objects_inserted") -> list[float | None]:
    """Per sample: rows of `inserted` (by default WAL objects committed) a second over the
    trailing window_s (None before a window's worth of samples, or when the run did not
    record them)."""
    rates: list[float | None] = []
    j = 0
    for s in samples:
        while samples[j]["t_s"] < s["t_s"] - window_s:
            j += 1
        rate = None
        older = samples[j - 1] if j > 0 else None
        if (older is not None and s.get(inserted) is not None
                and older.get(inserted) is not None):
            rate = (s[inserted] - older[inserted]) / (s["t_s"] - older["t_s"])
        rates.append(rate)
    return rates


def verdict(samples: list[dict]) -> dict[str, Any]:
    """Each series over the second half of the run (samples from half the last sample's time
    on): the Theil-Sen trend's growth across that half, at most MAX_GROWTH (or, for the
    COUNTED series, its window's: see above). Also its second half's range (min, max), so a
    reader sees how far it swings around the trend."""
    if not samples:
        return {"note": "no samples"}
    half_t = samples[-1]["t_s"] / 2
    out: dict[str, Any] = {}
    for name in SERIES:
        points = [(s["t_s"], s[name]) for s in samples
                  if s["t_s"] >= half_t and s.get(name) is not None]
        if len(points) < 4:
            out[name] = {"note": "fewer than 4 samples in the second half"}
            continue
        times, values = [p[0] for p in points], [float(p[1]) for p in points]
        start, end, growth = trend_growth(times, values, FLOORS.get(name, DEFAULT_FLOOR))
        judged = {"trend_half": round(start, 1), "trend_end": round(end, 1),
                  "min": min(values), "max": max(values), "growth": round(growth, 3),
                  "ok": growth <= MAX_GROWTH}
        window_s, inserted = COUNTED.get(name, (0.0, "wal_objects_inserted"))
        rates = object_rates(samples, window_s, inserted)
        windows = [(s["t_s"], s[name] / r) for s, r in zip(samples, rates)
                   if name in COUNTED and s["t_s"] >= half_t and s.get(name) is not None
                   and r is not None and r > 0]
        if len(windows) >= 4:
            mean_rate = sum(r for s, r in zip(samples, rates)
                            if s["t_s"] >= half_t and r) / len(windows)
            w_start, w_end, w_growth = trend_growth(
                [w[0] for w in windows], [w[1] for w in windows], DEFAULT_FLOOR / mean_rate)
            judged.update({"window_half_s": round(w_start, 1), "window_end_s": round(w_end, 1),
                           "window_growth": round(w_growth, 3),
                           "ok": growth <= MAX_GROWTH or w_growth <= MAX_GROWTH})
        out[name] = judged
    return out


def plot_run(run: dict, png: Path) -> bool:
    """One small plot per series (the verdict's, then the load's), its second-half trend
    line drawn over it. False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    samples = run["samples"]
    names = SERIES + LOAD_SERIES
    cols = 4
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows))
    half_t = samples[-1]["t_s"] / 2
    for ax, name in zip(axes.flat, names):
        points = [(s["t_s"] / 60, s[name]) for s in samples if s.get(name) is not None]
        if name in RATES:  # a running count: plot its rate between samples
            points = [(t1, (v1 - v0) / ((t1 - t0) * 60))
                      for (t0, v0), (t1, v1) in zip(points, points[1:]) if t1 > t0]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".",
                    markersize=3, linewidth=0.8)
        judged = run["verdict"].get(name, {})
        if "trend_half" in judged:
            ax.plot([half_t / 60, samples[-1]["t_s"] / 60],
                    [judged["trend_half"], judged["trend_end"]], color="red", linewidth=1.2)
            window = (f", window {judged['window_growth']:+.1%}"
                      if "window_growth" in judged else "")
            title = (f"{name}: {judged['growth']:+.1%}{window} "
                     f"{'ok' if judged['ok'] else 'FAIL'}")
        else:
            title = f"{RATES.get(name, name)} (load, not judged)" if name in LOAD_SERIES \
                else name
        ax.set_title(title, fontsize=9)
        ax.axvline(half_t / 60, color="grey", linewidth=0.6, linestyle="--")
        ax.set_xlabel("minutes", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"soak on {run['store']}: red = trend (Theil-Sen) over the second half",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)
    return True


def report_lines(report: dict, stamp: str, out: Path) -> list[str]:
    lines = [f"# Soak {stamp}", "", f"command: `{report['command']}`", ""]
    if report.get("note"):
        lines += [report["note"], ""]
    for run in report["runs"]:
        samples = run["samples"]
        if not samples:
            continue
        first, last = samples[0], samples[-1]
        judged = [v for v in run["verdict"].values() if isinstance(v, dict)]
        failed = [name for name, v in run["verdict"].items()
                  if isinstance(v, dict) and v.get("ok") is False]
        outcome = ("FAIL: " + ", ".join(failed) if failed
                   else "PASS" if judged and all("ok" in v for v in judged)
                   else "no verdict for every series")
        lines += [f"## {run['store']}: {outcome}", "",
                  f"{len(samples)} samples over {last['t_s'] / 60:.1f} minutes; growth = the "
                  f"trend (Theil-Sen) over the second half (from {last['t_s'] / 120:.1f} "
                  f"min), extrapolated across it, at most {MAX_GROWTH:.0%}.", "",
                  "Series counted in objects or index rows may pass by their window instead"
                  " (the series / WAL objects committed a second, change_log's / versions "
                  "written a second, over the trailing time a row stays in it: "
                  + ", ".join(f"{k} {v[0]:.0f} s" for k, v in COUNTED.items())
                  + "; the window is how long an object or a row stays).", "",
                  "| series | trend at half | trend at end | 2nd-half min | 2nd-half max "
                  "| growth | window at half, end (s) | window growth | ok |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for name in SERIES:
            v = run["verdict"].get(name, {})
            growth, w_growth = v.get("growth"), v.get("window_growth")
            window = (f"{v['window_half_s']}, {v['window_end_s']}" if w_growth is not None
                      else "")
            lines.append(f"| {name} | {v.get('trend_half', '')} | {v.get('trend_end', '')} | "
                         f"{v.get('min', '')} | {v.get('max', '')} | "
                         f"{'' if growth is None else f'{growth:+.1%}'} | {window} | "
                         f"{'' if w_growth is None else f'{w_growth:+.1%}'} | "
                         f"{v.get('ok', v.get('note', ''))} |")
        lines += ["", "Table sizes (rows) at the first and the last sample:", "",
                  f"| table | start ({first['t_s']:.0f} s) | end ({last['t_s']:.0f} s) |",
                  "| --- | ---: | ---: |"]
        for name in [*TABLES, "database_bytes", "store_objects", "store_bytes"]:
            lines.append(f"| {name} | {first.get(name)} | {last.get(name)} |")
        minutes = last["t_s"] / 60
        lines += ["", f"produced {last['produced']} ({last['produced'] / last['t_s']:.0f}/s), "
                  f"consumed {last['consumed']}, produce errors {last['produce_errors']}; "
                  f"WAL objects committed {last.get('wal_objects_inserted')} "
                  f"({(last.get('wal_objects_inserted') or 0) / last['t_s']:.1f}/s over "
                  f"{minutes:.1f} min)", ""]
        loads = [(s["t_s"], s["loadavg_1m"]) for s in samples if "loadavg_1m" in s]
        if loads:
            first_half = [v for t, v in loads if t < last["t_s"] / 2]
            second_half = [v for t, v in loads if t >= last["t_s"] / 2]
            lines += [f"The machine's 1-minute load average (2 cores, shared): median "
                      f"{statistics.median(first_half or [0]):.1f} in the first half, "
                      f"{statistics.median(second_half or [0]):.1f} in the second "
                      f"(range {min(v for _, v in loads):.1f} to {max(v for _, v in loads):.1f}"
                      f"); the node fenced itself {last.get('node_fences', 0)} times.", ""]
        png = out / f"soak-{stamp}-{run['store']}.png"
        if plot_run(run, png):
            lines.append(f"![{run['store']}]({png.name})")
        else:
            lines.append("(no plots: matplotlib is not installed; `pip install -e .[bench]`)")
        lines.append("")
    return lines


def write_report(report: dict, out: Path, stamp: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"soak-{stamp}.json").write_text(json.dumps(report, indent=2))
    (out / f"soak-{stamp}.md").write_text("\n".join(report_lines(report, stamp, out)))


def judge(path: Path) -> None:
    """Re-judge a saved run: the verdict, the Markdown and the plots from its samples."""
    report = json.loads(path.read_text())
    for run in report["runs"]:
        run["verdict"] = verdict(run["samples"])
    stamp = path.stem.removeprefix("soak-")
    write_report(report, path.parent, stamp)
    print(f"results: {path.parent}/soak-{stamp}.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--stores", default="file,s3")
    parser.add_argument("--rate-kib", type=int, default=256, help="produce rate, KiB/s")
    parser.add_argument("--retention-s", type=int, default=60)
    parser.add_argument("--sample-s", type=float, default=10,
                        help="seconds between samples of the sizes")
    parser.add_argument("--restart-s", type=float, default=60,
                        help="seconds between restarts (and produce p99 samples)")
    parser.add_argument("--lease-ttl", type=float, default=15,
                        help="the node's lease_ttl, s: a restart waits up to half of it for "
                        "the old incarnation's registration; too short and a node starved "
                        "by a busy machine fences itself")
    parser.add_argument("--wal-max-delay-ms", type=float, default=50,
                        help="the node's WAL flush delay on every store")
    parser.add_argument("--tiering-delay-ms", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--log-level", default="WARNING", help="the node's log level")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary folder (node logs, moto's log) and print it")
    parser.add_argument("--judge", type=Path, help="re-judge a saved soak-<stamp>.json")
    args = parser.parse_args()
    if args.judge:
        judge(args.judge)
        return
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
        if args.keep:
            print(f"kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"results: {args.out}/soak-{stamp}.md")


if __name__ == "__main__":
    main()
