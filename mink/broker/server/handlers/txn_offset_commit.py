"""TxnOffsetCommit (on the group's coordinator): offsets committed in a transaction, pending
until its decision, which makes them the group's committed offsets in the same PostgreSQL
transaction (see sql/0012_transactions.sql)."""

from __future__ import annotations

import trio
from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import READ, WRITE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema
from mink.storage import controlplane as md

WAIT_S = 5.0
_ERRORS = {"ok": ErrorCode.none, "not_coordinator": ErrorCode.not_coordinator,
           "producer_fenced": ErrorCode.producer_fenced,
           "invalid_producer_id_mapping": ErrorCode.invalid_producer_id_mapping,
           "invalid_txn_state": ErrorCode.invalid_txn_state}


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    topic_schema = nested(schema, "TxnOffsetCommitResponseTopic")
    partition_schema = nested(schema, "TxnOffsetCommitResponsePartition")
    error, fence = node.groups.transactional_fence(
        request.group_id, getattr(request, "generation_id", -1),
        getattr(request, "member_id", ""), getattr(request, "group_instance_id", None))
    offsets = [(t.name, p.partition_index, p.committed_offset,
                getattr(p, "committed_leader_epoch", -1), p.committed_metadata)
               for t in request.topics for p in t.partitions]
    authorizer = node.authorizer
    if not authorizer.transactional_id(ctx, WRITE, request.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    elif not authorizer.group(ctx, READ, request.group_id):
        error = ErrorCode.group_authorization_failed
    results = {(o[0], o[1]): error for o in offsets}
    if not error:
        allowed = authorizer.topics(ctx, READ, {o[0] for o in offsets})
        for name, index, *_ in offsets:
            if name not in allowed:
                results[(name, index)] = ErrorCode.topic_authorization_failed
        for name, index, *_ in offsets:
            info = node.view.topics.get(name)
            if results[(name, index)]:
                continue
            if info is None or not 0 <= index < len(info.partitions):
                results[(name, index)] = ErrorCode.unknown_topic_or_partition
        accepted = [o for o in offsets if not results[(o[0], o[1])]]
        try:
            with trio.fail_after(WAIT_S):
                outcome = await node.transactions.store.txn_offset_commit(
                    fence, request.transactional_id, request.producer_id,
                    request.producer_epoch, request.group_id, accepted)
            error = _ERRORS.get(outcome, ErrorCode.unknown_server_error)
        except (trio.TooSlowError, md.MetadataError):
            error = ErrorCode.coordinator_not_available
        for o in accepted:
            results[(o[0], o[1])] = error
    by_topic: dict[str, list] = {}
    for (name, index), e in results.items():
        by_topic.setdefault(name, []).append(build(partition_schema, partition_index=index,
                                                   error_code=e))
    return build(schema, throttle_time=NO_THROTTLE, topics=tuple(
        build(topic_schema, name=name, partitions=tuple(ps)) for name, ps in by_topic.items()))
