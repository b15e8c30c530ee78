"""FindCoordinator: the node coordinating a group (the leader of its partition of
__consumer_offsets) or a transactional id (the leader of its partition of
__transaction_state)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import DESCRIBE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema

GROUP, TRANSACTION = 0, 1


async def handle(node, ctx, request):
    ctx.applied()
    version = ctx.header.api_version
    schema = response_schema(ctx.header.api_key, version)
    key_type = getattr(request, "key_type", GROUP)
    if version >= 4:
        entry = nested(schema, "Coordinator")
        return build(schema, throttle_time=NO_THROTTLE, coordinators=tuple(
            build(entry, key=key, **_authorized_find(node, ctx, key, key_type))
            for key in request.coordinator_keys))
    return build(schema, throttle_time=NO_THROTTLE, **_authorized_find(node, ctx, request.key,
                                                                     key_type))


def _authorized_find(node, ctx, key: str, key_type: int) -> dict:
    """DESCRIBE on the group, or on the transactional id (Kafka's order: before looking)."""
    if key_type == GROUP and not node.authorizer.group(ctx, DESCRIBE, key):
        return _error(ErrorCode.group_authorization_failed, "Group authorization failed.")
    if key_type == TRANSACTION and not node.authorizer.transactional_id(ctx, DESCRIBE, key):
        return _error(ErrorCode.transactional_id_authorization_failed,
                      "Transactional Id authorization failed.")
    return _find(node, key, key_type, ctx.listener_name)


def _find(node, key: str, key_type: int, listener: str | None = None) -> dict:
    if key_type == TRANSACTION:
        error, broker = node.transactions.coordinator_for(key)
    elif key_type == GROUP:
        error, broker = node.groups.coordinator_for(key)
    else:
        return _error(ErrorCode.invalid_request, f"unknown coordinator key type {key_type}")
    if error:
        return _error(error, "the coordinator is not available")
    host, port = broker.endpoint(listener)  # the listener the request came in on
    return dict(error_code=ErrorCode.none, error_message=None, node_id=broker.node_id,
                host=host, port=port)


def _error(error: ErrorCode, message: str) -> dict:
    return dict(error_code=error, error_message=message, node_id=-1, host="", port=-1)
