"""The metadata store's connections, run by trio (mink.storage.controlplane.pool), against a
real PostgreSQL: statements of any size, a cancelled statement cancelled in the server too,
the bounded wait for a connection, and connections the server closed replaced unseen."""

from __future__ import annotations

import psycopg
import pytest
import trio

from mink.storage.controlplane import MetadataUnavailable, OutcomeUnknown
from mink.storage.controlplane.postgres import READ, WRITE, MetadataStore


async def open_store(pg_url, **kwargs) -> MetadataStore:
    options = {"min_size": 1, "max_size": 4, "timeout": 2.0, "op_timeout": 10.0}
    return await MetadataStore.open(pg_url, **(options | kwargs))


async def test_statements_larger_than_the_socket_buffers_go_both_ways(pg_url, aio_loop):
    """Parameters and results of several MiB: psycopg waits for the socket to take more (and
    for either direction while the server may be answering), on trio's I/O."""
    store = await open_store(pg_url)
    try:
        text = "mink" * (2 * 1024 * 1024)  # 8 MiB
        row = await store.fetch_one(READ, "SELECT md5(%s), length(%s), %s", (text, text, text))
        assert row is not None
        digest, length, echoed = row
        assert length == len(text) and echoed == text
        with psycopg.connect(pg_url) as conn:
            assert digest == conn.execute("SELECT md5(%s)", (text,)).fetchone()[0]
    finally:
        await store.aclose()


async def test_a_cancelled_statement_is_cancelled_in_the_server(pg_url, aio_loop):
    """The caller gives up (op_timeout) on a statement waiting for a lock: the server is asked
    to cancel it, so it neither holds on nor commits once the lock is free."""
    store = await open_store(pg_url, op_timeout=0.5)
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE pool_probe (k int PRIMARY KEY)")
        with psycopg.connect(pg_url) as blocker:
            blocker.execute("LOCK TABLE pool_probe IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(OutcomeUnknown):
                await store.fetch_one(WRITE, "INSERT INTO pool_probe VALUES (1) RETURNING k")
            with psycopg.connect(pg_url, autocommit=True) as observer:
                waiting = observer.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'INSERT INTO "
                    "pool_probe%%' AND state = 'active'").fetchone()[0]
            assert waiting == 0, "the abandoned INSERT still runs in the server"
            blocker.rollback()  # the lock is free: an INSERT still queued would commit now
        assert await store.fetch_one(READ, "SELECT count(*) FROM pool_probe") == (0,)
        # its connection is reused or replaced: the store goes on
        assert await store.fetch_one(WRITE, "INSERT INTO pool_probe VALUES (2) RETURNING k") == (2,)
    finally:
        await store.aclose()


async def test_a_busy_pool_is_a_bounded_wait_then_unavailable(pg_url, aio_loop):
    """Every connection taken: the next statement waits `timeout` seconds for one, then
    MetadataUnavailable; nothing was sent. Once they are back, statements run again."""
    store = await open_store(pg_url, max_size=2, timeout=0.5)
    try:
        release = trio.Event()
        holding = []

        async def hold() -> None:
            async with trio.open_nursery() as inner:
                inner.start_soon(store.fetch_one, READ, "SELECT pg_sleep(2)")
                holding.append(1)
                await release.wait()

        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(hold)
            with trio.fail_after(5):
                while len(holding) < 2:
                    await trio.sleep(0.01)
            await trio.sleep(0.1)  # both statements are in the server
            started = trio.current_time()
            with pytest.raises(MetadataUnavailable) as raised:
                await store.fetch_one(WRITE, "SELECT 1")
            assert not isinstance(raised.value, OutcomeUnknown)
            assert 0.4 <= trio.current_time() - started < 2.0
            release.set()
        assert await store.fetch_one(READ, "SELECT 42") == (42,)
    finally:
        await store.aclose()


async def test_connections_the_server_closed_are_replaced_even_for_a_write(pg_url, aio_loop):
    """Every pooled connection terminated by the server while idle (a restart, an
    administrator): the next write is sent on a new connection, not failed. (Only this
    test's database: xdist's other worker shares the server.)"""
    store = await open_store(pg_url, max_size=3)
    try:
        async with trio.open_nursery() as nursery:  # three connections in the pool
            for _ in range(3):
                nursery.start_soon(store.fetch_one, READ, "SELECT pg_sleep(0.2)")
        with psycopg.connect(pg_url, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'mink-metadata' AND datname = current_database()"
            ).fetchone()[0]
            assert ended == 3
            with trio.fail_after(10):  # terminating is asynchronous: wait until they are gone
                while admin.execute("SELECT count(*) FROM pg_stat_activity "
                                    "WHERE application_name = 'mink-metadata' "
                                    "AND datname = current_database()").fetchone()[0]:
                    await trio.sleep(0.02)
        row = await store.fetch_one(WRITE, "SELECT pg_backend_pid(), 7")
        assert row is not None and row[1] == 7
    finally:
        await store.aclose()
