"""AddOffsetsToTxn: a group's offsets join a producer's transaction (its partition of
__consumer_offsets becomes one of the transaction's partitions; TxnOffsetCommit follows)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import READ, WRITE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, response_schema


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    partition = node.transactions.group_partition(request.group_id)
    authorizer = node.authorizer
    if not authorizer.transactional_id(ctx, WRITE, request.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    elif not authorizer.group(ctx, READ, request.group_id):
        error = ErrorCode.group_authorization_failed
    elif partition is None:
        error = ErrorCode.coordinator_not_available
    else:
        error = await node.transactions.add_partitions(
            request.transactional_id, request.producer_id, request.producer_epoch,
            {partition})
    return build(schema, throttle_time=NO_THROTTLE, error_code=error)
