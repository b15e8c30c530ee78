"""DeleteGroups: empty groups and their committed offsets (NON_EMPTY_GROUP otherwise)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import DELETE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema


async def handle(node, ctx, request):
    names = list(dict.fromkeys(request.groups_names))
    allowed = [n for n in names if node.authorizer.group(ctx, DELETE, n)]
    results = await node.groups.delete_groups(allowed) if allowed else {}
    results = {n: results.get(n, ErrorCode.group_authorization_failed) for n in names}
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    entry = nested(schema, "DeletableGroupResult")
    return build(schema, throttle_time=NO_THROTTLE, results=tuple(
        build(entry, group_id=name, error_code=results[name]) for name in names))
