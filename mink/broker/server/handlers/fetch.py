"""Fetch: committed batches from the partitions' logs, long-polling on commits until
`min_bytes` are there or `max_wait` has passed. Fetch sessions are not kept: every answer
carries session id 0, which clients accept as "full fetch each time".

The consumer byte-rate quota as Kafka's KafkaApis applies it: a fetch reads at most what
the quota allows in its windows, its response's bytes are charged, and a fetch that passes
the quota is answered without records (the bytes unrecorded), throttled."""

from __future__ import annotations

import struct

import trio
from kio.schema.errors import ErrorCode

from mink.broker.server.errors import error_for
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.server.handlers.partitions import Located, check_leader_epoch, locate
from mink.broker.server.handlers.topic_ids import requested_topic
from mink.broker.transactions import read_committed
from mink.protocol.messages import build, nested, response_schema
from mink.storage.log import LogError


class _Read:
    __slots__ = ("topic", "topic_id", "request", "located", "error", "records", "size",
                 "aborted")

    def __init__(self, topic: str | None, topic_id, request, located):
        self.topic = topic
        self.topic_id = topic_id
        self.request = request
        self.located = located
        self.error = located.error
        self.records: list = []
        self.size = 0
        self.aborted: list = []  # read_committed: (producer id, first offset)


async def handle(node, ctx, request):
    ctx.applied()  # reads change nothing: later requests on the connection may start
    version = ctx.header.api_version
    reads = []
    for topic in request.topics:
        # v13+ (KIP-516) names the topic by id only
        name, topic_id, unknown = requested_topic(node.view, getattr(topic, "topic", None),
                                                  getattr(topic, "topic_id", None))
        for p in topic.partitions:
            located = Located(unknown) if unknown else locate(node, name, p.partition)
            read = _Read(name, topic_id, p, located)
            if located.log is not None:
                read.error = check_leader_epoch(p.current_leader_epoch, located.log)
            reads.append(read)
    deadline = trio.current_time() + request.max_wait.total_seconds()
    committed_only = request.isolation_level == read_committed.READ_COMMITTED
    quota = node.quotas.fetch
    user, client_id = ctx.principal.name, ctx.client_id
    max_bytes = request.max_bytes
    charged = bool(quota.limits) and not ctx.quota_exempt
    if charged:
        max_bytes = int(min(max_bytes, quota.max_value_in_window(user, client_id)))
    while True:
        total = await _read_all(reads, max_bytes, committed_only)
        if total >= request.min_bytes or trio.current_time() >= deadline or (
                any(r.error for r in reads)):
            break
        await _wait_for_commit(reads, deadline)
    if charged:
        now = trio.current_time()
        size = sum(r.size for r in reads)
        ctx.throttle = quota.record(user, client_id, size, now)
        if ctx.throttle > 0:  # Kafka's getThrottledResponse: no records, bytes unrecorded
            quota.unrecord(user, client_id, size, now)
            for read in reads:
                read.records, read.size = [], 0
    if committed_only:
        await _find_aborted(node, reads)
    return _response(node, version, reads, ctx.listener_name)


async def _find_aborted(node, reads: list[_Read]) -> None:
    """Transactions (KIP-98): the aborted transactions of each range returned."""
    for read in reads:
        if read.records and not read.error and read_committed.any_transactional(read.records):
            try:
                read.aborted = await read_committed.aborted_transactions(
                    node.transactions.store, read.located.log, read.request.fetch_offset,
                    read_committed.last_offset_of(read.records))
            except LogError as exc:
                read.error, read.records = error_for(exc), []


async def _read_all(reads: list[_Read], max_bytes: int, committed_only: bool = False) -> int:
    total = 0
    for read in reads:
        read.records, read.size = [], 0
        if read.error:
            continue
        budget = min(read.request.partition_max_bytes, max_bytes - total)
        if budget <= 0 and total > 0:
            continue  # the response is full; the first batch of a fetch is always sent
        try:
            read.records = await read.located.log.read(read.request.fetch_offset,
                                                       max(budget, 1))
        except LogError as exc:
            read.error = error_for(exc)
            continue
        if committed_only:  # read_committed: nothing at or past the last stable offset
            read.records = read_committed.below_stable_offset(
                read.records, read.located.log.last_stable_offset)
        read.size = sum(len(r) for r in read.records)
        total += read.size
    return total


async def _wait_for_commit(reads: list[_Read], deadline: float) -> None:
    woken = trio.Event()
    logs = [r.located.log for r in reads if r.located.log is not None]
    for partition_log in logs:
        partition_log.waiters.add(woken)
    try:
        with trio.move_on_at(deadline):
            await woken.wait()
    finally:
        for partition_log in logs:
            partition_log.waiters.discard(woken)


def _response(node, version: int, reads: list[_Read], listener: str | None = None):
    schema = response_schema(1, version)
    partition_schema = nested(schema, "PartitionData")
    aborted_schema = nested(schema, "AbortedTransaction")
    leader_schema = nested(schema, "LeaderIdAndEpoch") if version >= 12 else None
    topics: dict[tuple, list] = {}
    leaders: dict[int, object] = {}
    metrics = node.metrics
    for read in reads:
        partition_log = read.located.log
        if read.records and metrics.enabled:
            meters = metrics.topic(read.topic)
            meters.bytes_out.inc(read.size)
            meters.messages_out.inc(_records_in(read.records))
        elif read.error:
            metrics.request_error(1, version,
                                  getattr(read.error, "name", str(read.error)).upper())
        extra = {}
        if read.error and leader_schema is not None and read.located.partition is not None:
            p = read.located.partition
            if p.leader is not None:
                extra["current_leader"] = leader_schema(leader_id=p.leader,
                                                        leader_epoch=p.leader_epoch)
                leaders[p.leader] = node.view.brokers.get(p.leader)
        high_watermark = partition_log.high_watermark if partition_log is not None else -1
        stable = partition_log.last_stable_offset if partition_log is not None else -1
        topics.setdefault((read.topic, read.topic_id), []).append(build(
            partition_schema, partition_index=read.request.partition, error_code=read.error,
            high_watermark=high_watermark, last_stable_offset=stable,
            log_start_offset=partition_log.log_start_offset if partition_log else -1,
            aborted_transactions=tuple(aborted_schema(producer_id=pid, first_offset=first)
                                       for pid, first in read.aborted),
            preferred_read_replica=-1,
            records=b"".join(read.records) if read.records else b"", **extra))
    topic_schema = nested(schema, "FetchableTopicResponse")
    return build(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, session_id=0,
                 responses=tuple(build(topic_schema, topic=name, topic_id=topic_id,
                                       partitions=tuple(parts))
                                 for (name, topic_id), parts in topics.items()),
                 node_endpoints=_node_endpoints(schema, leaders, listener) if version >= 16 else ())


def _node_endpoints(schema, leaders: dict, listener: str | None = None) -> tuple:
    """v16+ (KIP-951): where the leaders named in `current_leader` listen (on the
    listener the request came in on)."""
    endpoint = nested(schema, "NodeEndpoint")
    return tuple(endpoint(node_id=b.node_id, host=b.endpoint(listener)[0],
                          port=b.endpoint(listener)[1], rack=b.rack)
                 for _, b in sorted(leaders.items()) if b is not None)


_BATCH_LENGTH = struct.Struct(">i")   # at byte 8 of a batch; the batch is 12 + length bytes
_RECORDS_COUNT = struct.Struct(">i")  # at byte 57 of a v2 batch header


def _records_in(views: list) -> int:
    """Records in the batches sent: one header read per batch, never per record."""
    count = 0
    for view in views:
        position, end = 0, len(view)
        while position + 61 <= end:
            (length,) = _BATCH_LENGTH.unpack_from(view, position + 8)
            (records,) = _RECORDS_COUNT.unpack_from(view, position + 57)
            count += records
            position += 12 + length
    return count
