"""One client connection: frames in, handlers in arrival order, responses out in that order.

Kafka clients pipeline requests (librdkafka keeps five Produce requests in flight on one
connection). A handler's effects must be applied in arrival order, but waiting for
durability may overlap: so a handler runs as its own task, and the next one starts only
once the previous one has called `ctx.applied()` (or finished). The writer sends responses
strictly in request order.

Quotas (KIP-219): once a handler ran, the node's quotas decide the request's throttle time
(`_charge`); the response carries it in `throttle_time_ms` and, once it is sent, no further
request is started on this connection for that long (the connection is muted), so a client
that ignores the field is held back too. To a client older than KIP-219 (Produce before v6,
Fetch before v8, ...: `mink/broker/quotas/throttling.py`) the response itself is held back
that long instead, with the connection muted meanwhile.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import os
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from mink.protocol.apis import ApiKey, advertised, privileged
from mink.protocol.framing import FrameError, FrameReader
from mink.protocol.messages import (
    EncodedBody,
    MalformedRequest,
    Request,
    decode_request,
    encode_response_frame,
    peek_client_id,
    peek_header,
)

from mink.broker.quotas.throttling import client_throttles
from mink.broker.security.listeners import KafkaListener
from mink.broker.security.sasl import SaslAuthenticator
from mink.broker.security.principal import ANONYMOUS, KafkaPrincipal
from mink.broker.server.errors import CloseConnection

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64  # requests read ahead of their responses on one connection


class RequestContext:
    def __init__(self, connection: Connection, request: Request, size: int = 0,
                 decode_seconds: float = 0.0, frame: bytes = b"", *,
                 envelope: RequestContext | None = None,
                 principal: KafkaPrincipal | None = None, client_host: str | None = None):
        self.connection = connection
        self.request = request
        self.header = request.header
        self.size = size  # bytes of the request frame (what a Produce is charged)
        self.decode_seconds = decode_seconds  # charged to request_percentage
        # The request's header and body as they came (what forwarding wraps in an Envelope).
        self.frame = frame
        # The Envelope this request arrived in (`handlers/envelope.py`), None if it came as
        # it is: a request that arrived in an Envelope is never forwarded again. Its
        # principal and client host are then the original client's, carried in the Envelope.
        self.envelope = envelope
        self._principal = principal
        self._client_host = client_host
        # A byte-rate throttle decided before the handler ends (a Produce's as it starts, a
        # Fetch's by its handler), in seconds, and which quota gave the throttle.
        self.throttle = 0.0
        self.throttle_kind = "fetch"
        # Set for an Envelope accepted from another node and for the request inside it:
        # not charged (the client was charged on the node it spoke to; Kafka exempts
        # inter-broker requests too). Nothing a client sends sets it.
        self.quota_exempt = False
        # Set by a handler whose response is the last on this connection (a failed
        # authentication): it is sent, then the connection is closed.
        self.close_after = False
        self._applied = envelope._applied if envelope is not None else trio.Event()

    @property
    def principal(self) -> KafkaPrincipal:
        if self._principal is not None:
            return self._principal
        return self.connection.principal

    @property
    def client_host(self) -> str:
        """The client's address (what ACL host rules match): the original client's for a
        request that arrived in an Envelope."""
        if self._client_host is not None:
            return self._client_host
        peer = self.connection.peer
        host = peer.rsplit(":", 1)[0] if ":" in peer else peer
        return host.strip("[]")

    @property
    def client_id(self) -> str:
        return self.header.client_id or ""

    @property
    def listener_name(self) -> str | None:
        """The listener the request came in on: answers name that listener's endpoints."""
        return self.connection.listener_name

    def enveloped(self, request: Request, frame: bytes, principal: KafkaPrincipal,
                  client_host: str) -> RequestContext:
        """The context of the request inside this (accepted) Envelope: the original
        principal and host, not charged, applied when it is."""
        inner = RequestContext(self.connection, request, len(frame), 0.0, frame,
                               envelope=self, principal=principal, client_host=client_host)
        inner.quota_exempt = True
        return inner

    def applied(self) -> None:
        """The handler's effects are in place; the next request on this connection may start."""
        self._applied.set()

    @property
    def peer(self) -> str:
        return self.connection.peer


Handler = Callable[[Any, RequestContext, Any], Awaitable[Any]]


class _Slot:
    """Where one request's response lands; the writer takes slots in request order."""

    __slots__ = ("done", "frame", "close", "close_after", "throttle", "hold")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.frame: bytes | list | None = None  # a list: buffers sent in order (Fetch)
        self.close = False
        self.close_after = False  # close once this response is sent
        self.throttle = 0.0  # seconds the connection is muted after this response
        self.hold = False  # a pre-KIP-219 client: hold the response back that long instead


class Connection:
    def __init__(self, node: Any, stream: trio.abc.Stream, handlers: dict[int, Handler],
                 max_frame_bytes: int, *, listener: KafkaListener | None = None,
                 principal: KafkaPrincipal = ANONYMOUS, peer: str | None = None):
        self.node = node
        self.stream = stream
        self.handlers = handlers
        self.reader = FrameReader(max_frame_bytes)
        # Who is speaking: ANONYMOUS on PLAINTEXT, the certificate's mapped DN on SSL with a
        # client certificate, the SASL user once SASL authenticated it.
        self.principal: KafkaPrincipal = principal
        self.listener_name = listener.name if listener is not None else None
        # Envelopes (forwarded requests) are served only here (Kafka: the privileged listener)
        self.on_inter_broker_listener = listener is None or listener.name == getattr(
            node, "inter_broker_listener", listener.name)
        self.sasl: SaslAuthenticator | None = (
            SaslAuthenticator(node, self)
            if listener is not None and listener.protocol.sasl else None)
        # Muting (KIP-219): throttled responses not sent yet, and until when (trio time)
        # nothing more is started after the last one sent.
        self._throttled_pending = 0
        self._muted_until = -math.inf
        self._unmuted = trio.Event()
        # The last Produce of this connection with partitions forwarded to other nodes
        # (produce_forwarding.Forwarded): the next one queues its parts after it.
        self.last_forwarded: Any = None
        # Partitions whose appends here, by an earlier Produce, may still fail as moved and
        # be forwarded: a later Produce's parts for them are queued after that (set events).
        self.appending: dict[tuple[str, int], trio.Event] = {}
        if peer is None:
            try:
                host, port = stream.socket.getpeername()[:2]
                peer = f"{host}:{port}"
            except (OSError, AttributeError):
                peer = "?"
        self.peer = peer

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
                if isinstance(self.stream, trio.SSLStream):
                    # no waiting on a peer that may never read our close_notify
                    await trio.aclose_forcefully(self.stream)
                else:
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
                    if not await self._receive():
                        return
                    continue
                if self._throttled_pending or trio.current_time() < self._muted_until:
                    await self._wait_unmuted()
                slot = _Slot()
                started = self._start_request(nursery, frame, slot)
                if started is None:
                    return
                await slots.send(slot)
                await started.wait()
                if self.node.quotas.request.limits and self._under_request_quota(frame):
                    # As Kafka, which reads a connection's next request only once the last
                    # one is answered: a request's handler time is known only when it is
                    # done, and pipelined requests would overshoot the quota meanwhile.
                    await slot.done.wait()

    async def _receive(self) -> int:
        """Bytes from the client into the reader's buffer; 0 once the client closed. A plain
        socket reads straight into it (a large frame's own buffer: no copy in user space);
        other streams (TLS) are copied in."""
        target = self.reader.receive_buffer()
        if isinstance(self.stream, trio.SocketStream):
            try:
                count = await self.stream.socket.recv_into(target)
            except OSError as exc:  # as SocketStream.receive_some translates them
                raise trio.BrokenResourceError(f"receive failed: {exc}") from exc
        else:
            data = await self.stream.receive_some(target.nbytes)
            count = len(data)
            target[:count] = data
        self.reader.received(count)
        return count

    def _start_request(self, nursery: trio.Nursery, frame: bytes, slot: _Slot) -> trio.Event | None:
        """Decode and start the handler. Returns the event set once its effects are applied,
        or None when the connection must be closed."""
        try:
            api_key, api_version, correlation_id = peek_header(frame)
        except MalformedRequest as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            return None
        if self.sasl is not None:
            refusal = self.sasl.refusal(api_key)
            if refusal is not None:
                log.info("closing connection from %s: %s", self.peer, refusal)
                return None
        if privileged(api_key, api_version) and not self.on_inter_broker_listener:
            log.info("closing connection from %s on listener %s: it sent an Envelope, which "
                     "only the inter-broker listener accepts", self.peer, self.listener_name)
            return None
        if not (advertised(api_key, api_version) or privileged(api_key, api_version)) or (
                api_key not in self.handlers):
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
        timed = self.node.quotas.timer is not None
        decode_started = time.perf_counter() if timed else 0.0
        try:
            request = decode_request(frame)
        except MalformedRequest as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            return None
        ctx = RequestContext(self, request, len(frame),
                             time.perf_counter() - decode_started if timed else 0.0, frame)
        if api_key == ApiKey.PRODUCE and self.node.quotas.produce.limits and (
                not ctx.quota_exempt):
            # A Produce is charged its bytes as it starts (Kafka charges them once the batch
            # is appended, which is the same moment here: before the wait for durability), so
            # the next request on the connection waits for a throttle already.
            ctx.throttle = self.node.quotas.record_produce(
                self.principal.name, ctx.client_id, ctx.size, trio.current_time())
            if ctx.throttle > 0:
                ctx.throttle_kind = "produce"
                self._throttle(slot, ctx.throttle, request.header)
        nursery.start_soon(self._run_handler, self.handlers[api_key], ctx, slot)
        return ctx._applied

    async def _run_handler(self, handler: Handler, ctx: RequestContext, slot: _Slot) -> None:
        header = ctx.header
        metrics = self.node.metrics
        started = time.perf_counter()
        timer = self.node.quotas.timer
        task = trio.lowlevel.current_task()
        if timer is not None:
            timer.track(task)
        try:
            body = await handler(self.node, ctx, ctx.request.body)
            slot.close_after = ctx.close_after
            throttle = self._charge(ctx, timer, task)
            if throttle > 0:
                body = _with_throttle(body, throttle)
                self._throttle(slot, throttle, header)
                metrics.quota_throttled(ctx.throttle_kind, throttle)
            if body is not None:
                encode_started = time.perf_counter()
                slot.frame = encode_response_frame(header.correlation_id, body)
                if timer is not None and not ctx.quota_exempt:  # Kafka's network-thread
                    # time: charged, never throttling
                    self.node.quotas.record_request_time_no_throttle(
                        ctx.principal.name, ctx.client_id,
                        time.perf_counter() - encode_started, trio.current_time())
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
            if timer is not None:
                timer.done(task)
            metrics.request(header.api_key, header.api_version).observe(
                time.perf_counter() - started)
            ctx.applied()
            slot.done.set()

    def _under_request_quota(self, frame: bytes) -> bool:
        if peek_header(frame)[0] == ApiKey.ENVELOPE:
            # Another node's forwarded requests, pipelined on its connection: not held back
            # one at a time (one refused for want of CLUSTER_ACTION is still charged).
            return False
        client_id = peek_client_id(frame) or ""
        return self.node.quotas.request.quota(self.principal.name, client_id) is not None

    def _charge(self, ctx: RequestContext, timer, task) -> float:
        """The request's throttle in seconds: the largest of its byte-rate quota's (a
        Produce's, charged as it started; a Fetch's, decided by its handler) and its request
        quota's (the handler time so far, decoding included)."""
        throttle = ctx.throttle
        if timer is not None and not ctx.quota_exempt:
            spent = ctx.decode_seconds + timer.done(task)
            timer.track(task)  # encoding is charged apart, without throttling (below)
            request = self.node.quotas.record_request_time(
                ctx.principal.name, ctx.client_id, spent, trio.current_time())
            if request > throttle:
                throttle, ctx.throttle_kind = request, "request"
        return throttle

    def _throttle(self, slot: _Slot, throttle: float, header) -> None:
        if not slot.throttle:
            self._throttled_pending += 1  # until the writer sends it
        slot.throttle = max(slot.throttle, throttle)
        slot.hold = not client_throttles(header.api_key, header.api_version)

    async def _wait_unmuted(self) -> None:
        while self._throttled_pending or trio.current_time() < self._muted_until:
            if self._throttled_pending:
                self._unmuted = trio.Event()
                await self._unmuted.wait()
            else:
                await trio.sleep_until(self._muted_until)

    async def _write_responses(self, slots: trio.MemoryReceiveChannel,
                               cancel_scope: trio.CancelScope) -> None:
        async with slots:
            async for slot in slots:
                await slot.done.wait()
                if slot.close:
                    break
                if slot.throttle and slot.hold:
                    await trio.sleep(slot.throttle)
                if slot.frame is not None:
                    await send_frame(self.stream, slot.frame)
                if slot.close_after:
                    break
                if slot.throttle:
                    self._throttled_pending -= 1
                    if not slot.hold:
                        self._muted_until = max(self._muted_until,
                                                trio.current_time() + slot.throttle)
                    self._unmuted.set()
        # The reader stopped (peer closed or bad input) or a handler asked to close: everything
        # still running for this connection has no one to answer to.
        cancel_scope.cancel()


_IOV_MAX = 512  # buffers per writev, below every platform's IOV_MAX (1024 on Linux)


async def send_frame(stream, frame: bytes | list) -> None:
    """Send a frame (bytes, or a list of buffers). On a plain socket its buffers go straight
    to the kernel, a writev at a time (scatter-gather: the batches in a list are copied by
    the kernel only), with a wait only while the socket's buffer is full: trio's own sends
    yield to its scheduler after every call, even when the kernel took everything, which
    cost the event loop about 15 us a response. Other streams (TLS) get the buffers joined."""
    if not isinstance(stream, trio.SocketStream):
        await stream.send_all(b"".join(frame) if isinstance(frame, list) else frame)
        return
    sock = stream.socket
    views = [memoryview(part) for part in (frame if isinstance(frame, list) else [frame])
             if len(part)]  # (an empty buffer would be written as 0 bytes, over and over)
    first = 0
    while first < len(views):
        try:
            sent = os.writev(sock.fileno(), views[first:first + _IOV_MAX])
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        except OSError as exc:  # as the stream's own sends say it: the client went away
            raise trio.BrokenResourceError(f"the client went away: {exc!r}") from exc
        while sent and first < len(views):
            size = len(views[first])
            if sent >= size:
                sent -= size
                first += 1
            else:
                views[first] = views[first][sent:]
                sent = 0


def _with_throttle(body: Any, seconds: float) -> Any:
    """The response with its throttle_time_ms set. A response encoded ahead (a cached
    Metadata answer) is patched in place when throttle_time_ms is its first field, as in
    every version that has it; a response without the field is only muted."""
    ms = min(round(seconds * 1000), 2**31 - 1)
    if isinstance(body, EncodedBody):
        fields = dataclasses.fields(body.schema)
        if fields and fields[0].name == "throttle_time" and len(body.payload) >= 4:
            return EncodedBody(body.schema, _THROTTLE_MS.pack(ms) + body.payload[4:])
        return body
    if body is None or not hasattr(body, "throttle_time"):
        return body
    return dataclasses.replace(body, throttle_time=datetime.timedelta(milliseconds=ms))


_THROTTLE_MS = struct.Struct(">i")
