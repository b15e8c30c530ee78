"""How long a committed transaction takes to complete when a partition is led by a node that
did not decide it: from `commit_transaction()` returning (PrepareCommit durable) to
CompleteCommit in PostgreSQL (every marker durable), which is what the producer's next
transaction waits for (its AddPartitionsToTxn answers CONCURRENT_TRANSACTIONS until then).

    .venv/bin/python -m benchmarks.txn_markers [--transactions 40]

Two in-process nodes of the harness (file:// store, embedded PostgreSQL), a topic of two
partitions (one per node), __transaction_state on one of them; a confluent-kafka
transactional producer writes one message to each partition per transaction. Measured twice
in the same run: `poll`, the other node finding its marker by its 200 ms poll only (the
behaviour before the LISTEN; the channel is renamed so no NOTIFY reaches it), and `listen`,
woken by the NOTIFY on mink_txn_markers.
"""

from __future__ import annotations

import argparse
import statistics
import time


def _measure(transactions: int, postgres) -> list[float]:
    import trio

    from mink.testing import open_cluster

    async def main() -> list[float]:
        async with open_cluster(2, postgres, num_partitions=2,
                                transaction_state_num_partitions=1, proxy=False) as cluster:
            await cluster.create_topic("markers", 2)
            leaders = cluster.leaders("markers")
            assert len(set(leaders.values())) == 2, leaders
            return await trio.to_thread.run_sync(_produce, cluster.bootstrap,
                                                 cluster.postgres_url, transactions)

    return trio.run(main)


def _produce(bootstrap: str, postgres_url: str, transactions: int) -> list[float]:
    import psycopg
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-markers",
                         "linger.ms": 1})
    producer.init_transactions(30)
    out = []
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for _ in range(transactions):
            producer.begin_transaction()
            producer.produce("markers", b"v", partition=0)
            producer.produce("markers", b"v", partition=1)
            producer.commit_transaction(30)
            started = time.monotonic()
            while conn.execute("SELECT state FROM transactions WHERE transactional_id = "
                               "'bench-markers'").fetchone()[0] != "CompleteCommit":
                time.sleep(0.001)
            out.append((time.monotonic() - started) * 1000)
    return out[5:]  # warm-up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=40)
    args = parser.parse_args(argv)

    from mink.broker.transactions import markers
    from mink.testing.postgres import TestPostgres

    postgres = TestPostgres().start()
    rows = ["| marker pickup | transactions | p50 ms | p90 ms | max ms |",
            "| --- | ---: | ---: | ---: | ---: |"]
    channel, poll = markers.MARKERS_CHANNEL, markers.POLL_S
    try:
        for mode in ("poll", "listen"):
            if mode == "poll":
                markers.MARKERS_CHANNEL, markers.POLL_S = "mink_nobody_notifies", 0.2
            else:
                markers.MARKERS_CHANNEL, markers.POLL_S = channel, poll
            times = sorted(_measure(args.transactions, postgres))
            rows.append(f"| {mode} | {len(times)} | {statistics.median(times):.1f} | "
                        f"{times[int(0.9 * len(times))]:.1f} | {times[-1]:.1f} |")
    finally:
        markers.MARKERS_CHANNEL, markers.POLL_S = channel, poll
        postgres.stop()
    print("commit_transaction() returned -> CompleteCommit\n\n" + "\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
