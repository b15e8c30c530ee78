"""Three in-process nodes behind one address, as behind a load balancer pinned to one node:
every node advertises one TCP proxy for clients, which leads to node 1's client listener
only; their inter-broker listener (INTERNAL) is their own."""

from __future__ import annotations

import socket
from contextlib import asynccontextmanager

import trio


@asynccontextmanager
async def one_address_cluster(postgres, **settings):
    """Yields (cluster, the proxy's "host:port")."""
    from mink.testing import open_cluster
    from mink.testing.cluster import _replace
    from mink.testing.proxy import TcpProxy

    with socket.socket() as probe:  # a free port for node 1's client listener
        probe.bind(("127.0.0.1", 0))
        client_port = probe.getsockname()[1]
    proxy = TcpProxy("127.0.0.1", client_port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        host, port = proxy.address
        async with open_cluster(
                3, postgres, proxy=False,
                listeners="INTERNAL://127.0.0.1:0,CLIENT://127.0.0.1:0",
                listener_security_protocol_map="INTERNAL:PLAINTEXT,CLIENT:PLAINTEXT",
                inter_broker_listener_name="INTERNAL",
                advertised_listeners=f"INTERNAL://127.0.0.1:0,CLIENT://{host}:{port}",
                **settings) as cluster:
            first = cluster.node(1)  # restarted on the port the proxy leads to
            await first.stop()
            first.config = _replace(first.config, listeners=(
                f"INTERNAL://127.0.0.1:0,CLIENT://127.0.0.1:{client_port}"))
            await first.start()
            # every view has node 1 back before a test places a topic: one created before
            # had all its partitions on nodes 2 and 3
            with trio.fail_after(30):
                while any({1, 2, 3} - set(n.node.view.assignable or n.node.view.brokers)
                          for n in cluster.running_nodes()):
                    await trio.sleep(0.05)
            yield cluster, f"{host}:{port}"
        nursery.cancel_scope.cancel()
