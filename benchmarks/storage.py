"""Storage-layer benchmark: the WAL write path alone, without the Kafka protocol.

    .venv/bin/python -m benchmarks.storage [--quick] [--out DIR]

Per object store (file://, S3 on moto, and both behind a simulated 20 ms +- 10 ms network):

- throughput: N producers over N partitions, each with up to `in_flight` appends waiting for
  their ack (as librdkafka keeps five Produce requests in flight), 16-64 KiB batches of 1 KiB
  records, for a fixed time: MB/s, appends/s, WAL objects written, bytes per object;
- latency: an open-loop load at a steady rate (appends paced with trio.sleep_until, so slow
  acks never slow the offered load): ack latency p50/p99/p99.9 and the rate achieved.

"Ack latency" is the time from `PartitionLog.append()` to the moment the waiting task wakes
up with the append durable: uploaded to the object store and committed in PostgreSQL.

Everything runs in one process on trio (with trio_asyncio for psycopg and aiobotocore), like a
node: the load generator shares the event loop (and the GIL) with the storage code it measures.
PostgreSQL is a fresh embedded server; moto runs in a child process by default (`--moto thread`
runs it in this process, as the tests do, where its request handling competes for the GIL).
Results go to `<out>/storage-<timestamp>.json` and a Markdown summary next to it. See
benchmarks/README.md for what every figure means.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import logging
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import trio
import trio_asyncio

# pgserver's platformdirs warns once about XDG_RUNTIME_DIR on import; it means nothing here.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

from mink.protocol.records import Record, build_batch
from mink.storage.embedded_postgres import EmbeddedPostgres
from mink.storage.log import LogError
from mink.storage.controlplane import MetadataStore
from mink.storage.objectstore import LatencyObjectStore, open_object_store
from mink.storage.objectstore.base import as_buffers
from mink.storage.streams import Streams

log = logging.getLogger("benchmarks.storage")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
MB = 1_000_000  # throughput figures are in MB = 10^6 bytes; batch sizes in KiB
KIB = 1024
MIB = 1024 * 1024
BUCKET = "mink-bench"
S3_REGION = "us-east-1"
S3_KEY = "testing"  # moto's dummy credentials; never a real service's

# -- configuration ---------------------------------------------------------------------------


@dataclass
class WalSettings:
    """What a node would use for the store's scheme (mink.broker.config + DESIGN write path)."""

    wal_max_bytes: int
    wal_max_delay: float  # seconds
    wal_max_uploads: int
    commit_timeout: float = 10.0


WAL_BY_SCHEME = {
    "file": WalSettings(wal_max_bytes=8 * MIB, wal_max_delay=0.0, wal_max_uploads=1),
    "s3": WalSettings(wal_max_bytes=8 * MIB, wal_max_delay=0.05, wal_max_uploads=4),
}


@dataclass
class StoreSpec:
    name: str
    scheme: str  # "file" | "s3"
    latency: bool  # wrapped in LatencyObjectStore(mean, jitter)


STORES = [
    StoreSpec("file", "file", False),
    StoreSpec("s3-moto", "s3", False),
    StoreSpec("file+20ms", "file", True),
    StoreSpec("s3-moto+20ms", "s3", True),
]
SCENARIOS = ("throughput", "latency")


@dataclass
class BenchConfig:
    quick: bool
    partitions: int = 8
    producers: int = 8  # one trio task per partition
    in_flight: int = 5  # appends waiting for their ack, per producer
    record_bytes: int = 1024
    batch_records_min: int = 16  # 16-64 records of 1 KiB: 16-64 KiB batches
    batch_records_max: int = 64
    throughput_duration: float = 10.0
    latency_duration: float = 15.0
    latency_rate_mb_s: float = 5.0
    latency_batch_records: int = 64  # 64 KiB batches
    warmup_rounds: int = 3  # appends per partition, awaited one by one, before measuring
    simulated_latency_s: float = 0.020
    simulated_jitter_s: float = 0.010
    append_timeout: float = 60.0
    file_fsync: bool = True  # as a node runs file://
    postgres_durable: bool = False  # fsync=off: commit cost without the disk flush
    moto_mode: str = "process"
    seed: int = 1
    wal: dict[str, WalSettings] = field(
        default_factory=lambda: {k: replace(v) for k, v in WAL_BY_SCHEME.items()})


# -- helpers ---------------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summary_ms(values: list[float]) -> dict[str, Any]:
    """Percentiles of durations given in seconds, in milliseconds."""
    data = sorted(values)
    if not data:
        return {"n": 0}

    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 3)

    return {
        "n": len(data),
        "mean_ms": ms(sum(data) / len(data)),
        "min_ms": ms(data[0]),
        "p50_ms": ms(percentile(data, 50)),
        "p90_ms": ms(percentile(data, 90)),
        "p99_ms": ms(percentile(data, 99)),
        "p999_ms": ms(percentile(data, 99.9)),
        "max_ms": ms(data[-1]),
    }


@dataclass
class Template:
    data: bytes
    count: int
    max_timestamp: int


def make_templates(record_bytes: int, counts: list[int], rng: random.Random) -> list[Template]:
    """Pre-built batches: building one costs far more than appending it. Each append copies
    its template into a fresh bytearray (the append patches offsets in place), like a broker
    receiving a request buffer."""
    ts = 1_700_000_000_000
    out = []
    for n in counts:
        records = [Record(i, 0, None, rng.randbytes(record_bytes)) for i in range(n)]
        out.append(Template(bytes(build_batch(records, base_timestamp=ts)), n, ts))
    return out


class CountingStore:
    """Counts and times the WAL's uploads; everything else passes through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reset()

    def reset(self) -> None:
        self.creates = 0
        self.create_bytes = 0
        self.create_times: list[float] = []
        self.create_sizes: list[int] = []

    async def create(self, key: str, data: Any) -> None:
        size = sum(b.nbytes for b in as_buffers(data))
        started = trio.current_time()
        await self.inner.create(key, data)
        self.create_times.append(trio.current_time() - started)
        self.creates += 1
        self.create_bytes += size
        self.create_sizes.append(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TimedMetadata:
    """Times CommitWal and counts the objects per call; everything else passes through."""

    def __init__(self, inner: MetadataStore) -> None:
        self.inner = inner
        self.reset()

    def reset(self) -> None:
        self.commit_times: list[float] = []
        self.commit_objects: list[int] = []

    async def commit_wal(self, node_id: int, node_epoch: int, objects: Any) -> Any:
        started = trio.current_time()
        result = await self.inner.commit_wal(node_id, node_epoch, objects)
        self.commit_times.append(trio.current_time() - started)
        self.commit_objects.append(len(objects))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class AckStats:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.acked_bytes = 0
        self.sent = 0
        self.sent_bytes = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.first_sent: float | None = None
        self.last_ack: float | None = None

    async def wait(self, pending: Any, sent_at: float, size: int, timeout: float,
                   release: trio.Semaphore | None = None) -> None:
        try:
            await pending.wait(timeout)
            now = trio.current_time()
            self.latencies.append(now - sent_at)
            self.acked_bytes += size
            self.last_ack = now
        except LogError as exc:
            self.errors[type(exc).__name__] += 1
        finally:
            if release is not None:
                release.release()


# -- CPU accounting --------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return 0.0
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def _children(ppid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            if int(text[text.rfind(")") + 2 :].split()[1]) == ppid:
                out.append(int(entry))
    return out


def _machine_cpu() -> tuple[float, float, float, float]:
    """busy, total, iowait and steal seconds of all CPUs since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return (total - idle) / _TICK, total / _TICK, values[4] / _TICK, values[7] / _TICK


class CpuMeter:
    """CPU seconds of this process (all threads), of PostgreSQL (postmaster and backends), of
    a moto child process, and of the whole machine, between two snapshots."""

    def __init__(self, postgres_pid: int | None, moto_pid: int | None) -> None:
        self.postgres_pid = postgres_pid
        self.moto_pid = moto_pid

    def snapshot(self) -> dict[str, float]:
        busy, total, iowait, steal = _machine_cpu()
        times = os.times()
        snap = {"wall": time.monotonic(), "self": times.user + times.system,
                "self_user": times.user, "self_sys": times.system, "machine_busy": busy,
                "machine_total": total, "machine_iowait": iowait, "machine_steal": steal}
        if self.postgres_pid:
            snap["postgres"] = sum(_proc_cpu_s(p) for p in
                                   [self.postgres_pid, *_children(self.postgres_pid)])
        if self.moto_pid:
            snap["moto"] = _proc_cpu_s(self.moto_pid)
        return snap

    @staticmethod
    def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        """Percent of one core for processes; percent of all cores for the machine."""
        wall = b["wall"] - a["wall"]
        out = {"wall_s": round(wall, 3)}
        for key in ("self", "self_user", "self_sys", "postgres", "moto"):
            if key in a and key in b:
                out[f"{key}_cpu_pct"] = round(100 * (b[key] - a[key]) / wall, 1)
        total = b["machine_total"] - a["machine_total"]
        if total > 0:
            for key in ("busy", "iowait", "steal"):
                out[f"machine_{key}_pct"] = round(
                    100 * (b[f"machine_{key}"] - a[f"machine_{key}"]) / total, 1)
            # Everything else on the machine, in percent of one core: other sessions or
            # neighbours sharing these cores make a run noisy.
            busy_cores_pct = 100 * (b["machine_busy"] - a["machine_busy"]) / wall
            ours = sum(out.get(f"{k}_cpu_pct", 0.0) for k in ("self", "postgres", "moto"))
            out["other_cpu_pct"] = round(max(0.0, busy_cores_pct - ours), 1)
        return out


# -- environment: PostgreSQL, moto, stores ---------------------------------------------------

_MOTO_CHILD = """
import logging, sys
logging.getLogger("werkzeug").setLevel(logging.WARNING)
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
print(f"http://{host}:{port}", flush=True)
sys.stdin.read()  # until the parent closes our stdin
server.stop()
"""


class Moto:
    """moto's S3 server on a free loopback port, in a child process or in a thread here."""

    def __init__(self, mode: str, log_path: Path) -> None:
        self.mode = mode
        self.log_path = log_path
        self.endpoint = ""
        self.pid: int | None = None
        self._proc: subprocess.Popen | None = None
        self._server: Any = None
        self._log_file: Any = None

    def start(self) -> None:
        if self.mode == "thread":
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.WARNING)
            self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self._server.start()
            host, port = self._server.get_host_and_port()
            self.endpoint = f"http://{host}:{port}"
        else:
            self._log_file = open(self.log_path, "wb")
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _MOTO_CHILD], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self._log_file, env={**os.environ, **_s3_env()})
            self.pid = self._proc.pid
            assert self._proc.stdout is not None
            line = self._proc.stdout.readline().decode().strip()
            if not line.startswith("http://"):
                raise RuntimeError(f"moto did not start; see {self.log_path}")
            self.endpoint = line
        deadline = time.monotonic() + 30
        while True:  # ready when it answers HTTP
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=2).read()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._proc is not None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except Exception:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def _s3_env() -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_KEY,
            "AWS_DEFAULT_REGION": S3_REGION, "AWS_REGION": S3_REGION}


def _boto3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name=S3_REGION,
                        aws_access_key_id=S3_KEY, aws_secret_access_key=S3_KEY)


def _empty_prefix(endpoint: str, prefix: str) -> int:
    """Delete what one run wrote to moto (it keeps objects in memory or temp files)."""
    client = _boto3_client(endpoint)
    deleted = 0
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", ())]
            if keys:
                client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys, "Quiet": True})
                deleted += len(keys)
    finally:
        client.close()
    return deleted


@dataclass
class Env:
    config: BenchConfig
    tmp: Path
    postgres: EmbeddedPostgres
    moto: Moto
    metadata: MetadataStore
    cpu: CpuMeter


# -- scenarios -------------------------------------------------------------------------------


async def throughput(cfg: BenchConfig, streams: Streams, logs: list, templates: list[Template],
                     rng: random.Random) -> dict[str, Any]:
    """Closed loop: every producer keeps `in_flight` appends waiting, for a fixed time."""
    stats = AckStats()
    deadline_box: list[float] = []

    async def producer(index: int, nursery: trio.Nursery) -> None:
        window = trio.Semaphore(cfg.in_flight)
        log_ = logs[index % len(logs)]
        while True:
            await window.acquire()
            if trio.current_time() >= deadline_box[0]:
                window.release()
                return
            await streams.wal.wait_for_room()  # the WAL's back-pressure, as a node applies it
            template = templates[rng.randrange(len(templates))]
            data = bytearray(template.data)
            sent_at = trio.current_time()
            pending = log_.append(data, [template.count], template.max_timestamp)
            stats.sent += 1
            stats.sent_bytes += len(data)
            nursery.start_soon(stats.wait, pending, sent_at, len(data), cfg.append_timeout,
                               window)

    started = trio.current_time()
    deadline_box.append(started + cfg.throughput_duration)
    stats.first_sent = started
    async with trio.open_nursery() as nursery:
        for i in range(cfg.producers):
            nursery.start_soon(producer, i, nursery)
    finished = trio.current_time()
    elapsed = (stats.last_ack or finished) - started
    return {
        "duration_s": round(elapsed, 3),
        "appends": len(stats.latencies),
        "sent": stats.sent,
        "errors": dict(stats.errors),
        "acked_bytes": stats.acked_bytes,
        "mb_per_s": round(stats.acked_bytes / MB / elapsed, 2),
        "appends_per_s": round(len(stats.latencies) / elapsed, 1),
        "records_per_s": None,  # filled in by the caller (needs the records per byte)
        "mean_batch_bytes": round(stats.acked_bytes / max(1, len(stats.latencies))),
        "ack_latency": summary_ms(stats.latencies),
    }


async def latency(cfg: BenchConfig, streams: Streams, logs: list, template: Template
                  ) -> dict[str, Any]:
    """Open loop: appends at a fixed interval whatever the acks do, round-robin over the
    partitions. Lateness of a send against its schedule is reported as `schedule_lag`."""
    stats = AckStats()
    size = len(template.data)
    interval = size / (cfg.latency_rate_mb_s * MB)
    lags: list[float] = []
    room_waits = 0
    started = trio.current_time() + 0.01
    end = started + cfg.latency_duration
    async with trio.open_nursery() as nursery:
        i = 0
        while True:
            scheduled = started + i * interval
            if scheduled >= end:
                break
            await trio.sleep_until(scheduled)
            if streams.wal._unflushed_bytes >= streams.wal.max_buffered_bytes:
                room_waits += 1
            await streams.wal.wait_for_room()
            now = trio.current_time()
            lags.append(now - scheduled)
            data = bytearray(template.data)
            pending = logs[i % len(logs)].append(data, [template.count], template.max_timestamp)
            stats.sent += 1
            stats.sent_bytes += size
            nursery.start_soon(stats.wait, pending, now, size, cfg.append_timeout)
            i += 1
        send_end = trio.current_time()
    drained = trio.current_time()
    send_window = send_end - started
    return {
        "duration_s": round(send_window, 3),
        "drain_s": round(drained - send_end, 3),
        "batch_bytes": size,
        "interval_ms": round(interval * 1000, 3),
        "offered_mb_per_s": cfg.latency_rate_mb_s,
        "sent_mb_per_s": round(stats.sent_bytes / MB / send_window, 2),
        "achieved_mb_per_s": round(stats.acked_bytes / MB / max(1e-9, drained - started), 2),
        "appends": len(stats.latencies),
        "sent": stats.sent,
        "errors": dict(stats.errors),
        "room_waits": room_waits,
        "ack_latency": summary_ms(stats.latencies),
        "schedule_lag": summary_ms(lags),
    }


async def run_case(env: Env, spec: StoreSpec, scenario: str, case_no: int) -> dict[str, Any]:
    cfg = env.config
    wal = cfg.wal[spec.scheme]
    rng = random.Random(cfg.seed + case_no)
    run_dir: Path | None = None
    s3_prefix = f"run-{case_no:02d}-{spec.name}-{scenario}"
    if spec.scheme == "file":
        run_dir = env.tmp / "objects" / f"{case_no:02d}-{spec.name}-{scenario}"
        run_dir.mkdir(parents=True)
        url = run_dir.as_uri() + ("" if cfg.file_fsync else "?fsync=false")
        inner = open_object_store(url)
    else:
        inner = open_object_store(
            f"s3://{BUCKET}/{s3_prefix}", endpoint_url=env.moto.endpoint, region=S3_REGION,
            access_key_id=S3_KEY, secret_access_key=S3_KEY)
    await inner.check()
    store = inner
    if spec.latency:
        store = LatencyObjectStore(inner, cfg.simulated_latency_s, cfg.simulated_jitter_s,
                                   rng=random.Random(cfg.seed * 7919 + case_no))
    objects = CountingStore(store)
    metadata = TimedMetadata(env.metadata)
    node_id = 100 + case_no
    epoch = await env.metadata.register_node(node_id, "127.0.0.1", 19000 + node_id, ttl_s=3600)
    # Creating a topic is a coordinator action: fenced by the coordinator lease, taken here.
    lease = await env.metadata.acquire_lease("coordinator", node_id, epoch, ttl_s=60)
    assert lease is not None, "another process holds the coordinator lease"
    topic = await env.metadata.create_topic(f"bench-{case_no:02d}-{spec.name}-{scenario}",
                                            cfg.partitions, {}, [node_id] * cfg.partitions,
                                            coordinator_epoch=lease)
    await env.metadata.release_lease("coordinator", node_id, lease)
    streams = Streams(node_id, epoch, objects, metadata, wal_max_bytes=wal.wal_max_bytes,
                      wal_max_delay=wal.wal_max_delay, wal_max_uploads=wal.wal_max_uploads,
                      commit_timeout=wal.commit_timeout)
    if scenario == "throughput":
        step = 8
        counts = list(range(cfg.batch_records_min, cfg.batch_records_max + 1, step))
    else:
        counts = [cfg.latency_batch_records]
    templates = make_templates(cfg.record_bytes, counts, rng)
    result: dict[str, Any] = {"store": spec.name, "scenario": scenario,
                              "wal": asdict(wal), "object_store": repr(store)}
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(streams.run)
            logs = [await streams.open(topic.topic_id, p, 0) for p in range(cfg.partitions)]
            for _ in range(cfg.warmup_rounds):  # connections, first directories, caches
                waits = [lg.append(bytearray(templates[0].data), [templates[0].count],
                                   templates[0].max_timestamp) for lg in logs]
                for pending in waits:
                    await pending.wait(cfg.append_timeout)
            objects.reset()
            metadata.reset()
            before = env.cpu.snapshot()
            if scenario == "throughput":
                figures = await throughput(cfg, streams, logs, templates, rng)
                records = sum(t.count for t in templates) / len(templates)
                per_record = sum(len(t.data) for t in templates) / len(templates) / records
                figures["records_per_s"] = round(figures["mb_per_s"] * MB / per_record)
            else:
                figures = await latency(cfg, streams, logs, templates[0])
            after = env.cpu.snapshot()
            nursery.cancel_scope.cancel()
        result.update(figures)
        result["cpu"] = CpuMeter.delta(before, after)
        result["objects"] = objects.creates
        result["objects_per_s"] = round(objects.creates / figures["duration_s"], 1)
        result["object_bytes_total"] = objects.create_bytes
        result["bytes_per_object"] = round(objects.create_bytes / max(1, objects.creates))
        sizes = sorted(objects.create_sizes)
        result["object_size_kib"] = {
            "min": round(sizes[0] / KIB) if sizes else None,
            "p50": round(percentile(sizes, 50) / KIB) if sizes else None,
            "max": round(sizes[-1] / KIB) if sizes else None}
        result["upload_time"] = summary_ms(objects.create_times)
        result["commits"] = len(metadata.commit_times)
        result["objects_per_commit"] = round(
            sum(metadata.commit_objects) / max(1, len(metadata.commit_objects)), 2)
        result["commit_time"] = summary_ms(metadata.commit_times)
        # Derived: what an ack waits besides its upload and its commit, on average (the
        # buffer filling up to wal_max_delay, queueing for an upload slot or the commit loop).
        if result["ack_latency"].get("n") and objects.create_times and metadata.commit_times:
            result["other_wait_mean_ms"] = round(
                result["ack_latency"]["mean_ms"] - result["upload_time"]["mean_ms"]
                - result["commit_time"]["mean_ms"], 3)
        if spec.latency:
            result["simulated_requests"] = dict(store.counts)
    finally:
        # Also when interrupted; bounded, since the run's own clean-up removes everything.
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            await inner.aclose()
            if run_dir is not None:
                await trio.to_thread.run_sync(lambda: shutil.rmtree(run_dir, ignore_errors=True))
            else:
                await trio.to_thread.run_sync(_empty_prefix, env.moto.endpoint, s3_prefix + "/")
            # Write back what this case left dirty now, not during the next case's measurement.
            await trio.to_thread.run_sync(os.sync)
    return result


# -- reporting -------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _cpu_cell(cpu: dict[str, float]) -> str:
    return "/".join(_fmt(cpu.get(k), 0) for k in ("self_cpu_pct", "postgres_cpu_pct",
                                                   "moto_cpu_pct", "other_cpu_pct"))


def throughput_table(results: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = ["store", "MB/s", "appends/s", "objects", "objects/s", "KiB/obj avg/max", "objs/commit",
            "ack p50 ms", "ack p99 ms", "upload p50 ms", "commit p50 ms", "cpu self/pg/moto/other %",
            "errors"]
    rows = []
    for r in results:
        if r["scenario"] != "throughput":
            continue
        cpu = r["cpu"]
        rows.append([
            r["store"], _fmt(r["mb_per_s"]), _fmt(r["appends_per_s"], 0), str(r["objects"]),
            _fmt(r["objects_per_s"]),
            f"{r['bytes_per_object'] / KIB:.0f}/{_fmt(r['object_size_kib']['max'])}",
            _fmt(r["objects_per_commit"], 2),
            _fmt(r["ack_latency"].get("p50_ms")), _fmt(r["ack_latency"].get("p99_ms")),
            _fmt(r["upload_time"].get("p50_ms")), _fmt(r["commit_time"].get("p50_ms")),
            _cpu_cell(cpu),
            str(sum(r["errors"].values())),
        ])
    return head, rows


def latency_table(results: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = ["store", "offered MB/s", "achieved MB/s", "appends", "p50 ms", "p99 ms",
            "p99.9 ms", "max ms", "objects", "KiB/object", "upload mean ms", "commit mean ms",
            "other wait mean ms", "lag p99 ms", "cpu self/pg/moto/other %", "errors"]
    rows = []
    for r in results:
        if r["scenario"] != "latency":
            continue
        lat, cpu = r["ack_latency"], r["cpu"]
        rows.append([
            r["store"], _fmt(r["offered_mb_per_s"]), _fmt(r["achieved_mb_per_s"], 2),
            str(r["appends"]), _fmt(lat.get("p50_ms")), _fmt(lat.get("p99_ms")),
            _fmt(lat.get("p999_ms")), _fmt(lat.get("max_ms")), str(r["objects"]),
            _fmt(r["bytes_per_object"] / KIB, 0), _fmt(r["upload_time"].get("mean_ms")),
            _fmt(r["commit_time"].get("mean_ms")), _fmt(r.get("other_wait_mean_ms")),
            _fmt(r["schedule_lag"].get("p99_ms"), 2),
            _cpu_cell(cpu),
            str(sum(r["errors"].values())),
        ])
    return head, rows


def text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(r, widths))) for r in rows]
    return "\n".join(lines)


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "nproc_usable": len(os.sched_getaffinity(0)),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["memory_mib"] = int(line.split()[1]) // 1024
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    for key, args in (("git_commit", ["rev-parse", "--short", "HEAD"]),
                      ("git_dirty", ["status", "--porcelain", "--untracked-files=no"])):
        try:
            out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                 timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = None
        info[key] = out if key == "git_commit" else bool(out)
    try:
        info["git_untracked_under_mink"] = subprocess.run(
            ["git", "ls-files", "--others", "--exclude-standard", "mink"], cwd=REPO,
            capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


NOISY_OTHER_PCT = 25.0


def noisy_cases(results: list[dict]) -> list[str]:
    """Cases during which something else used a quarter of a core or more."""
    return [f"{r['store']} {r['scenario']} ({r['cpu']['other_cpu_pct']:.0f}%)" for r in results
            if r.get("cpu", {}).get("other_cpu_pct", 0.0) >= NOISY_OTHER_PCT]


def write_reports(out_dir: Path, stamp: str, report: dict[str, Any]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"storage-{stamp}.json"
    md_path = out_dir / f"storage-{stamp}.md"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    cfg, machine = report["config"], report["machine"]
    results = report["results"]
    md = [f"# Mink storage benchmark, {report['started_at']}", ""]
    md.append(f"`{report['command']}`, {report['mode']} mode, {report['total_seconds']:.0f} s "
              f"in all. Raw figures: `{json_path.name}`.")
    md.append("")
    if report.get("interrupted"):
        md.append("**Interrupted**: partial results.")
        md.append("")
    md.append(f"Machine: {machine.get('nproc')} CPUs ({machine.get('cpu_model', '?')}), "
              f"{machine.get('memory_mib')} MiB, Python {machine['python']}, git "
              f"{machine.get('git_commit')}{' (dirty)' if machine.get('git_dirty') else ''}"
              + (f", {len(machine['git_untracked_under_mink'])} untracked files under mink/"
                 if machine.get("git_untracked_under_mink") else "") + ".")
    md.append("")
    md.append("## Throughput (closed loop)")
    md.append("")
    md.append(f"{cfg['producers']} producers over {cfg['partitions']} partitions, up to "
              f"{cfg['in_flight']} appends in flight each, batches of "
              f"{cfg['batch_records_min']}-{cfg['batch_records_max']} records of "
              f"{cfg['record_bytes']} B, {cfg['throughput_duration']:g} s per store. "
              "MB = 10^6 bytes of record batches acknowledged.")
    md.append("")
    md.append(markdown_table(*throughput_table(results)))
    md.append("")
    md.append("## Ack latency at a steady rate (open loop)")
    md.append("")
    md.append(f"{cfg['latency_rate_mb_s']:g} MB/s offered in batches of "
              f"{cfg['latency_batch_records']} records of {cfg['record_bytes']} B, paced with "
              f"trio.sleep_until, round-robin over the partitions, "
              f"{cfg['latency_duration']:g} s per store.")
    md.append("")
    md.append(markdown_table(*latency_table(results)))
    md.append("")
    noisy = noisy_cases(results)
    if noisy:
        md.append(f"**Noisy run**: other processes used {NOISY_OTHER_PCT:g}% of a core or more "
                  f"during {', '.join(noisy)}.")
        md.append("")
    md.append("## Settings")
    md.append("")
    for scheme, wal in cfg["wal"].items():
        md.append(f"- `{scheme}`: wal_max_bytes {wal['wal_max_bytes'] // MIB} MiB, wal_max_delay "
                  f"{wal['wal_max_delay'] * 1000:g} ms, wal_max_uploads {wal['wal_max_uploads']}")
    md.append(f"- file:// fsync: {cfg['file_fsync']}; PostgreSQL durable (fsync): "
              f"{cfg['postgres_durable']}; moto: {cfg['moto_mode']}; simulated network: "
              f"{cfg['simulated_latency_s'] * 1000:g} ms +- {cfg['simulated_jitter_s'] * 1000:g} ms "
              "per request")
    md.append("- cpu: percent of one core (user + system, all threads) used by this process "
              "(load generator included), by PostgreSQL, by moto (when in a child process) and "
              "by everything else on the machine (other: other processes and kernel threads such "
              "as page writeback; high values mean a noisy run) during the measured window; "
              "the JSON splits user and system time and has iowait and steal.")
    md.append("")
    md_path.write_text("\n".join(md))
    return json_path, md_path


# -- main ------------------------------------------------------------------------------------


async def _cancel_on_signal(scope: trio.CancelScope, interrupted: list[int]) -> None:
    """Ctrl-C or SIGTERM: cancel the run, so that everything is cleaned up in order."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            interrupted.append(signum)
            scope.cancel()


async def bench(env_args: dict[str, Any], cfg: BenchConfig, stores: list[StoreSpec],
                scenarios: list[str], results: list[dict[str, Any]],
                interrupted: list[int]) -> None:
    postgres: EmbeddedPostgres = env_args["postgres"]
    moto: Moto = env_args["moto"]
    async with trio_asyncio.open_loop():
        metadata = await MetadataStore.open(postgres.url)
        try:
            pid_file = postgres.data_dir / "postmaster.pid"
            pg_pid = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
            env = Env(cfg, env_args["tmp"], postgres, moto, metadata, CpuMeter(pg_pid, moto.pid))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_signal, nursery.cancel_scope, interrupted)
                case_no = 0
                for spec in stores:
                    for scenario in scenarios:
                        case_no += 1
                        print(f"  {spec.name:<14} {scenario:<10} ...", end="", flush=True)
                        started = time.monotonic()
                        result = await run_case(env, spec, scenario, case_no)
                        result["case_seconds"] = round(time.monotonic() - started, 2)
                        results.append(result)
                        if scenario == "throughput":
                            print(f" {result['mb_per_s']:7.1f} MB/s, ack p99 "
                                  f"{result['ack_latency'].get('p99_ms')} ms "
                                  f"({result['case_seconds']:.1f} s)", flush=True)
                        else:
                            print(f" ack p50 {result['ack_latency'].get('p50_ms')} ms, p99 "
                                  f"{result['ack_latency'].get('p99_ms')} ms "
                                  f"({result['case_seconds']:.1f} s)", flush=True)
                nursery.cancel_scope.cancel()  # stop the signal watcher
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(15):
                await metadata.aclose()


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.storage",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s per scenario (about 30 s in all)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"directory for the JSON and Markdown results (default {DEFAULT_OUT})")
    parser.add_argument("--stores", default=",".join(s.name for s in STORES),
                        help="comma-separated subset of: " + ", ".join(s.name for s in STORES))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="comma-separated subset of: " + ", ".join(SCENARIOS))
    parser.add_argument("--duration", type=float, help="seconds per scenario (overrides both)")
    parser.add_argument("--rate", type=float, help="offered MB/s of the latency scenario (5)")
    parser.add_argument("--producers", type=int, help="producers = partitions (8)")
    parser.add_argument("--in-flight", type=int, help="appends in flight per producer (5)")
    parser.add_argument("--wal-max-delay-ms", type=float,
                        help="override wal_max_delay for every store (tuning experiments)")
    parser.add_argument("--wal-max-uploads", type=int,
                        help="override wal_max_uploads for every store (tuning experiments)")
    parser.add_argument("--moto", choices=("process", "thread"), default="process",
                        help="run moto in a child process (default) or in a thread of this one")
    parser.add_argument("--durable-postgres", action="store_true",
                        help="run PostgreSQL with fsync on (default off: a throwaway server)")
    parser.add_argument("--no-file-fsync", action="store_true",
                        help="file:// without fsync (a node always fsyncs)")
    args = parser.parse_args(argv)

    by_name = {s.name: s for s in STORES}
    try:
        stores = [by_name[n.strip()] for n in args.stores.split(",") if n.strip()]
        scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
        if any(s not in SCENARIOS for s in scenarios):
            raise KeyError(scenarios)
    except KeyError as exc:
        parser.error(f"unknown store or scenario: {exc}")

    cfg = BenchConfig(quick=args.quick, moto_mode=args.moto,
                      postgres_durable=args.durable_postgres, file_fsync=not args.no_file_fsync)
    if args.quick:
        cfg.throughput_duration = cfg.latency_duration = 3.0
        cfg.warmup_rounds = 2
    if args.duration:
        cfg.throughput_duration = cfg.latency_duration = args.duration
    if args.rate:
        cfg.latency_rate_mb_s = args.rate
    if args.producers:
        cfg.producers = cfg.partitions = args.producers
    if args.in_flight:
        cfg.in_flight = args.in_flight
    for wal in cfg.wal.values():
        if args.wal_max_delay_ms is not None:
            wal.wal_max_delay = args.wal_max_delay_ms / 1000
        if args.wal_max_uploads is not None:
            wal.wal_max_uploads = args.wal_max_uploads

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    os.environ.update(_s3_env())  # dummy credentials: a real service's never reach moto

    started_at = dt.datetime.now().astimezone()
    stamp = started_at.strftime("%Y%m%d-%H%M%S")
    t0 = time.monotonic()
    machine = machine_info()
    print(f"Mink storage benchmark ({'quick' if args.quick else 'full'}): "
          f"{machine['nproc']} CPUs, Python {machine['python']}, git {machine['git_commit']}")
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, through the clean-up below; inside
    # trio.run both cancel the run instead (see _cancel_on_signal).
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    signal.signal(signal.SIGINT, _raise_keyboard_interrupt)  # also when started with it ignored
    interrupted: list[int] = []
    tmp = Path(tempfile.mkdtemp(prefix="mink-bench-"))
    postgres = EmbeddedPostgres(tmp / "pg" / "data", durable=cfg.postgres_durable)
    moto = Moto(cfg.moto_mode, tmp / "moto.log")
    results: list[dict[str, Any]] = []
    try:
        print(f"starting PostgreSQL (durable={cfg.postgres_durable}) and moto ({cfg.moto_mode})",
              flush=True)
        postgres.start()
        moto.start()
        client = _boto3_client(moto.endpoint)
        client.create_bucket(Bucket=BUCKET)
        client.close()
        setup_s = time.monotonic() - t0
        trio.run(bench, {"postgres": postgres, "moto": moto, "tmp": tmp}, cfg, stores,
                 scenarios, results, interrupted)
    except KeyboardInterrupt:
        interrupted.append(signal.SIGINT)
    finally:
        moto.stop()
        try:
            if postgres.running():
                postgres.stop("immediate")
        except Exception as exc:  # noqa: BLE001 - report, then keep cleaning up
            print(f"stopping PostgreSQL failed: {exc}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)

    total = time.monotonic() - t0
    if interrupted:
        print(f"\ninterrupted ({signal.Signals(interrupted[0]).name}); cleaned up", file=sys.stderr)
        if not results:
            return 130
    cfg_dict = asdict(cfg)
    report = {
        "benchmark": "storage",
        "started_at": started_at.isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.storage", *(argv if argv is not None
                                                                   else sys.argv[1:])]),
        "mode": "quick" if args.quick else "full",
        "interrupted": bool(interrupted),
        "total_seconds": round(total, 1),
        "setup_seconds": round(setup_s, 1),
        "machine": machine,
        "config": cfg_dict,
        "results": results,
    }
    json_path, md_path = write_reports(args.out, stamp, report)
    print()
    print("Throughput (closed loop, MB = 10^6 B):")
    print(text_table(*throughput_table(results)))
    print()
    print(f"Ack latency at {cfg.latency_rate_mb_s:g} MB/s (open loop):")
    print(text_table(*latency_table(results)))
    print()
    noisy = noisy_cases(results)
    if noisy:
        print(f"warning: other processes used {NOISY_OTHER_PCT:g}% of a core or more during "
              f"{', '.join(noisy)}: compare these figures with care")
    print(f"{total:.0f} s in all; results: {json_path} and {md_path.name}")
    if interrupted:
        return 130
    return 0 if all(not r["errors"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
