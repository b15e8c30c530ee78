"""Produce forwarding's overhead: the same Produce load sent to a partition's leader and to
the other node (which forwards it to the leader in an Envelope), in the same run.

    python -m benchmarks.forwarding [--requests 400] [--window 5] [--records 10] [--rounds 1]
                                    [--wal-max-delay-ms MS] [--processes]

Two in-process nodes (`mink.testing.open_cluster`, their own PostgreSQL, a `file://` store)
and a topic of two partitions; the partition node 2 leads gets the load. Each round runs,
for each route (to the leader, through the non-leader), `--requests` acks=-1 Produce
requests of one batch of `--records` 100-byte records with `--window` of them in flight on
one connection (as librdkafka keeps up to five), then the same one at a time. Reported per
route: records/s of the pipelined phase and the latency percentiles of the one-at-a-time
phase (a request's time from send to answer: the WAL flush and the commit dominate both
routes). Client and nodes share one process and event loop: the numbers compare the two
routes, they are not a node's capacity. The rounds alternate which route goes first.
Results: `results/forwarding-<timestamp>.json`, `.md`.

`--processes`: the same Produce rounds against two `mink serve` subprocesses (an embedded
PostgreSQL, fsync off, and a file:// store), the client alone in this process, as nodes run
in production; no fetch phase. In one process the forwarding node's work (about 0.35 ms of
CPU a request) and its hand-offs queue on the event loop the leader and the client use too.

Then Fetch through a non-leader (issue 25) vs from the leader, on the same partition: per
route, a catch-up read of the whole partition from offset 0 (records/s, MB/s: the leader
mostly from its tail cache, the non-leader through the index and the object store), and
`--tail-samples` single-batch Produce requests to the leader, each read by a Fetch
long-polling at the end on the route (max_wait 5 s): the time from the Produce's answer to
the Fetch's (negative when the Fetch returns first: the leader wakes it at the commit,
before the ack is sent). For the non-leader, PostgreSQL reads of the replica poller per
second while `--waiters` Fetches wait on the partition and nothing is produced, and during
the tail phase. `--no-produce` skips the Produce rounds (the fetch phase writes its own
data then).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import shutil
import statistics
import struct
import tempfile
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
FETCH_VERSION = 12


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


def fetch_request(partition: int, offset: int, *, max_wait_ms: int = 0, min_bytes: int = 0,
                  max_bytes: int = 1 << 20):
    schema = load_request_schema(ApiKey.FETCH, FETCH_VERSION)
    part = nested(schema, "FetchPartition")(
        partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes,
        current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
    return build(schema, replica_id=-1, max_wait=dt.timedelta(milliseconds=max_wait_ms),
                 min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=0, session_id=0,
                 session_epoch=-1, topics=(nested(schema, "FetchTopic")(
                     topic=TOPIC, partitions=(part,)),), forgotten_topics_data=(), rack_id="")


def fetched(response) -> tuple[int, int, bytes]:
    p = response.responses[0].partitions[0]
    return int(p.error_code), p.high_watermark, bytes(p.records or b"")


def next_offset(records: bytes, offset: int) -> int:
    """The offset after the last batch in `records` (v2 batches: base at 0, last delta at 23)."""
    position = 0
    while position + 27 <= len(records):
        base, length = struct.unpack_from(">qi", records, position)
        (delta,) = struct.unpack_from(">i", records, position + 23)
        offset = base + delta + 1
        position += 12 + length
    return offset


async def catch_up(address: str, partition: int) -> dict:
    """Read the partition from 0 to its high watermark, one Fetch after another."""
    offset, size, requests = 0, 0, 0
    async with await KafkaClient.connect(address) as client:
        started = time.perf_counter()
        while True:
            error, high_watermark, records = fetched(await client.call(
                ApiKey.FETCH, FETCH_VERSION, fetch_request(partition, offset)))
            requests += 1
            assert error == 0, error
            if not records:
                break
            size += len(records)
            offset = next_offset(records, offset)
            if offset >= high_watermark:
                break
        elapsed = time.perf_counter() - started
    return {"records": offset, "mb_per_s": round(size / elapsed / 1e6, 1),
            "records_per_s": round(offset / elapsed), "fetches": requests}


async def tail_latency(fetch_address: str, leader_address: str, partition: int, args,
                       replicas) -> dict:
    """Produce to the leader one batch at a time; a long-poll Fetch at the end on
    `fetch_address` reads each: ms from the Produce's answer to the Fetch's."""
    body = produce_request(partition, args.records)
    latencies = []
    queries_before, started = replicas.queries, time.perf_counter()
    async with await KafkaClient.connect(leader_address) as producer, \
            await KafkaClient.connect(fetch_address) as consumer:
        _, offset, _ = fetched(await consumer.call(ApiKey.FETCH, FETCH_VERSION,
                                                  fetch_request(partition, 0, max_bytes=1)))
        for i in range(args.tail_samples):
            answers = {}

            async def poll() -> None:
                error, _, records = fetched(await consumer.call(
                    ApiKey.FETCH, FETCH_VERSION, fetch_request(
                        partition, offset, max_wait_ms=5000, min_bytes=1)))
                answers["fetched"] = time.perf_counter()
                answers["records"] = records

            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll)
                await trio.sleep(0.02 + (i % 5) * 0.01)  # the fetch is waiting by now
                response = await producer.call(ApiKey.PRODUCE, VERSION, body)
                answers["acked"] = time.perf_counter()
                assert not errors_of(response)
            assert answers["records"], "the long poll returned nothing"
            offset = next_offset(answers["records"], offset)
            latencies.append((answers["fetched"] - answers["acked"]) * 1000)
    elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)

    return {"ack_to_fetched_p50_ms": pct(0.5), "ack_to_fetched_p90_ms": pct(0.9),
            "ack_to_fetched_max_ms": round(latencies[-1], 2),
            "pg_queries_per_s": round((replicas.queries - queries_before) / elapsed, 1)}


async def idle_polling(address: str, partition: int, waiters: int, seconds: float,
                       replicas) -> float:
    """PostgreSQL reads per second of the poller while `waiters` Fetches (one connection
    each) wait at the end and nothing is produced."""
    async with await KafkaClient.connect(address) as client:
        _, end, _ = fetched(await client.call(ApiKey.FETCH, FETCH_VERSION,
                                             fetch_request(partition, 0, max_bytes=1)))
    async with trio.open_nursery() as nursery:
        async def wait_at_end() -> None:
            async with await KafkaClient.connect(address) as client:
                while True:
                    await client.call(ApiKey.FETCH, FETCH_VERSION, fetch_request(
                        partition, end, max_wait_ms=500, min_bytes=1))

        for _ in range(waiters):
            nursery.start_soon(wait_at_end)
        await trio.sleep(0.5)  # all waiting
        before = replicas.queries
        await trio.sleep(seconds)
        rate = (replicas.queries - before) / seconds
        nursery.cancel_scope.cancel()
    return round(rate, 1)


async def fetch_phase(cluster, routes: dict, partition: int, args) -> dict:
    replicas = cluster.node(1).node.replica_reads
    out = {"poll_ms": cluster.node(1).node.config.replica_fetch_poll_ms}
    for route, target in (("leader", 2), ("non-leader", 1)):
        out[route] = {"catch_up": await catch_up(routes[target], partition),
                      "catch_up_again": await catch_up(routes[target], partition),
                      **await tail_latency(routes[target], routes[2], partition, args,
                                           replicas)}
        print(json.dumps({"fetch": route, **out[route]}), flush=True)
    out["non-leader"]["idle_pg_queries_per_s"] = {
        n: await idle_polling(routes[1], partition, n, args.idle_s, replicas)
        for n in (1, args.waiters)}
    print(json.dumps({"idle_pg_queries_per_s": out["non-leader"]["idle_pg_queries_per_s"]}),
          flush=True)
    return out


async def produce_rounds(routes: dict, partition: int, args) -> list[dict]:
    """The Produce rounds: per round, each route (to the leader, through node 1), the first
    one alternating."""
    await one_at_a_time(routes[1], partition, argparse.Namespace(
        requests=20, records=args.records))  # warm: the pooled connection, caches
    rows = []
    order = (("leader", 2), ("forwarded", 1))
    for round_ in range(args.rounds if args.produce else 0):
        for route, target in order if round_ % 2 == 0 else order[::-1]:
            throughput = await pipelined(routes[target], partition, args)
            latency = await one_at_a_time(routes[target], partition, args)
            row = {"round": round_, "route": route, **throughput, **latency}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


async def run(args) -> dict:
    settings = {} if args.wal_max_delay_ms is None else {
        "wal_max_delay_ms": args.wal_max_delay_ms}
    fetch = None
    if args.processes:
        with node_processes(settings) as (routes, partition):
            rows = await produce_rounds(routes, partition, args)
    else:
        async with open_cluster(2, proxy=False, **settings) as cluster:
            await cluster.create_topic(TOPIC, partitions=2)
            partition = next(p for p, leader in cluster.leaders(TOPIC).items() if leader == 2)
            routes = {}
            for n in cluster.nodes:
                host, port = n.node.advertised
                routes[n.node_id] = f"{host}:{port}"
            if not args.produce:  # data for the fetch phase
                await pipelined(routes[2], partition, argparse.Namespace(
                    requests=args.requests * 4, window=args.window, records=args.records))
            rows = await produce_rounds(routes, partition, args)
            fetch = await fetch_phase(cluster, routes, partition, args)
    summary = {}
    for route in ("leader", "forwarded"):
        mine = [r for r in rows if r["route"] == route]
        if not mine:
            continue
        summary[route] = {
            "records_per_s": round(statistics.median(r["records_per_s"] for r in mine)),
            "p50_ms": round(statistics.median(r["p50_ms"] for r in mine), 2),
            "p99_ms": round(statistics.median(r["p99_ms"] for r in mine), 2),
            "errors": sum(r["errors"] for r in mine)}
    return {"requests": args.requests, "window": args.window, "records": args.records,
            "rounds": args.rounds, "wal_max_delay_ms": args.wal_max_delay_ms,
            "processes": args.processes, "rows": rows, "summary": summary, "fetch": fetch}


@contextlib.contextmanager
def node_processes(settings: dict):
    """Two `mink serve` subprocesses on an embedded PostgreSQL and a file:// store, and a
    topic of two partitions: yields ({node id: address}, the partition node 2 leads)."""
    import psycopg
    from confluent_kafka.admin import AdminClient, NewTopic

    from benchmarks.controlled_shutdown import Node, wait_for
    from mink.storage.embedded_postgres import EmbeddedPostgres

    tmp = Path(tempfile.mkdtemp(prefix="mink-forwarding-"))
    pg = EmbeddedPostgres(tmp / "pg" / "data", durable=False)
    nodes = []
    try:
        pg.start()
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE forwarding")
        url = pg.url_for("forwarding")
        store = tmp / "objects"
        store.mkdir()
        nodes = [Node(i, url, store.as_uri(), tmp, settings) for i in (1, 2)]
        for node in nodes:
            node.start()
        with psycopg.connect(url, autocommit=True) as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM nodes WHERE expires_at > "
                                          "now()").fetchone()[0] == 2, 60, "two live nodes")
            admin = AdminClient({"bootstrap.servers": nodes[0].address})
            admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(60)

            def open_leaders() -> dict:
                return dict(conn.execute(
                    "SELECT partition, leader_node FROM partitions p JOIN topics t "
                    "USING (topic_id) WHERE t.name = %s AND stream_state = 'open' AND "
                    "opened_by_node = leader_node", (TOPIC,)).fetchall())

            leaders = wait_for(lambda: len(led := open_leaders()) == 2 and led, 60,
                               "the partitions open")
        if 2 not in leaders.values():
            raise RuntimeError(f"node 2 leads no partition: {leaders}")
        yield ({n.node_id: n.address for n in nodes},
               next(p for p, leader in leaders.items() if leader == 2))
    finally:
        for node in nodes:
            node.stop()
        if pg.running():
            pg.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)


def write(result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = RESULTS / f"forwarding-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    rows = "\n".join(
        f"| {r['round']} | {r['route']} | {r['records_per_s']:,} | {r['p50_ms']} | "
        f"{r['p90_ms']} | {r['p99_ms']} | {r['errors']} |" for r in result["rows"])
    s = result["summary"]
    f = result["fetch"]
    if f is None:  # --processes: no fetch phase
        fetch_md = ""
        where = ("Two `mink serve` subprocesses (embedded PostgreSQL, file:// store); the "
                 "client in its own process.")
    else:
        fetch_md = _fetch_md(f)
        where = "Two in-process nodes; client and nodes share one process."
    if not s:
        base.with_suffix(".md").write_text(fetch_md.lstrip())
        return base
    delay = result["wal_max_delay_ms"]
    base.with_suffix(".md").write_text(
        f"# Produce forwarding: to the leader vs through the other node\n\n"
        f"{where} wal_max_delay_ms {'the default' if delay is None else delay}; acks=-1 "
        f"Produce requests of one batch of {result['records']} "
        f"100-byte records: {result['requests']} with {result['window']} in flight "
        f"(records/s), then {result['requests']} one at a time (latency). Median over "
        f"{result['rounds']} rounds: leader "
        f"{s['leader']['records_per_s']:,} records/s, p50 {s['leader']['p50_ms']} ms; "
        f"forwarded {s['forwarded']['records_per_s']:,} records/s, p50 "
        f"{s['forwarded']['p50_ms']} ms.\n\n"
        "| round | route | records/s (pipelined) | p50 ms | p90 ms | p99 ms | errors |\n"
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n" + rows + "\n" + fetch_md)
    return base


def _fetch_md(f: dict) -> str:
    fetch_rows = "\n".join(
        f"| {route} | {f[route]['catch_up']['records_per_s']:,} | "
        f"{f[route]['catch_up']['mb_per_s']} | {f[route]['catch_up_again']['mb_per_s']} | "
        f"{f[route]['ack_to_fetched_p50_ms']} | {f[route]['ack_to_fetched_p90_ms']} | "
        f"{f[route]['ack_to_fetched_max_ms']} | {f[route]['pg_queries_per_s']} |"
        for route in ("leader", "non-leader"))
    idle = ", ".join(f"{n} waiting: {q}/s" for n, q in
                     f["non-leader"]["idle_pg_queries_per_s"].items())
    fetch_md = (
        f"\n# Fetch: from the leader vs through the non-leader\n\n"
        f"replica_fetch_poll_ms {f['poll_ms']}. Catch-up: the whole partition from offset 0 "
        f"(first pass, then again). Tail: ms from a Produce's answer (leader) to the "
        f"answer of a Fetch long-polling at the end on the route; PostgreSQL reads of "
        f"the replica poller per second meanwhile. Idle polling on the non-leader: {idle}."
        f"\n\n| route | catch-up records/s | MB/s | MB/s again | tail p50 ms | p90 ms | "
        f"max ms | poller PG reads/s |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | "
        f"---: |\n" + fetch_rows + "\n")
    return fetch_md


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.forwarding")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--wal-max-delay-ms", type=float, default=None,
                        help="the nodes' wal_max_delay_ms (default: the store's, 0 on file://)")
    parser.add_argument("--tail-samples", type=int, default=30)
    parser.add_argument("--waiters", type=int, default=20,
                        help="long-polling Fetches for the idle polling measure")
    parser.add_argument("--idle-s", type=float, default=1.5)
    parser.add_argument("--no-produce", dest="produce", action="store_false",
                        help="only the fetch phase")
    parser.add_argument("--processes", action="store_true",
                        help="the Produce rounds against two `mink serve` subprocesses "
                             "(no fetch phase)")
    args = parser.parse_args(argv)
    if args.processes and not args.produce:
        parser.error("--processes has no fetch phase: it needs the Produce rounds")
    result = trio.run(run, args)
    print(json.dumps(result["summary"], indent=2))
    print(f"results: {write(result)}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
