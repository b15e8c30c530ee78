"""Encoding a Fetch response: kio's writer (the frame as one bytes, the batches joined first,
as the handler did before) against mink/protocol/fetch_encoding.py (a list of buffers around
the stored batches), in the same run.

    python -m benchmarks.fetch_encoding [--partitions 100] [--batch-kib 10] [--batches 1]

Each shape is encoded `--repeat` times by both; the figures are the median time per frame and
what it makes of the payload (MB/s of record bytes). Sending is not included: the list goes
out with one sendmsg, the bytes with one send. Results: `results/fetch-encoding-<ts>.json`, `.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import statistics
import time
import uuid
from pathlib import Path

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from mink.protocol.fetch_encoding import encode_fetch_response
from mink.protocol.messages import build, nested

RESULTS = Path(__file__).with_name("results")
VERSION = 17


def response(partitions: int, batch_bytes: int, batches: int, joined: bool):
    schema = load_response_schema(1, VERSION)
    stored = [memoryview(bytes(batch_bytes)) for _ in range(batches)]
    partition = nested(schema, "PartitionData")
    parts = tuple(build(partition, partition_index=i, error_code=ErrorCode.none,
                        high_watermark=10**6, last_stable_offset=10**6, log_start_offset=0,
                        aborted_transactions=(), preferred_read_replica=-1,
                        records=b"".join(stored) if joined else tuple(stored))
                  for i in range(partitions))
    return build(schema, throttle_time=dt.timedelta(0), error_code=ErrorCode.none, session_id=0,
                 responses=(build(nested(schema, "FetchableTopicResponse"),
                                  topic_id=uuid.uuid4(), partitions=parts),))


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(partitions: int, batch_kib: int, batches: int, repeat: int) -> dict:
    batch_bytes = batch_kib * 1024
    payload = partitions * batch_bytes * batches
    stored = response(partitions, batch_bytes, batches, joined=False)

    joined = response(partitions, batch_bytes, batches, joined=True)
    joined = build(type(joined), throttle_time=joined.throttle_time, error_code=ErrorCode.none,
                   session_id=0, responses=(build(type(joined.responses[0]),
                                                  topic_id=stored.responses[0].topic_id,
                                                  partitions=joined.responses[0].partitions),))
    header_schema = type(joined).__header_schema__
    write_header, write_body = entity_writer(header_schema), entity_writer(type(joined))

    def kio_with_join():
        """What the handler and connection did before: join each partition's batches (the
        join is timed, the response it went into is built beforehand, as the handler builds
        it either way), then kio writes the frame."""
        for p in stored.responses[0].partitions:
            b"".join(p.records)
        buffer = io.BytesIO()
        buffer.write(b"\0\0\0\0")
        write_header(buffer, header_schema(correlation_id=1))
        write_body(buffer, joined)
        out = buffer.getbuffer()
        out[0:4] = (len(out) - 4).to_bytes(4, "big")
        del out
        return buffer.getvalue()

    kio_s = timed(kio_with_join, repeat)
    ours_s = timed(lambda: encode_fetch_response(1, VERSION, stored), repeat)
    assert b"".join(encode_fetch_response(1, VERSION, stored)) == kio_with_join()
    return {"partitions": partitions, "batch_kib": batch_kib, "batches": batches,
            "payload_bytes": payload, "kio_ms": round(kio_s * 1000, 3),
            "ours_ms": round(ours_s * 1000, 3), "speedup": round(kio_s / ours_s, 1),
            "kio_mb_s": round(payload / kio_s / 1e6), "ours_mb_s": round(payload / ours_s / 1e6)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fetch_encoding")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)
    shapes = [(1, 1024, 1), (3, 340, 3), (100, 10, 1), (1000, 1, 1), (1000, 0, 0)]
    rows = []
    for partitions, batch_kib, batches in shapes:
        row = measure(partitions, batch_kib, batches, args.repeat)
        print(json.dumps(row), flush=True)
        rows.append(row)
    RESULTS.mkdir(exist_ok=True)
    base = RESULTS / f"fetch-encoding-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    base.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    table = "\n".join(f"| {r['partitions']} | {r['batches']} x {r['batch_kib']} KiB | "
                      f"{r['kio_ms']} | {r['ours_ms']} | {r['speedup']}x |" for r in rows)
    base.with_suffix(".md").write_text(
        f"# Fetch response encoding (v{VERSION}): kio vs fetch_encoding, same run\n\n"
        "Median of the repeats; kio's figure includes the join of each partition's batches "
        "the handler did before.\n\n"
        "| partitions | batches per partition | kio ms | ours ms | speedup |\n"
        "| ---: | --- | ---: | ---: | ---: |\n" + table + "\n")
    print(f"results: {base}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
