"""SyncGroup: the leader sends the assignment; every member gets its own once it is stored."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import READ
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, response_schema


async def handle(node, ctx, request):
    version = ctx.header.api_version
    if not node.authorizer.group(ctx, READ, request.group_id):
        ctx.applied()
        return build(response_schema(ctx.header.api_key, version), throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed, protocol_type=None,
                     protocol_name=None, assignment=b"")
    waiter = node.groups.sync_group(
        request.group_id, request.generation_id, request.member_id,
        getattr(request, "protocol_type", None), getattr(request, "protocol_name", None),
        getattr(request, "group_instance_id", None),
        {a.member_id: bytes(a.assignment) for a in request.assignments})
    # The answer waits for the leader's assignment; the connection's next requests must not.
    ctx.applied()
    result = await waiter.wait()
    return build(response_schema(ctx.header.api_key, version), throttle_time=NO_THROTTLE,
                 error_code=result.error, protocol_type=result.protocol_type,
                 protocol_name=result.protocol_name, assignment=result.assignment)
