"""The file store's compiled helpers against their Python fallbacks, beside a busy event loop.

    .venv/bin/python -m benchmarks.gil_helpers [--rounds 3] [--out DIR]

A node's object store calls run in worker threads beside the event loop, which at 20 MB/s is
about 80% busy; in Python every syscall of such a call gives the GIL up and takes it back,
and each take-back waits for the loop's current step. Two measurements, each alternating
the compiled helper and its fallback (module attribute set to None), which goes first too,
round by round, in one process on trio:

- create: 1,500 WAL-sized objects (113 KB, one buffer) created one after another on
  file:// (fsynced), the loop busy in 0.8 ms Python steps with 0.2 ms sleeps between them
  (about 80%), and idle: the create's latency (`_create_file.pyx`);
- compose: a 32 MiB stream object composed from 8,000 ranges of 4 KiB out of 2,000 objects
  written through the page cache, as tiering composes one at 8 partitions: wall time and
  the process's CPU time (`_range_copy.pyx`).

Results: a Markdown summary on stdout and in `<out>/gil-helpers-<timestamp>.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import trio

from mink.storage.objectstore import ObjectRange
from mink.storage.objectstore import file as file_store

DEFAULT_OUT = Path("benchmarks/out")
CREATES = 1500
WAL_OBJECT = 113_000
BUSY_STEP_S, BUSY_SLEEP_S = 0.0008, 0.0002


async def _busy(stop: trio.Event) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        while time.perf_counter() - started < BUSY_STEP_S:
            sum(range(200))
        await trio.sleep(BUSY_SLEEP_S)


async def _creates(root: Path, busy: bool) -> list[float]:
    store = file_store.FileObjectStore(str(root))
    data = memoryview(os.urandom(WAL_OBJECT))
    took: list[float] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        if busy:
            nursery.start_soon(_busy, stop)
        for i in range(CREATES):
            started = time.perf_counter()
            await store.create(f"wal/1/{i:012d}", [data])
            took.append(time.perf_counter() - started)
        stop.set()
    return took


async def _compose(root: Path) -> tuple[float, float]:
    store = file_store.FileObjectStore(str(root))
    objects, ranges_each = 2000, 4
    if not (root / "wal").exists():
        for i in range(objects):
            await store.create(f"wal/{i:012d}", os.urandom(ranges_each * 4096))
    parts = [ObjectRange(f"wal/{i // ranges_each:012d}", (i % ranges_each) * 4096,
                         (i % ranges_each + 1) * 4096) for i in range(objects * ranges_each)]
    wall, cpu = time.perf_counter(), time.process_time()
    await store.compose(f"stream/{time.monotonic_ns()}", parts)
    return time.perf_counter() - wall, time.process_time() - cpu


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    compiled = {"create": file_store._create_file, "compose": file_store._range_copy}
    if None in compiled.values():
        raise SystemExit("the compiled helpers are not built: pip install -e .")
    tmp = Path(tempfile.mkdtemp(prefix="mink-gil-helpers-"))
    rows = ["| round | helper | loop | create p50 ms | p99 ms | mean ms |",
            "| --- | --- | --- | ---: | ---: | ---: |"]
    compose_rows = ["| round | helper | compose wall ms | CPU ms |", "| --- | --- | ---: | ---: |"]
    try:
        for n in range(1, args.rounds + 1):
            # alternated, first one then the other: the disk's own drift falls on both
            for helper in ("compiled", "python")[::1 if n % 2 else -1]:
                file_store._create_file = compiled["create"] if helper == "compiled" else None
                file_store._range_copy = compiled["compose"] if helper == "compiled" else None
                for busy in (True, False):
                    root = tmp / f"creates-{n}-{helper}-{busy}"
                    root.mkdir()
                    took = trio.run(_creates, root, busy)
                    shutil.rmtree(root)
                    rows.append(f"| {n} | {helper} | {'busy' if busy else 'idle'} | "
                                f"{_ms(took, .5):.2f} | {_ms(took, .99):.2f} | "
                                f"{1000 * statistics.mean(took):.2f} |")
                    print(rows[-1], flush=True)
                (tmp / "compose").mkdir(exist_ok=True)
                wall, cpu = trio.run(_compose, tmp / "compose")
                compose_rows.append(f"| {n} | {helper} | {1000 * wall:.0f} | {1000 * cpu:.0f} |")
                print(compose_rows[-1], flush=True)
    finally:
        file_store._create_file, file_store._range_copy = compiled["create"], compiled["compose"]
        shutil.rmtree(tmp, ignore_errors=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    md = [f"# The file store's compiled helpers beside a busy event loop {stamp}", "",
          (f"`python -m benchmarks.gil_helpers --rounds {args.rounds}`; {os.cpu_count()} "
           f"cores, load average {os.getloadavg()[0]:.1f} at the end."), "",
          (f"Create of {WAL_OBJECT} B objects, {CREATES} one after another (fsynced), the "
           f"loop busy (~80%) or idle:"), "", *rows, "",
          "Compose of 32 MiB from 8,000 ranges of 4 KiB out of 2,000 objects:", "",
          *compose_rows, ""]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gil-helpers-{stamp}.md"
    path.write_text("\n".join(md))
    print("\n".join(md))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
