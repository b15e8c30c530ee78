"""PostgreSQL for the tests: one server per session, a fresh migrated database per test."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from mink.storage.embedded_postgres import EmbeddedPostgres

TEMPLATE_DB = "mink_template"
_db_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres]:
    # Not under pytest's temporary root: every pytest session that starts resets that root
    # to mode 0700, which locks PostgreSQL's own user (as root, the server runs as
    # `pgserver`) out of the data folder of any other session still running.
    root = Path(tempfile.mkdtemp(prefix="mink-test-pg-"))
    server = EmbeddedPostgres(root / "data", durable=False)
    server.start()
    try:
        from mink.storage.controlplane.migrate import migrate_sync

        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
        migrate_sync(server.url_for(TEMPLATE_DB))
        yield server
    finally:
        if server.running():
            server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """URL of a new database cloned from the migrated template."""
    if not pg_server.running():  # a test that stopped the server must not break the next one
        pg_server.start()
    name = f"t_{os.getpid()}_{next(_db_counter)}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}")
    yield pg_server.url_for(name)
    if not pg_server.running():
        pg_server.start()
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def pg_data_dir(server: EmbeddedPostgres) -> Path:
    return server.data_dir


def via_proxy(url: str, proxy) -> str:
    """The same PostgreSQL URL, through a mink.testing.proxy.TcpProxy."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    user, _, _ = parts.netloc.rpartition("@")
    host, port = proxy.address
    netloc = f"{user}@{host}:{port}" if user else f"{host}:{port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
async def pg_proxy(nursery, pg_url):
    """A TcpProxy in front of the test's PostgreSQL (stall, cut, delay, drop replies); pass
    `via_proxy(pg_url, pg_proxy)` to what should reach PostgreSQL through it."""
    import urllib.parse

    from mink.testing.proxy import TcpProxy

    parts = urllib.parse.urlsplit(pg_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await nursery.start(proxy.run)
    return proxy
