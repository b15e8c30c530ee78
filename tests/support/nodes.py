"""Mink nodes for the tests: in-process (in the test's trio run) or as subprocesses."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mink.broker.config import Config
from mink.broker.node import run_node


def require_tool(name: str) -> str:
    """The path of an external tool; a missing tool skips the test, except in CI."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("MINK_REQUIRE_TOOLS"):
            pytest.fail(f"{name} is required in CI but is not installed")
        pytest.skip(f"{name} is not installed (apt-get install {name})")
    return path


def node_config(pg_url: str, store_url: str, **overrides) -> Config:
    values = dict(node_id=1, listener="127.0.0.1:0", postgres_url=pg_url,
                  object_store=store_url, lease_ttl=6.0, coordinator_tick=1.0)
    values.update(overrides)
    return Config(**values)


async def start_node(nursery, config: Config) -> str:
    """Start a node in `nursery`; returns its bootstrap address."""
    host, port = await nursery.start(run_node, config)
    return f"{host}:{port}"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    root = tmp_path / "objects"
    root.mkdir()
    return root.as_uri()


@pytest.fixture
async def node(nursery, pg_url: str, store_url: str) -> str:
    """A single in-process node on PostgreSQL and the file:// store; yields host:port."""
    return await start_node(nursery, node_config(pg_url, store_url))
