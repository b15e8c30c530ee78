"""Forwarding coordinator actions (seed 000, "Coordinator action forwarded"): a request that
only the cluster coordinator may carry out is sent, as it came, to the coordinator's Kafka
listener, and its answer relayed. Forwarded requests are marked by their client id and are
never forwarded again."""

from __future__ import annotations

import datetime

import trio
from kio.index import load_request_schema

from mink.client import KafkaClient, KafkaClientError
from mink.protocol.messages import MalformedResponse, build, nested

FORWARDED_CLIENT_ID = "mink-forwarded"


class CoordinatorUnavailable(Exception):
    """No live coordinator, or it could not be reached: the client should retry."""


def is_forwarded(ctx) -> bool:
    return ctx.header.client_id == FORWARDED_CLIENT_ID


async def forward_unless_coordinator(node, ctx, request):
    """The coordinator's answer to `request` when this node is not the coordinator; None
    when this node is (or no coordinator can be reached: the handler then answers
    NOT_CONTROLLER, and the client retries after refreshing its metadata)."""
    if node.coordinator.is_holder or is_forwarded(ctx):
        return None
    ctx.applied()
    try:
        return await forward(node, ctx.header.api_key, ctx.header.api_version, request)
    except CoordinatorUnavailable:
        return None


async def forward(node, api_key: int, api_version: int, body, timeout: float = 30.0):
    """Send `body` to the coordinator node; returns its decoded response body."""
    view = node.view
    target = view.brokers.get(view.coordinator) if view.coordinator is not None else None
    if target is None or target.node_id == node.node_id:
        raise CoordinatorUnavailable("no live cluster coordinator")
    try:
        with trio.fail_after(timeout):
            async with await KafkaClient.connect(
                    f"{target.host}:{target.port}", client_id=FORWARDED_CLIENT_ID,
                    security=node.inter_broker_security) as client:
                return await client.call(api_key, api_version, body)
    except (OSError, EOFError, trio.TooSlowError, KafkaClientError,
            MalformedResponse) as exc:
        raise CoordinatorUnavailable(f"coordinator {target.node_id} unreachable: {exc}") from None


async def auto_create_via_coordinator(node, names: list[str]) -> None:
    """Topic auto-creation on a node that is not the coordinator: a CreateTopics request
    with the broker defaults, sent to the coordinator. Errors (the topic exists, no
    coordinator) are left for the client's retry to find."""
    schema = load_request_schema(19, 5)
    topic_schema = nested(schema, "CreatableTopic")
    body = build(schema, topics=tuple(
        build(topic_schema, name=name, num_partitions=-1, replication_factor=-1,
              assignments=(), configs=()) for name in names),
        timeout=datetime.timedelta(seconds=30), validate_only=False)
    try:
        await forward(node, 19, 5, body)
    except CoordinatorUnavailable:
        pass
