"""Compacted topics (issue 20), the in-process parts, on one core:

1. the KV tablet (mink/storage/compaction/tablet.py) with N keys (1,000,000 by default):
   replay throughput (committed batches applied, records/s), bytes per key, snapshot size
   and encode time, restore = snapshot decode + replay of the records after it (10% of N),
   lookup latency p50/p99 (in memory: no record read);
2. the log cleaner's record work (mink/storage/compaction/cleaner.py) over a log of N/5 keys
   written three times, lz4 batches of 100 records: records/s and MB/s in, records out;
3. one pass streamed as store.py streams it (the map scan, then the clean scan, the batches
   kept gathered into objects of 4 MiB that are dropped once full, as an upload frees
   them), over the same keys with values of about 200 bytes, in memory: its peak allocation
   (tracemalloc, a second run; the log itself is not counted), the map's size, and with a
   map of 1/4 of the keys where the pass stops.

Not measured here: a tablet restored from the object store on a leader, lookups through the
HTTP endpoint (benchmarks/kv_lookup.py); a pass's object-store reads and its swap.

    .venv/bin/python -m benchmarks.compaction [--quick] [--keys N] [--out DIR]

Writes benchmarks/results/compaction-<stamp>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import time
import tracemalloc
from pathlib import Path

from mink.protocol import compression as codecs
from mink.protocol.records import Record, build_batch
from mink.storage.compaction import cleaner
from mink.storage.compaction.offset_map import SLOT_BYTES, OffsetMap
from mink.storage.compaction.tablet import KVTablet

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
PER_BATCH = 100
NOW = 1_700_000_000_000


def _log(keys: int, rounds: int, codec: int, rng: random.Random,
         padding: int = 0) -> list[bytes]:
    batches, offset = [], 0
    for r in range(rounds):
        order = list(range(keys))
        rng.shuffle(order)
        for i in range(0, keys, PER_BATCH):
            records = [Record(j, 0, b"key-%08d" % k,
                              b"value-%d-%08d" % (r, k) + rng.randbytes(padding))
                       for j, k in enumerate(order[i:i + PER_BATCH])]
            batches.append(build_batch(records, base_offset=offset, compression=codec,
                                       base_timestamp=NOW))
            offset += len(records)
    return batches


def tablet_figures(keys: int) -> dict[str, float]:
    rng = random.Random(1)
    log = _log(keys, 1, codecs.NONE, rng)
    tail = [build_batch([Record(j, 0, b"key-%08d" % rng.randrange(keys), b"later")
                         for j in range(PER_BATCH)], base_offset=keys + i * PER_BATCH,
                        base_timestamp=NOW) for i in range(max(1, keys // 10 // PER_BATCH))]
    tablet = KVTablet()
    started = time.perf_counter()
    for b in log:
        tablet.apply(b)
    replay_s = time.perf_counter() - started
    started = time.perf_counter()
    snapshot = b"".join(tablet.snapshot())
    encode_s = time.perf_counter() - started
    started = time.perf_counter()
    restored = KVTablet.restore(snapshot)
    decode_s = time.perf_counter() - started
    started = time.perf_counter()
    for b in tail:
        restored.apply(b)
    tail_s = time.perf_counter() - started
    probes = [b"key-%08d" % rng.randrange(keys) for _ in range(20_000)]
    latencies = []
    for key in probes:
        t0 = time.perf_counter_ns()
        restored.get(key)
        latencies.append(time.perf_counter_ns() - t0)
    latencies.sort()
    return {
        "keys": keys,
        "replay_records_per_s": keys / replay_s,
        "bytes_per_key": tablet.nbytes() / len(tablet),
        "table_mib": tablet.nbytes() / 2**20,
        "snapshot_mib": len(snapshot) / 2**20,
        "snapshot_encode_s": encode_s,
        "restore_decode_s": decode_s,
        "restore_replay_records": len(tail) * PER_BATCH,
        "restore_replay_s": tail_s,
        "restore_total_s": decode_s + tail_s,
        "lookup_p50_us": latencies[len(latencies) // 2] / 1000,
        "lookup_p99_us": latencies[int(len(latencies) * 0.99)] / 1000,
    }


def cleaner_figures(keys: int) -> dict[str, float]:
    rng = random.Random(2)
    log = _log(keys, 3, codecs.LZ4, rng)
    size = sum(len(b) for b in log)
    records = 3 * keys
    started = time.perf_counter()
    result = cleaner.clean_batches(log, now_ms=NOW, delete_retention_ms=86_400_000,
                                   end=records, dirty_from=0)
    took = time.perf_counter() - started
    return {
        "keys": keys,
        "records_in": result.records_in,
        "records_out": result.records_out,
        "mb_in": size / 1e6,
        "mb_out": sum(len(b) for b in result.batches) / 1e6,
        "seconds": took,
        "records_per_s": records / took,
        "mb_per_s": size / 1e6 / took,
    }


def _streamed_pass(log: list[bytes], records: int, map_bytes: int,
                   object_bytes: int) -> dict[str, float]:
    offset_map = OffsetMap.sized(map_bytes, records)
    builder = cleaner.MapBuilder(offset_map, 0, records)
    # Views of the batches, as store.py's blocks give them: a batch kept whole is then
    # copied into the object as there, not the log's own bytes passed on uncounted.
    for b in log:
        if not builder.feed([memoryview(b)]):
            break
    limit = builder.finish()
    pass_ = cleaner.BatchCleaner(offset_map, builder.decisions, now_ms=NOW,
                                 delete_retention_ms=86_400_000, end=limit)
    current: list[bytes] = []
    size = objects = written = 0
    last = len(log) - 1
    for i, b in enumerate(log):
        kept = pass_.clean(memoryview(b), i == last)
        if kept is None:
            continue
        if current and size + len(kept) > object_bytes:
            objects, written, current, size = objects + 1, written + size, [], 0
        current.append(bytes(kept))
        size += len(kept)
    return {"cleaned_to": max(limit, 0), "map_full": builder.full, "objects": objects + 1,
            "mb_out": (written + size) / 1e6, "records_out": pass_.records_out,
            "map_mib": offset_map.nbytes() / 2**20}


def pass_figures(keys: int) -> dict[str, float]:
    rng = random.Random(2)
    log = _log(keys, 3, codecs.LZ4, rng, padding=200)
    records, size = 3 * keys, sum(len(b) for b in log)
    started = time.perf_counter()
    whole = _streamed_pass(log, records, 128 << 20, 4 << 20)
    took = time.perf_counter() - started
    tracemalloc.start()
    _streamed_pass(log, records, 128 << 20, 4 << 20)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    small = _streamed_pass(log, records, keys // 4 * SLOT_BYTES, 4 << 20)
    return {
        "keys": keys,
        "mb_in": size / 1e6,
        "seconds": took,
        "records_per_s": records / took,
        "records_out": whole["records_out"],
        "objects": whole["objects"],
        "map_mib": whole["map_mib"],
        "peak_mib": peak / 2**20,
        "peak_over_input": peak / size,
        "small_map_mib": small["map_mib"],
        "small_map_cleaned_to": small["cleaned_to"],
        "small_map_full": small["map_full"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compaction")
    parser.add_argument("--quick", action="store_true", help="100,000 keys")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    keys = 100_000 if args.quick else args.keys
    figures = {"tablet": tablet_figures(keys), "cleaner": cleaner_figures(max(1000, keys // 5)),
               "pass": pass_figures(max(1000, keys // 5))}
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"compaction-{stamp}.json").write_text(json.dumps(figures, indent=2))
    lines = [f"# Compaction benchmark {stamp}", ""]
    for part, values in figures.items():
        lines += [f"## {part}", "", "| figure | value |", "| --- | --- |"]
        lines += [f"| {k} | {v:,.3f} |" if isinstance(v, float) else f"| {k} | {v:,} |"
                  for k, v in values.items()]
        lines.append("")
    text = "\n".join(lines)
    (args.out / f"compaction-{stamp}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
