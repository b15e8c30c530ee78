"""Request bytes of a consumer of many partitions, with and without incremental fetch
sessions (KIP-227), in the same run.

    python -m benchmarks.fetch_sessions [--partitions 1000] [--phase-s 20] [--phases 2]

One in-process node (`mink.testing.open_node`, its own PostgreSQL) advertises a byte-counting
TCP proxy, so every byte the consumer sends and receives is counted on the wire. A topic of
`--partitions` partitions gets a trickle of records (`--rate` per second, each to a random
partition) while one kafka-python consumer, assigned every partition, reads for `--phase-s`
seconds with `enable_incremental_fetch_sessions` on, then off, `--phases` times over. Without
a session every Fetch names every partition and every answer carries every partition; with
one, a Fetch names what moved and the answer what changed. Results:
`results/fetch-sessions-<timestamp>.json`, `.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import time
from pathlib import Path

import trio
from kio.index import load_request_schema

from mink.client import KafkaClient
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build, nested
from mink.protocol.records import Record, build_batch
from mink.storage.embedded_postgres import free_port
from mink.testing.cluster import open_node
from mink.testing.proxy import TcpProxy

RESULTS = Path(__file__).with_name("results")
TOPIC = "fetch-sessions"


def consume_phase(bootstrap: str, partitions: int, seconds: float, sessions: bool,
                  counters: dict) -> dict:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="latest",
                             enable_auto_commit=False, fetch_max_wait_ms=500,
                             enable_incremental_fetch_sessions=sessions)
    consumer.assign([TopicPartition(TOPIC, i) for i in range(partitions)])
    records = 0
    try:
        warm_until = time.monotonic() + 3  # positions (ListOffsets) and the first fetches
        while time.monotonic() < warm_until:
            consumer.poll(timeout_ms=200)
        sent0, received0 = counters["proxy"].bytes_to_upstream, counters["proxy"].bytes_to_client
        produced0 = counters["produced"]
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            for batch in consumer.poll(timeout_ms=200).values():
                records += len(batch)
        elapsed = time.monotonic() - started
        sent = counters["proxy"].bytes_to_upstream - sent0
        received = counters["proxy"].bytes_to_client - received0
        produced = counters["produced"] - produced0
    finally:
        consumer.close()
    return {"sessions": sessions, "seconds": round(elapsed, 2), "produced": produced,
            "records": records,
            "request_bytes": sent, "response_bytes": received,
            "request_bytes_per_s": round(sent / elapsed), "response_bytes_per_s":
            round(received / elapsed)}


async def trickle(address: str, args, counters: dict) -> None:
    """Up to `args.rate` records a second, each a one-record Produce to a random partition
    (one at a time: the rate reached is counted in `counters["produced"]`)."""
    rng = random.Random(1)
    async with await KafkaClient.connect(address) as client:
        while True:
            batch = build_batch([Record(0, 0, None, b"x" * 100)])
            await client.call(ApiKey.PRODUCE, 9, produce_request(
                TOPIC, rng.randrange(args.partitions), batch))
            counters["produced"] += 1
            await trio.sleep(1 / args.rate)


def produce_request(topic: str, partition: int, records: bytes):
    schema = load_request_schema(ApiKey.PRODUCE, 9)
    data = build(nested(schema, "PartitionProduceData"), index=partition, records=records)
    return build(schema, transactional_id=None, acks=1, timeout=dt.timedelta(seconds=10),
                 topic_data=(build(nested(schema, "TopicProduceData"), name=topic,
                                   partition_data=(data,)),))


async def run(args) -> dict:
    node_port = free_port()
    proxy = TcpProxy("127.0.0.1", node_port)
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(proxy.run)
        async with open_node(listener=f"127.0.0.1:{node_port}",
                             advertised_listener=f"{host}:{port}", proxy=False) as node:
            await node.create_topic(TOPIC, args.partitions)
            await node.wait_led(TOPIC, timeout=120)
            phases = []
            counters = {"proxy": proxy, "produced": 0}
            async with trio.open_nursery() as workers:
                # straight to the node, not through the counting proxy (a Kafka client would
                # follow Metadata to the advertised address)
                workers.start_soon(trickle, f"127.0.0.1:{node_port}", args, counters)
                for _ in range(args.phases):
                    for sessions in (True, False):
                        phase = await trio.to_thread.run_sync(
                            consume_phase, f"{host}:{port}", args.partitions,
                            args.phase_s, sessions, counters)
                        print(json.dumps(phase), flush=True)
                        phases.append(phase)
                workers.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    on = [p for p in phases if p["sessions"]]
    off = [p for p in phases if not p["sessions"]]

    def median(rows, field):
        return statistics.median(r[field] for r in rows)

    return {"partitions": args.partitions, "rate": args.rate, "phase_s": args.phase_s,
            "phases": phases,
            "request_bytes_per_s": {"sessions": median(on, "request_bytes_per_s"),
                                    "no_sessions": median(off, "request_bytes_per_s")},
            "response_bytes_per_s": {"sessions": median(on, "response_bytes_per_s"),
                                     "no_sessions": median(off, "response_bytes_per_s")},
            "request_ratio": round(median(on, "request_bytes_per_s")
                                   / median(off, "request_bytes_per_s"), 4)}


def write(result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = RESULTS / f"fetch-sessions-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    rows = "\n".join(f"| {'on' if p['sessions'] else 'off'} | {p['seconds']} | {p['produced']} "
                     f"| {p['records']} "
                     f"| {p['request_bytes_per_s']:,} | {p['response_bytes_per_s']:,} |"
                     for p in result["phases"])
    base.with_suffix(".md").write_text(
        f"# Fetch sessions: a kafka-python consumer of {result['partitions']} partitions\n\n"
        f"A trickle of up to {result['rate']} records/s to random partitions (one Produce at a "
        f"time: `produced` is what it reached); bytes counted on the "
        f"wire by a proxy the node advertises. Median request bytes with sessions are "
        f"**{result['request_ratio']:.1%}** of those without.\n\n"
        "| sessions | seconds | produced | read | request B/s | response B/s |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: |\n" + rows + "\n")
    return base


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fetch_sessions")
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--phase-s", type=float, default=20.0)
    parser.add_argument("--phases", type=int, default=2)
    parser.add_argument("--rate", type=float, default=50.0, help="records per second")
    args = parser.parse_args(argv)
    result = trio.run(run, args)
    print(json.dumps({k: v for k, v in result.items() if k != "phases"}, indent=2))
    print(f"results: {write(result)}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
