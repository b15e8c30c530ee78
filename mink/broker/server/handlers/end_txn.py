"""EndTxn: commit or abort a producer's transaction; answered once the decision
(PrepareCommit / PrepareAbort) is durable in PostgreSQL, the markers follow."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import WRITE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, response_schema


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    if not node.authorizer.transactional_id(ctx, WRITE, request.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    else:
        error = await node.transactions.end_txn(request.transactional_id,
                                                request.producer_id, request.producer_epoch,
                                                request.committed)
    return build(schema, throttle_time=NO_THROTTLE, error_code=error)
