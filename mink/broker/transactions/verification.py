"""Server-side verification of transactional batches (KIP-890 part 1), for every client.

A transactional batch that does not continue its producer's ongoing transaction in the
partition is appended only if PostgreSQL lists the partition in the ongoing transaction of
that (producer id, epoch); otherwise the append answers INVALID_TXN_STATE. Without it, a
Produce delayed or retried past its transaction's abort would open a transaction nobody ends,
and the partition's last stable offset would never move again.

Produce calls `verify_transactional_batches` before its appends (which do not await); the
answer is left in each partition's producer state (`verified`), guarded against a marker
written while PostgreSQL was being asked.

When PostgreSQL cannot answer, nothing is known: the batch is refused with a retriable error,
never INVALID_TXN_STATE (which makes the client abort a transaction that may be fine). As
Kafka's ReplicaManager translates a verification that failed on the coordinator
(COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, ...), the answer is NOT_ENOUGH_REPLICAS: every
client retries it, and it does not make them refresh their metadata.
"""

from __future__ import annotations

import logging

import trio
from kio.schema.errors import ErrorCode

from mink.protocol.records import BatchError, parse_batch_header
from mink.storage.controlplane import MetadataError

log = logging.getLogger(__name__)

VERIFY_TIMEOUT_S = 5.0
UNVERIFIED = ErrorCode.not_enough_replicas


async def verify_transactional_batches(node, request) -> dict[tuple[str, int],
                                                               tuple[ErrorCode, str]]:
    """Verify the request's transactional batches that start a transaction in their
    partition; returns (topic, partition) -> (error, message) for the batches to refuse
    before appending because PostgreSQL could not tell (retriable)."""
    if request.transactional_id is None:
        return {}
    wanted: dict[tuple[int, int], list] = {}
    for topic_data in request.topic_data:
        topic = node.view.topics.get(topic_data.name)
        if topic is None:
            continue
        for data in topic_data.partition_data:
            if not 0 <= data.index < len(topic.partitions) or not data.records:
                continue
            partition_log = node.leader_log(topic, data.index)
            if partition_log is None:
                continue
            try:
                header = parse_batch_header(memoryview(data.records))
            except BatchError:
                continue  # the validator answers it
            if not header.is_transactional or header.producer_id < 0:
                continue
            key = (header.producer_id, header.producer_epoch)
            if partition_log.producers.in_transaction(*key):
                continue
            wanted.setdefault(key, []).append((topic_data.name, data.index, partition_log))
    unverified: dict[tuple[str, int], tuple[ErrorCode, str]] = {}
    for (producer_id, epoch), logs in wanted.items():
        guards = [(partition_log, object()) for _, _, partition_log in logs]
        for partition_log, guard in guards:
            partition_log.producers.guards[producer_id] = guard
        listed: set | None = None
        failure = "PostgreSQL did not answer"
        try:
            with trio.move_on_after(VERIFY_TIMEOUT_S):
                listed = await node.transactions.store.verify(
                    producer_id, epoch, [(p.topic_id, p.partition) for _, _, p in logs])
        except MetadataError as exc:
            failure = str(exc) or failure
        if listed is None:
            log.warning("verifying producer %d's transaction failed: %s", producer_id, failure)
            node.transactions.unverified_batches += len(logs)
            for name, index, _ in logs:
                unverified[name, index] = (
                    UNVERIFIED, f"Unable to verify the partition has been added to the "
                    f"transaction: {failure}")
        for partition_log, guard in guards:
            producers = partition_log.producers
            if producers.guards.get(producer_id) is guard:
                del producers.guards[producer_id]
                if listed is not None and (
                        partition_log.topic_id, partition_log.partition) in listed:
                    producers.verified[producer_id] = epoch
    return unverified
