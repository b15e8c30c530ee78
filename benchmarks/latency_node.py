"""`mink serve` for the benchmarks, optionally behind a simulated network to the object store.

    MINK_BENCH_STORE_LATENCY_MS=20 MINK_BENCH_STORE_JITTER_MS=10 MINK_... \\
        python -m benchmarks.latency_node

Without MINK_BENCH_* variables this is exactly `python -m mink.cli serve`.

- MINK_BENCH_STORE_LATENCY_MS (and _JITTER_MS): the object store the node opens is wrapped
  in `mink.storage.objectstore.testing.LatencyObjectStore(mean, jitter)`: every request
  sleeps uniform(mean - jitter, mean + jitter) first, like a remote store's round trip. It
  patches `open_object_store` as `mink.broker.node` imported it, and touches nothing else.
- MINK_BENCH_GC_LOG=PATH: every garbage collection of generation 1 or 2 that takes 1 ms or
  more is appended to PATH as `<time.monotonic() at its end> <generation> <ms> <collected>`
  (a `gc.callbacks` hook: observes, changes nothing). The benchmark reports the pauses that
  fall in each measurement window: the event loop runs nothing while one lasts.
- MINK_BENCH_STALL_LOG=PATH (and MINK_BENCH_STALL_MS, default 20): a trio instrument
  appends every task step (the run of one task between two awaits) that takes that long or
  longer to PATH as `<time.monotonic() at its end> <ms> <task name> <where it stopped>`:
  while one runs, no other request is served. It costs two Python calls per task step, so
  it is off unless asked for (`benchmarks.kafka --stalls`).
- MINK_BENCH_WAL_LOG=PATH: every WAL upload is appended to PATH as `U <start> <end> <bytes>
  <ranges>` and every CommitWal call as `C <start> <end> <objects> <bytes>` (time.monotonic();
  wraps WalWriter._upload and _commit, changes nothing): where a produce's wait goes. Set it in
  the environment of `benchmarks.kafka`, whose nodes inherit it.
"""

from __future__ import annotations

import os
import random
import sys


def _install_latency(mean_ms: float, jitter_ms: float, seed: int | None) -> None:
    import mink.broker.node as node_module
    from mink.storage.objectstore import LatencyObjectStore

    original = node_module.open_object_store

    def open_with_latency(*args, **kwargs):
        return LatencyObjectStore(original(*args, **kwargs), mean_ms / 1000, jitter_ms / 1000,
                                  rng=random.Random(seed))

    node_module.open_object_store = open_with_latency


def _install_gc_log(path: str) -> None:
    import gc
    import time

    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's lifetime
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.monotonic()
        elif info["generation"] >= 1:
            end = time.monotonic()
            ms = (end - started[0]) * 1000
            if ms >= 1.0:
                out.write(f"{end:.6f} {info['generation']} {ms:.2f} {info['collected']}\n")

    gc.callbacks.append(on_gc)


def task_stopped_at(task) -> str:
    """The innermost frame outside trio that a task's coroutine chain is suspended in ("?":
    the task finished)."""
    coro, last = task.coro, "?"
    for _ in range(50):
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        if "/trio/" not in frame.f_code.co_filename:
            last = f"{frame.f_code.co_qualname}:{frame.f_lineno}"
        nxt = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if nxt is None:
            break
        coro = nxt
    return last


def _install_stall_log(path: str, threshold_ms: float) -> None:
    import time

    import trio

    import mink.broker.node as node_module

    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's lifetime
    limit = threshold_ms / 1000

    class StallLog(trio.abc.Instrument):
        def __init__(self) -> None:
            self.started: float | None = None  # the step that added it is not timed

        def before_task_step(self, task) -> None:
            self.started = time.perf_counter()

        def after_task_step(self, task) -> None:
            if self.started is None:
                return
            took = time.perf_counter() - self.started
            if took >= limit:
                out.write(f"{time.monotonic():.6f} {took * 1000:.1f} {task.name.replace(' ', '_')} "
                          f"{task_stopped_at(task)}\n")

    original = node_module.run_node

    async def run_node(*args, **kwargs):
        trio.lowlevel.add_instrument(StallLog())
        return await original(*args, **kwargs)

    node_module.run_node = run_node


def _install_wal_log(path: str) -> None:
    import time

    from mink.storage import wal

    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's lifetime
    upload, commit = wal.WalWriter._upload, wal.WalWriter._commit

    async def timed_upload(self, obj):
        started = time.monotonic()
        await upload(self, obj)
        out.write(f"U {started:.6f} {time.monotonic():.6f} {obj.size} {len(obj.ranges)}\n")

    async def timed_commit(self, ready):
        started = time.monotonic()
        await commit(self, ready)
        out.write(f"C {started:.6f} {time.monotonic():.6f} {len(ready)} "
                  f"{sum(obj.size for obj in ready)}\n")

    wal.WalWriter._upload, wal.WalWriter._commit = timed_upload, timed_commit


def main() -> int:
    from mink.cli import keep_hypothesis_out

    keep_hypothesis_out()  # as `mink serve`: before the patches below import kio
    stall_log = os.environ.get("MINK_BENCH_STALL_LOG")
    if stall_log:
        _install_stall_log(stall_log, float(os.environ.get("MINK_BENCH_STALL_MS", "20")))
    wal_log = os.environ.get("MINK_BENCH_WAL_LOG")
    if wal_log:
        _install_wal_log(wal_log)
    gc_log = os.environ.get("MINK_BENCH_GC_LOG")
    if gc_log:
        _install_gc_log(gc_log)
    latency = os.environ.get("MINK_BENCH_STORE_LATENCY_MS")
    if latency:
        jitter = os.environ.get("MINK_BENCH_STORE_JITTER_MS", "0")
        seed = os.environ.get("MINK_BENCH_SEED")
        _install_latency(float(latency), float(jitter), int(seed) if seed else None)
    from mink.cli import main as cli_main

    return cli_main(["serve"])


if __name__ == "__main__":
    sys.exit(main())
