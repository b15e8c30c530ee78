"""Produce forwarding's overhead: the same Produce load sent to a partition's leader and to
the other node (which forwards it to the leader in an Envelope), in the same run.

    python -m benchmarks.forwarding [--requests 400] [--window 5] [--records 10] [--rounds 2]
                                    [--wal-max-delay-ms MS]

Two in-process nodes (`mink.testing.open_cluster`, their own PostgreSQL, a `file://` store)
and a topic of two partitions; the partition node 2 leads gets the load. Each round runs,
for each route (to the leader, through the non-leader), `--requests` acks=-1 Produce
requests of one batch of `--records` 100-byte records with `--window` of them in flight on
one connection (as librdkafka keeps up to five), then the same one at a time. Reported per
route: records/s of the pipelined phase and the latency percentiles of the one-at-a-time
phase (a request's time from send to answer: the WAL flush and the commit dominate both
routes). Client and nodes share one process and event loop: the numbers compare the two
routes, they are not a node's capacity. Results: `results/forwarding-<timestamp>.json`, `.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from pathlib import Path

import trio
from kio.index import load_request_schema

from mink.client import KafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build, nested
from mink.protocol.records import Record, build_batch
from mink.testing.cluster import open_cluster

RESULTS = Path(__file__).with_name("results")
TOPIC = "forwarding"
VERSION = 9


def produce_request(partition: int, records: int):
    batch = build_batch([Record(i, i, None, b"x" * 100) for i in range(records)])
    schema = load_request_schema(ApiKey.PRODUCE, VERSION)
    data = build(nested(schema, "PartitionProduceData"), index=partition, records=batch)
    return build(schema, transactional_id=None, acks=-1, timeout=dt.timedelta(seconds=30),
                 topic_data=(build(nested(schema, "TopicProduceData"), name=TOPIC,
                                   partition_data=(data,)),))


def errors_of(response) -> list[int]:
    return [int(p.error_code) for t in response.responses for p in t.partition_responses
            if p.error_code]


async def pipelined(address: str, partition: int, args) -> dict:
    """`args.requests` Produce requests, `args.window` in flight: records per second."""
    body = produce_request(partition, args.records)
    errors = 0
    async with await KafkaClient.connect(address) as client:
        window = trio.Semaphore(args.window)
        sent = trio.Semaphore(0)
        started = time.perf_counter()

        async def receive() -> None:
            nonlocal errors
            for _ in range(args.requests):
                await sent.acquire()
                _, response = await client.receive(ApiKey.PRODUCE, VERSION)
                errors += len(errors_of(response))
                window.release()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            for _ in range(args.requests):
                await window.acquire()
                await client.send(ApiKey.PRODUCE, VERSION, body)
                sent.release()
        elapsed = time.perf_counter() - started
    return {"seconds": round(elapsed, 3),
            "records_per_s": round(args.requests * args.records / elapsed),
            "requests_per_s": round(args.requests / elapsed, 1), "errors": errors}


async def one_at_a_time(address: str, partition: int, args) -> dict:
    body = produce_request(partition, args.records)
    latencies = []
    errors = 0
    async with await KafkaClient.connect(address) as client:
        for _ in range(args.requests):
            started = time.perf_counter()
            response = await client.call(ApiKey.PRODUCE, VERSION, body)
            latencies.append((time.perf_counter() - started) * 1000)
            errors += len(errors_of(response))
    latencies.sort()

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)

    return {"p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99),
            "mean_ms": round(statistics.fmean(latencies), 2), "errors": errors}


async def run(args) -> dict:
    rows = []
    settings = {} if args.wal_max_delay_ms is None else {
        "wal_max_delay_ms": args.wal_max_delay_ms}
    async with open_cluster(2, proxy=False, **settings) as cluster:
        await cluster.create_topic(TOPIC, partitions=2)
        partition = next(p for p, leader in cluster.leaders(TOPIC).items() if leader == 2)
        routes = {}
        for n in cluster.nodes:
            host, port = n.node.advertised
            routes[n.node_id] = f"{host}:{port}"
        await one_at_a_time(routes[1], partition, argparse.Namespace(
            requests=20, records=args.records))  # warm: the pooled connection, caches
        for round_ in range(args.rounds):
            for route, target in (("leader", 2), ("forwarded", 1)):
                throughput = await pipelined(routes[target], partition, args)
                latency = await one_at_a_time(routes[target], partition, args)
                row = {"round": round_, "route": route, **throughput, **latency}
                print(json.dumps(row), flush=True)
                rows.append(row)
    summary = {}
    for route in ("leader", "forwarded"):
        mine = [r for r in rows if r["route"] == route]
        summary[route] = {
            "records_per_s": round(statistics.median(r["records_per_s"] for r in mine)),
            "p50_ms": round(statistics.median(r["p50_ms"] for r in mine), 2),
            "p99_ms": round(statistics.median(r["p99_ms"] for r in mine), 2),
            "errors": sum(r["errors"] for r in mine)}
    return {"requests": args.requests, "window": args.window, "records": args.records,
            "rounds": args.rounds, "wal_max_delay_ms": args.wal_max_delay_ms, "rows": rows,
            "summary": summary}


def write(result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = RESULTS / f"forwarding-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    rows = "\n".join(
        f"| {r['round']} | {r['route']} | {r['records_per_s']:,} | {r['p50_ms']} | "
        f"{r['p90_ms']} | {r['p99_ms']} | {r['errors']} |" for r in result["rows"])
    s = result["summary"]
    base.with_suffix(".md").write_text(
        f"# Produce forwarding: to the leader vs through the other node\n\n"
        f"Two in-process nodes; acks=-1 Produce requests of one batch of {result['records']} "
        f"100-byte records: {result['requests']} with {result['window']} in flight "
        f"(records/s), then {result['requests']} one at a time (latency). Client and nodes "
        f"share one process. Median over {result['rounds']} rounds: leader "
        f"{s['leader']['records_per_s']:,} records/s, p50 {s['leader']['p50_ms']} ms; "
        f"forwarded {s['forwarded']['records_per_s']:,} records/s, p50 "
        f"{s['forwarded']['p50_ms']} ms.\n\n"
        "| round | route | records/s (pipelined) | p50 ms | p90 ms | p99 ms | errors |\n"
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n" + rows + "\n")
    return base


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.forwarding")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--wal-max-delay-ms", type=float, default=None,
                        help="the nodes' wal_max_delay_ms (default: the store's, 0 on file://)")
    args = parser.parse_args(argv)
    result = trio.run(run, args)
    print(json.dumps(result["summary"], indent=2))
    print(f"results: {write(result)}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
