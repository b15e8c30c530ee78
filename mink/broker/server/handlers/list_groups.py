"""ListGroups: the groups this node coordinates (clients ask every node).

v4 filters by state (KIP-518), v5 by type (KIP-848): "classic" groups (JoinGroup/SyncGroup)
and "consumer" groups (ConsumerGroupHeartbeat), whose protocol type is "consumer"."""

from __future__ import annotations

from mink.broker.security.authorizer import DESCRIBE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema

CLASSIC = "classic"
CONSUMER = "consumer"


async def handle(node, ctx, request):
    ctx.applied()
    states = set(getattr(request, "states_filter", ()) or ())
    types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
    error, groups = node.groups.list_groups(states or None)
    listed = [] if types and CLASSIC not in types else [(*g, CLASSIC) for g in groups]
    if not types or CONSUMER in types:
        listed += [(*g, CONSUMER) for g in node.groups.consumer.list_groups(states or None)]
    # DESCRIBE on the cluster lists every group; otherwise the groups the principal describes
    authorizer = node.authorizer
    if not authorizer.cluster(ctx, DESCRIBE):
        listed = [g for g in listed if authorizer.group(ctx, DESCRIBE, g[0])]
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    entry = nested(schema, "ListedGroup")
    return build(schema, throttle_time=NO_THROTTLE, error_code=error, groups=tuple(
        build(entry, group_id=group_id, protocol_type=protocol_type, group_state=state,
              group_type=group_type)
        for group_id, protocol_type, state, group_type in sorted(listed)))
