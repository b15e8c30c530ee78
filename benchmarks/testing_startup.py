"""Start-up time and memory of mink.testing's fixtures.

    .venv/bin/python -m benchmarks.testing_startup [--starts 20] [--out DIR]

On one warm embedded PostgreSQL (started once, template migrated, one node started and
stopped first so imports and the server's caches are warm), it measures:

- `open_node` (the trio API, and what `mink_trio_broker` does): from the call to a node that
  serves (registered, view loaded, __consumer_offsets led), cloning its fresh database and
  making its store folder included; and the time to close it (node left, database dropped,
  folder removed);
- `blocking_node` (what the sync `mink_broker` fixture does): the same through the harness
  thread;
- `open_cluster(3)`;
- `open_node` with Mink's default of 50 `__consumer_offsets` partitions (the harness uses 1):
  what that default costs a start;
- the database clone alone;
- memory: the process's RSS growth with 5 nodes open at once, per node;
- baseline, same run: `mink serve` in a subprocess on a cloned database, from spawn to a
  Metadata answer listing the node (what tests that kill a process pay today).

Results: a Markdown summary and a JSON file in benchmarks/results/ (or DIR).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil
import trio

from mink.testing.blocking import HarnessThread, blocking_node
from mink.testing.cluster import open_cluster, open_node
from mink.testing.postgres import TestPostgres

RESULTS = Path(__file__).with_name("results")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(values_s: list[float]) -> dict:
    ms = [v * 1000 for v in values_s]
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1),
            "p95_ms": round(pct(ms, 95), 1), "min_ms": round(min(ms), 1),
            "max_ms": round(max(ms), 1)}


async def time_open_node(postgres: TestPostgres, starts: int,
                         **settings) -> tuple[list, list]:
    """Each start after the background work of the one before is done, as in a test suite
    whose tests last longer than a drop and a clone (a few hundred ms)."""
    ready, close = [], []
    for _ in range(starts):
        await trio.to_thread.run_sync(postgres.settle)
        t0 = time.perf_counter()
        async with open_node(postgres, **settings):
            t1 = time.perf_counter()
        ready.append(t1 - t0)
        close.append(time.perf_counter() - t1)
    return ready, close


async def time_open_cluster(postgres: TestPostgres, starts: int) -> list:
    ready = []
    for _ in range(starts):
        await trio.to_thread.run_sync(postgres.settle)
        t0 = time.perf_counter()
        async with open_cluster(3, postgres):
            ready.append(time.perf_counter() - t0)
    return ready


async def rss_per_node(postgres: TestPostgres, count: int) -> dict:
    """In a process that ran nothing else: RSS with one node open (imports and one node's
    worth), then with `count` open; the added memory per node is the difference over
    count - 1. Each node has produced to and read from a topic of its own."""
    process = psutil.Process()
    samples = {}
    async with trio.open_nursery() as nursery:
        release = trio.Event()

        async def one(task_status=trio.TASK_STATUS_IGNORED) -> None:
            async with open_node(postgres) as node:
                await node.create_topic("t", partitions=3)
                task_status.started()
                await release.wait()

        for n in range(count):
            await nursery.start(one)
            if n in (0, count - 1):
                await trio.sleep(2.0)  # the loops' first rounds
                gc.collect()
                samples[n + 1] = process.memory_info().rss
        release.set()
    return {"nodes": count, "rss_one_node_mib": round(samples[1] / 2**20, 1),
            f"rss_{count}_nodes_mib": round(samples[count] / 2**20, 1),
            "per_node_mib": round((samples[count] - samples[1]) / (count - 1) / 2**20, 1)}


def memory_main(url: str, count: int) -> None:
    """`--memory URL`: the memory measurement alone, in a fresh process (run by main)."""
    postgres = TestPostgres(url)
    postgres.start()
    try:
        print(json.dumps(trio.run(rss_per_node, postgres, count)))
    finally:
        postgres.stop()


def time_clone(postgres: TestPostgres, count: int) -> list:
    """Clones alone (drops afterwards: a drop right before a clone slows it)."""
    out, urls = [], []
    for _ in range(count):
        t0 = time.perf_counter()
        urls.append(postgres.new_database())
        out.append(time.perf_counter() - t0)
    for url in urls:
        postgres.drop_database(url)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metadata_lists_a_broker(port: int) -> bool:
    """A raw Metadata v1 request (no topics): true once the answer lists one broker."""
    import struct

    request = struct.pack(">hhih", 3, 1, 7, 5) + b"bench" + struct.pack(">i", 0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(struct.pack(">i", len(request)) + request)
            header = s.recv(4)
            if len(header) < 4:
                return False
            size = struct.unpack(">i", header)[0]
            body = b""
            while len(body) < size:
                chunk = s.recv(size - len(body))
                if not chunk:
                    return False
                body += chunk
            brokers = struct.unpack(">i", body[4:8])[0]
            return brokers >= 1
    except OSError:
        return False


def time_subprocess_node(postgres: TestPostgres, starts: int) -> list:
    out = []
    for _ in range(starts):
        url = postgres.new_database()
        folder = Path(tempfile.mkdtemp(prefix="mink-bench-store-"))
        port = free_port()
        env = dict(os.environ, MINK_NODE_ID="1", MINK_LISTENER=f"127.0.0.1:{port}",
                   MINK_POSTGRES_URL=url, MINK_OBJECT_STORE=folder.as_uri(),
                   MINK_LOG_LEVEL="WARNING")
        t0 = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-m", "mink.cli", "serve"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = t0 + 60
            while not metadata_lists_a_broker(port):
                if process.poll() is not None or time.perf_counter() > deadline:
                    raise RuntimeError("mink serve did not come up")
                time.sleep(0.01)
            out.append(time.perf_counter() - t0)
        finally:
            process.terminate()
            process.wait(30)
            postgres.drop_database(url)
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.testing_startup")
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--note", default="", help="a line about the machine's load")
    parser.add_argument("--memory", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory:
        memory_main(args.memory, args.nodes)
        return 0

    results: dict = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "python": platform.python_version(), "cpus": os.cpu_count(),
                     "load_average_at_start": os.getloadavg(), "note": args.note}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    results["commit"] = commit
    with TestPostgres() as postgres:
        async def warm_and_measure() -> None:
            async with open_node(postgres):  # warm-up: imports, server caches
                pass
            ready, close = await time_open_node(postgres, args.starts)
            results["open_node_ready"] = summary(ready)
            results["open_node_close"] = summary(close)
            results["open_cluster_3_ready"] = summary(
                await time_open_cluster(postgres, max(3, args.starts // 4)))
            # Mink's own default of 50 __consumer_offsets partitions instead of the harness's 1
            ready, _ = await time_open_node(postgres, max(5, args.starts // 2),
                                            offsets_topic_num_partitions=50)
            results["open_node_ready_50_offsets_partitions"] = summary(ready)
            postgres.spares = 0  # the clone on the path: the first test of a session
            ready, _ = await time_open_node(postgres, args.starts)
            results["open_node_ready_no_spare"] = summary(ready)
            postgres.spares = 1

        trio.run(warm_and_measure)
        harness = HarnessThread()
        try:
            ready = []
            for _ in range(args.starts):
                postgres.settle()
                t0 = time.perf_counter()
                with blocking_node(harness, postgres):
                    ready.append(time.perf_counter() - t0)
            results["blocking_node_ready"] = summary(ready)
        finally:
            harness.close()
        postgres.spares = 0
        postgres.settle()
        postgres.new_database()  # the last spare
        results["clone_database"] = summary(time_clone(postgres, args.starts))
        memory = subprocess.run([sys.executable, "-m", "benchmarks.testing_startup",
                                 "--memory", postgres.url], capture_output=True, text=True,
                                cwd=Path(__file__).parent.parent, timeout=300)
        if memory.returncode != 0:
            raise RuntimeError(f"memory measurement failed:\n{memory.stderr[-3000:]}")
        results["memory"] = json.loads(memory.stdout.strip().splitlines()[-1])
        results["baseline_mink_serve_subprocess_ready"] = summary(
            time_subprocess_node(postgres, max(3, args.starts // 4)))
    results["load_average_at_end"] = os.getloadavg()

    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    json_path = args.out / f"testing-startup-{stamp}.json"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    lines = [f"# mink.testing start-up, {results['when']} at {commit}", "",
             f"`python -m benchmarks.testing_startup --starts {args.starts}`; "
             f"{results['cpus']} CPUs, load average {results['load_average_at_start']} at "
             f"start, {results['load_average_at_end']} at the end. {args.note}", "",
             "| what | n | p50 ms | p95 ms | min | max |", "| --- | --- | --- | --- | --- | --- |"]
    for key in ("open_node_ready", "open_node_ready_no_spare",
                "open_node_ready_50_offsets_partitions", "blocking_node_ready",
                "open_node_close",
                "open_cluster_3_ready", "clone_database",
                "baseline_mink_serve_subprocess_ready"):
        r = results[key]
        lines.append(f"| {key} | {r['n']} | {r['p50_ms']} | {r['p95_ms']} | {r['min_ms']} | "
                     f"{r['max_ms']} |")
    m = results["memory"]
    many = m[f"rss_{m['nodes']}_nodes_mib"]
    lines += ["", f"Memory (a fresh process): RSS {m['rss_one_node_mib']} MiB with one node "
              f"open, {many} MiB with {m['nodes']}: {m['per_node_mib']} MiB added per node."]
    md_path = json_path.with_suffix(".md")
    md_path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten: {md_path}, {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
