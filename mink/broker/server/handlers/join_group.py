"""JoinGroup: answered once the group's rebalance completes (or at once with an error)."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import READ
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema

MS = datetime.timedelta(milliseconds=1)


def client_host(ctx) -> str:
    """Kafka's form: "/" and the client's address (the original client's for a request
    forwarded in an Envelope)."""
    return "/" + ctx.client_host


async def handle(node, ctx, request):
    version = ctx.header.api_version
    session_timeout_ms = request.session_timeout // MS
    rebalance_timeout_ms = (request.rebalance_timeout // MS if version >= 1
                            else session_timeout_ms)
    if not node.authorizer.group(ctx, READ, request.group_id):
        ctx.applied()
        return build(response_schema(ctx.header.api_key, version), throttle_time=NO_THROTTLE,
                     error_code=ErrorCode.group_authorization_failed, generation_id=-1,
                     protocol_type=None, protocol_name=None if version >= 7 else "",
                     leader="", member_id=request.member_id, members=())
    waiter = node.groups.join_group(
        request.group_id, request.member_id, getattr(request, "group_instance_id", None),
        require_known_member_id=version >= 4, client_id=ctx.header.client_id or "",
        client_host=client_host(ctx), rebalance_timeout_ms=rebalance_timeout_ms,
        session_timeout_ms=session_timeout_ms, protocol_type=request.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in request.protocols])
    # The answer waits for the rebalance; the connection's next requests must not.
    ctx.applied()
    result = await waiter.wait()
    schema = response_schema(ctx.header.api_key, version)
    member_schema = nested(schema, "JoinGroupResponseMember")
    return build(
        schema, throttle_time=NO_THROTTLE, error_code=result.error,
        generation_id=result.generation, protocol_type=result.protocol_type,
        protocol_name=(result.protocol_name if version >= 7 else result.protocol_name or ""),
        leader=result.leader, member_id=result.member_id,
        members=tuple(build(member_schema, member_id=member_id, group_instance_id=instance_id,
                            metadata=metadata)
                      for member_id, instance_id, metadata in result.members))
