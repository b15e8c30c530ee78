"""What one CommitWal costs PostgreSQL: the current `mink_commit_wal` (and the
`mink_wal_ranges` it calls) against 0002's definitions of both, alternating in one server.

    .venv/bin/python -m benchmarks.commit_wal_cost [--commits 1500] [--rounds 6]
        [--partitions 3] [--producer-states]

A fresh embedded PostgreSQL (fsync off), one topic of --partitions partitions led and opened
by node 1. Each commit is one WAL object with one range per partition (what a node sends at
20 MB/s over 3 partitions), sent by a synchronous psycopg connection so that little but
PostgreSQL is timed; with --producer-states every range carries one producer's state (an
idempotent producer). Each round installs one pair of definitions (CREATE OR REPLACE), warms
it with 200 commits, then times --commits; rounds alternate, the order swapped each time.
Reported per round and as medians: wall time per commit, and the CPU time the server's
backend spent per commit (from /proc/<pid>/stat).
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

from benchmarks.control_plane import cpu_seconds  # noqa: E402
from mink.storage.embedded_postgres import EmbeddedPostgres  # noqa: E402

SQL_DIR = Path(__file__).resolve().parent.parent / "mink" / "storage" / "controlplane" / "sql"


def definitions_of_0002() -> str:
    """0002's mink_wal_ranges and mink_commit_wal, as CREATE OR REPLACE statements."""
    text = (SQL_DIR / "0002_operations.sql").read_text()
    ranges = text[text.index("CREATE FUNCTION mink_wal_ranges("):]
    ranges = ranges[:ranges.index("$$;") + 3]
    commit = text[text.index("CREATE FUNCTION mink_commit_wal("):]
    commit = commit[:commit.index("END $$;") + 7]
    return (ranges + "\n" + commit).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


def current_definitions() -> str:
    """The newest migration's text that defines mink_commit_wal (all of it: it is rerun)."""
    newest = None
    for path in sorted(SQL_DIR.glob("*.sql")):
        text = path.read_text()
        if "FUNCTION mink_commit_wal(" in text:
            newest = text
    assert newest is not None
    return newest.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


async def set_up(url: str, partitions: int):
    from mink.storage.controlplane.postgres import MetadataStore

    async with trio_asyncio.open_loop():
        metadata = await MetadataStore.open(url)
        try:
            node_epoch = await metadata.register_node(1, "127.0.0.1", 1, ttl_s=3600)
            epoch = await metadata.acquire_lease("coordinator", 1, node_epoch, ttl_s=3600)
            topic = await metadata.create_topic("cost", partitions, {}, [1] * partitions,
                                                coordinator_epoch=epoch)
            for p in range(partitions):
                await metadata.open_stream(topic.topic_id, p, 0, 1, node_epoch)
            return topic.topic_id, node_epoch
        finally:
            await metadata.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--producer-states", action="store_true")
    args = parser.parse_args()

    import psycopg

    from mink.storage.controlplane.api import ProducerStateUpdate, WalObject, WalRange
    from mink.storage.controlplane.postgres import SQL_COMMIT_WAL, _json_encoder
    from mink.storage.wal import wal_key

    variants = {"0002": definitions_of_0002(), "current": current_definitions()}
    tmp = Path(tempfile.mkdtemp(prefix="mink-commit-cost-"))
    pg = EmbeddedPostgres(tmp / "pg" / "data", durable=False)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    try:
        pg.start()
        topic_id, node_epoch = trio.run(set_up, pg.url, args.partitions)
        conn = psycopg.connect(pg.url, autocommit=True)
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        seq = 0
        state = bytes(40)

        def commit() -> None:
            nonlocal seq
            seq += 1
            ranges = [WalRange(topic_id, p, 0, (seq - 1) * 30, seq * 30 - 1, p * 35_000,
                               (p + 1) * 35_000, int(time.time() * 1000), 1,
                               producer_states=[ProducerStateUpdate(1000 + p, 0, state)]
                               if args.producer_states else [])
                      for p in range(args.partitions)]
            payload = _json_encoder.encode([WalObject(wal_key(1, node_epoch, seq),
                                                      args.partitions * 35_000 + 200, ranges)])
            conn.execute(SQL_COMMIT_WAL, (1, node_epoch, payload.decode())).fetchall()

        for round_ in range(args.rounds):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for name in order:
                conn.execute(variants[name])
                for _ in range(200):
                    commit()
                cpu, started = cpu_seconds([backend]), time.perf_counter()
                for _ in range(args.commits):
                    commit()
                wall = (time.perf_counter() - started) / args.commits
                results[name].append((wall, (cpu_seconds([backend]) - cpu) / args.commits))
        conn.close()
    finally:
        if pg.running():
            pg.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"one WAL object of {args.partitions} ranges per commit"
          f"{', each with a producer state' if args.producer_states else ''}; "
          f"{args.commits} commits per round, {args.rounds} rounds")
    for name, rows in results.items():
        walls = " ".join(f"{wall * 1000:.3f}" for wall, _ in rows)
        cpus = " ".join(f"{cpu * 1000:.3f}" for _, cpu in rows)
        print(f"  {name:8s} wall ms/commit {walls}  (median "
              f"{statistics.median(w for w, _ in rows) * 1000:.3f})")
        print(f"  {'':8s} PG cpu ms/commit {cpus}  (median "
              f"{statistics.median(c for _, c in rows) * 1000:.3f})")


if __name__ == "__main__":
    main()
