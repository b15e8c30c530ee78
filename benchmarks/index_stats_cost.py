"""What keeping topic statistics by deltas costs a WAL commit: the statement triggers on
batch_index (sql/0009) against the same inserts with those triggers disabled.

    .venv/bin/python -m benchmarks.index_stats_cost [--commits 2000] [--partitions 50]

A fresh embedded PostgreSQL (fsync off), one topic of --partitions partitions led and opened
by node 1. Each commit is a real `MetadataStore.commit_wal` of one WAL object with one range
per partition (what a node under load sends). Alternating rounds with the stats triggers
enabled and disabled; reported: the median time per commit of each.
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

from mink.storage.embedded_postgres import EmbeddedPostgres  # noqa: E402

TRIGGERS = ("batch_index_stats_added",)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=50)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mink-stats-"))
    pg = EmbeddedPostgres(tmp / "pg" / "data", durable=False)
    try:
        pg.start()
        times = trio.run(measure, pg.url, args.commits, args.partitions)
    finally:
        if pg.running():
            pg.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"{args.partitions} ranges per commit, {len(times[True])} commits each:")
    print(f"  stats triggers on:  median {on * 1000:.3f} ms per commit_wal")
    print(f"  stats triggers off: median {off * 1000:.3f} ms per commit_wal")
    print(f"  difference: {(on - off) * 1000:.3f} ms ({(on / off - 1) * 100:.0f}%)")


def set_triggers(url: str, action: str) -> None:
    """(A blocking call between measured rounds: nothing else runs meanwhile.)"""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for trigger in TRIGGERS:
            conn.execute(f"ALTER TABLE batch_index {action} TRIGGER {trigger}")


async def measure(url: str, commits: int, partitions: int) -> dict[bool, list[float]]:
    import psycopg

    from mink.storage.controlplane.api import WalObject, WalRange
    from mink.storage.controlplane.postgres import MetadataStore
    from mink.storage.wal import wal_key

    async with trio_asyncio.open_loop():
        metadata = await MetadataStore.open(url)
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                epoch = conn.execute("""
                    INSERT INTO leases (scope, holder, holder_epoch, epoch, acquired_at,
                                        expires_at)
                    VALUES ('coordinator', NULL, NULL, 1, now(), now() + interval '1 hour')
                    RETURNING epoch""").fetchone()[0]
            node_epoch = await metadata.register_node(1, "127.0.0.1", 1, ttl_s=3600)
            topic = await metadata.create_topic("stats", partitions, {}, [1] * partitions,
                                                coordinator_epoch=epoch)
            for p in range(partitions):
                await metadata.open_stream(topic.topic_id, p, 0, 1, node_epoch)
            times: dict[bool, list[float]] = {True: [], False: []}
            seq = 0
            for round_ in range(10):
                enabled = round_ % 2 == 0
                action = "ENABLE" if enabled else "DISABLE"
                set_triggers(url, action)
                for _ in range(commits // 10):
                    seq += 1
                    ranges = [WalRange(topic.topic_id, p, 0, seq - 1, seq - 1, p * 100,
                                       p * 100 + 100, 0, 1) for p in range(partitions)]
                    started = time.perf_counter()
                    await metadata.commit_wal(1, node_epoch, [WalObject(
                        wal_key(1, node_epoch, seq), partitions * 100, ranges)])
                    times[enabled].append(time.perf_counter() - started)
            set_triggers(url, "ENABLE")
            return times
        finally:
            await metadata.aclose()


if __name__ == "__main__":
    main()
