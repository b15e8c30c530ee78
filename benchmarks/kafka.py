"""Kafka-level benchmark: real `mink serve` nodes (subprocesses) on an embedded PostgreSQL,
driven by confluent-kafka load generators in other processes.

    .venv/bin/python -m benchmarks.kafka [--quick] [--out DIR]

Scenarios (see benchmarks/README.md for what every figure means):

1. produce throughput: 1 KiB messages, acks=all, 1, 3 and 12 partitions;
2. produce latency p50/p99/p99.9 at fixed offered rates (5, 20, 50 MB/s), open loop;
3. end-to-end latency: producer to a tailing consumer at 5 MB/s;
4. consumer catch-up with the node's caches cold (the node restarted);
5. scale on one node: 10,000 partitions (Metadata time, memory) and 1,000 idle connections;
6. three nodes: aggregate produce throughput, and the time from a leader's SIGKILL to the
   first acknowledged produce to a partition it led.

Object stores: file:// for all; S3 on moto, and S3 behind a simulated 20 ms +- 10 ms network,
for scenarios 1 (3 partitions) and 2 (5 MB/s). A baseline in the same run: the rate at which
this machine moves the same bytes from a client socket through a trio reader into the same
store with no Mink logic (benchmarks/baseline.py). Results: `<out>/kafka-<stamp>.json`, a
Markdown summary and PNG plots next to it.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import logging
import os
import queue
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

from benchmarks.storage import (  # noqa: E402 - helpers shared with the storage benchmark
    BUCKET,
    S3_KEY,
    S3_REGION,
    Moto,
    _boto3_client,
    _children,
    _empty_prefix,
    _machine_cpu,
    _proc_cpu_s,
    _s3_env,
    machine_info,
)
from mink.storage.embedded_postgres import EmbeddedPostgres, free_port  # noqa: E402

log = logging.getLogger("benchmarks.kafka")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
MB = 1_000_000
MIB = 1024 * 1024

# -- configuration ---------------------------------------------------------------------------


@dataclass
class KafkaBenchConfig:
    quick: bool
    value_bytes: int = 1024
    # 1. throughput
    throughput_partitions: list[int] = field(default_factory=lambda: [1, 3, 12])
    throughput_seconds: float = 10.0
    # 2. latency at fixed rates
    latency_rates_mb_s: list[float] = field(default_factory=lambda: [5.0, 20.0, 50.0])
    latency_partitions: int = 3
    latency_seconds: float = 30.0
    # sent at the same rate before each window, unmeasured (0: the window starts cold)
    latency_warmup_seconds: float = 0.0
    # 3. end-to-end
    e2e_rate_mb_s: float = 5.0
    e2e_seconds: float = 30.0
    # 4. catch-up
    catchup_mb: int = 1000
    catchup_partitions: int = 3
    catchup_tiered: bool = False  # read back once tiering moved it all to stream objects
    drop_page_cache: bool = True
    # 5. scale
    scale_topics: int = 10
    scale_partitions_per_topic: int = 1000
    idle_connections: int = 1000
    scale_idle_seconds: float = 30.0
    scale_metadata_probes: int = 5
    # 6. three nodes
    cluster_nodes: int = 3
    cluster_partitions: int = 6
    cluster_seconds: float = 10.0
    lease_ttl_s: float = 3.0
    coordinator_tick_s: float = 0.5
    failover_interval_ms: int = 10
    # object stores beyond file://
    s3_stores: list[str] = field(default_factory=lambda: ["s3", "s3+20ms"])
    s3_throughput_partitions: int = 3
    s3_latency_rate_mb_s: float = 5.0
    simulated_latency_ms: float = 20.0
    simulated_jitter_ms: float = 10.0
    # baseline
    baseline_seconds: float = 5.0
    baseline_chunk_bytes: int = MIB
    # clients (confluent-kafka / librdkafka settings)
    producer_throughput: dict[str, Any] = field(default_factory=lambda: {
        "acks": "all", "linger.ms": 5, "batch.size": 1_000_000, "compression.type": "none",
        "enable.idempotence": False})
    producer_latency: dict[str, Any] = field(default_factory=lambda: {
        "acks": "all", "linger.ms": 5, "batch.size": 1_000_000, "compression.type": "none",
        "enable.idempotence": False})
    producer_failover: dict[str, Any] = field(default_factory=lambda: {
        "acks": "all", "linger.ms": 1, "enable.idempotence": True,
        "message.timeout.ms": 60000, "retry.backoff.ms": 50, "retry.backoff.max.ms": 500,
        "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
        "topic.metadata.refresh.interval.ms": 60000})
    consumer_tail: dict[str, Any] = field(default_factory=lambda: {
        "fetch.wait.max.ms": 500, "fetch.min.bytes": 1})
    consumer_catchup: dict[str, Any] = field(default_factory=lambda: {
        "fetch.max.bytes": 64 * MIB, "max.partition.fetch.bytes": 16 * MIB,
        "queued.max.messages.kbytes": 256 * 1024, "fetch.wait.max.ms": 500})
    postgres_durable: bool = False
    moto_mode: str = "process"
    node_log_level: str = "WARNING"
    scenarios: list[str] = field(default_factory=list)
    profile_dir: str | None = None
    stall_ms: float = 0.0  # log the node's task steps this long or longer (0: off)


SCENARIOS = ("baseline", "throughput", "latency", "e2e", "catchup", "s3", "s3-catchup", "scale",
             "cluster")

TARGETS = {
    "produce_mb_s": 150.0,  # 1 KiB, acks=all, file://
    "latency_rate_mb_s": 20.0,  # p99 <= wal.max_delay + 20 ms at a steady 20 MB/s
    "latency_p99_extra_ms": 20.0,
    "e2e_p99_extra_ms": 30.0,  # p99 <= wal.max_delay + 30 ms
    "catchup_mb_s": 200.0,  # caches cold
}
# librdkafka logs at level 6 (info) to stderr: keep only errors of the orchestrator's clients.
ADMIN_QUIET = {"log_level": 3, "log.connection.close": False}
WAL_MAX_DELAY_MS = {"file": 0.0, "s3": 50.0, "s3+20ms": 50.0}  # the node's defaults per scheme


def quick_config(cfg: KafkaBenchConfig) -> None:
    cfg.throughput_seconds = 2.0
    cfg.latency_seconds = 2.5
    cfg.e2e_seconds = 2.5
    cfg.catchup_mb = 150
    cfg.cluster_seconds = 2.0
    cfg.baseline_seconds = 1.0
    cfg.scale_topics = 2  # 2,000 partitions: creating 10,000 alone takes longer than quick allows
    cfg.scale_idle_seconds = 3.0
    cfg.scale_metadata_probes = 2
    cfg.s3_stores = ["s3", "s3+20ms"]


# -- processes -------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the child
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_parent() -> None:
    """In a child before exec: SIGKILL it when the benchmark dies, whatever the reason."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


class Children:
    """Every process this run starts; all are killed at the end (also on errors and Ctrl-C)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def popen(self, args: list[str], **kwargs: Any) -> subprocess.Popen:
        proc = subprocess.Popen(args, preexec_fn=_die_with_parent, cwd=REPO, **kwargs)
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _status_kib(pid: int, field_name: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_mib(pid: int) -> float | None:
    kib = _status_kib(pid, "VmRSS")
    return None if kib is None else round(kib / 1024, 1)


def hwm_mib(pid: int) -> float | None:
    kib = _status_kib(pid, "VmHWM")
    return None if kib is None else round(kib / 1024, 1)


class Node:
    """`mink serve` (through benchmarks.latency_node) in a subprocess."""

    def __init__(self, bench: Bench, node_id: int, db_url: str, store: StoreSetup,
                 port: int | None = None, **settings: Any) -> None:
        self.bench = bench
        self.node_id = node_id
        self.db_url = db_url
        self.store = store
        self.port = port or free_port()
        self.settings = settings
        self.proc: subprocess.Popen | None = None
        self.log_path = bench.tmp / "logs" / f"node-{store.group}-{node_id}.log"
        self.gc_log_path = bench.tmp / "logs" / f"gc-{store.group}-{node_id}.log"
        self.stall_log_path = bench.tmp / "logs" / f"stalls-{store.group}-{node_id}.log"
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"MINK_NODE_ID": str(self.node_id), "MINK_LISTENER": self.address,
                    "MINK_POSTGRES_URL": self.db_url, "MINK_OBJECT_STORE": self.store.url,
                    "MINK_LOG_LEVEL": self.bench.cfg.node_log_level,
                    "MINK_BENCH_GC_LOG": str(self.gc_log_path)})
        if self.bench.cfg.stall_ms:
            env.update({"MINK_BENCH_STALL_LOG": str(self.stall_log_path),
                        "MINK_BENCH_STALL_MS": str(self.bench.cfg.stall_ms)})
        env.update(self.store.node_env)
        for key, value in self.settings.items():
            env[f"MINK_{key.upper()}"] = str(value)
        return env

    def start(self, timeout: float = 60.0) -> None:
        self.starts += 1
        log_file = open(self.log_path, "ab")
        self.proc = self.bench.children.popen([sys.executable, "-m", "benchmarks.latency_node"],
                                              env=self.env(), stdout=log_file,
                                              stderr=subprocess.STDOUT)
        log_file.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.node_id} exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                if self._registered():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"node {self.node_id} did not listen within {timeout} s:\n"
                           f"{self.log_tail()}")

    def _registered(self) -> bool:
        """Listening, and its Metadata lists itself and a controller. (Before c8a288a a node
        answered before it had registered: no brokers, controller -1, and an AdminClient
        that saw that answer waited for a controller until its request timed out.)"""
        from benchmarks.loadgen import RawConnection, metadata_request
        from mink.protocol.messages import decode_response

        conn = RawConnection(self.address, timeout=5)
        try:
            conn.send(3, 12, metadata_request(topics=[]))
            _, body = decode_response(3, 12, conn.receive_frame())
        finally:
            conn.close()
        return (any(b.node_id == self.node_id for b in body.brokers)
                and body.controller_id >= 0)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def gc_pauses(self, start: float, end: float) -> list[tuple[float, int, float]]:
        """(end time, generation, ms) of the node's collections that ended in [start, end]."""
        out = []
        try:
            lines = self.gc_log_path.read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            parts = line.split()
            if len(parts) >= 3 and start <= float(parts[0]) <= end:
                out.append((float(parts[0]), int(parts[1]), float(parts[2])))
        return out

    def stalls(self, start: float, end: float) -> list[tuple[float, float, str, str]]:
        """(end time, ms, task, where) of the task steps logged in [start, end]."""
        out = []
        try:
            lines = self.stall_log_path.read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            parts = line.split(" ", 3)
            if len(parts) == 4 and start <= float(parts[0]) <= end:
                out.append((float(parts[0]), float(parts[1]), parts[2], parts[3]))
        return out

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class LoadGen:
    """One `benchmarks.loadgen` worker; its stdout lines arrive through a reader thread."""

    def __init__(self, bench: Bench, worker: str, params: dict[str, Any]) -> None:
        self.bench = bench
        self.worker = worker
        self.log_path = bench.tmp / "logs" / f"loadgen-{worker}-{bench.next_id()}.log"
        self.lines: queue.Queue[str | None] = queue.Queue()
        log_file = open(self.log_path, "ab")
        self.proc = bench.children.popen(
            [sys.executable, "-m", "benchmarks.loadgen", worker, json.dumps(params)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, text=True,
            bufsize=1)
        log_file.close()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, tag: str, timeout: float) -> str:
        """The rest of the next line starting with `tag` (other lines are logged)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"loadgen {self.worker}: no {tag} within {timeout} s; "
                                   f"stderr:\n{self.stderr_tail()}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(10)
                raise RuntimeError(f"loadgen {self.worker} exited ({self.proc.returncode}) "
                                   f"before {tag}; stderr:\n{self.stderr_tail()}")
            if line == tag or line.startswith(tag + " "):
                return line[len(tag):].strip()
            log.info("loadgen %s: %s", self.worker, line)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        """The worker's result; it stays alive (for CPU accounting) until `close()`."""
        return json.loads(self.expect("RESULT", timeout))

    def stderr_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def close(self) -> None:
        """Close its stdin (a worker exits then), kill it if it does not."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- CPU accounting --------------------------------------------------------------------------


class CpuWindow:
    """CPU of the roles in a measurement (node(s), PostgreSQL, moto, load generators) and of
    the whole machine between `start()` and `stop()`, in percent of one core."""

    def __init__(self, bench: Bench, nodes: list[Node], loadgens: list[LoadGen]) -> None:
        self.bench = bench
        self.roles: dict[str, Callable[[], list[int]]] = {
            "node": lambda: [n.pid for n in nodes if n.proc and n.proc.poll() is None],
            "postgres": lambda: [p for p in [bench.pg_pid] if p] + (
                _children(bench.pg_pid) if bench.pg_pid else []),
            "moto": lambda: [bench.moto.pid] if bench.moto.pid else [],
            "loadgen": lambda: [lg.pid for lg in loadgens if lg.proc.poll() is None],
            # Kernel threads (children of kthreadd): page writeback, the filesystem journal.
            "kernel": lambda: _children(2),
            "bench": lambda: [os.getpid()],  # this orchestrator (its reader threads)
        }
        self.nodes = nodes
        self.before: dict[str, Any] | None = None
        self.result: dict[str, Any] = {}

    def _snap(self) -> dict[str, Any]:
        busy, total, iowait, steal = _machine_cpu()
        snap: dict[str, Any] = {"wall": time.monotonic(), "busy": busy, "total": total,
                                "iowait": iowait, "steal": steal}
        for role, pids in self.roles.items():
            snap[role] = {pid: _proc_cpu_s(pid) for pid in pids()}
        return snap

    def start(self) -> None:
        self.before = self._snap()

    def stop(self) -> dict[str, float]:
        assert self.before is not None
        a, b = self.before, self._snap()
        wall = b["wall"] - a["wall"]
        out: dict[str, float] = {"wall_s": round(wall, 2)}
        ours = 0.0
        for role in self.roles:
            # A process that exited in between counts with what it had at the start.
            used = sum(b[role].get(pid, a[role].get(pid, 0.0)) - a[role].get(pid, 0.0)
                       for pid in set(a[role]) | set(b[role]))
            pct = 100 * used / wall if wall > 0 else 0.0
            out[f"{role}_pct"] = round(pct, 1)
            ours += pct
        total = b["total"] - a["total"]
        if total > 0 and wall > 0:
            busy_cores_pct = 100 * (b["busy"] - a["busy"]) / wall
            out["machine_busy_pct"] = round(100 * (b["busy"] - a["busy"]) / total, 1)
            out["iowait_pct"] = round(100 * (b["iowait"] - a["iowait"]) / total, 1)
            out["steal_pct"] = round(100 * (b["steal"] - a["steal"]) / total, 1)
            out["other_pct"] = round(max(0.0, busy_cores_pct - ours), 1)
        pauses = [p for n in self.nodes if isinstance(n, Node)
                  for p in n.gc_pauses(a["wall"], b["wall"])]
        if any(isinstance(n, Node) for n in self.nodes):
            gen2 = [ms for _, gen, ms in pauses if gen == 2]
            out["node_gc"] = {"gen2_count": len(gen2), "gen2_max_ms": max(gen2, default=0.0),
                              "gen2_total_ms": round(sum(gen2), 1),
                              "gen1_over_1ms": sum(1 for _, gen, _ in pauses if gen == 1),
                              "total_ms": round(sum(ms for _, _, ms in pauses), 1)}
        if self.bench.cfg.stall_ms and any(isinstance(n, Node) for n in self.nodes):
            steps = [st for n in self.nodes if isinstance(n, Node)
                     for st in n.stalls(a["wall"], b["wall"])]
            longest = sorted(steps, key=lambda st: -st[1])[:10]
            out["node_stalls"] = {
                "threshold_ms": self.bench.cfg.stall_ms, "count": len(steps),
                "total_ms": round(sum(st[1] for st in steps), 1),
                "max_ms": max((st[1] for st in steps), default=0.0),
                "longest": [{"ms": st[1], "task": st[2], "stopped_at": st[3],
                             "at_s": round(st[0] - a["wall"], 3)} for st in longest]}
        self.result = out
        return out


# -- stores ----------------------------------------------------------------------------------


@dataclass
class StoreSetup:
    name: str  # file | s3 | s3+20ms
    group: str  # what this node group is for: its database, folder or S3 prefix
    url: str
    node_env: dict[str, str]
    baseline_args: list[str]
    cleanup: Callable[[], None]

    @property
    def scheme(self) -> str:
        return "file" if self.name == "file" else "s3"


# -- the run ---------------------------------------------------------------------------------


class Bench:
    def __init__(self, cfg: KafkaBenchConfig, tmp: Path) -> None:
        self.cfg = cfg
        self.tmp = tmp
        (tmp / "logs").mkdir(parents=True, exist_ok=True)
        self.children = Children()
        self.postgres = EmbeddedPostgres(tmp / "pg" / "data", durable=cfg.postgres_durable)
        self.moto = Moto(cfg.moto_mode, tmp / "logs" / "moto.log")
        self.pg_pid: int | None = None
        self._ids = 0
        self.report: dict[str, Any] = {"baseline": {}, "throughput": [], "latency": [],
                                       "e2e": [], "catchup": [], "scale": {}, "cluster": {},
                                       "errors": [], "notes": []}
        self.profiles: list[str] = []

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    # environment

    def start_environment(self) -> None:
        self.postgres.start()
        pid_file = self.postgres.data_dir / "postmaster.pid"
        self.pg_pid = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
        if {"s3", "s3-catchup", "baseline"} & set(self.cfg.scenarios):
            self.moto.start()
            client = _boto3_client(self.moto.endpoint)
            client.create_bucket(Bucket=BUCKET)
            client.close()

    def stop_environment(self) -> None:
        self.children.kill_all()
        try:
            self.moto.stop()
        except Exception as exc:  # noqa: BLE001 - keep cleaning up
            print(f"stopping moto failed: {exc}", file=sys.stderr)
        try:
            if self.postgres.running():
                self.postgres.stop("immediate")
        except Exception as exc:  # noqa: BLE001
            print(f"stopping PostgreSQL failed: {exc}", file=sys.stderr)

    def new_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.postgres.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.postgres.url_for(name)

    def store(self, name: str, group: str) -> StoreSetup:
        if name == "file":
            root = self.tmp / "objects" / group
            root.mkdir(parents=True, exist_ok=True)
            return StoreSetup(name, group, root.as_uri(), {}, ["--uploads", "1"],
                              lambda: shutil.rmtree(root, ignore_errors=True))
        endpoint = self.moto.endpoint
        env = {"MINK_S3_ENDPOINT_URL": endpoint, "MINK_S3_REGION": S3_REGION,
               "MINK_S3_ACCESS_KEY_ID": S3_KEY, "MINK_S3_SECRET_ACCESS_KEY": S3_KEY}
        args = ["--uploads", "4"]
        if name == "s3+20ms":
            env.update({"MINK_BENCH_STORE_LATENCY_MS": str(self.cfg.simulated_latency_ms),
                        "MINK_BENCH_STORE_JITTER_MS": str(self.cfg.simulated_jitter_ms),
                        "MINK_BENCH_SEED": "1"})
            args += ["--latency-ms", str(self.cfg.simulated_latency_ms),
                     "--jitter-ms", str(self.cfg.simulated_jitter_ms)]
        prefix = group
        return StoreSetup(name, group, f"s3://{BUCKET}/{prefix}", env, args,
                          lambda: _empty_prefix(endpoint, prefix + "/"))

    def node(self, node_id: int, db_url: str, store: StoreSetup, **settings: Any) -> Node:
        node = Node(self, node_id, db_url, store, **settings)
        node.start()
        return node

    def loadgen(self, worker: str, params: dict[str, Any]) -> LoadGen:
        return LoadGen(self, worker, params)

    def measure(self, worker: str, params: dict[str, Any], nodes: list[Node],
                timeout: float, profile: str | None = None) -> dict[str, Any]:
        """Run one loadgen worker that prints START; CPU from START to RESULT."""
        lg = self.loadgen(worker, params)
        try:
            cpu = CpuWindow(self, nodes, [lg])
            lg.expect("START", 120)
            cpu.start()
            spy = self.start_profile(nodes[0], profile) if profile else None
            result = lg.result(timeout)
            result["cpu"] = cpu.stop()
            if spy is not None:
                self.stop_profile(spy)
            result["node_rss_mib"] = [rss_mib(n.pid) for n in nodes]
            return result
        finally:
            lg.close()

    def start_profile(self, node: Node, name: str) -> subprocess.Popen | None:
        if not self.cfg.profile_dir:
            return None
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        out = Path(self.cfg.profile_dir) / f"{name}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        self.profiles.append(str(out))
        return self.children.popen([spy, "record", "--pid", str(node.pid), "-r", "200",
                                    "-f", "raw", "--threads", "-o", str(out), "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @staticmethod
    def stop_profile(spy: subprocess.Popen) -> None:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()

    def admin_create(self, bootstrap: str, topics: list[tuple[str, int]],
                     timeout: float = 120) -> float:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap, **ADMIN_QUIET})
        try:
            t0 = time.monotonic()
            futures = admin.create_topics([NewTopic(name, n, 1) for name, n in topics],
                                          request_timeout=timeout, operation_timeout=timeout)
            for future in futures.values():
                future.result(timeout)
            return time.monotonic() - t0
        finally:
            del admin  # destroyed now: no log lines later about nodes that went away

    def wait_ready(self, address: str, topic: str | None, partitions: int,
                   timeout: float = 60) -> float:
        """Until Metadata shows every partition of `topic` (None: of every topic, internal
        ones included) without error, i.e. opened by its leader."""
        from benchmarks.loadgen import RawConnection, _metadata_errors, metadata_request

        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            try:
                conn = RawConnection(address, timeout=10)
                try:
                    conn.send(3, 12, metadata_request(topics=None if topic is None else [topic]))
                    counts = _metadata_errors(conn.receive_frame(), skip_internal=False)
                finally:
                    conn.close()
                if counts["partitions"] >= partitions and counts["partition_errors"] == 0:
                    return time.monotonic() - t0
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions not ready within {timeout} s")
            time.sleep(0.1)

    def prepare_groups(self, node: Node) -> float:
        """A consumer with a group.id looks up its group coordinator even with assign(); the
        first lookup creates the internal offsets topic (50 partitions). Done here, before
        any measurement, so that it does not happen during one."""
        from confluent_kafka import Consumer

        t0 = time.monotonic()
        consumer = Consumer({"bootstrap.servers": node.address, "group.id": "mink-bench-warmup",
                             **ADMIN_QUIET})
        try:
            consumer.poll(0.2)
            deadline = time.monotonic() + 60
            while True:
                try:
                    self.wait_ready(node.address, "__consumer_offsets", 1, timeout=1)
                    break
                except TimeoutError:
                    consumer.poll(0.1)
                    if time.monotonic() > deadline:
                        raise
            self.wait_ready(node.address, "__consumer_offsets", self.offsets_partitions(node),
                            timeout=60)
        finally:
            consumer.close()
        return time.monotonic() - t0

    def offsets_partitions(self, node: Node) -> int:
        from benchmarks.loadgen import RawConnection, metadata_request

        conn = RawConnection(node.address, timeout=10)
        try:
            conn.send(3, 12, metadata_request(topics=["__consumer_offsets"]))
            frame = conn.receive_frame()
        finally:
            conn.close()
        from mink.protocol.messages import decode_response

        _, body = decode_response(3, 12, frame)
        return max(1, sum(len(t.partitions) for t in body.topics))

    def settle(self) -> None:
        """Write back what the last case left dirty now, not during the next measurement."""
        os.sync()

    def record_error(self, scenario: str, exc: BaseException) -> None:
        text = "".join(traceback.format_exception(exc))
        self.report["errors"].append({"scenario": scenario, "error": f"{type(exc).__name__}: {exc}",
                                      "traceback": text})
        print(f"\n  ERROR in {scenario}: {type(exc).__name__}: {exc}", flush=True)


_T0 = time.monotonic()


def _say(text: str) -> None:
    """Start a console line, prefixed with the seconds since the run started."""
    print(f"[{time.monotonic() - _T0:5.0f}s]{text}", end="", flush=True)


# -- scenarios -------------------------------------------------------------------------------


class _Proc:
    """A process in the place of a node, for CpuWindow."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pid = proc.pid


def run_baseline(bench: Bench, store_name: str) -> None:
    cfg = bench.cfg
    store = bench.store(store_name, f"baseline_{store_name.replace('+', '_')}")
    _say(f"  baseline {store_name:<8} ...")
    env = dict(os.environ, **store.node_env)
    server_log = open(bench.tmp / "logs" / f"baseline-{store_name}.log", "ab")
    server = bench.children.popen(
        [sys.executable, "-m", "benchmarks.baseline", "--store", store.url, *store.baseline_args],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=server_log, text=True)
    server_log.close()
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()
        if not line.startswith("PORT "):
            raise RuntimeError(f"baseline server did not start: {line!r}")
        port = int(line.split()[1])
        lg = bench.loadgen("baseline_client", {
            "address": f"127.0.0.1:{port}", "chunk_bytes": cfg.baseline_chunk_bytes,
            "duration": cfg.baseline_seconds})
        try:
            cpu = CpuWindow(bench, [_Proc(server)], [lg])  # "node": the baseline server here
            lg.expect("START", 60)
            cpu.start()
            result = lg.result(cfg.baseline_seconds + 120)
            result["cpu"] = cpu.stop()
        finally:
            lg.close()
        server_line = server.stdout.readline().strip()
        if server_line.startswith("RESULT "):
            result["server"] = json.loads(server_line[7:])
        assert server.stdin is not None
        server.stdin.close()
        server.wait(30)
        result["store"] = store_name
        result["uploads_in_flight"] = int(store.baseline_args[1])
        bench.report["baseline"][store_name] = result
        print(f" {result['mb_per_s']:7.1f} MB/s", flush=True)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        store.cleanup()
        bench.settle()


def run_throughput(bench: Bench, node: Node, store: str, partitions: int) -> dict[str, Any]:
    cfg = bench.cfg
    topic = f"tput-{store.replace('+', '-')}-{partitions}"
    bench.admin_create(node.address, [(topic, partitions)])
    bench.wait_ready(node.address, topic, partitions)
    _say(f"  throughput {store:<8} {partitions:>2} partitions ...")
    result = bench.measure("produce", {
        "bootstrap": node.address, "topic": topic, "partitions": partitions,
        "value_bytes": cfg.value_bytes, "duration": cfg.throughput_seconds,
        "producer_config": cfg.producer_throughput}, [node], cfg.throughput_seconds + 180,
        profile=f"throughput-{store}-{partitions}")
    result.update({"store": store, "topic": topic})
    bench.report["throughput"].append(result)
    print(f" {result['mb_per_s']:7.1f} MB/s, {result['msgs_per_s']:9.0f} msgs/s "
          f"(node cpu {result['cpu'].get('node_pct')}%)", flush=True)
    bench.settle()
    return result


def run_latency(bench: Bench, node: Node, store: str, rate: float) -> dict[str, Any]:
    cfg = bench.cfg
    topic = f"lat-{store.replace('+', '-')}-{int(rate)}"
    bench.admin_create(node.address, [(topic, cfg.latency_partitions)])
    bench.wait_ready(node.address, topic, cfg.latency_partitions)
    _say(f"  latency    {store:<8} {rate:>4g} MB/s ...")
    result = bench.measure("paced", {
        "bootstrap": node.address, "topic": topic, "partitions": cfg.latency_partitions,
        "value_bytes": cfg.value_bytes, "duration": cfg.latency_seconds, "rate_mb_s": rate,
        "warmup_seconds": cfg.latency_warmup_seconds,
        "producer_config": cfg.producer_latency}, [node],
        cfg.latency_warmup_seconds + cfg.latency_seconds + 180,
        profile=f"latency-{store}-{int(rate)}")
    result.update({"store": store, "topic": topic,
                   "wal_max_delay_ms": WAL_MAX_DELAY_MS[store]})
    bench.report["latency"].append(result)
    lat = result["latency"]
    print(f" achieved {result['achieved_mb_per_s']:6.2f} MB/s, p50 {lat.get('p50_ms')} ms, "
          f"p99 {lat.get('p99_ms')} ms, p99.9 {lat.get('p999_ms')} ms", flush=True)
    bench.settle()
    return result


def run_e2e(bench: Bench, node: Node, store: str) -> dict[str, Any]:
    cfg = bench.cfg
    topic = f"e2e-{store.replace('+', '-')}"
    bench.admin_create(node.address, [(topic, cfg.latency_partitions)])
    bench.wait_ready(node.address, topic, cfg.latency_partitions)
    _say(f"  end-to-end {store:<8} {cfg.e2e_rate_mb_s:>4g} MB/s ...")
    consumer = bench.loadgen("tail", {"bootstrap": node.address, "topic": topic,
                                      "partitions": cfg.latency_partitions,
                                      "consumer_config": cfg.consumer_tail,
                                      "max_seconds": cfg.e2e_seconds + 120})
    try:
        consumer.expect("READY", 60)
        producer = bench.loadgen("paced", {
            "bootstrap": node.address, "topic": topic, "partitions": cfg.latency_partitions,
            "value_bytes": cfg.value_bytes, "duration": cfg.e2e_seconds,
            "rate_mb_s": cfg.e2e_rate_mb_s, "stamp": True,
            "producer_config": cfg.producer_latency})
        try:
            cpu = CpuWindow(bench, [node], [producer, consumer])
            producer.expect("START", 60)
            cpu.start()
            produced = producer.result(cfg.e2e_seconds + 120)
            consumer.send(f"STOP {produced['acked']}")
            consumed = consumer.result(60)
            cpu_result = cpu.stop()
        finally:
            producer.close()
    finally:
        consumer.close()
    result = {"store": store, "topic": topic, "rate_mb_s": cfg.e2e_rate_mb_s,
              "wal_max_delay_ms": WAL_MAX_DELAY_MS[store], "produce": produced,
              "consume": consumed, "latency": consumed["latency"], "cpu": cpu_result}
    bench.report["e2e"].append(result)
    lat = consumed["latency"]
    print(f" received {consumed['received']}/{produced['acked']}, p50 {lat.get('p50_ms')} ms, "
          f"p99 {lat.get('p99_ms')} ms (produce p99 {produced['latency'].get('p99_ms')} ms)",
          flush=True)
    bench.settle()
    return result


def drop_page_cache() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def run_catchup(bench: Bench, node: Node, store: str) -> None:
    cfg = bench.cfg
    topic = f"catchup-{store.replace('+', '-')}"
    partitions = cfg.catchup_partitions
    bench.admin_create(node.address, [(topic, partitions)])
    bench.wait_ready(node.address, topic, partitions)
    messages = cfg.catchup_mb * MB // cfg.value_bytes
    _say(f"  catch-up   {store:<8} writing {cfg.catchup_mb} MB ...")
    # Closed-loop produce until `messages` are acknowledged: duration is generous, the worker
    # stops at the count.
    written = bench.measure("produce", {
        "bootstrap": node.address, "topic": topic, "partitions": partitions,
        "value_bytes": cfg.value_bytes, "duration": 3600, "max_messages": messages,
        "producer_config": cfg.producer_throughput, "warmup_per_partition": 0}, [node], 600)
    print(f" {written['acked']} messages at {written['mb_per_s']:.0f} MB/s", flush=True)
    tiered_s = wait_tiered(node, topic) if cfg.catchup_tiered else None
    variants = [("node restarted", False)]
    if cfg.drop_page_cache and store == "file":
        variants.append(("node restarted, OS page cache dropped", True))
    for label, drop in variants:
        node.stop()
        bench.settle()
        dropped = drop_page_cache() if drop else False
        node.start()
        # Every partition open (the offsets topic's too) and a second more, so that the
        # consumer measures reading, not the node's start-up.
        ready_s = bench.wait_ready(node.address, None, 1)
        time.sleep(1.0)
        rss_before = rss_mib(node.pid)
        _say(f"  catch-up   {store:<8} {label} ...")
        result = bench.measure("catchup", {
            "bootstrap": node.address, "topic": topic, "partitions": partitions,
            "expected_messages": written["acked"], "consumer_config": cfg.consumer_catchup,
            "max_seconds": 300}, [node], 400, profile=f"catchup-{store}-{int(drop)}")
        result.update({"store": store, "topic": topic, "variant": label,
                       "page_cache_dropped": dropped, "written_mb": round(
                           written["acked"] * cfg.value_bytes / MB, 1),
                       "produce_mb_per_s": written["mb_per_s"], "node_ready_s": round(ready_s, 2),
                       "tiered_after_s": tiered_s,
                       "node_rss_before_mib": rss_before})
        bench.report["catchup"].append(result)
        print(f" {result['mb_per_s']:7.1f} MB/s, {result['received']}/{result['expected']} "
              f"messages, first after {result['first_message_s']} s "
              f"(node cpu {result['cpu'].get('node_pct')}%, consumer cpu "
              f"{result['client_cpu_pct']}%)", flush=True)
    bench.settle()


def wait_tiered(node: Node, topic: str, timeout: float = 600.0) -> float:
    """Wait until tiering has moved every index row of `topic` to stream objects (the node's
    MINK_TIERING_DELAY_MS sets how soon): the seconds it took."""
    import psycopg

    _say(f"  catch-up   waiting for tiering of {topic} ...")
    started = time.monotonic()
    with psycopg.connect(node.db_url, autocommit=True) as conn:
        while True:
            (wal_rows,) = conn.execute(
                "SELECT count(*) FROM batch_index AS b JOIN topics AS t USING (topic_id)"
                " WHERE t.name = %s AND b.object_key NOT LIKE 'stream/%%'", (topic,)).fetchone()
            if wal_rows == 0:
                waited = time.monotonic() - started
                print(f" tiered after {waited:.0f} s", flush=True)
                return round(waited, 1)
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"{wal_rows} index rows of {topic} still in WAL objects "
                                   f"after {timeout:.0f} s (is tiering on?)")
            time.sleep(1.0)


def run_single_node_store(bench: Bench, store_name: str) -> None:
    """Scenarios 1-4 on file://; 1 (3 partitions) and 2 (one rate) on the S3 stores."""
    cfg = bench.cfg
    group = f"single_{store_name.replace('+', '_')}"
    store = bench.store(store_name, group)
    db = bench.new_database(group)
    node = bench.node(1, db, store)
    try:
        if store_name == "file":
            steps: list[tuple[str, Callable[[], Any]]] = []
            if "e2e" in cfg.scenarios or "catchup" in cfg.scenarios:
                steps.append(("groups", lambda: bench.prepare_groups(node)))
            if "throughput" in cfg.scenarios:
                steps += [(f"throughput-{p}", lambda p=p: run_throughput(bench, node, "file", p))
                          for p in cfg.throughput_partitions]
            if "latency" in cfg.scenarios:
                steps += [(f"latency-{r:g}", lambda r=r: run_latency(bench, node, "file", r))
                          for r in cfg.latency_rates_mb_s]
            if "e2e" in cfg.scenarios:
                steps.append(("e2e", lambda: run_e2e(bench, node, "file")))
            if "catchup" in cfg.scenarios:
                steps.append(("catchup", lambda: run_catchup(bench, node, "file")))
        else:
            steps = [
                (f"throughput-{store_name}", lambda: run_throughput(
                    bench, node, store_name, cfg.s3_throughput_partitions)),
                (f"latency-{store_name}", lambda: run_latency(
                    bench, node, store_name, cfg.s3_latency_rate_mb_s)),
            ] if "s3" in cfg.scenarios else []
            if "s3-catchup" in cfg.scenarios:
                steps.append((f"catchup-{store_name}",
                              lambda: run_catchup(bench, node, store_name)))
        for name, step in steps:
            try:
                if node.proc is None or node.proc.poll() is not None:
                    node.start()
                step()
            except Exception as exc:  # noqa: BLE001 - record, carry on with the next case
                bench.record_error(f"{store_name}/{name}", exc)
                print(node.log_tail(15), file=sys.stderr)
    finally:
        node.stop()
        store.cleanup()
        bench.settle()


def run_scale(bench: Bench) -> None:
    cfg = bench.cfg
    store = bench.store("file", "scale")
    db = bench.new_database("scale")
    node = bench.node(1, db, store)
    out: dict[str, Any] = {"topics": cfg.scale_topics,
                           "partitions_per_topic": cfg.scale_partitions_per_topic}
    bench.report["scale"] = out
    try:
        time.sleep(1.0)
        out["rss_idle_mib"] = rss_mib(node.pid)
        total = cfg.scale_topics * cfg.scale_partitions_per_topic
        _say(f"  scale      creating {cfg.scale_topics} x {cfg.scale_partitions_per_topic} "
             f"partitions ...")
        since = time.monotonic_ns()
        cpu = CpuWindow(bench, [node], [])
        cpu.start()
        names = [(f"scale-{i:02d}", cfg.scale_partitions_per_topic)
                 for i in range(cfg.scale_topics)]
        out["create_topics_s"] = round(bench.admin_create(node.address, names, timeout=600), 2)
        waited = bench.loadgen("metadata_wait", {"address": node.address, "partitions": total,
                                                 "since_ns": since, "max_seconds": 600})
        try:
            ready = waited.result(660)
        finally:
            waited.close()
        out["create_cpu"] = cpu.stop()
        out["all_open_s"] = ready["ready_s"]
        out["all_open"] = ready["ready"]
        out["metadata_polls"] = ready["polls"]
        print(f" created in {out['create_topics_s']} s, all open after {ready['ready_s']} s",
              flush=True)
        _say(f"  scale      idle for {cfg.scale_idle_seconds:g} s ...")
        # Node CPU second by second once everything is open: the leases of the new
        # partitions are taken in the first rounds, then the node is idle.
        series = []
        spy = bench.start_profile(node, "scale-idle")
        for _ in range(int(cfg.scale_idle_seconds)):
            window = CpuWindow(bench, [node], [])
            window.start()
            time.sleep(1.0)
            c = window.stop()
            series.append([c["node_pct"], c["postgres_pct"]])
        if spy is not None:
            bench.stop_profile(spy)
        out["idle_cpu_series"] = series  # [node %, PostgreSQL %] per second
        tail = series[-5:]
        out["idle_cpu_last5s"] = {"node_pct": round(sum(x[0] for x in tail) / len(tail), 1),
                                  "postgres_pct": round(sum(x[1] for x in tail) / len(tail), 1)}
        out["rss_partitions_mib"] = rss_mib(node.pid)
        print(f" node cpu by second {[x[0] for x in series]} %, PostgreSQL "
              f"{[x[1] for x in series]} %", flush=True)
        # A new topic changes the view: the next Metadata for all topics is encoded anew
        # (uncached). One request per new topic, timed here; the node's GC pauses during
        # each are noted.
        from benchmarks.loadgen import RawConnection, metadata_request

        _say("  scale      Metadata, every topic ...")
        spy = bench.start_profile(node, "scale-metadata-uncached")
        uncached = []
        for i in range(cfg.scale_metadata_probes):
            bench.admin_create(node.address, [(f"scale-probe-{i}", 1)])
            bench.wait_ready(node.address, f"scale-probe-{i}", 1)
            time.sleep(0.5)
            conn = RawConnection(node.address)
            try:
                t0 = time.monotonic()
                conn.send(3, 12, metadata_request())
                size = len(conn.receive_frame())
                t1 = time.monotonic()
            finally:
                conn.close()
            gc_ms = sum(ms for _, gen, ms in node.gc_pauses(t0, t1 + 0.001) if gen == 2)
            uncached.append({"ms": round((t1 - t0) * 1000, 1), "bytes": size,
                             "gen2_gc_ms_during": round(gc_ms, 1)})
        if spy is not None:
            bench.stop_profile(spy)
        out["metadata_uncached"] = uncached
        times = sorted(u["ms"] for u in uncached)
        out["metadata_uncached_ms"] = {"min": times[0], "median": times[len(times) // 2],
                                       "max": times[-1], "n": len(times)}
        spy = bench.start_profile(node, "scale-metadata")
        timing = bench.loadgen("metadata_timing", {"address": node.address, "repeats": 20,
                                                   "admin_repeats": 3})
        try:
            out["metadata"] = timing.result(300)
        finally:
            timing.close()
            if spy is not None:
                bench.stop_profile(spy)
        out["rss_after_metadata_mib"] = rss_mib(node.pid)
        m = out["metadata"]
        print(f" {m['partitions']} partitions, {m['response_bytes'] / MB:.2f} MB: uncached "
              f"{[u['ms'] for u in uncached]} ms (gen2 GC during them "
              f"{[u['gen2_gc_ms_during'] for u in uncached]} ms), cached p50 "
              f"{m['repeated_p50_ms']} ms, AdminClient.list_topics {m['admin_list_topics_ms']} "
              "ms", flush=True)
        gc_all = node.gc_pauses(0, time.monotonic())
        gen2 = [ms for _, gen, ms in gc_all if gen == 2]
        out["node_gc_since_start"] = {"gen2_count": len(gen2),
                                      "gen2_max_ms": max(gen2, default=0.0),
                                      "gen2_median_ms": sorted(gen2)[len(gen2) // 2] if gen2
                                      else None}
        _say(f"  scale      {cfg.idle_connections} idle connections ...")
        conns = bench.loadgen("connections", {"address": node.address,
                                              "count": cfg.idle_connections})
        try:
            conns.expect("READY", 300)
            time.sleep(2.0)
            idle_cpu = CpuWindow(bench, [node], [])
            idle_cpu.start()
            time.sleep(3.0)
            out["connections_idle_cpu"] = idle_cpu.stop()
            out["rss_connections_mib"] = rss_mib(node.pid)
            conns.send("GO")
            out["connections"] = conns.result(300)
        finally:
            conns.close()
        time.sleep(1.0)
        out["rss_after_connections_closed_mib"] = rss_mib(node.pid)
        out["rss_peak_mib"] = hwm_mib(node.pid)
        c = out["connections"]
        print(f" opened in {c['open_all_seconds']} s, {c['alive_after']} still answering; RSS "
              f"{out['rss_after_metadata_mib']} -> {out['rss_connections_mib']} MiB; node cpu "
              f"{out['connections_idle_cpu'].get('node_pct')}% with the connections idle",
              flush=True)
    except Exception as exc:  # noqa: BLE001
        bench.record_error("scale", exc)
        print(node.log_tail(15), file=sys.stderr)
    finally:
        node.stop()
        store.cleanup()
        bench.settle()


class LeaderWatch(threading.Thread):
    """Polls PostgreSQL every 20 ms: when the victim's partitions got a new leader, and when
    the new leader had them open."""

    def __init__(self, db_url: str, topic: str, partitions: list[int], victim: int,
                 survivor: str) -> None:
        super().__init__(daemon=True)
        self.db_url, self.topic, self.partitions, self.victim = db_url, topic, partitions, victim
        self.survivor = survivor  # a surviving node's address: when does its Metadata tell?
        self.killed_ns: int | None = None
        self.releaded_ns: int | None = None
        self.opened_ns: int | None = None
        self.node_expired_ns: int | None = None
        self.metadata_ns: int | None = None
        self.stop_event = threading.Event()
        self.error: str | None = None

    def _metadata_moved(self) -> bool:
        """A surviving node's Metadata names a live new leader, without error, for every
        partition the victim led."""
        from benchmarks.loadgen import RawConnection, metadata_request
        from mink.protocol.messages import decode_response

        conn = RawConnection(self.survivor, timeout=5)
        try:
            conn.send(3, 12, metadata_request(topics=[self.topic]))
            _, body = decode_response(3, 12, conn.receive_frame())
        finally:
            conn.close()
        parts = {p.partition_index: p for t in body.topics for p in t.partitions}
        return all(i in parts and int(parts[i].error_code) == 0
                   and parts[i].leader_id not in (-1, self.victim) for i in self.partitions)

    def run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.db_url, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    if self.killed_ns is not None and self.metadata_ns is None:
                        try:
                            if self._metadata_moved():
                                self.metadata_ns = time.monotonic_ns()
                        except OSError:
                            pass
                    rows = conn.execute(
                        "SELECT p.partition, p.leader_node, p.stream_state, p.opened_by_node "
                        "FROM partitions p JOIN topics t USING (topic_id) WHERE t.name = %s "
                        "AND t.deleted_at IS NULL", (self.topic,)).fetchall()
                    live = conn.execute("SELECT count(*) FROM nodes WHERE node_id = %s AND "
                                        "expires_at > now()", (self.victim,)).fetchone()[0]
                    now = time.monotonic_ns()
                    if self.killed_ns is not None:
                        mine = [r for r in rows if r[0] in self.partitions]
                        if self.node_expired_ns is None and not live:
                            self.node_expired_ns = now
                        if self.releaded_ns is None and all(r[1] != self.victim for r in mine):
                            self.releaded_ns = now
                        if self.opened_ns is None and all(
                                r[1] != self.victim and r[2] == "open" and r[3] == r[1]
                                for r in mine):
                            self.opened_ns = now
                        if self.opened_ns is not None and self.metadata_ns is not None:
                            return
                    time.sleep(0.02)
        except Exception as exc:  # noqa: BLE001 - reported with the result
            self.error = f"{type(exc).__name__}: {exc}"

    def figures(self) -> dict[str, Any]:
        def since(ns: int | None) -> float | None:
            if ns is None or self.killed_ns is None:
                return None
            return round((ns - self.killed_ns) / 1e9, 3)

        return {"node_expired_s": since(self.node_expired_ns),
                "partitions_releaded_s": since(self.releaded_ns),
                "partitions_open_s": since(self.opened_ns),
                "survivor_metadata_moved_s": since(self.metadata_ns), "watch_error": self.error}


def run_cluster(bench: Bench) -> None:
    from confluent_kafka.admin import AdminClient

    cfg = bench.cfg
    store = bench.store("file", "cluster")
    db = bench.new_database("cluster")
    nodes: list[Node] = []
    out: dict[str, Any] = {"nodes": cfg.cluster_nodes, "partitions": cfg.cluster_partitions,
                           "lease_ttl_s": cfg.lease_ttl_s,
                           "coordinator_tick_s": cfg.coordinator_tick_s}
    bench.report["cluster"] = out
    try:
        for node_id in range(1, cfg.cluster_nodes + 1):
            nodes.append(bench.node(node_id, db, store, lease_ttl=cfg.lease_ttl_s,
                                    coordinator_tick=cfg.coordinator_tick_s))
        bootstrap = ",".join(n.address for n in nodes)
        topic = "cluster-tput"
        time.sleep(1.0)  # every node registered before the topic's leaders are assigned
        bench.admin_create(bootstrap, [(topic, cfg.cluster_partitions)])
        bench.wait_ready(nodes[0].address, topic, cfg.cluster_partitions)
        admin = AdminClient({"bootstrap.servers": bootstrap, **ADMIN_QUIET})
        md = admin.list_topics(topic, timeout=30)
        del admin
        leaders = {p.id: p.leader for p in md.topics[topic].partitions.values()}
        out["leaders"] = {str(k): v for k, v in sorted(leaders.items())}
        _say(f"  cluster    {cfg.cluster_nodes} nodes, {cfg.cluster_partitions} partitions ...")
        result = bench.measure("produce", {
            "bootstrap": bootstrap, "topic": topic, "partitions": cfg.cluster_partitions,
            "value_bytes": cfg.value_bytes, "duration": cfg.cluster_seconds,
            "producer_config": cfg.producer_throughput}, nodes, cfg.cluster_seconds + 180)
        out["throughput"] = result
        print(f" {result['mb_per_s']:7.1f} MB/s, {result['msgs_per_s']:9.0f} msgs/s (nodes cpu "
              f"{result['cpu'].get('node_pct')}% of one core in all)", flush=True)
        bench.settle()

        # Failover: kill the leader of partition 0.
        victim_id = leaders[0]
        victim = next(n for n in nodes if n.node_id == victim_id)
        targets = sorted(p for p, leader in leaders.items() if leader == victim_id)
        out["failover_victim"] = victim_id
        out["failover_partitions"] = targets
        _say(f"  cluster    SIGKILL node {victim_id} (leads {targets}) ...")
        survivor = next(n for n in nodes if n.node_id != victim_id)
        watch = LeaderWatch(db, topic, targets, victim_id, survivor.address)
        lg = bench.loadgen("failover", {"bootstrap": bootstrap, "topic": topic,
                                        "partitions": targets, "value_bytes": cfg.value_bytes,
                                        "interval_ms": cfg.failover_interval_ms,
                                        "producer_config": cfg.producer_failover,
                                        "max_seconds": 120})
        try:
            lg.expect("READY", 60)
            time.sleep(0.5)
            watch.start()
            killed = time.monotonic_ns()
            watch.killed_ns = killed
            victim.kill()
            lg.send(f"KILLED {killed}")
            failover = lg.result(150)
        finally:
            lg.close()
            watch.stop_event.set()
        watch.join(5)
        failover.update(watch.figures())
        out["failover"] = failover
        print(f" first acknowledged produce to its partitions after "
              f"{failover['first_produce_after_kill_s']} s (all: "
              f"{failover['all_partitions_after_kill_s']} s; node expired "
              f"{failover['node_expired_s']} s, re-led {failover['partitions_releaded_s']} s, "
              f"open {failover['partitions_open_s']} s, in a survivor's Metadata "
              f"{failover['survivor_metadata_moved_s']} s)", flush=True)
    except Exception as exc:  # noqa: BLE001
        bench.record_error("cluster", exc)
        for n in nodes:
            print(n.log_tail(10), file=sys.stderr)
    finally:
        for n in nodes:
            n.stop()
        store.cleanup()
        bench.settle()


# -- main ------------------------------------------------------------------------------------


def run(bench: Bench) -> None:
    cfg = bench.cfg
    if "baseline" in cfg.scenarios:
        for name in ["file", *cfg.s3_stores]:
            try:
                run_baseline(bench, name)
            except Exception as exc:  # noqa: BLE001
                bench.record_error(f"baseline/{name}", exc)
    if any(s in cfg.scenarios for s in ("throughput", "latency", "e2e", "catchup")):
        run_single_node_store(bench, "file")
    if "s3" in cfg.scenarios or "s3-catchup" in cfg.scenarios:
        for name in cfg.s3_stores:
            run_single_node_store(bench, name)
    if "scale" in cfg.scenarios:
        run_scale(bench)
    if "cluster" in cfg.scenarios:
        run_cluster(bench)


def _tree_state() -> dict[str, Any]:
    """What was measured when the tree is dirty: modified files under mink/ and a hash of
    their diff against HEAD (two runs with the same hash ran the same code)."""
    import hashlib

    try:
        names = subprocess.run(["git", "diff", "--name-only", "HEAD", "--", "mink"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.split()
        diff = subprocess.run(["git", "diff", "HEAD", "--", "mink"], cwd=REPO,
                              capture_output=True, timeout=10).stdout
        head = subprocess.run(["git", "log", "-1", "--format=%h %s"], cwd=REPO,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_head": head, "git_modified_under_mink": names,
            "git_diff_mink_sha1": hashlib.sha1(diff).hexdigest()[:12] if diff else None}


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    from benchmarks import kafka_report

    parser = argparse.ArgumentParser(prog="python -m benchmarks.kafka",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="short scenarios, 2,000 partitions (under 2 minutes)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"directory for the results (default {DEFAULT_OUT})")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="comma-separated subset of: " + ", ".join(SCENARIOS))
    parser.add_argument("--partitions", type=int, metavar="N",
                        help="scale scenario: N partitions in all (1000 per topic)")
    parser.add_argument("--durable-postgres", action="store_true",
                        help="PostgreSQL with fsync on (default off: a throwaway server)")
    parser.add_argument("--no-drop-caches", action="store_true",
                        help="catch-up: do not also measure with the OS page cache dropped")
    parser.add_argument("--moto", choices=("process", "thread"), default="process")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="record the node with py-spy (raw folded stacks) during each "
                             "throughput, latency and catch-up case, into DIR")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--stalls", type=float, nargs="?", const=20.0, metavar="MS",
                        help="log the node's event-loop task steps of MS (20) ms or more and "
                             "report them per case (costs some node cpu)")
    parser.add_argument("--rates", metavar="MB/S,...",
                        help="latency scenario: the offered rates (default 5,20,50)")
    parser.add_argument("--latency-seconds", type=float, metavar="S",
                        help="latency scenario: the window per rate (default 30)")
    parser.add_argument("--latency-warmup-seconds", type=float, metavar="S",
                        help="latency scenario: sent at the rate before each window, "
                             "unmeasured (default 0: the window starts cold)")
    parser.add_argument("--catchup-mb", type=int, metavar="MB",
                        help="catch-up: MB written, then read back (default 1000)")
    parser.add_argument("--catchup-consumer", choices=("tuned", "default"), default="tuned",
                        help="catch-up: the consumer's fetch settings, large (tuned, the "
                             "default) or librdkafka's own (default)")
    parser.add_argument("--catchup-tiered", action="store_true",
                        help="catch-up: read back once tiering moved everything to stream "
                             "objects (set MINK_TIERING_DELAY_MS, e.g. 4000, to wait less)")
    args = parser.parse_args(argv)

    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    cfg = KafkaBenchConfig(quick=args.quick, postgres_durable=args.durable_postgres,
                           moto_mode=args.moto, drop_page_cache=not args.no_drop_caches,
                           scenarios=scenarios,
                           profile_dir=str(args.profile) if args.profile else None,
                           stall_ms=args.stalls or 0.0)
    if args.quick:
        quick_config(cfg)
    if args.rates:
        cfg.latency_rates_mb_s = [float(r) for r in args.rates.split(",") if r.strip()]
    if args.latency_seconds:
        cfg.latency_seconds = args.latency_seconds
    if args.latency_warmup_seconds:
        cfg.latency_warmup_seconds = args.latency_warmup_seconds
    if args.catchup_mb:
        cfg.catchup_mb = args.catchup_mb
    if args.catchup_consumer == "default":
        cfg.consumer_catchup = {}
    cfg.catchup_tiered = args.catchup_tiered
    if args.partitions:
        cfg.scale_topics = max(1, args.partitions // cfg.scale_partitions_per_topic)

    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ.update(_s3_env())  # dummy credentials: a real service's never reach moto
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # nodes inherit it: 1,000 idle connections need the file descriptors
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    global _T0
    started_at = dt.datetime.now().astimezone()
    stamp = started_at.strftime("%Y%m%d-%H%M%S")
    t0 = _T0 = time.monotonic()
    machine = machine_info()
    machine.update(_tree_state())
    machine["loadavg_at_start"] = os.getloadavg()
    print(f"Mink Kafka benchmark ({'quick' if args.quick else 'full'}): {machine['nproc']} CPUs, "
          f"Python {machine['python']}, git {machine['git_commit']}", flush=True)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="mink-kbench-"))
    bench = Bench(cfg, tmp)
    interrupted = False
    try:
        print(f"starting PostgreSQL (durable={cfg.postgres_durable}) and moto ({cfg.moto_mode})",
              flush=True)
        bench.start_environment()
        run(bench)
    except KeyboardInterrupt:
        interrupted = True
    except Exception as exc:  # noqa: BLE001 - write what we have
        bench.record_error("setup", exc)
    finally:
        bench.stop_environment()
        shutil.rmtree(tmp, ignore_errors=True)

    total = time.monotonic() - t0
    machine["loadavg_at_end"] = os.getloadavg()
    report = {
        "benchmark": "kafka",
        "started_at": started_at.isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.kafka",
                             *(argv if argv is not None else sys.argv[1:])]),
        "mode": "quick" if args.quick else "full",
        "interrupted": interrupted,
        "total_seconds": round(total, 1),
        "machine": machine,
        "config": asdict(cfg),
        "targets": TARGETS,
        "wal_max_delay_ms": WAL_MAX_DELAY_MS,
        "profiles": bench.profiles,
        **bench.report,
    }
    kafka_report.add_derived(report)
    paths = kafka_report.write(args.out, stamp, report, plots=not args.no_plots)
    print()
    print(kafka_report.console_summary(report))
    print(f"{total:.0f} s in all; results: " + ", ".join(str(p) for p in paths))
    if interrupted:
        print("interrupted; cleaned up", file=sys.stderr)
        return 130
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
