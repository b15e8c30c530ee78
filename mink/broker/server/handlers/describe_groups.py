"""DescribeGroups: state, protocol and members (with metadata and assignment when Stable)."""

from __future__ import annotations

from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema

NO_AUTHORIZED_OPERATIONS = -(2**31)


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    group_schema = nested(schema, "DescribedGroup")
    member_schema = nested(schema, "DescribedGroupMember")
    described = []
    for group_id in request.groups:
        error, summary = node.groups.describe_group(group_id)
        described.append(build(
            group_schema, error_code=error, group_id=group_id, group_state=summary.state,
            protocol_type=summary.protocol_type, protocol_data=summary.protocol_data,
            authorized_operations=NO_AUTHORIZED_OPERATIONS,
            members=tuple(build(member_schema, member_id=m.member_id,
                                group_instance_id=m.group_instance_id, client_id=m.client_id,
                                client_host=m.client_host, member_metadata=m.metadata,
                                member_assignment=m.assignment)
                          for m in summary.members)))
    return build(schema, throttle_time=NO_THROTTLE, groups=tuple(described))
