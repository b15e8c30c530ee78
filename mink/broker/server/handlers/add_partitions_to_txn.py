"""AddPartitionsToTxn: partitions join a producer's transaction (v0-3, from producers), or
(v4-5, broker to broker in Kafka) several transactions' partitions are added or, with
verify_only, checked."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import WRITE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema
from mink.protocol.topics import INTERNAL_TOPICS


async def handle(node, ctx, request):
    ctx.applied()
    version = ctx.header.api_version
    schema = response_schema(ctx.header.api_key, version)
    topic_schema = nested(schema, "AddPartitionsToTxnTopicResult")
    partition_schema = nested(schema, "AddPartitionsToTxnPartitionResult")

    authorizer = node.authorizer

    async def one(transactional_id, producer_id, epoch, topics, verify_only=False):
        errors, known = _resolve(node, topics)
        if not authorizer.transactional_id(ctx, WRITE, transactional_id):
            errors = dict.fromkeys(errors, ErrorCode.transactional_id_authorization_failed)
        else:  # WRITE on each topic, asked before whether it exists (Kafka's order)
            allowed = authorizer.topics(ctx, WRITE, {name for name, _ in errors})
            errors = {k: e if k[0] in allowed else ErrorCode.topic_authorization_failed
                      for k, e in errors.items()}
        if not any(errors.values()):
            method = (node.transactions.verify_partitions if verify_only
                      else node.transactions.add_partitions)
            error = await method(transactional_id, producer_id, epoch, set(known.values()))
            errors = dict.fromkeys(errors, error)
        else:  # Kafka: the unknown ones get their error, the others OPERATION_NOT_ATTEMPTED
            errors = {k: e or ErrorCode.operation_not_attempted for k, e in errors.items()}
        by_topic: dict[str, list] = {}
        for (name, index), error in errors.items():
            by_topic.setdefault(name, []).append(
                build(partition_schema, partition_index=index, partition_error_code=error))
        return tuple(build(topic_schema, name=name, results_by_partition=tuple(results))
                     for name, results in by_topic.items())

    if version <= 3:
        results = await one(request.v3_and_below_transactional_id,
                            request.v3_and_below_producer_id,
                            request.v3_and_below_producer_epoch, request.v3_and_below_topics)
        return build(schema, throttle_time=NO_THROTTLE, results_by_topic_v3_and_below=results)
    result_schema = nested(schema, "AddPartitionsToTxnResult")
    results = []
    for txn in request.transactions:
        results.append(build(result_schema, transactional_id=txn.transactional_id,
                             topic_results=await one(txn.transactional_id, txn.producer_id,
                                                     txn.producer_epoch, txn.topics,
                                                     txn.verify_only)))
    return build(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                 results_by_transaction=tuple(results))


def _resolve(node, topics):
    """Per (topic, partition): its error (NONE when known) and (topic id, partition)."""
    errors, known = {}, {}
    for topic in topics:
        info = node.view.topics.get(topic.name)
        for index in topic.partitions:
            if info is None or not 0 <= index < len(info.partitions):
                errors[(topic.name, index)] = ErrorCode.unknown_topic_or_partition
            elif topic.name in INTERNAL_TOPICS:
                errors[(topic.name, index)] = ErrorCode.invalid_topic_exception
            else:
                errors[(topic.name, index)] = ErrorCode.none
                known[(topic.name, index)] = (info.topic_id, index)
    return errors, known
