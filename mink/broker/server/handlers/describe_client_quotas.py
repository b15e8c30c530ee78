"""DescribeClientQuotas (API 48, KIP-546): the stored quotas of the entities a filter
matches, from the node's copy (read from PostgreSQL whenever the view moves).

Filter components name an entity type and match a name exactly (0), the default (1) or
any name or the default (2); `strict` leaves out entities with other parts. A bad filter
(unknown entity type, a type twice, an exact match without a name) is INVALID_REQUEST.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.quotas.entities import (
    InvalidQuota,
    entity_components,
    matches,
    parse_filter,
)
from mink.broker.security.authorizer import DESCRIBE_CONFIGS
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    if not node.authorizer.cluster(ctx, DESCRIBE_CONFIGS):
        return build(schema, throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.cluster_authorization_failed,
                     error_message="Cluster authorization failed.", entries=None)
    try:
        wanted = parse_filter((c.entity_type, int(c.match_type), c.match)
                              for c in request.components)
    except InvalidQuota as exc:
        return build(schema, throttle_time=NO_THROTTLE, error_code=exc.code,
                     error_message=str(exc), entries=None)
    entry_schema = nested(schema, "EntryData")
    entity_schema = nested(schema, "EntityData")
    value_schema = nested(schema, "ValueData")
    entries = []
    for entity, values in sorted(node.quotas.entities.items()):
        if not values or not matches(entity, wanted, bool(request.strict)):
            continue
        entries.append(entry_schema(
            entity=tuple(entity_schema(entity_type=t, entity_name=n)
                         for t, n in entity_components(entity)),
            values=tuple(value_schema(key=k, value=v) for k, v in sorted(values.items()))))
    return build(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                 error_message=None, entries=tuple(entries))
