"""DescribeTransactions (KIP-664): the state of transactional ids this node coordinates,
read from PostgreSQL. DESCRIBE on each transactional id (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED for it), and a transaction's partitions are shown only
for topics the principal may describe, as Kafka's KafkaApis."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

import datetime

from mink.broker.security.authorizer import DESCRIBE
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.protocol.messages import build, nested, response_schema

# An error entry leaves the start time at the schema's default (0), as Kafka's does; a
# transaction not started (Empty) says -1, as Kafka's txnStartTimestamp.
_ERROR_TIME = 0


async def handle(node, ctx, request):
    ctx.applied()
    schema = response_schema(ctx.header.api_key, ctx.header.api_version)
    state_schema = nested(schema, "TransactionState")
    topic_schema = nested(schema, "TopicData")
    states = []
    allowed = [t for t in request.transactional_ids
               if node.authorizer.transactional_id(ctx, DESCRIBE, t)]
    described = await node.transactions.describe(allowed) if allowed else []
    described += [(t, ErrorCode.transactional_id_authorization_failed, None)
                  for t in request.transactional_ids if t not in allowed]
    for transactional_id, error, txn in described:
        if txn is None:
            states.append(build(state_schema, error_code=error,
                                transactional_id=transactional_id, transaction_state="",
                                transaction_timeout=datetime.timedelta(0),
                                transaction_start_time=_time(_ERROR_TIME), producer_id=-1,
                                producer_epoch=-1, topics=()))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, partition in txn.partitions:
            by_topic.setdefault(topic, []).append(partition)
        # only the partitions of topics the principal may describe, as Kafka's KafkaApis
        described = node.authorizer.topics(ctx, DESCRIBE, by_topic)
        by_topic = {t: p for t, p in by_topic.items() if t in described}
        states.append(build(
            state_schema, error_code=error, transactional_id=transactional_id,
            transaction_state=txn.state,
            transaction_timeout=datetime.timedelta(milliseconds=txn.timeout_ms),
            transaction_start_time=_time(txn.start_ms), producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            topics=tuple(build(topic_schema, topic=t, partitions=tuple(p))
                         for t, p in by_topic.items())))
    return build(schema, throttle_time=NO_THROTTLE, transaction_states=tuple(states))


def _time(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
