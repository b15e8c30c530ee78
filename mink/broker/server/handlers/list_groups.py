"""ListGroups: the groups this node coordinates (clients ask every node).

v4 filters by state (KIP-518), v5 by type (KIP-848). Every Mink group is a classic group
(JoinGroup/SyncGroup; KIP-848's consumer groups are not served): a type filter without
"classic" lists nothing, as Kafka does for a type it has no group of."""

from __future__ import annotations

from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema

CLASSIC = "classic"


async def handle(node, ctx, request):
    ctx.applied()
    states = set(getattr(request, "states_filter", ()) or ())
    types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
    error, groups = node.groups.list_groups(states or None)
    if types and CLASSIC not in types:
        groups = []
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    entry = nested(schema, "ListedGroup")
    return build(schema, throttle_time=NO_THROTTLE, error_code=error, groups=tuple(
        build(entry, group_id=group_id, protocol_type=protocol_type, group_state=state,
              group_type=CLASSIC)
        for group_id, protocol_type, state in groups))
