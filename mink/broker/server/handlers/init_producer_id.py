"""InitProducerId for idempotent producers (no transactional id): a producer id that was
never used before, at epoch 0; or, when the client names its current id and epoch (v3+,
KIP-360, how the Java client recovers from OUT_OF_ORDER_SEQUENCE_NUMBER), the next epoch.
With a transactional id the transaction coordinator answers (mink/broker/transactions/)."""

from __future__ import annotations

import trio
from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import WRITE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.transactions.producer_ids import WAIT_FOR_BLOCK_S, ProducerIdsUnavailable
from mink.protocol.messages import build, response_schema
from mink.storage.controlplane import MetadataError

MAX_EPOCH = 32767


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(22, ctx.header.api_version)

    def answer(error: ErrorCode, producer_id: int = -1, epoch: int = -1):
        return build(schema, throttle_time=NO_THROTTLE, error_code=error,
                     producer_id=producer_id, producer_epoch=epoch)

    authorizer = node.authorizer
    if request.transactional_id is not None:
        if not authorizer.transactional_id(ctx, WRITE, request.transactional_id):
            return answer(ErrorCode.transactional_id_authorization_failed)
    elif not authorizer.idempotent_write(ctx):  # KIP-679
        return answer(ErrorCode.cluster_authorization_failed)
    current_id = getattr(request, "producer_id", -1)
    current_epoch = getattr(request, "producer_epoch", -1)
    if request.transactional_id is not None:
        error, producer_id, epoch = await node.transactions.init_producer_id(
            request.transactional_id, int(request.transaction_timeout.total_seconds() * 1000),
            current_id, current_epoch)
        return answer(error, producer_id, epoch)
    try:
        if current_id >= 0 and current_epoch >= 0:
            with trio.move_on_after(WAIT_FOR_BLOCK_S) as waited:
                issued = await node.metadata.producer_id_issued(current_id)
            if waited.cancelled_caught:
                return answer(ErrorCode.coordinator_not_available)
            if not issued:
                return answer(ErrorCode.invalid_producer_id_mapping)
            if current_epoch + 1 < MAX_EPOCH:
                return answer(ErrorCode.none, current_id, current_epoch + 1)
        elif current_id >= 0 or current_epoch >= 0:
            return answer(ErrorCode.invalid_request)
        return answer(ErrorCode.none, await node.producer_ids.next_id(), 0)
    except (MetadataError, ProducerIdsUnavailable):
        # PostgreSQL cannot be asked now: retriable, so the producer tries again (a fatal
        # error would wedge an idempotent producer for good).
        return answer(ErrorCode.coordinator_not_available)
