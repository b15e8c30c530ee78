"""ListGroups: the groups this node coordinates (clients ask every node)."""

from __future__ import annotations

from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema


async def handle(node, ctx, request):
    ctx.applied()
    states = set(getattr(request, "states_filter", ()) or ())
    error, groups = node.groups.list_groups(states or None)
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    entry = nested(schema, "ListedGroup")
    return build(schema, throttle_time=NO_THROTTLE, error_code=error, groups=tuple(
        build(entry, group_id=group_id, protocol_type=protocol_type, group_state=state)
        for group_id, protocol_type, state in groups))
