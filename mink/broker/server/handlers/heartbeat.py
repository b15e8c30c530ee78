"""Heartbeat: keeps a member's session alive; REBALANCE_IN_PROGRESS tells it to rejoin."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import READ
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, response_schema


async def handle(node, ctx, request):
    if not node.authorizer.group(ctx, READ, request.group_id):
        ctx.applied()
        return build(response_schema(ctx.header.api_key, ctx.header.api_version),
                     throttle_time=NO_THROTTLE, error_code=ErrorCode.group_authorization_failed)
    error = node.groups.heartbeat(request.group_id, request.member_id,
                                  getattr(request, "group_instance_id", None),
                                  request.generation_id)
    ctx.applied()
    return build(response_schema(ctx.header.api_key, ctx.header.api_version),
                 throttle_time=NO_THROTTLE, error_code=error)
