"""Tiering benchmark: catch-up reads from WAL objects only vs from stream objects, index rows
per GB before and after, tiering throughput of one node. Storage layer only (no Kafka
protocol), one process, in the same run:

    .venv/bin/python -m benchmarks.tiering [--mb 512] [--partitions 8] [--latency-ms 20]

1. `--mb` MB are appended to `--partitions` partitions through `Streams` (the WAL writer a
   node runs, with S3's settings: objects flushed every 50 ms, 4 uploads in flight) on a
   file:// store: many small WAL objects, each shared by every partition.
2. Catch-up from WAL objects: one reader per partition, all at once, each from offset 0 to
   the high watermark in 1 MiB Fetches (`max.partition.fetch.bytes`' default), with cold
   caches (a new `ReadCaches`: no tail cache, empty block cache), through
   `LatencyObjectStore(--latency-ms ± half)` per GET, like a remote store's round trip.
3. Tiering: rounds as the coordinator runs them (`plan_stream_objects`,
   `write_stream_object`, 4 at once) until no index row points into a WAL object; timed.
4. Catch-up again, now from stream objects, cold caches, the same simulated latency.

5. Catch-up from stream objects once more with read-ahead on (the Streams' nursery hosts
   it on a node; here the benchmark's), cold caches: read-ahead off vs on in the same run.

The OS page cache is warm for both reads (the file:// store's files were just written):
the difference measured is the one of GETs and index lookups, which a remote store makes
expensive. Results: `<out>/tiering-<timestamp>.json` and `.md`.

`--mode commit-latency`: a leader's commits with tiering off vs on, in the same run.
`--partitions` producers append ~4 KiB batches every `--append-interval-ms` each (one in
flight per partition, the WAL of a file:// node: flush as soon as the previous one is done)
for alternating phases of `--phase-s` seconds, `--phases` of each; in the "on" phases
tiering rounds run beside them in the same process (as on a leader that is also the writer-
lease holder, the worst case), every `--round-interval-s` (0.25 s), every row due at once
(`--due-after-s` 0), 256 KiB stream objects (`--stream-object-kib`): so every round swaps
rows of every partition the leader is committing to. A node's own pace, for comparison:
`--round-interval-s 15 --due-after-s 30 --stream-object-kib 32768` (the defaults of
tiering_delay_ms and tiering_stream_object_bytes), with phases of a minute or more. Reported: the
latency from append to durable (uploaded and committed) p50 / p99 / p99.9 / max per mode,
errors, stream objects swapped. Results: `<out>/tiering-commit-latency-<timestamp>.json`.
With `--io-phases`, a third mode, "io", follows each "on" phase: the bare I/O of tiering and
nothing else, i.e. objects of the sizes the last "on" phase's rounds created, written (and
fsynced) at the same times in its rounds, then deleted; no reads, no PostgreSQL, no swaps.
"on" against "io" is what tiering costs a leader beyond the disk writes it must make.
A round is paced as a node's (`--spread`, tiering_round_spread): its reads spread over that
share of the round interval, its stream objects one at a time. With `--burst-phases`, a
"burst" mode follows each "on" phase: the same rounds unpaced, `--jobs` objects at once
(tiering_round_spread 0).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import trio
import trio_asyncio

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

from benchmarks.latency_node import task_stopped_at
from mink import collector
from mink.protocol.records import Record, build_batch, iter_batches
from mink.storage.controlplane import MetadataStore
from mink.storage.controlplane.postgres import READ
from mink.storage.embedded_postgres import EmbeddedPostgres
from mink.storage.lifecycle import tiering, tiering_child
from mink.storage.log import PartitionLog, ReadCaches
from mink.storage.objectstore import LatencyObjectStore, open_object_store
from mink.storage.streams import Streams

MB = 1_000_000
MIB = 1024 * 1024
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


class CountingGets:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.gets = 0
        self.get_bytes = 0

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = await self.inner.get(key, start, end)
        self.gets += 1
        self.get_bytes += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def produce(streams: Streams, logs: list[PartitionLog], total: int, seed: int) -> float:
    rng = random.Random(seed)
    templates = []
    for n in (16, 32, 64):  # 16-64 KiB batches of 1 KiB records
        records = [Record(i, 0, None, rng.randbytes(1024)) for i in range(n)]
        templates.append((bytes(build_batch(records, base_timestamp=1_700_000_000_000)), n))
    per_partition = total // len(logs)
    started = time.monotonic()

    async def producer(log: PartitionLog) -> None:
        written = 0
        pending: list = []
        while written < per_partition:
            data, count = templates[rng.randrange(len(templates))]
            await streams.wal.wait_for_room()
            pending.append(log.append(bytearray(data), [count], 1_700_000_000_000))
            written += len(data)
            if len(pending) >= 5:
                await pending.pop(0).wait(60)
        for p in pending:
            await p.wait(60)

    async with trio.open_nursery() as nursery:
        for log in logs:
            nursery.start_soon(producer, log)
    return time.monotonic() - started


async def catch_up(metadata, objects, topic_id, partitions: int, node_id: int,
                   node_epoch: int, fetch_bytes: int, read_ahead: bool = False) -> dict[str, Any]:
    """Every partition read from 0 to its high watermark at once, cold caches."""
    counting = CountingGets(objects)
    caches = ReadCaches(metadata, counting, 0, 256 * MIB)
    async with trio.open_nursery() as owner:
        if read_ahead:
            await owner.start(caches.run_read_ahead)
        result = await _catch_up(caches, counting, metadata, topic_id, partitions,
                                 fetch_bytes)
        owner.cancel_scope.cancel()
    result["read_ahead_gets"] = caches.read_ahead_gets
    return result


async def _catch_up(caches, counting, metadata, topic_id, partitions: int,
                    fetch_bytes: int) -> dict[str, Any]:
    total = 0
    fetches = 0
    started = time.monotonic()

    async def reader(p: int) -> None:
        nonlocal total, fetches
        state = await metadata.stream_state(topic_id, p)
        log = PartitionLog(topic_id, p, state.leader_epoch, state.committed_end,
                           state.log_start_offset, None, caches)
        offset = state.log_start_offset
        while offset < state.committed_end:
            got = await log.read(offset, fetch_bytes)
            fetches += 1
            for view in got:
                total += len(view)
                for header, _ in iter_batches(view):
                    offset = header.last_offset + 1

    async with trio.open_nursery() as nursery:
        for p in range(partitions):
            nursery.start_soon(reader, p)
    elapsed = time.monotonic() - started
    return {"seconds": round(elapsed, 3), "bytes": total,
            "mb_per_s": round(total / MB / elapsed, 1), "fetches": fetches,
            "gets": counting.gets, "get_mb": round(counting.get_bytes / MB, 1)}


async def index_stats(metadata, topic_id) -> dict[str, Any]:
    rows, size = await metadata.fetch_one(READ, """
        SELECT count(*), coalesce(sum(byte_end - byte_start), 0) FROM batch_index
         WHERE topic_id = %s""", (topic_id,))
    size = int(size)
    return {"index_rows": rows, "bytes": size,
            "index_rows_per_gb": round(rows / (size / 1e9), 1) if size else None}


async def run(args, postgres: EmbeddedPostgres, root: Path) -> dict[str, Any]:
    async with trio_asyncio.open_loop():
        metadata = await MetadataStore.open(postgres.url)
        try:
            files = open_object_store(root.as_uri())
            await files.check()
            remote = LatencyObjectStore(files, args.latency_ms / 1000, args.latency_ms / 2000,
                                        rng=random.Random(args.seed))
            epoch = await metadata.register_node(1, "127.0.0.1", 19001, ttl_s=3600)
            lease = await metadata.acquire_lease("coordinator", 1, epoch, ttl_s=3600)
            topic = await metadata.create_topic("tiering-bench", args.partitions, {},
                                                [1] * args.partitions, coordinator_epoch=lease)
            streams = Streams(1, epoch, files, metadata, wal_max_bytes=8 * MIB,
                              wal_max_delay=0.05, wal_max_uploads=4)
            async with trio.open_nursery() as nursery:
                await nursery.start(streams.run)
                logs = [await streams.open(topic.topic_id, p, 0)
                        for p in range(args.partitions)]
                produce_s = await produce(streams, logs, args.mb * MB, args.seed)
                streams.stop()
            print(f"appended {args.mb} MB in {produce_s:.1f} s", flush=True)
            before = await index_stats(metadata, topic.topic_id)
            wal_objects = len(await files.list("wal/"))
            print(f"index before tiering: {before}, {wal_objects} WAL objects", flush=True)
            from_wal = await catch_up(metadata, remote, topic.topic_id, args.partitions, 1,
                                      epoch, args.fetch_bytes)
            print(f"catch-up from WAL objects: {from_wal}", flush=True)

            started = time.monotonic()
            tiered = 0
            tiered_bytes = 0
            limiter = trio.CapacityLimiter(4)
            while True:
                plans = tiering.plan_stream_objects(await tiering.wal_rows(metadata, 0.0),
                                                    args.stream_object_mb * MIB)
                if not plans:
                    break

                async def job(plan) -> None:
                    nonlocal tiered, tiered_bytes
                    async with limiter:
                        await tiering.write_stream_object(metadata, files, lease, plan)
                    tiered += 1
                    tiered_bytes += plan.size

                async with trio.open_nursery() as nursery:
                    for plan in plans:
                        nursery.start_soon(job, plan)
            tier_s = time.monotonic() - started
            tier = {"seconds": round(tier_s, 2), "stream_objects": tiered,
                    "mb": round(tiered_bytes / MB, 1),
                    "mb_per_s": round(tiered_bytes / MB / tier_s, 1)}
            print(f"tiering (one node, file://, 4 at once): {tier}", flush=True)
            after = await index_stats(metadata, topic.topic_id)
            print(f"index after tiering: {after}", flush=True)
            from_streams = await catch_up(metadata, remote, topic.topic_id, args.partitions,
                                          1, epoch, args.fetch_bytes)
            print(f"catch-up from stream objects: {from_streams}", flush=True)
            read_ahead = await catch_up(metadata, remote, topic.topic_id, args.partitions,
                                        1, epoch, args.fetch_bytes, read_ahead=True)
            print(f"catch-up from stream objects, read-ahead on: {read_ahead}", flush=True)
            settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
            return {"settings": settings, "produce_seconds": round(produce_s, 2),
                    "wal_objects": wal_objects, "index_before": before,
                    "index_after": after, "catch_up_wal": from_wal,
                    "catch_up_streams": from_streams, "catch_up_read_ahead": read_ahead,
                    "tiering": tier}
        finally:
            with trio.CancelScope(shield=True):
                await metadata.aclose()


def _percentiles(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {"n": len(ordered), "p50_ms": at(0.5), "p99_ms": at(0.99), "p999_ms": at(0.999),
            "max_ms": round(ordered[-1] * 1000, 2)}


class _StallRecorder(trio.abc.Instrument):
    """--stalls MS: every task step of MS or more (the event loop held: the producers' appends
    and the WAL's commits wait), counted by the phase's mode and where the task stopped."""

    def __init__(self, limit_s: float) -> None:
        self.limit, self.mode = limit_s, ""
        # None until a step began under this instrument: the step that added it is not timed
        self.started: float | None = None
        self.seen: dict[str, dict[str, list[float]]] = {}
        self.busy: dict[str, dict[str, float]] = {}  # mode -> task name -> seconds of steps

    def before_task_step(self, task) -> None:
        self.started = time.perf_counter()

    def after_task_step(self, task) -> None:
        if self.started is None:
            return
        took = time.perf_counter() - self.started
        by_task = self.busy.setdefault(self.mode, {})
        name = task.name.rsplit(".", 1)[-1]
        by_task[name] = by_task.get(name, 0.0) + took
        if took >= self.limit:
            where = f"{name} in {task_stopped_at(task)}"
            self.seen.setdefault(self.mode, {}).setdefault(where, []).append(took * 1000)

    def summary(self) -> dict[str, list[str]]:
        out = {mode: [f"{len(ms)} x {where} (max {max(ms):.0f} ms)" for where, ms in sorted(
            places.items(), key=lambda item: -sum(item[1]))[:8]]
            for mode, places in self.seen.items()}
        for mode, by_task in self.busy.items():
            out.setdefault(mode, []).append("event loop busy by task (s): " + ", ".join(
                f"{name} {seconds:.2f}" for name, seconds in sorted(
                    by_task.items(), key=lambda item: -item[1])[:6]))
        return out


async def commit_latency(args, postgres: EmbeddedPostgres, root: Path) -> dict[str, Any]:
    """A leader's append-to-durable latency with tiering rounds beside it or not."""
    from mink.protocol.records import Record, build_batch

    async with trio_asyncio.open_loop():
        metadata = await MetadataStore.open(postgres.url)
        try:
            files = open_object_store(root.as_uri())
            await files.check()
            epoch = await metadata.register_node(1, "127.0.0.1", 19001, ttl_s=3600)
            lease = await metadata.acquire_lease("coordinator", 1, epoch, ttl_s=3600)
            topic = await metadata.create_topic("commit-latency", args.partitions, {},
                                                [1] * args.partitions, coordinator_epoch=lease)
            rng = random.Random(args.seed)
            batch = bytes(build_batch([Record(i, 0, None, rng.randbytes(512)) for i in range(8)],
                                      base_timestamp=1_700_000_000_000))
            streams = Streams(1, epoch, files, metadata)  # a file:// node's WAL settings
            phases: list[dict[str, Any]] = []
            # A node's collector settings (mink.collector), its set-up frozen as a node's is.
            collector.tune()
            collector.freeze_heap()
            modes = ("off", "on") + (("burst",) if args.burst_phases else ()) + (
                ("io",) if args.io_phases else ())
            latencies: dict[str, list[float]] = {m: [] for m in modes}
            errors = {m: 0 for m in modes}
            swapped = {m: 0 for m in modes}
            # The "on" phase's rounds: (seconds into the phase, [object sizes]) for "io".
            rounds_written: list[tuple[float, list[int]]] = []
            # as a node's tiering worker: the copy in child processes (tiering_child.py)
            children = None if args.in_node_threads else tiering_child.TieringChildren()
            async with trio.open_nursery() as nursery:
                await nursery.start(streams.run)
                logs = [await streams.open(topic.topic_id, p, 0) for p in range(args.partitions)]

                async def producer(log: PartitionLog, mode: str, until: float) -> None:
                    while trio.current_time() < until:
                        started = trio.current_time()
                        try:
                            await log.append(bytearray(batch), [8], 1_700_000_000_000).wait(30)
                            latencies[mode].append(trio.current_time() - started)
                        except Exception:
                            errors[mode] += 1
                        await trio.sleep(args.append_interval_ms / 1000)

                async def tiering_rounds(mode: str) -> None:
                    phase_started = trio.current_time()
                    if mode == "on":
                        rounds_written.clear()
                    while True:
                        plans = await tiering.plan_round(metadata, args.due_after_s,
                                                         args.stream_object_kib * 1024)
                        if mode == "on":
                            rounds_written.append((trio.current_time() - phase_started,
                                                   [p.size for p in plans]))
                        # as a node's round (broker/cluster/tiering.py _run_jobs)
                        pace = tiering.round_pace(plans, args.round_interval_s,
                                                  0 if mode == "burst" else args.spread)
                        limiter = trio.CapacityLimiter(1 if pace else args.jobs)

                        async def job(plan) -> None:
                            async with limiter:
                                try:
                                    await tiering.write_stream_object(metadata, files, lease,
                                                                      plan, pace=pace,
                                                                      children=children)
                                    swapped[mode] += 1
                                except tiering.TieringRefused:
                                    pass

                        async with trio.open_nursery() as jobs:
                            for plan in plans:
                                jobs.start_soon(job, plan)
                        await trio.sleep(args.round_interval_s)

                async def bare_io(mode: str) -> None:
                    """The last "on" phase's object writes, at its rounds' times."""
                    limiter = trio.CapacityLimiter(args.jobs)
                    phase_started = trio.current_time()
                    for n, (at, sizes) in enumerate(list(rounds_written)):
                        await trio.sleep_until(phase_started + at)

                        async def write(key: str, size: int) -> None:
                            async with limiter:
                                await files.create(key, bytes(size))
                                swapped[mode] += 1
                                await files.delete(key)

                        async with trio.open_nursery() as writes:
                            for j, size in enumerate(sizes):
                                writes.start_soon(write, f"bare-io/{n}-{j}", size)

                stalls = _StallRecorder(args.stalls_ms / 1000) if args.stalls_ms else None
                if stalls is not None:
                    trio.lowlevel.add_instrument(stalls)
                for i in range(len(modes) * args.phases):
                    mode = modes[i % len(modes)]
                    if stalls is not None:
                        stalls.mode = mode
                    before = len(latencies[mode])
                    until = trio.current_time() + args.phase_s
                    async with trio.open_nursery() as phase:
                        if mode in ("on", "burst"):
                            phase.start_soon(tiering_rounds, mode)
                        elif mode == "io":
                            phase.start_soon(bare_io, mode)
                        async with trio.open_nursery() as producers:
                            for log in logs:
                                producers.start_soon(producer, log, mode, until)
                        phase.cancel_scope.cancel()
                    summary = {"mode": mode, **_percentiles(latencies[mode][before:])}
                    phases.append(summary)
                    print(f"phase {i + 1}: {summary}", flush=True)
                if children is not None:
                    await children.aclose()
                streams.stop()
            backlog_rows, _ = await tiering.backlog(metadata)
            settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
            return {"settings": settings, "phases": phases,
                    "off": {**_percentiles(latencies["off"]), "errors": errors["off"]},
                    "on": {**_percentiles(latencies["on"]), "errors": errors["on"],
                           "stream_objects_swapped": swapped["on"]},
                    **({"burst": {**_percentiles(latencies["burst"]),
                                  "errors": errors["burst"],
                                  "stream_objects_swapped": swapped["burst"]}}
                       if args.burst_phases else {}),
                    **({"io": {**_percentiles(latencies["io"]), "errors": errors["io"],
                               "objects_written": swapped["io"]}} if args.io_phases else {}),
                    "wal_rows_left": backlog_rows,
                    **({"stalls": stalls.summary()} if stalls is not None else {})}
        finally:
            with trio.CancelScope(shield=True):
                await metadata.aclose()


def main_commit_latency(args, argv) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="mink-tiering-bench-"))
    postgres = EmbeddedPostgres(tmp / "pg", durable=False)
    root = tmp / "objects"
    root.mkdir()
    try:
        postgres.start()
        load_before = os.getloadavg()
        result = trio.run(commit_latency, args, postgres, root)
        result["load_average"] = [load_before, os.getloadavg()]
    finally:
        if postgres.running():
            postgres.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    result["command"] = "python -m benchmarks.tiering " + " ".join(argv or sys.argv[1:])
    (args.out / f"tiering-commit-latency-{stamp}.json").write_text(json.dumps(result, indent=2))
    off, on, burst, io = result["off"], result["on"], result.get("burst"), result.get("io")
    copy = ("in the node's threads" if args.in_node_threads
            else "in child processes (SCHED_IDLE)")
    md = [f"# Tiering beside a leader's commits {stamp}", "", f"`{result['command']}`", "",
          f"{args.partitions} partitions, a ~4 KiB batch every {args.append_interval_ms} ms "
          f"each, tiering rounds every {args.round_interval_s} s (rows due from "
          f"{args.due_after_s} s, stream objects of {args.stream_object_kib} KiB), "
          f"{args.phases} phases of {args.phase_s} s per mode, alternating; the copy "
          f"{copy}; load "
          f"average {result['load_average'][0][0]:.1f} -> {result['load_average'][1][0]:.1f}.",
          "", f"| append to durable | tiering off | tiering on (spread {args.spread}) |" + (
              " on, unpaced burst |" if burst else "") + (" its bare I/O |" if io else ""),
          "| --- | ---: | ---: |" + (" ---: |" if burst else "") + (" ---: |" if io else ""),
          *[f"| {k} | {off.get(k)} | {on.get(k)} |" + (f" {burst.get(k)} |" if burst else "")
            + (f" {io.get(k)} |" if io else "")
            for k in ("n", "p50_ms", "p99_ms", "p999_ms", "max_ms", "errors")],
          f"| stream objects swapped | 0 | {on['stream_objects_swapped']} |" + (
              f" {burst['stream_objects_swapped']} |" if burst else "") + (
              f" 0 ({io['objects_written']} objects written) |" if io else ""), "",
          "Per phase: " + "; ".join(f"{p['mode']} p50 {p.get('p50_ms')} p99 {p.get('p99_ms')}"
                                    for p in result["phases"])]
    for mode, places in result.get("stalls", {}).items():
        md += ["", f"Task steps of {args.stalls_ms:g} ms or more in the {mode} phases: "
               + "; ".join(places)]
    (args.out / f"tiering-commit-latency-{stamp}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tiering", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=512, help="MB appended (default 512)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=20.0,
                        help="simulated round trip per GET for the catch-up reads")
    parser.add_argument("--fetch-bytes", type=int, default=MIB)
    parser.add_argument("--stream-object-mb", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--mode", choices=("catch-up", "commit-latency"), default="catch-up")
    parser.add_argument("--phase-s", type=float, default=10.0,
                        help="commit-latency: seconds per phase")
    parser.add_argument("--phases", type=int, default=3,
                        help="commit-latency: phases of each mode (off, on, off, on, ...)")
    parser.add_argument("--append-interval-ms", type=float, default=20.0,
                        help="commit-latency: pause between one partition's appends")
    parser.add_argument("--due-after-s", type=float, default=0.0,
                        help="commit-latency: rows are due this old (a node: the tiering "
                             "delay's half, 30 s by default)")
    parser.add_argument("--stream-object-kib", type=int, default=256,
                        help="commit-latency: stream object target (a node's: 32768)")
    parser.add_argument("--jobs", type=int, default=4,
                        help="commit-latency: stream objects written at once (a node's "
                             "tiering_concurrency, 4)")
    parser.add_argument("--spread", type=float, default=0.5,
                        help="commit-latency: a round's reads paced over this share of "
                             "--round-interval-s, its objects one at a time (a node's "
                             "tiering_round_spread, 0.5; 0: --jobs at once, unpaced)")
    parser.add_argument("--burst-phases", action="store_true",
                        help="commit-latency: a \"burst\" phase after each \"on\" one: its "
                             "rounds unpaced (--spread 0), --jobs at once")
    parser.add_argument("--io-phases", action="store_true",
                        help="commit-latency: an \"io\" phase after each \"on\" one: its "
                             "object writes alone (no tiering)")
    parser.add_argument("--round-interval-s", type=float, default=0.25,
                        help="commit-latency: pause between tiering rounds")
    parser.add_argument("--in-node-threads", action="store_true",
                        help="commit-latency: walk and copy in the node's worker threads, "
                             "as before tiering's child processes")
    parser.add_argument("--stalls-ms", type=float, default=0,
                        help="commit-latency: count the task steps of this many ms or more "
                             "by mode and place (a trio instrument; it costs some CPU)")
    args = parser.parse_args(argv)
    if args.mode == "commit-latency":
        return main_commit_latency(args, argv)
    tmp = Path(tempfile.mkdtemp(prefix="mink-tiering-bench-"))
    postgres = EmbeddedPostgres(tmp / "pg", durable=False)
    root = tmp / "objects"
    root.mkdir()
    try:
        postgres.start()
        result = trio.run(run, args, postgres, root)
    finally:
        if postgres.running():
            postgres.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    result["command"] = "python -m benchmarks.tiering " + " ".join(argv or sys.argv[1:])
    (args.out / f"tiering-{stamp}.json").write_text(json.dumps(result, indent=2))
    w, s, r = result["catch_up_wal"], result["catch_up_streams"], result["catch_up_read_ahead"]
    b, a = result["index_before"], result["index_after"]
    md = [f"# Tiering benchmark {stamp}", "", f"`{result['command']}`", "",
          f"{args.mb} MB over {args.partitions} partitions, {result['wal_objects']} WAL objects "
          f"(50 ms flushes); catch-up with cold caches, 1 MiB Fetches, "
          f"{args.latency_ms} ms ± {args.latency_ms / 2} ms per GET.", "",
          "| | from WAL objects only | from stream objects | stream objects, read-ahead |",
          "| --- | ---: | ---: | ---: |",
          f"| catch-up MB/s | {w['mb_per_s']} | {s['mb_per_s']} | {r['mb_per_s']} |",
          f"| catch-up seconds | {w['seconds']} | {s['seconds']} | {r['seconds']} |",
          f"| GETs | {w['gets']} | {s['gets']} | {r['gets']} "
          f"({r['read_ahead_gets']} read ahead) |",
          f"| MB fetched from the store | {w['get_mb']} | {s['get_mb']} | {r['get_mb']} |",
          f"| index rows | {b['index_rows']} | {a['index_rows']} | |",
          f"| index rows per GB retained | {b['index_rows_per_gb']} | {a['index_rows_per_gb']} "
          "| |",
          "", f"Tiering (one node, file://, 4 stream objects at once): "
          f"{result['tiering']['mb_per_s']} MB/s ({result['tiering']['stream_objects']} "
          f"stream objects in {result['tiering']['seconds']} s)."]
    (args.out / f"tiering-{stamp}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
