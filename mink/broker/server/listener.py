"""The Kafka listeners: each accepts connections and runs one `Connection` per client, after
the TLS handshake on SSL and SASL_SSL listeners (`mink/broker/security/tls.py`)."""

from __future__ import annotations

import logging

import trio

from mink.broker.security.listeners import KafkaListener
from mink.broker.security.principal import ANONYMOUS
from mink.broker.security.tls import TlsRefused, accept_tls
from mink.broker.server.connection import Connection
from mink.broker.server.handlers import HANDLERS

log = logging.getLogger(__name__)


async def serve_kafka(node, listener: KafkaListener, max_frame_bytes: int, ssl_context=None,
                      *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen where `listener` says; reports the bound (host, port) through task_status."""
    listeners = await trio.open_tcp_listeners(listener.port, host=listener.host or None)
    bound = listeners[0].socket.getsockname()[:2]

    async def handle(stream: trio.SocketStream) -> None:
        # The listener opens before the node registers (its port may be chosen by the OS),
        # but no request is answered before the node is in its own view: Metadata would
        # list no brokers and controller -1, which makes admin clients wait for a
        # controller until they time out.
        try:
            host, port = stream.socket.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "?"
        principal = ANONYMOUS
        if listener.protocol.tls:
            try:
                stream, principal = await accept_tls(node, stream, ssl_context, peer)
            except TlsRefused as exc:
                log.info("failed authentication with %s on listener %s (%s)", peer,
                         listener.name, exc)
                node.metrics.authentication(listener.name, "SSL", "failure")
                return
            if listener.protocol.sasl:
                principal = ANONYMOUS  # SASL decides
            elif principal is not ANONYMOUS:
                node.metrics.authentication(listener.name, "SSL", "success")
                log.debug("%s on listener %s is %s by its certificate", peer, listener.name,
                          principal)
        await node.ready.wait()
        node.metrics.connection_opened()
        try:
            await Connection(node, stream, HANDLERS, max_frame_bytes, listener=listener,
                             principal=principal, peer=peer).run()
        except Exception:
            # One client's trouble must never take the node down.
            log.exception("connection failed")
        finally:
            node.metrics.connection_closed()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        log.info("listening for Kafka clients on %s:%d (listener %s, %s)", *bound,
                 listener.name, listener.protocol.value)
        task_status.started(bound)
