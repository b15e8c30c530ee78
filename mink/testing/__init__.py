"""A real Mink node or cluster inside your tests (docs/testing.md).

    async with mink.testing.open_node() as node:        # in a trio program or test
        await node.create_topic("orders", partitions=3)
        ... any Kafka client on node.bootstrap ...

With pytest, the plugin (`mink.testing.plugin`, on by default once mink is installed; `-p
no:mink` turns it off) offers the fixtures `mink_broker`, `mink_cluster`, `mink_postgres`,
`mink_trio_broker` and `mink_trio_cluster`.

This module imports nothing heavy until a name is used: the plugin loads it at every pytest
start.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Message", "MinkCluster", "MinkNode", "NodeNotRunning", "TestPostgres",
           "open_cluster", "open_node", "BlockingCluster", "BlockingNode", "TcpProxy"]

_WHERE = {
    "Message": "mink.testing.cluster",
    "MinkCluster": "mink.testing.cluster",
    "MinkNode": "mink.testing.cluster",
    "NodeNotRunning": "mink.testing.cluster",
    "open_cluster": "mink.testing.cluster",
    "open_node": "mink.testing.cluster",
    "TestPostgres": "mink.testing.postgres",
    "BlockingCluster": "mink.testing.blocking",
    "BlockingNode": "mink.testing.blocking",
    "TcpProxy": "mink.testing.proxy",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
