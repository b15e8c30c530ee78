"""One client connection: frames in, handlers in arrival order, responses out in that order.

Kafka clients pipeline requests (librdkafka keeps five Produce requests in flight on one
connection). A handler's effects must be applied in arrival order, but waiting for
durability may overlap: so a handler runs as its own task, and the next one starts only
once the previous one has called `ctx.applied()` (or finished). The writer sends responses
strictly in request order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from mink.protocol.apis import ApiKey, advertised
from mink.protocol.framing import FrameError, FrameReader
from mink.protocol.messages import (
    MalformedRequest,
    Request,
    decode_request,
    encode_response,
    peek_header,
)

from mink.broker.server.errors import CloseConnection

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64  # requests read ahead of their responses on one connection
RECEIVE_BYTES = 256 * 1024


class RequestContext:
    def __init__(self, connection: Connection, request: Request):
        self.connection = connection
        self.request = request
        self.header = request.header
        self._applied = trio.Event()

    def applied(self) -> None:
        """The handler's effects are in place; the next request on this connection may start."""
        self._applied.set()

    @property
    def peer(self) -> str:
        return self.connection.peer


Handler = Callable[[Any, RequestContext, Any], Awaitable[Any]]


class _Slot:
    """Where one request's response lands; the writer takes slots in request order."""

    __slots__ = ("done", "frame", "close")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.frame: bytes | None = None
        self.close = False


class Connection:
    def __init__(self, node: Any, stream: trio.SocketStream, handlers: dict[int, Handler],
                 max_frame_bytes: int):
        self.node = node
        self.stream = stream
        self.handlers = handlers
        self.reader = FrameReader(max_frame_bytes)
        try:
            host, port = stream.socket.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            self.peer = "?"

    async def run(self) -> None:
        send_slot, receive_slot = trio.open_memory_channel[_Slot](MAX_IN_FLIGHT)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_responses, receive_slot, nursery.cancel_scope)
                await self._read_requests(nursery, send_slot)
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        finally:
            with trio.CancelScope(shield=True):
                await self.stream.aclose()

    async def _read_requests(self, nursery: trio.Nursery, slots: trio.MemorySendChannel) -> None:
        async with slots:
            while True:
                try:
                    frame = self.reader.next_frame()
                except FrameError as exc:
                    log.warning("closing connection from %s: %s", self.peer, exc)
                    return
                if frame is None:
                    data = await self.stream.receive_some(max(RECEIVE_BYTES, self.reader.wanted()))
                    if not data:
                        return
                    self.reader.feed(data)
                    continue
                slot = _Slot()
                started = self._start_request(nursery, frame, slot)
                if started is None:
                    return
                await slots.send(slot)
                await started.wait()

    def _start_request(self, nursery: trio.Nursery, frame: bytes, slot: _Slot) -> trio.Event | None:
        """Decode and start the handler. Returns the event set once its effects are applied,
        or None when the connection must be closed."""
        try:
            api_key, api_version, correlation_id = peek_header(frame)
        except MalformedRequest as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            return None
        if not advertised(api_key, api_version) or api_key not in self.handlers:
            if api_key == ApiKey.API_VERSIONS:
                # KIP-511: answer an unknown ApiVersions version in v0 form with our ranges,
                # so the client can pick a version it shares with us.
                from mink.broker.server.handlers.api_versions import unsupported_version_response

                slot.frame = unsupported_version_response(correlation_id)
                slot.done.set()
                return slot.done
            log.warning("closing connection from %s: api key %d version %d is not supported",
                        self.peer, api_key, api_version)
            return None
        try:
            request = decode_request(frame)
        except MalformedRequest as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            return None
        ctx = RequestContext(self, request)
        nursery.start_soon(self._run_handler, self.handlers[api_key], ctx, slot)
        return ctx._applied

    async def _run_handler(self, handler: Handler, ctx: RequestContext, slot: _Slot) -> None:
        header = ctx.header
        metrics = self.node.metrics
        started = time.perf_counter()
        try:
            body = await handler(self.node, ctx, ctx.request.body)
            if body is not None:
                slot.frame = encode_response(header.correlation_id, body)
                error = getattr(body, "error_code", None)  # a response's top-level error
                if error:
                    metrics.request_error(header.api_key, header.api_version,
                                          getattr(error, "name", str(error)).upper())
        except CloseConnection as exc:
            log.info("closing connection from %s after api %d: %s", self.peer,
                     header.api_key, exc)
            slot.close = True
            metrics.request_error(header.api_key, header.api_version, "CONNECTION_CLOSED")
        except Exception:
            log.exception("closing connection from %s: handler for api %d v%d failed",
                          self.peer, header.api_key, header.api_version)
            slot.close = True
            metrics.request_error(header.api_key, header.api_version, "HANDLER_FAILED")
        finally:
            metrics.request(header.api_key, header.api_version).observe(
                time.perf_counter() - started)
            ctx.applied()
            slot.done.set()

    async def _write_responses(self, slots: trio.MemoryReceiveChannel,
                               cancel_scope: trio.CancelScope) -> None:
        async with slots:
            async for slot in slots:
                await slot.done.wait()
                if slot.close:
                    break
                if slot.frame is not None:
                    await self.stream.send_all(slot.frame)
        # The reader stopped (peer closed or bad input) or a handler asked to close: everything
        # still running for this connection has no one to answer to.
        cancel_scope.cancel()
