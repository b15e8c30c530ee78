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
"""

from __future__ import annotations

import datetime
import logging
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
