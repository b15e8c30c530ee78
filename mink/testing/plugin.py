"""The pytest plugin: Mink fixtures for any test (docs/testing.md).

Registered through the `pytest11` entry point `mink`, so it is there wherever mink is
installed; `-p no:mink` switches it off. Loading it imports nothing but pytest: PostgreSQL,
the harness thread and the nodes start the first time a fixture asks for them.

    mink_postgres       session: one PostgreSQL (embedded, or MINK_TESTING_POSTGRES_URL) with
                        a migrated template database; every node or cluster gets a clone
    mink_broker         one node for a sync or asyncio test (in the harness thread): .bootstrap,
                        .create_topic(), .read_topic(), fault hooks
    mink_cluster        three nodes (or @pytest.mark.mink(nodes=N)), .kill(id), .restart(id) ...
    mink_trio_broker    the same, in the test's own trio run (pytest-trio tests)
    mink_trio_cluster

`@pytest.mark.mink(nodes=..., **config)` passes Config settings (num_partitions=3,
lease_ttl=2.0, ...) to the fixture of that test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "mink(nodes=3, **config): settings for the mink_* fixtures of this test")


def _settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("mink")
    return dict(marker.kwargs) if marker else {}


@pytest.fixture(scope="session")
def mink_postgres() -> Iterator[Any]:
    from mink.testing.postgres import TestPostgres

    server = TestPostgres().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _mink_harness() -> Iterator[Any]:
    from mink.testing.blocking import HarnessThread

    harness = HarnessThread()
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def mink_broker(mink_postgres: Any, _mink_harness: Any,
                request: pytest.FixtureRequest) -> Iterator[Any]:
    from mink.testing.blocking import blocking_node

    settings = _settings(request)
    settings.pop("nodes", None)
    with blocking_node(_mink_harness, mink_postgres, **settings) as node:
        yield node


@pytest.fixture
def mink_cluster(mink_postgres: Any, _mink_harness: Any,
                 request: pytest.FixtureRequest) -> Iterator[Any]:
    from mink.testing.blocking import blocking_cluster

    settings = _settings(request)
    nodes = settings.pop("nodes", 3)
    with blocking_cluster(_mink_harness, nodes, mink_postgres, **settings) as cluster:
        yield cluster


@pytest.fixture
async def mink_trio_broker(mink_postgres: Any,
                           request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    from mink.testing.cluster import open_node

    settings = _settings(request)
    settings.pop("nodes", None)
    async with open_node(mink_postgres, **settings) as node:
        yield node


@pytest.fixture
async def mink_trio_cluster(mink_postgres: Any,
                            request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    from mink.testing.cluster import open_cluster

    settings = _settings(request)
    nodes = settings.pop("nodes", 3)
    async with open_cluster(nodes, mink_postgres, **settings) as cluster:
        yield cluster
