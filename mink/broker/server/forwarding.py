"""Forwarding (seed 000, "Coordinator action forwarded"; KIP-590's Envelope): a request
another node must carry out is sent there inside an Envelope (API 58) over the inter-broker
listener, logged in with this node's inter-broker credentials
(`node.inter_broker_security`), and its answer relayed.

The Envelope carries the client's request as it came (header and body bytes), the client's
principal (Kafka's DefaultPrincipalData serialization) and the client's address, so the
receiving node checks the request itself, as that principal from that host
(`handlers/envelope.py`). A request that arrived in an Envelope is never forwarded again.

`forward_to(node, target, ...)` is the one way to send a request to another node, by node
id; the coordinator actions use it with the coordinator's id. Each call opens its own
connection (coordinator actions are rare); bounded by `timeout`.

`EnvelopeLinks` (`node.envelope_links`) keeps connections open for the group and
transaction-coordinator requests forwarded to their coordinators
(`coordinator_forwarding.py`): one call at a time on each, any number at once per target,
so a JoinGroup waiting out a rebalance never holds another client's Heartbeat behind it (a
pipelined connection, as Produce forwarding's `peers.py`, would).
"""

from __future__ import annotations

import datetime
import logging
import select
from dataclasses import dataclass

import trio
from kio.index import load_request_schema
from kio.schema.envelope.v0 import EnvelopeRequest
from kio.schema.errors import ErrorCode

from mink.client import KafkaClient, KafkaClientError
from mink.protocol.apis import ApiKey
from mink.protocol.envelope import address_bytes, serialize_principal
from mink.protocol.messages import (
    MalformedResponse,
    build,
    decode_response,
    encode_request,
    nested,
)

log = logging.getLogger(__name__)

ENVELOPE_VERSION = 0


class CoordinatorUnavailable(Exception):
    """No live coordinator, or it could not be reached: the client should retry."""


class ForwardingFailed(CoordinatorUnavailable):
    """The target node could not be reached, or refused the Envelope itself (its error)."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Who a forwarded request is from: the principal and address the target checks."""

    principal_type: str
    principal_name: str
    client_host: str
    client_id: str | None

    @classmethod
    def of(cls, ctx) -> Origin:
        return cls(ctx.principal.principal_type, ctx.principal.name, ctx.client_host,
                   ctx.header.client_id)


def is_forwarded(ctx) -> bool:
    """Whether the request arrived in an Envelope (then it is never forwarded again)."""
    return ctx.envelope is not None


async def forward_unless_coordinator(node, ctx):
    """The coordinator's answer to the request of `ctx` when this node is not the
    coordinator; None when this node is, when the request arrived in an Envelope, or when no
    coordinator can be reached (the handler then answers NOT_CONTROLLER, and the client
    retries after refreshing its metadata)."""
    if node.coordinator.is_holder or is_forwarded(ctx):
        return None
    ctx.applied()
    view = node.view
    if view.coordinator is None or view.coordinator == node.node_id:
        return None  # the lease is moving: NOT_CONTROLLER, and the client retries
    try:
        return await forward_to(node, view.coordinator, Origin.of(ctx), ctx.header.api_key,
                                ctx.header.api_version, ctx.frame)
    except ForwardingFailed as exc:
        log.warning("forwarding api %d to the coordinator failed: %s", ctx.header.api_key,
                    exc)
        return None


async def forward_to(node, target: int, origin: Origin, api_key: int, api_version: int,
                     request_data: bytes, timeout: float = 30.0):
    """Send a request (its header and body, `request_data`) to node `target` in an
    Envelope from `origin`; returns the decoded response body, or ForwardingFailed."""
    response_data = await send_envelope(node, target, origin, request_data, timeout)
    try:
        _, body = decode_response(api_key, api_version, response_data)
    except MalformedResponse as exc:
        raise ForwardingFailed(f"node {target} answered in a form not understood: {exc}") \
            from None
    return body


async def send_envelope(node, target: int, origin: Origin, request_data: bytes,
                        timeout: float = 30.0) -> bytes:
    """The response data (header and body) of the request `request_data` sent to node
    `target` in an Envelope; ForwardingFailed when it cannot be reached, or refuses."""
    broker = node.view.brokers.get(target)
    if broker is None or target == node.node_id:
        raise ForwardingFailed(f"node {target} is not a live other node")
    envelope = EnvelopeRequest(
        request_data=bytes(request_data),
        request_principal=serialize_principal(origin.principal_type, origin.principal_name),
        client_host_address=address_bytes(origin.client_host))
    try:
        with trio.fail_after(timeout):
            async with await KafkaClient.connect(
                    f"{broker.host}:{broker.port}", client_id=f"mink-node-{node.node_id}",
                    security=node.inter_broker_security) as client:
                response = await client.call(ApiKey.ENVELOPE, ENVELOPE_VERSION, envelope)
    except (OSError, EOFError, trio.TooSlowError, KafkaClientError,
            MalformedResponse) as exc:
        raise ForwardingFailed(f"node {target} unreachable: {exc or type(exc).__name__}") \
            from None
    if response.error_code != ErrorCode.none or response.response_data is None:
        raise ForwardingFailed(f"node {target} refused the envelope: "
                               f"{ErrorCode(response.error_code).name.upper()}")
    return response.response_data


async def auto_create_via_coordinator(node, names: list[str], ctx) -> None:
    """Topic auto-creation on a node that is not the coordinator: a CreateTopics request
    with the broker defaults, sent to the coordinator in an Envelope from the client whose
    Metadata or Produce asked for the topics (as Kafka's AutoTopicCreationManager), so the
    coordinator checks that client's CREATE itself. Errors (the topic exists, no
    coordinator) are left for the client's retry to find."""
    view = node.view
    if view.coordinator is None or view.coordinator == node.node_id:
        return
    schema = load_request_schema(ApiKey.CREATE_TOPICS, 5)
    topic_schema = nested(schema, "CreatableTopic")
    body = build(schema, topics=tuple(
        build(topic_schema, name=name, num_partitions=-1, replication_factor=-1,
              assignments=(), configs=()) for name in names),
        timeout=datetime.timedelta(seconds=30), validate_only=False)
    origin = Origin.of(ctx)
    frame = encode_request(ApiKey.CREATE_TOPICS, 5, 0, body, origin.client_id)[4:]
    try:
        await forward_to(node, view.coordinator, origin, ApiKey.CREATE_TOPICS, 5, frame)
    except ForwardingFailed as exc:
        log.warning("forwarding the auto-creation of %s failed: %s", names, exc)


# -- kept-open connections, one call at a time each -------------------------------------------

CONNECT_TIMEOUT = 5.0  # one connection attempt (TCP, TLS, SASL)
MAX_IDLE_PER_TARGET = 8  # connections kept open between calls, per target node
IDLE_SECONDS = 60.0  # an idle connection older than this is closed, not reused


class EnvelopeLinks:
    """Connections to the other nodes for Envelopes answered one at a time.

    A call takes an idle connection to its target (or opens one, within CONNECT_TIMEOUT),
    sends its Envelope, waits for the answer until its deadline, and puts the connection
    back for the next call. Calls to one target never wait for each other: a call that finds
    no idle connection opens another, and at most MAX_IDLE_PER_TARGET stay open once the
    calls are answered. A connection that failed, or timed out with a call on it, is closed
    (its answer would come out of turn); the idle ones to the same target are closed too, as
    a peer that closed one (it restarted) closed them all. An idle connection the peer has
    closed is seen at once (its socket is readable: EOF) and not reused. Nothing is resent:
    a call that failed ends as ForwardingFailed, and the caller decides.
    """

    def __init__(self, node) -> None:
        self.node = node
        # per target: (client, address, reuse until: trio time), the most recent last
        self._idle: dict[int, list[tuple[KafkaClient, str, float]]] = {}
        self.opened = 0  # connections opened so far (for tests and measurements)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Closes the idle connections when the node stops (a task of its nursery)."""
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            for target in list(self._idle):
                self._close_idle(target)

    def idle(self, target: int) -> int:
        return len(self._idle.get(target, ()))

    async def call(self, target: int, envelope: EnvelopeRequest, deadline: float) -> bytes:
        """The response data (header and body) of `envelope`'s request on node `target`,
        answered by `deadline` (trio time); ForwardingFailed otherwise."""
        node = self.node
        broker = node.view.brokers.get(target)
        if broker is None or target == node.node_id:
            raise ForwardingFailed(f"node {target} is not a live other node")
        address = f"{broker.host}:{broker.port}"
        client = self._take(target, address)
        reused = client is not None
        try:
            with trio.fail_at(deadline):
                if client is None:
                    with trio.fail_at(min(deadline, trio.current_time() + CONNECT_TIMEOUT)):
                        client = await KafkaClient.connect(
                            address, client_id=f"mink-node-{node.node_id}",
                            security=node.inter_broker_security)
                    self.opened += 1
                response = await client.call(ApiKey.ENVELOPE, ENVELOPE_VERSION, envelope)
        except (OSError, EOFError, trio.TooSlowError, trio.BrokenResourceError,
                trio.ClosedResourceError, KafkaClientError, MalformedResponse) as exc:
            if client is not None:
                await trio.aclose_forcefully(client.stream)
            self._close_idle(target)
            reason = "no answer in time" if isinstance(exc, trio.TooSlowError) else (
                str(exc) or type(exc).__name__)
            raise ForwardingFailed(f"node {target} at {address}"
                                   f"{' (a kept-open connection)' if reused else ''}: "
                                   f"{reason}") from None
        except BaseException:  # cancelled: the answer would come out of turn
            if client is not None:
                await trio.aclose_forcefully(client.stream)
            raise
        self._give_back(target, address, client)
        if response.error_code != ErrorCode.none or response.response_data is None:
            raise ForwardingFailed(f"node {target} refused the envelope: "
                                   f"{ErrorCode(response.error_code).name.upper()}")
        return response.response_data

    def _take(self, target: int, address: str) -> KafkaClient | None:
        idle = self._idle.get(target)
        now = trio.current_time()
        while idle:
            client, at, reuse_until = idle.pop()
            if at == address and now < reuse_until and not _closed_by_peer(client):
                return client
            _close_now(client)
        return None

    def _give_back(self, target: int, address: str, client: KafkaClient) -> None:
        idle = self._idle.setdefault(target, [])
        if len(idle) >= MAX_IDLE_PER_TARGET:
            _close_now(client)
            return
        reuse_until = trio.current_time() + IDLE_SECONDS
        if client.session_lifetime_ms > 0:  # KIP-368: not past its SASL session
            lifetime = client.session_lifetime_ms / 1000
            reuse_until = min(reuse_until, trio.current_time() + lifetime - max(
                min(1.0, lifetime / 2), lifetime / 10))
        idle.append((client, address, reuse_until))

    def _close_idle(self, target: int) -> None:
        for client, _, _ in self._idle.pop(target, ()):
            _close_now(client)


def _socket_of(client: KafkaClient):
    stream = client.stream
    stream = getattr(stream, "transport_stream", stream)  # under TLS
    return getattr(stream, "socket", None)


def _closed_by_peer(client: KafkaClient) -> bool:
    """Whether an idle connection's peer closed it (or sent what nobody asked for): its
    socket is readable. A zero-timeout poll, never a wait."""
    sock = _socket_of(client)
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _close_now(client: KafkaClient) -> None:
    """Close an idle connection without awaiting (nothing is in flight on it)."""
    sock = _socket_of(client)
    if sock is not None:
        sock.close()
