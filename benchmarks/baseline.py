"""The baseline of `benchmarks.kafka`: bytes from a client socket into the object store, with
no Mink logic in between.

    python -m benchmarks.baseline --store URL [--uploads N] [--latency-ms MS --jitter-ms MS]

A trio TCP server on a free loopback port (printed as `PORT <n>`) takes one connection that
sends length-prefixed chunks (4-byte big-endian length, then the bytes; 1 MiB in the
benchmark) and writes each chunk as one object with mink's object store (`FileObjectStore`
with fsync, as a node writes its WAL; `S3ObjectStore` through trio_asyncio), with at most
`--uploads` writes in flight (the benchmark passes 1 for file://, as a node uploads below
its `wal_concurrent_upload_min_bytes`, and 4 for s3://). An empty frame ends the stream: once every chunk is written the server answers with
the number written (8 bytes) and prints `RESULT <json>`. The client is
`benchmarks.loadgen baseline_client`, in another process.

S3 settings come from MINK_S3_ENDPOINT_URL, MINK_S3_REGION, MINK_S3_ACCESS_KEY_ID and
MINK_S3_SECRET_ACCESS_KEY, as for a node.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import time

import trio
import trio_asyncio

from mink.storage.objectstore import LatencyObjectStore, open_object_store

_LENGTH = struct.Struct(">I")


async def serve(args: argparse.Namespace) -> dict:
    inner = open_object_store(
        args.store, endpoint_url=os.environ.get("MINK_S3_ENDPOINT_URL"),
        region=os.environ.get("MINK_S3_REGION"),
        access_key_id=os.environ.get("MINK_S3_ACCESS_KEY_ID"),
        secret_access_key=os.environ.get("MINK_S3_SECRET_ACCESS_KEY"))
    await inner.check()
    store = inner
    if args.latency_ms:
        store = LatencyObjectStore(inner, args.latency_ms / 1000, args.jitter_ms / 1000,
                                   rng=random.Random(1))
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(f"PORT {listeners[0].socket.getsockname()[1]}", flush=True)
    slots = trio.Semaphore(args.uploads)
    stats = {"objects": 0, "bytes": 0, "upload_s": 0.0}
    upload_times: list[float] = []
    try:
        stream = await listeners[0].accept()
        for listener in listeners:
            await listener.aclose()
        first = None

        async def upload(key: str, data: bytes) -> None:
            try:
                t0 = time.monotonic()
                await store.create(key, [data])
                upload_times.append(time.monotonic() - t0)
                stats["upload_s"] += upload_times[-1]
                stats["objects"] += 1
                stats["bytes"] += len(data)
            finally:
                slots.release()

        buffer = bytearray()
        seq = 0
        done = False
        async with trio.open_nursery() as nursery:
            while not done:
                data = await stream.receive_some(1 << 20)
                if not data:
                    raise EOFError("the client went away before the end frame")
                if first is None:
                    first = time.monotonic()
                buffer += data
                while len(buffer) >= 4:
                    (size,) = _LENGTH.unpack_from(buffer)
                    if size == 0:
                        done = True
                        break
                    if len(buffer) < 4 + size:
                        break
                    with memoryview(buffer) as view:
                        chunk = bytes(view[4:4 + size])
                    del buffer[:4 + size]
                    await slots.acquire()  # back-pressure: stop reading while uploads are full
                    nursery.start_soon(upload, f"baseline/{seq:08d}", chunk)
                    seq += 1
        await stream.send_all(struct.pack(">q", stats["objects"]))
        elapsed = time.monotonic() - (first or time.monotonic())
        await stream.aclose()
    finally:
        with trio.CancelScope(shield=True):
            await inner.aclose()
    return {"objects": stats["objects"], "bytes": stats["bytes"],
            "server_seconds": round(elapsed, 3),
            "upload_mean_ms": round(1000 * stats["upload_s"] / max(1, stats["objects"]), 2),
            "upload_p99_ms": _ms_at(upload_times, 99), "upload_max_ms": _ms_at(upload_times, 100),
            "uploads": args.uploads, "store": repr(store)}


def _ms_at(values: list[float], q: float) -> float | None:
    if not values:
        return None
    data = sorted(values)
    return round(1000 * data[min(len(data) - 1, max(0, int(q / 100 * len(data) + 0.5) - 1))], 2)


async def main_async(args: argparse.Namespace) -> dict:
    async with trio_asyncio.open_loop():
        return await serve(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.baseline")
    parser.add_argument("--store", required=True)
    parser.add_argument("--uploads", type=int, default=1)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    result = trio.run(main_async, args)
    print("RESULT " + json.dumps(result), flush=True)
    sys.stdin.read()  # stay until the benchmark has read our CPU time and closes stdin
    return 0


if __name__ == "__main__":
    sys.exit(main())
