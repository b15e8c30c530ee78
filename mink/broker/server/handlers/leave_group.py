"""LeaveGroup: one member (v0-2) or a batch of members (v3+) leave the group."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import READ
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema


async def handle(node, ctx, request):
    version = ctx.header.api_version
    if version >= 3:
        leaving = [(m.member_id, m.group_instance_id) for m in request.members]
    else:
        leaving = [(request.member_id, None)]
    if not node.authorizer.group(ctx, READ, request.group_id):
        error, member_errors = ErrorCode.group_authorization_failed, []
    else:
        error, member_errors = node.groups.leave_group(request.group_id, leaving)
    ctx.applied()
    schema = response_schema(ctx.header.api_key, version)
    if version < 3:
        if error == ErrorCode.none and member_errors:
            error = member_errors[0]
        return build(schema, throttle_time=NO_THROTTLE, error_code=error)
    member_schema = nested(schema, "MemberResponse")
    return build(schema, throttle_time=NO_THROTTLE, error_code=error, members=tuple(
        build(member_schema, member_id=member_id, group_instance_id=instance_id,
              error_code=member_error)
        for (member_id, instance_id), member_error in zip(leaving, member_errors)))
