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

The OS page cache is warm for both reads (the file:// store's files were just written):
the difference measured is the one of GETs and index lookups, which a remote store makes
expensive. Results: `<out>/tiering-<timestamp>.json` and `.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
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

from mink.protocol.records import Record, build_batch, iter_batches
from mink.storage.controlplane import MetadataStore
from mink.storage.controlplane.postgres import READ
from mink.storage.embedded_postgres import EmbeddedPostgres
from mink.storage.lifecycle import tiering
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
                   node_epoch: int, fetch_bytes: int) -> dict[str, Any]:
    """Every partition read from 0 to its high watermark at once, cold caches."""
    counting = CountingGets(objects)
    caches = ReadCaches(metadata, counting, 0, 256 * MIB)
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
            settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
            return {"settings": settings, "produce_seconds": round(produce_s, 2),
                    "wal_objects": wal_objects, "index_before": before,
                    "index_after": after, "catch_up_wal": from_wal,
                    "catch_up_streams": from_streams, "tiering": tier}
        finally:
            with trio.CancelScope(shield=True):
                await metadata.aclose()


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
    args = parser.parse_args(argv)
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
    w, s = result["catch_up_wal"], result["catch_up_streams"]
    b, a = result["index_before"], result["index_after"]
    md = [f"# Tiering benchmark {stamp}", "", f"`{result['command']}`", "",
          f"{args.mb} MB over {args.partitions} partitions, {result['wal_objects']} WAL objects "
          f"(50 ms flushes); catch-up with cold caches, 1 MiB Fetches, "
          f"{args.latency_ms} ms ± {args.latency_ms / 2} ms per GET.", "",
          "| | from WAL objects only | from stream objects |", "| --- | ---: | ---: |",
          f"| catch-up MB/s | {w['mb_per_s']} | {s['mb_per_s']} |",
          f"| catch-up seconds | {w['seconds']} | {s['seconds']} |",
          f"| GETs | {w['gets']} | {s['gets']} |",
          f"| MB fetched from the store | {w['get_mb']} | {s['get_mb']} |",
          f"| index rows | {b['index_rows']} | {a['index_rows']} |",
          f"| index rows per GB retained | {b['index_rows_per_gb']} | {a['index_rows_per_gb']} |",
          "", f"Tiering (one node, file://, 4 stream objects at once): "
          f"{result['tiering']['mb_per_s']} MB/s ({result['tiering']['stream_objects']} "
          f"stream objects in {result['tiering']['seconds']} s)."]
    (args.out / f"tiering-{stamp}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
