"""What the metadata store's statements cost the node's own CPU (not PostgreSQL's).

    .venv/bin/python -m benchmarks.metadata_client_cost [--calls 3000] [--rounds 4]

A fresh embedded PostgreSQL (fsync off), one topic of 3 partitions led by node 1, and one
`MetadataStore` opened as a node opens it. Timed in turn, each round: `SELECT 1` through
`fetch_one` (the floor of any operation) and `commit_wal` of one WAL object of 3 ranges
(what a node sends at 20 MB/s over 3 partitions). Reported per call: this process's CPU time
(`time.process_time`, every thread) and wall time. Run it from another checkout (with this
file copied there) to compare two versions of the store in the same session.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

import trio  # noqa: E402
import trio_asyncio  # noqa: E402 - before psycopg's first asyncio use in this process

from benchmarks.commit_wal_cost import set_up  # noqa: E402
from mink.storage.embedded_postgres import EmbeddedPostgres  # noqa: E402


async def measure(url: str, topic_id, node_epoch: int, calls: int, rounds: int) -> dict:
    from mink.storage.controlplane.api import WalObject, WalRange
    from mink.storage.controlplane.postgres import READ, MetadataStore
    from mink.storage.wal import wal_key

    seq = 0

    def objects() -> list[WalObject]:
        nonlocal seq
        seq += 1
        ranges = [WalRange(topic_id, p, 0, (seq - 1) * 30, seq * 30 - 1, p * 35_000,
                           (p + 1) * 35_000, int(time.time() * 1000), 1, producer_states=[])
                  for p in range(3)]
        return [WalObject(wal_key(1, node_epoch, seq), 3 * 35_000 + 200, ranges)]

    results: dict[str, list[tuple[float, float]]] = {"select 1": [], "commit_wal": []}
    async with trio_asyncio.open_loop():
        store = await MetadataStore.open(url, migrate=False)
        try:
            async def select_one() -> None:
                await store.fetch_one(READ, "SELECT 1")

            async def commit() -> None:
                [outcome] = await store.commit_wal(1, node_epoch, objects())
                assert outcome.committed

            operations = {"select 1": select_one, "commit_wal": commit}
            for _ in range(rounds):
                for name, operation in operations.items():
                    for _ in range(200):  # warm-up: prepared statements, pooled connection
                        await operation()
                    cpu, wall = time.process_time(), time.perf_counter()
                    for _ in range(calls):
                        await operation()
                    results[name].append(((time.process_time() - cpu) / calls,
                                          (time.perf_counter() - wall) / calls))
        finally:
            await store.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="mink-client-cost-"))
    pg = EmbeddedPostgres(tmp / "pg" / "data", durable=False)
    try:
        pg.start()
        topic_id, node_epoch = trio.run(set_up, pg.url, 3)
        results = trio.run(measure, pg.url, topic_id, node_epoch, args.calls, args.rounds)
    finally:
        if pg.running():
            pg.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{args.calls} calls per round, {args.rounds} rounds; this process's CPU and wall "
          f"time per call, ms")
    for name, rows in results.items():
        cpus = " ".join(f"{cpu * 1000:.3f}" for cpu, _ in rows)
        walls = " ".join(f"{wall * 1000:.3f}" for _, wall in rows)
        print(f"  {name:10s} cpu {cpus}  (median {statistics.median(c for c, _ in rows) * 1000:.3f})")
        print(f"  {'':10s} wall {walls}  (median {statistics.median(w for _, w in rows) * 1000:.3f})")


if __name__ == "__main__":
    main()
