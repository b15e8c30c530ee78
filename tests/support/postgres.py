"""PostgreSQL for the tests: the harness's one server per session (mink.testing's
`mink_postgres`), a fresh migrated database per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mink.storage.embedded_postgres import EmbeddedPostgres


@pytest.fixture(scope="session")
def pg_server(mink_postgres) -> EmbeddedPostgres:
    """The session's embedded PostgreSQL, the one the harness's `mink_postgres` started (one
    server for the whole suite): tests of outages stop and start it."""
    if mink_postgres.server is None:
        pytest.skip("the session's PostgreSQL is an outside server (MINK_TESTING_POSTGRES_URL)")
    return mink_postgres.server


@pytest.fixture
def pg_url(mink_postgres) -> Iterator[str]:
    """URL of a new database cloned from the migrated template (the harness's clone, taken
    from a spare cloned ahead; dropped in the background afterwards)."""
    server = mink_postgres.server
    if server is not None and not server.running():  # a test stopped it: restart for this one
        server.start()
    url = mink_postgres.new_database()
    yield url
    if server is not None and not server.running():
        server.start()
    mink_postgres.drop_database(url, wait=False)


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
