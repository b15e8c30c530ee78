"""What the instrumentation costs a node (issue 18): node CPU-seconds per GB produced with
metrics on (an admin listener, every metric kept, /metrics scraped every --scrape-every
seconds during the run) vs off (no admin listener: NULL_METRICS, nothing kept).

One node (`mink serve` in a subprocess, file:// store), confluent-kafka producing 1 KiB
messages (acks=all, linger.ms 5) to one partition for --seconds per run; --rounds runs per
mode, alternating which mode goes first so drift in the machine's load cancels out; the
figure is the median per mode. CPU is the node process's own (user + system) from /proc,
so other load on a shared machine moves it less than it moves the throughput.

    .venv/bin/python -m benchmarks.metrics_cost [--rounds 5] [--seconds 10]
                                                [--scrape-every 1] [--out DIR]

Writes benchmarks/results/metrics-cost-<stamp>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any

from mink.storage.embedded_postgres import free_port

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
TARGET_PCT = 3.0


class Scraper(threading.Thread):
    """GET /metrics every `every` seconds until stopped, as Prometheus would."""

    def __init__(self, url: str, every: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every = url, every
        self.stopped = threading.Event()
        self.scrapes = 0
        self.last_bytes = 0
        self.errors = 0

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    self.last_bytes = len(response.read())
                self.scrapes += 1
            except OSError:
                self.errors += 1

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


def _cpu_per_call(fn, min_seconds: float) -> float:
    """CPU seconds per call of `fn` (this process's CPU time, not wall time)."""
    import time

    fn()
    n, start = 0, time.process_time()
    while True:
        fn()
        n += 1
        elapsed = time.process_time() - start
        if elapsed >= min_seconds:
            return elapsed / n


def focused(min_seconds: float = 0.5) -> dict[str, float]:
    """The hot-path hooks alone, per call, in this process: what one Produce request (one
    partition) and one Fetch response (one partition, 16 batches) add with metrics on, and
    the CPU of one scrape with 100 topics. Independent of the machine's other load."""
    import time
    from types import SimpleNamespace

    from mink.broker.admin.metrics import NULL_METRICS, NodeMetrics
    from mink.broker.server.handlers.fetch import _records_in
    from mink.protocol.records import Record, build_batch

    topics = {f"topic-{i}": SimpleNamespace(partitions=()) for i in range(100)}
    node = SimpleNamespace(
        node_id=1, node_epoch=1, leading=True, valid_until=0.0, streams=None,
        may_lead=lambda: True, view=SimpleNamespace(version=1, brokers={1: None}, topics=topics),
        coordinator=SimpleNamespace(is_holder=False, lease_epoch=None),
        groups=SimpleNamespace(groups={}), config=SimpleNamespace(consumer_lag_refresh_ms=5000))
    batch = build_batch([Record(i, 0, None, b"x" * 1024) for i in range(16)])
    views = [memoryview(batch * 16)]

    def produce_hooks(metrics):
        def run():
            started = time.perf_counter()
            meters = metrics.topic("topic-7")
            meters.bytes_in.inc(16 * 1024)
            meters.messages_in.inc(16)
            metrics.request(0, 9).observe(time.perf_counter() - started)
        return run

    def fetch_hooks(metrics):
        def run():
            started = time.perf_counter()
            if metrics.enabled:
                meters = metrics.topic("topic-7")
                meters.bytes_out.inc(len(views[0]))
                meters.messages_out.inc(_records_in(views))
            metrics.request(1, 12).observe(time.perf_counter() - started)
        return run

    on = NodeMetrics(node)
    for name in topics:  # every topic has its series, as after traffic to each
        on.topic(name).bytes_in.inc(1)
    out = {
        "produce_hooks_on_us": 1e6 * _cpu_per_call(produce_hooks(on), min_seconds),
        "produce_hooks_off_us": 1e6 * _cpu_per_call(produce_hooks(NULL_METRICS), min_seconds),
        "fetch_hooks_on_us": 1e6 * _cpu_per_call(fetch_hooks(on), min_seconds),
        "fetch_hooks_off_us": 1e6 * _cpu_per_call(fetch_hooks(NULL_METRICS), min_seconds),
        "scrape_100_topics_ms": 1e3 * _cpu_per_call(on.exposition, min_seconds),
        "scrape_bytes": len(on.exposition()),
    }
    for key, value in out.items():
        print(f"  {key}: {value:.2f}", flush=True)
    return out


def cpu_s_per_gb(run: dict[str, Any]) -> float:
    """node_cpu_pct is CPU seconds per wall second in percent of one core: CPU-seconds per
    GB = (pct / 100) / (MB/s / 1000)."""
    return (run["node_cpu_pct"] or 0.0) * 10.0 / run["mb_per_s"]


def measure(rounds: int, seconds: float, scrape_every: float) -> list[dict[str, Any]]:
    from benchmarks.kafka import Bench, KafkaBenchConfig

    cfg = KafkaBenchConfig(quick=False, scenarios=["throughput"], throughput_seconds=seconds)
    tmp = Path(tempfile.mkdtemp(prefix="mink-mbench-"))
    bench = Bench(cfg, tmp)
    runs: list[dict[str, Any]] = []
    try:
        bench.start_environment()
        for round_no in range(rounds):
            for mode in (["on", "off"] if round_no % 2 == 0 else ["off", "on"]):
                group = f"m_{mode}_{round_no}"
                store = bench.store("file", group)
                db = bench.new_database(group)
                settings: dict[str, Any] = {}
                admin_port = None
                if mode == "on":
                    admin_port = free_port()
                    settings["admin_listener"] = f"127.0.0.1:{admin_port}"
                node = bench.node(1, db, store, **settings)
                scraper = None
                try:
                    bench.admin_create(node.address, [("metered", 1)])
                    bench.wait_ready(node.address, "metered", 1)
                    if admin_port is not None:
                        scraper = Scraper(f"http://127.0.0.1:{admin_port}/metrics",
                                          scrape_every)
                        scraper.start()
                    result = bench.measure("produce", {
                        "bootstrap": node.address, "topic": "metered", "partitions": 1,
                        "value_bytes": cfg.value_bytes, "duration": seconds,
                        "producer_config": cfg.producer_throughput}, [node], seconds + 180)
                finally:
                    if scraper is not None:
                        scraper.stop()
                    node.stop()
                    store.cleanup()
                run = {"round": round_no, "metrics": mode, "mb_per_s": result["mb_per_s"],
                       "node_cpu_pct": result.get("cpu", {}).get("node_pct"),
                       "machine_busy_pct": result.get("cpu", {}).get("machine_busy_pct"),
                       "scrapes": scraper.scrapes if scraper else 0,
                       "scrape_bytes": scraper.last_bytes if scraper else 0}
                run["cpu_s_per_gb"] = cpu_s_per_gb(run)
                runs.append(run)
                print(f"  round {round_no} metrics {mode:<3}: {run['mb_per_s']:7.1f} MB/s, "
                      f"node cpu {run['node_cpu_pct']}%, {run['cpu_s_per_gb']:.2f} "
                      f"CPU-s/GB, {run['scrapes']} scrapes", flush=True)
                bench.settle()
    finally:
        bench.stop_environment()
        shutil.rmtree(tmp, ignore_errors=True)
    return runs


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    on = [r for r in runs if r["metrics"] == "on"]
    off = [r for r in runs if r["metrics"] == "off"]
    cpu_on = statistics.median(r["cpu_s_per_gb"] for r in on)
    cpu_off = statistics.median(r["cpu_s_per_gb"] for r in off)
    return {"runs_each": len(on), "on_cpu_s_per_gb": cpu_on, "off_cpu_s_per_gb": cpu_off,
            "cost_pct": 100.0 * (cpu_on - cpu_off) / cpu_off,
            "on_mb_s": statistics.median(r["mb_per_s"] for r in on),
            "off_mb_s": statistics.median(r["mb_per_s"] for r in off),
            "on_spread": [min(r["cpu_s_per_gb"] for r in on),
                          max(r["cpu_s_per_gb"] for r in on)],
            "off_spread": [min(r["cpu_s_per_gb"] for r in off),
                           max(r["cpu_s_per_gb"] for r in off)]}


def markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    f = report["focused"]
    verdict = "met" if s["cost_pct"] < TARGET_PCT else "missed"
    lines = [f"# Metrics cost ({report['started_at']})", "",
             f"Command: `{report['command']}`; git {report['git_commit']}; "
             f"{os.cpu_count()} CPUs, shared with other work (load average at start "
             f"{report['loadavg_at_start']}, at end {report['loadavg_at_end']}).", "",
             "One node, file://, confluent-kafka 1 KiB messages, acks=all, linger.ms 5, one "
             f"partition; /metrics scraped every {report['scrape_every_s']} s while on.", "",
             "| | metrics on | metrics off |", "| --- | --- | --- |",
             f"| node CPU-seconds per GB (median) | {s['on_cpu_s_per_gb']:.2f} | "
             f"{s['off_cpu_s_per_gb']:.2f} |",
             f"| min - max | {s['on_spread'][0]:.2f} - {s['on_spread'][1]:.2f} | "
             f"{s['off_spread'][0]:.2f} - {s['off_spread'][1]:.2f} |",
             f"| MB/s (median) | {s['on_mb_s']:.1f} | {s['off_mb_s']:.1f} |",
             f"| runs | {s['runs_each']} | {s['runs_each']} |", "",
             f"Cost of instrumentation: {s['cost_pct']:+.1f}% node CPU per GB "
             f"(target < {TARGET_PCT:.0f}%: {verdict}).", "",
             "Focused, per call in one process (CPU time, so the machine's other load "
             "matters little):", "",
             "| hooks | metrics on | off |", "| --- | --- | --- |",
             f"| one Produce request, one partition | {f['produce_hooks_on_us']:.2f} us | "
             f"{f['produce_hooks_off_us']:.2f} us |",
             f"| one Fetch response, one partition of 16 batches | "
             f"{f['fetch_hooks_on_us']:.2f} us | {f['fetch_hooks_off_us']:.2f} us |",
             f"| one scrape, 100 topics ({f['scrape_bytes']} bytes) | "
             f"{f['scrape_100_topics_ms']:.2f} ms | |", "", "Every run:", ""]
    for r in report["runs"]:
        lines.append(f"- round {r['round']} metrics {r['metrics']}: {r['mb_per_s']:.1f} MB/s, "
                     f"node cpu {r['node_cpu_pct']}%, {r['cpu_s_per_gb']:.2f} CPU-s/GB, "
                     f"machine busy {r['machine_busy_pct']}%, {r['scrapes']} scrapes of "
                     f"{r['scrape_bytes']} bytes")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metrics_cost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs per mode (at least 5)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per run")
    parser.add_argument("--scrape-every", type=float, default=1.0,
                        help="seconds between scrapes while metrics are on")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    started = dt.datetime.now().astimezone()
    load_at_start = [round(x, 1) for x in os.getloadavg()]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print("focused (per call, this process's CPU):", flush=True)
    hooks = focused()
    print("end to end:", flush=True)
    runs = measure(args.rounds, args.seconds, args.scrape_every)
    report = {"benchmark": "metrics_cost", "started_at": started.isoformat(timespec="seconds"),
              "command": " ".join(["python -m benchmarks.metrics_cost",
                                   *(argv if argv is not None else sys.argv[1:])]),
              "git_commit": commit, "loadavg_at_start": load_at_start,
              "loadavg_at_end": [round(x, 1) for x in os.getloadavg()],
              "scrape_every_s": args.scrape_every, "focused": hooks, "runs": runs,
              "summary": summary(runs)}
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    (args.out / f"metrics-cost-{stamp}.json").write_text(json.dumps(report, indent=1))
    md = markdown(report)
    (args.out / f"metrics-cost-{stamp}.md").write_text(md)
    print()
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
