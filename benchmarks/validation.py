"""What Kafka's LogValidator costs on Produce (issue 12), in one run:

1. focused (CPU time per call): `validate_produce_records` over realistic batches (1 KiB records; 16 KiB, 256 KiB
   and 1 MiB batches; uncompressed and every codec), header checks only (validation off) vs
   the full record walk (compiled, and the pure-Python fallback), and decompression alone;
2. end to end: confluent-kafka producing 1 KiB messages (acks=all, linger.ms 5, one node,
   file://) to a node with `produce_validate_records` on and to one with it off, alternating,
   for each codec.

    .venv/bin/python -m benchmarks.validation [--quick] [--seconds S] [--rounds N]
                                              [--codecs none,lz4] [--no-e2e] [--out DIR]

Writes benchmarks/results/validation-<stamp>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mink.protocol import compression as codecs
from mink.protocol import log_validator, record_walk
from mink.protocol.log_validator import ValidationSettings, validate_produce_records
from mink.protocol.records import Record, build_batch, decompressed_records

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
BATCH_SIZES = [16 * 1024, 256 * 1024, 1024 * 1024]
RECORD_BYTES = 1024
_WORDS = [b"order", b"customer", b"amount", b"2026-12-01", b"EUR", b"status", b"shipped",
          b"id", b"warehouse", b"priority", b"true", b"false", b"null"]


def realistic_value(rng: random.Random, size: int) -> bytes:
    """JSON-ish text with random numbers: compresses about as well as real events do."""
    out = bytearray()
    while len(out) < size:
        out += b'"%s": %d, ' % (rng.choice(_WORDS), rng.randrange(10**9))
    return bytes(out[:size])


def make_batch(codec: int, batch_bytes: int, rng: random.Random) -> tuple[bytes, int]:
    count = max(1, batch_bytes // (RECORD_BYTES + 10))
    now = int(time.time() * 1000)
    records = [Record(i, i % 7, None, realistic_value(rng, RECORD_BYTES)) for i in range(count)]
    return build_batch(records, compression=codec, base_timestamp=now,
                       max_timestamp=now + 6), count * RECORD_BYTES


def _time_per_call(fn, min_seconds: float) -> float:
    """CPU seconds per call (this process's CPU time: on a shared machine wall time mostly
    measures the others' load)."""
    fn()
    n, start = 0, time.process_time()
    while True:
        fn()
        n += 1
        elapsed = time.process_time() - start
        if elapsed >= min_seconds:
            return elapsed / n


def focused(min_seconds: float) -> list[dict[str, Any]]:
    rng = random.Random(12)
    rows = []
    on = ValidationSettings(now_ms=int(time.time() * 1000))
    off = on._replace(validate_records=False)
    for codec_name in CODECS:
        codec = codecs.CODEC_IDS[codec_name]
        for size in BATCH_SIZES:
            batch, payload = make_batch(codec, size, rng)
            assert not isinstance(validate_produce_records(batch, 9, on),
                                  log_validator.Refusal)
            t_off = _time_per_call(lambda: validate_produce_records(batch, 9, off), min_seconds)
            t_on = _time_per_call(lambda: validate_produce_records(batch, 9, on), min_seconds)
            t_decompress = (0.0 if codec == codecs.NONE else _time_per_call(
                lambda: decompressed_records(batch), min_seconds))
            original = log_validator.walk_records
            log_validator.walk_records = record_walk.walk_records
            try:
                t_pure = _time_per_call(lambda: validate_produce_records(batch, 9, on),
                                        min_seconds)
            finally:
                log_validator.walk_records = original
            row = {"codec": codec_name, "batch_bytes": size, "wire_bytes": len(batch),
                   "records_bytes": payload,
                   "off_us": t_off * 1e6, "on_us": t_on * 1e6, "pure_python_us": t_pure * 1e6,
                   "decompress_us": t_decompress * 1e6,
                   "on_mb_s": payload / t_on / 1e6, "pure_python_mb_s": payload / t_pure / 1e6}
            rows.append(row)
            print(f"  {codec_name:<6} {size // 1024:>5} KiB: off {row['off_us']:8.1f} us, "
                  f"on {row['on_us']:8.1f} us (decompression {row['decompress_us']:8.1f} us), "
                  f"pure Python {row['pure_python_us']:9.1f} us", flush=True)
    return rows


def end_to_end(codec_names: list[str], seconds: float, rounds: int) -> list[dict[str, Any]]:
    from benchmarks.kafka import Bench, KafkaBenchConfig

    cfg = KafkaBenchConfig(quick=False, scenarios=["throughput"], throughput_seconds=seconds)
    tmp = Path(tempfile.mkdtemp(prefix="mink-vbench-"))
    bench = Bench(cfg, tmp)
    runs: list[dict[str, Any]] = []
    try:
        bench.start_environment()
        for round_no in range(rounds):
            for codec in codec_names:
                # alternate which mode goes first, so drift in the machine's load cancels out
                modes = ["on", "off"] if round_no % 2 == 0 else ["off", "on"]
                for mode in modes:
                    group = f"v_{codec}_{mode}_{round_no}"
                    store = bench.store("file", group)
                    db = bench.new_database(group)
                    node = bench.node(1, db, store, produce_validate_records=(
                        "true" if mode == "on" else "false"))
                    try:
                        topic = f"validation-{codec}"
                        bench.admin_create(node.address, [(topic, 1)])
                        bench.wait_ready(node.address, topic, 1)
                        result = bench.measure("produce", {
                            "bootstrap": node.address, "topic": topic, "partitions": 1,
                            "value_bytes": cfg.value_bytes, "duration": seconds,
                            "producer_config": {**cfg.producer_throughput,
                                                "compression.type": codec}},
                            [node], seconds + 180)
                    finally:
                        node.stop()
                        store.cleanup()
                    runs.append({"round": round_no, "codec": codec, "validation": mode,
                                 "mb_per_s": result["mb_per_s"],
                                 "msgs_per_s": result["msgs_per_s"],
                                 "node_cpu_pct": result.get("cpu", {}).get("node_pct")})
                    print(f"  round {round_no} {codec:<6} validation {mode:<3}: "
                          f"{result['mb_per_s']:7.1f} MB/s (node cpu "
                          f"{result.get('cpu', {}).get('node_pct')}%)", flush=True)
                    bench.settle()
    finally:
        bench.stop_environment()
        shutil.rmtree(tmp, ignore_errors=True)
    return runs


def summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for codec in dict.fromkeys(r["codec"] for r in runs):
        on = [r["mb_per_s"] for r in runs if r["codec"] == codec and r["validation"] == "on"]
        off = [r["mb_per_s"] for r in runs if r["codec"] == codec and r["validation"] == "off"]
        m_on, m_off = statistics.median(on), statistics.median(off)
        # node CPU per MB produced: what validation costs the node, whatever else the
        # machine runs (on a shared machine the throughput follows the others' load)
        cpu_on = statistics.median(_cpu_ms_per_mb(r) for r in runs
                                   if r["codec"] == codec and r["validation"] == "on")
        cpu_off = statistics.median(_cpu_ms_per_mb(r) for r in runs
                                    if r["codec"] == codec and r["validation"] == "off")
        out.append({"codec": codec, "on_mb_s": m_on, "off_mb_s": m_off,
                    "difference_pct": 100.0 * (m_off - m_on) / m_off, "runs": len(on),
                    "on_cpu_ms_per_mb": cpu_on, "off_cpu_ms_per_mb": cpu_off,
                    "cpu_difference_pct": 100.0 * (cpu_on - cpu_off) / cpu_off})
    return out


def _cpu_ms_per_mb(run: dict[str, Any]) -> float:
    # node_cpu_pct is CPU seconds per wall second, in percent of one core
    return (run["node_cpu_pct"] or 0.0) * 10.0 / run["mb_per_s"]


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Produce validation cost ({report['started_at']})", "",
             f"Command: `{report['command']}`; git {report['git_commit']}; compiled walk: "
             f"{report['compiled_walk']}; {os.cpu_count()} CPUs; load average at start "
             f"{report['loadavg_at_start']}, at end {report['loadavg_at_end']}.", "",
             "## Focused: validate_produce_records per batch (1 KiB records)", "",
             "| codec | batch | off (header, CRC) us | on us | of which decompression us | "
             "on MB/s | pure-Python walk us |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["focused"]:
        lines.append(f"| {r['codec']} | {r['batch_bytes'] // 1024} KiB | {r['off_us']:.1f} | "
                     f"{r['on_us']:.1f} | {r['decompress_us']:.1f} | {r['on_mb_s']:.0f} | "
                     f"{r['pure_python_us']:.1f} |")
    if report["e2e_summary"]:
        lines += ["", "## End to end: confluent-kafka, 1 KiB, acks=all, 1 partition, file://",
                  "", "| codec | validation on MB/s | off MB/s | throughput lost | "
                  "node CPU ms/MB on | off | CPU added | runs each |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for s in report["e2e_summary"]:
            lines.append(f"| {s['codec']} | {s['on_mb_s']:.1f} | {s['off_mb_s']:.1f} | "
                         f"{s['difference_pct']:+.1f}% | {s['on_cpu_ms_per_mb']:.2f} | "
                         f"{s['off_cpu_ms_per_mb']:.2f} | {s['cpu_difference_pct']:+.1f}% | "
                         f"{s['runs']} |")
        lines += ["", "Medians of the runs; every run:", ""]
        for r in report["e2e_runs"]:
            lines.append(f"- round {r['round']} {r['codec']} {r['validation']}: "
                         f"{r['mb_per_s']:.1f} MB/s, node cpu {r['node_cpu_pct']}%")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.validation",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per end-to-end run")
    parser.add_argument("--rounds", type=int, default=2, help="end-to-end runs per mode")
    parser.add_argument("--codecs", default=",".join(CODECS))
    parser.add_argument("--no-e2e", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds = 2.0, 1
    import subprocess

    started = dt.datetime.now().astimezone()
    load_at_start = [round(x, 1) for x in os.getloadavg()]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"compiled record walk: {log_validator.COMPILED}", flush=True)
    print("focused:", flush=True)
    rows = focused(0.05 if args.quick else 0.5)
    runs = []
    if not args.no_e2e:
        print("end to end:", flush=True)
        runs = end_to_end([c for c in args.codecs.split(",") if c], args.seconds, args.rounds)
    report = {"benchmark": "validation", "started_at": started.isoformat(timespec="seconds"),
              "command": " ".join(["python -m benchmarks.validation",
                                   *(argv if argv is not None else sys.argv[1:])]),
              "git_commit": commit, "compiled_walk": log_validator.COMPILED,
              "loadavg_at_start": load_at_start,
              "loadavg_at_end": [round(x, 1) for x in os.getloadavg()],
              "focused": rows, "e2e_runs": runs, "e2e_summary": summary(runs) if runs else []}
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    (args.out / f"validation-{stamp}.json").write_text(json.dumps(report, indent=1))
    md = markdown(report)
    (args.out / f"validation-{stamp}.md").write_text(md)
    print()
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
