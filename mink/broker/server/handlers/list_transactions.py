"""ListTransactions (KIP-664): the transactional ids coordinated by this node's partitions
of __transaction_state, with the state, producer id and (v1) duration filters."""

from __future__ import annotations

from mink.broker.security.authorizer import DESCRIBE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    state_schema = nested(schema, "TransactionState")
    duration = getattr(request, "duration_filter", -1)
    error, unknown, rows = await node.transactions.list_transactions(
        list(request.state_filters), list(request.producer_id_filters), duration)
    return build(schema, throttle_time=NO_THROTTLE, error_code=error,
                 unknown_state_filters=tuple(unknown),
                 transaction_states=tuple(
                     build(state_schema, transactional_id=t, producer_id=pid,
                           transaction_state=state) for t, pid, state in rows
                     if node.authorizer.transactional_id(ctx, DESCRIBE, t)))
