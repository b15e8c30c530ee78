"""Transactional throughput and commit latency, with confluent-kafka's transactional producer.

    .venv/bin/python -m benchmarks.transactions [--seconds 5] [--stores file,s3] [--nodes 1]
        [--out DIR]

Per store (file:// in a temporary folder, fsync on; S3 on moto in a child process), one node
of the test harness (`mink.testing`, in this process, on an embedded PostgreSQL), a topic of
3 partitions, and for 1, 10 and 100 messages (100 bytes) per transaction, for `--seconds`:
begin, produce the messages round-robin over the partitions, commit; the commit's latency is
the `commit_transaction()` call (flush of the messages, EndTxn answered once PrepareCommit is
durable). With `--nodes 2` the partitions are spread over two nodes, so the markers of some
are written by a node that did not decide the transaction (it learns of the decision by
NOTIFY, or its fallback poll), and the next transaction waits for them. Baseline, same run and shape: an idempotent producer (acks=all) that flushes after
the same number of messages (the same unit of durability, without a transaction).

The node shares this process with the client (librdkafka's threads release the GIL; the
Python side of each produce() call does not), so absolute figures are lower than a separate
`mink serve`; the ratio to the baseline is the figure to read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

SIZES = (1, 10, 100)
VALUE = b"x" * 100
PARTITIONS = 3


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_case(bootstrap: str, size: int, seconds: float, transactional: bool) -> dict:
    from confluent_kafka import Producer

    topic = f"bench-{'txn' if transactional else 'idem'}-{size}-{uuid.uuid4().hex[:6]}"
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all",
            "enable.idempotence": True}
    if transactional:
        conf["transactional.id"] = f"bench-{uuid.uuid4()}"
    producer = Producer(conf)
    if transactional:
        producer.init_transactions(60)
    # warm-up: the topic exists and the connections are up before anything is measured
    for p in range(PARTITIONS):
        if transactional:
            producer.begin_transaction()
        producer.produce(topic, value=VALUE, partition=p)
        if transactional:
            producer.commit_transaction(60)
        else:
            producer.flush(60)
    latencies: list[float] = []
    messages = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        t0 = time.monotonic()
        if transactional:
            producer.begin_transaction()
        for i in range(size):
            producer.produce(topic, value=VALUE, partition=(messages + i) % PARTITIONS)
        if transactional:
            producer.commit_transaction(60)
        else:
            assert producer.flush(60) == 0
        latencies.append((time.monotonic() - t0) * 1000)
        messages += size
    elapsed = time.monotonic() - started
    return {"size": size, "transactional": transactional, "units": len(latencies),
            "messages_per_s": round(messages / elapsed, 1),
            "units_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": round(statistics.median(latencies), 2),
            "p99_ms": round(_percentile(latencies, 0.99), 2)}


def run_store(name: str, seconds: float, postgres, harness, moto, nodes: int = 1
              ) -> list[dict]:
    from mink.testing.blocking import blocking_cluster, blocking_node

    config = dict(num_partitions=PARTITIONS, transaction_state_num_partitions=1,
                  offsets_topic_num_partitions=1, proxy=False)
    folder = None
    if name == "file":
        folder = tempfile.mkdtemp(prefix="mink-bench-txn-")
        config["store_url"] = Path(folder).as_uri()
    else:
        import os

        from benchmarks.storage import _boto3_client, _s3_env

        # The harness opens the store from its URL alone: moto's endpoint and dummy
        # credentials come from the environment (never a real service's).
        os.environ.update(_s3_env(), AWS_ENDPOINT_URL_S3=moto.endpoint)
        bucket = f"bench-txn-{uuid.uuid4().hex[:8]}"
        _boto3_client(moto.endpoint).create_bucket(Bucket=bucket)
        config.update(store_url=f"s3://{bucket}/mink")
    results = []
    opened = (blocking_node(harness, postgres, **config) if nodes == 1 else
              blocking_cluster(harness, nodes, postgres, **config))
    with opened as node:
        for size in SIZES:
            for transactional in (False, True):
                case = run_case(node.bootstrap, size, seconds, transactional)
                case["store"] = name
                case["nodes"] = nodes
                print(json.dumps(case), flush=True)
                results.append(case)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--stores", default="file,s3")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).with_name("results")))
    args = parser.parse_args(argv)

    from benchmarks.storage import Moto
    from mink.testing.blocking import HarnessThread
    from mink.testing.postgres import TestPostgres

    stores = args.stores.split(",")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    postgres = TestPostgres().start()
    harness = HarnessThread()
    moto = None
    results: list[dict] = []
    try:
        if "s3" in stores:
            moto = Moto("process", out_dir / "moto-transactions.log")
            moto.start()
        for store in stores:
            results += run_store(store, args.seconds, postgres, harness, moto, args.nodes)
    finally:
        harness.close()
        if moto is not None:
            moto.stop()
        postgres.stop()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    lines = [f"nodes: {args.nodes}", "",
             "| store | msgs/txn | kind | msgs/s | txns (flushes)/s | p50 ms | p99 ms |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in results:
        lines.append(f"| {r['store']} | {r['size']} | "
                     f"{'transaction' if r['transactional'] else 'idempotent+flush'} | "
                     f"{r['messages_per_s']} | {r['units_per_s']} | {r['p50_ms']} | "
                     f"{r['p99_ms']} |")
    summary = "\n".join(lines)
    (out_dir / f"transactions-{stamp}.json").write_text(json.dumps(results, indent=2))
    (out_dir / f"transactions-{stamp}.md").write_text(
        f"# Transactions, {stamp}\n\n`python -m benchmarks.transactions "
        f"--seconds {args.seconds} --stores {args.stores} --nodes {args.nodes}`\n\n{summary}\n")
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
