"""The Kafka listener: accepts connections and runs one `Connection` per client."""

from __future__ import annotations

import logging

import trio

from mink.broker.server.connection import Connection
from mink.broker.server.handlers import HANDLERS

log = logging.getLogger(__name__)


async def serve_kafka(node, host: str, port: int, max_frame_bytes: int,
                      *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen on host:port; reports the bound (host, port) through task_status."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[:2]

    async def handle(stream: trio.SocketStream) -> None:
        # The listener opens before the node registers (its port may be chosen by the OS),
        # but no request is answered before the node is in its own view: Metadata would
        # list no brokers and controller -1, which makes admin clients wait for a
        # controller until they time out.
        await node.ready.wait()
        node.metrics.connection_opened()
        try:
            await Connection(node, stream, HANDLERS, max_frame_bytes).run()
        except Exception:
            # One client's trouble must never take the node down.
            log.exception("connection failed")
        finally:
            node.metrics.connection_closed()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        log.info("listening for Kafka clients on %s:%d", *bound)
        task_status.started(bound)
