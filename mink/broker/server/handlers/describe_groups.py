"""DescribeGroups: state, protocol and members (with metadata and assignment when Stable)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.groups.state import GroupState, GroupSummary
from mink.broker.security.authorizer import DESCRIBE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.security.operations import OMITTED
from mink.protocol.messages import build, nested, response_schema

DEAD = GroupState.DEAD.value


async def handle(node, ctx, request):
    ctx.applied()
    version = ctx.header.api_version
    schema = response_schema(ctx.header.api_key, version)
    group_schema = nested(schema, "DescribedGroup")
    member_schema = nested(schema, "DescribedGroupMember")
    described = []
    asked = bool(getattr(request, "include_authorized_operations", False))
    for group_id in request.groups:
        if not node.authorizer.group(ctx, DESCRIBE, group_id):
            described.append(build(
                group_schema, error_code=ErrorCode.group_authorization_failed,
                error_message=None, group_id=group_id, group_state="", protocol_type="",
                protocol_data="", authorized_operations=OMITTED, members=()))
            continue
        error, summary = node.groups.describe_group(group_id)
        message = None
        group_ops = node.authorizer.group_operations(ctx, group_id, asked)
        if version >= 6 and not error and summary.state == DEAD:
            # v6 (KIP-1043): a group that does not exist is an error, not a Dead group,
            # answered as Kafka's DescribeGroupsResponse.groupError
            error, message = ErrorCode.group_id_not_found, (
                f"Group {group_id} is not a classic group."
                if group_id in node.groups.consumer.groups else f"Group {group_id} not found.")
            summary, group_ops = GroupSummary("", "", "", []), OMITTED
        described.append(build(
            group_schema, error_code=error, error_message=message, group_id=group_id, group_state=summary.state,
            protocol_type=summary.protocol_type, protocol_data=summary.protocol_data,
            authorized_operations=group_ops,
            members=tuple(build(member_schema, member_id=m.member_id,
                                group_instance_id=m.group_instance_id, client_id=m.client_id,
                                client_host=m.client_host, member_metadata=m.metadata,
                                member_assignment=m.assignment)
                          for m in summary.members)))
    return build(schema, throttle_time=NO_THROTTLE, groups=tuple(described))
