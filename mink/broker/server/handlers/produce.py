"""Produce: validate each partition's batch, append it to the WAL in arrival order, and
answer once it is in the object store and committed (acks=1 and acks=all alike).

Partitions another node leads are forwarded to it (`produce_forwarding.py`) unless the
request arrived in an Envelope or `produce_forwarding` is off; their answers are merged
into this response in the request's order."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time

import trio
from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import WRITE
from mink.broker.server.errors import CloseConnection, error_for
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.server.produce_forwarding import Forwarded, Remote
from mink.broker.topics.config import is_compacted, topic_setting
from mink.broker.transactions.verification import verify_transactional_batches
from mink.protocol.messages import build, nested, response_schema
from mink.protocol.log_validator import (
    Refusal,
    ValidationSettings,
    decompressed_size_limit,
    validate_produce_records,
)
from mink.protocol.recompression import target_codec
from mink.protocol.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    BatchError,
    BatchHeader,
    parse_batch_header,
    write_batch_header,
)
from mink.protocol.topics import INTERNAL_TOPICS
from mink.storage.log import DuplicateBatch, LogError, NotLeader
from mink.storage.producer_state import ProducerAppend

OPENING_WAIT = 5.0  # seconds, at most, a Produce waits for a partition moving here

log = logging.getLogger(__name__)


class _PartitionResult:
    __slots__ = ("index", "error", "pending", "base_offset", "log_append_time",
                 "log_start_offset", "leader", "message", "record_errors", "forwarded",
                 "moved", "sent_header")

    def __init__(self, index: int):
        self.index = index
        self.error = ErrorCode.none
        self.pending = None
        self.base_offset = -1
        self.log_append_time = None
        self.log_start_offset = -1
        self.leader = None
        self.message = None
        self.record_errors = ()
        self.forwarded = False  # sent to its leader: answered by it (produce_forwarding)
        self.moved = False  # appended here, then refused as the partition moved: not written
        # The batch header as the client sent it: the batch may be patched where it lies in
        # the request (max timestamp, base offset, leader epoch), and a moved part is
        # forwarded as sent.
        self.sent_header: BatchHeader | None = None


async def handle(node, ctx, request):
    version = ctx.header.api_version

    def refuse_all(error: ErrorCode, message: str | None = None):
        results = {t.name: [_refused(p.index, error, message) for p in t.partition_data]
                   for t in request.topic_data}
        ctx.applied()
        _remember_not_written(node, request, results)
        if request.acks == 0:
            raise CloseConnection(message or error.name)
        return _response(node, version, results, ctx.listener_name)

    if request.acks not in (-1, 0, 1):
        return refuse_all(ErrorCode.invalid_required_acks)
    authorizer = node.authorizer
    if request.transactional_id is not None and not authorizer.transactional_id(
            ctx, WRITE, request.transactional_id):
        return refuse_all(ErrorCode.transactional_id_authorization_failed)
    # WRITE on each topic, asked before whether it exists (Kafka's order)
    denied = {t.name for t in request.topic_data} - authorizer.topics(
        ctx, WRITE, (t.name for t in request.topic_data))
    deadline = trio.current_time() + request.timeout.total_seconds()
    if node.config.auto_create_topics_enable:
        await node.topic_admin.auto_create_topics([
            t.name for t in request.topic_data if t.name not in node.view.topics
            and t.name not in denied and authorizer.may_create_topic(ctx, t.name)], ctx)
    streams = node.streams
    if streams is None or not node.membership.may_lead():
        return refuse_all(ErrorCode.not_leader_or_follower, "this node is not leading")
    try:
        if not streams.wal.has_room:  # a deadline's cancel scope only when it may wait
            with trio.fail_at(deadline):
                await streams.wal.wait_for_room()
    except trio.TooSlowError:
        return refuse_all(ErrorCode.request_timed_out, "the WAL stayed full")
    except LogError as exc:
        return refuse_all(error_for(exc), str(exc))
    if node.config.produce_forwarding:
        await _wait_for_opening(node, ctx, request, denied, deadline)
    # KIP-890: transactional batches starting a transaction here are checked first.
    unverified = await verify_transactional_batches(node, request)
    # From here to ctx.applied() nothing awaits: offsets follow the arrival order.
    transactional = request.transactional_id is not None
    # partitions another node leads, to forward (never for a request already forwarded)
    remote = [] if node.config.produce_forwarding and ctx.envelope is None else None
    results = {t.name: [_refused(p.index, ErrorCode.topic_authorization_failed)
                        if t.name in denied else
                        _refused(p.index, *unverified[t.name, p.index])
                        if (t.name, p.index) in unverified else
                        _append(node, t.name, p, version, transactional, remote, position)
                        for p in t.partition_data]
               for position, t in enumerate(request.topic_data)}
    forwarded = None
    if remote:  # queued for their leaders in arrival order, before the next request starts
        forwarded = Forwarded(node, ctx, request, remote)
        forwarded.try_dispatch()  # else after ctx.applied(), the next requests behind it
    appended = None
    if remote is not None and request.acks != 0:
        appended = _appending(ctx, results)
    ctx.applied()
    _log_too_large(ctx, results)

    if request.acks == 0:
        if any(r.error and not r.forwarded for rs in results.values() for r in rs):
            raise CloseConnection("acks=0 produce failed; the client must refresh metadata")
        if forwarded is not None and not await forwarded.settle():
            raise CloseConnection("acks=0 produce forwarded and refused; the client must "
                                  "refresh metadata")
        return None
    if forwarded is not None and not forwarded.queued.is_set():
        await forwarded.dispatch_late()  # before waiting for the local partitions
    for partition_results in results.values():
        for result in partition_results:
            if result.pending is not None:
                timeout = max(0.0, deadline - trio.current_time())
                try:
                    if isinstance(result.pending, DuplicateBatch):
                        result.base_offset = await result.pending.base_offset(timeout)
                    else:
                        result.base_offset = await result.pending.wait(timeout)
                except LogError as exc:
                    result.error = error_for(exc)
                    result.message = str(exc)
                    result.moved = isinstance(exc, NotLeader)
    if appended is not None:
        await _forward_moved(node, ctx, request, results, appended, deadline)
    if forwarded is not None:
        await forwarded.settle()
    _remember_not_written(node, request, results)
    return _response(node, version, results, ctx.listener_name)


async def _wait_for_opening(node, ctx, request, denied: set, deadline: float) -> None:
    """Partitions moving here are waited for, bounded by the request's timeout (and
    OPENING_WAIT), rather than answered NOT_LEADER_OR_FOLLOWER: with forwarding a client is
    never told to look elsewhere while a partition moves (issue 25). Waited for: a partition
    the view says this node leads that is still opening, and a part forwarded here that this
    node does not lead yet (the forwarder saw the move first). Nothing else is waited for:
    another node's partitions are forwarded, and Kafka's answers stand without forwarding."""
    def opening() -> bool:
        view = node.view
        for t in request.topic_data:
            topic = view.topics.get(t.name)
            if topic is None or t.name in denied:
                continue
            for p in t.partition_data:
                if not 0 <= p.index < len(topic.partitions) or node.leader_log(
                        topic, p.index) is not None:
                    continue
                if ctx.envelope is not None or topic.partitions[p.index].leader == node.node_id:
                    return True
        return False

    if not opening():  # the common case, without a cancel scope
        return
    with trio.move_on_at(min(deadline, trio.current_time() + OPENING_WAIT)):
        while opening():
            await node.sync.wait_for_change()


def _appending(ctx, results: dict[str, list[_PartitionResult]]):
    """Mark the partitions this request appended to here on its connection: a later
    request's parts for them, forwarded if they move, wait for this one (`_forward_moved`).
    Returns (this request's event, the earlier requests' events it took the place of), or
    None when it appended nothing here."""
    appending = ctx.connection.appending
    done = None
    earlier = []
    for name, partition_results in results.items():
        for result in partition_results:
            if result.pending is not None and not isinstance(result.pending, DuplicateBatch):
                if done is None:
                    done = trio.Event()
                previous = appending.get((name, result.index))
                if previous is not None and not previous.is_set():
                    earlier.append(previous)
                appending[name, result.index] = done
    return None if done is None else (done, tuple(earlier))


async def _forward_moved(node, ctx, request, results: dict[str, list[_PartitionResult]],
                         appending: tuple, deadline: float) -> None:
    """Appends refused because their partition moved away meanwhile (not written:
    NotLeader) are forwarded to the new leader, before the connection's later requests'
    parts for those partitions (and after the earlier requests' own moved parts),
    instead of answering NOT_LEADER_OR_FOLLOWER."""
    appended, earlier = appending
    try:
        moved = [Remote(position, t.name, _as_sent(data, result), result)
                 for position, t in enumerate(request.topic_data)
                 for data, result in zip(t.partition_data, results.get(t.name, ()),
                                         strict=False) if result.moved]
        if not moved:
            return
        again = Forwarded(node, ctx, request, moved, moved=True, after=earlier,
                          deadline=deadline)
        for item in moved:
            item.result.forwarded = True
        await again.dispatch_late()
    finally:
        appended.set()
        marks = ctx.connection.appending
        for key in [k for k, event in marks.items() if event is appended]:
            del marks[key]
    await again.settle()


def _as_sent(data, result: _PartitionResult):
    """A partition's data as the client sent it, before this node patched its batch."""
    if result.sent_header is None:
        return data
    records = bytearray(data.records)
    write_batch_header(records, result.sent_header)
    return dataclasses.replace(data, records=records)


# Errors that say "not written, retry": what a batch pipelined behind one is told too.
_NOT_WRITTEN = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error,
                          ErrorCode.not_enough_replicas})  # the last: KIP-890 unverified


def _remember_not_written(node, request, results: dict[str, list[_PartitionResult]]) -> None:
    """Idempotent batches answered as not written, remembered so that a batch pipelined
    behind one of them is answered retriably rather than OUT_OF_ORDER_SEQUENCE_NUMBER
    (`RefusedSequences` says why). Covers the refusals no partition log saw (not leading,
    still opening)."""
    refused = node.refused_sequences
    for t in request.topic_data:
        topic = node.view.topics.get(t.name)
        if topic is None:
            continue
        for data, result in zip(t.partition_data, results.get(t.name, ()), strict=False):
            if result.error not in _NOT_WRITTEN or not data.records:
                continue
            try:
                header = parse_batch_header(data.records)
            except BatchError:  # not a v2 batch: no producer to remember
                continue
            if header.producer_id >= 0:
                refused.refused(topic.topic_id, data.index, ProducerAppend(
                    header.producer_id, header.producer_epoch, header.base_sequence,
                    header.last_sequence))


def _log_too_large(ctx, results: dict[str, list[_PartitionResult]]) -> None:
    """One line per request that had batches refused as too large (oversized, or a
    decompression bomb): the operator sees which client, the client gets MESSAGE_TOO_LARGE."""
    refused = [(name, r) for name, rs in results.items() for r in rs
               if r.error == ErrorCode.message_too_large]
    if refused:
        name, first = refused[0]
        log.warning("produce from client %r: %d batch(es) refused as too large, first %s-%d: %s",
                    ctx.header.client_id, len(refused), name, first.index, first.message)


def _refused(index: int, error: ErrorCode, message: str | None = None) -> _PartitionResult:
    result = _PartitionResult(index)
    result.error = error
    result.message = message
    return result


def _append(node, name: str, data, version: int, transactional: bool = False,
            remote: list | None = None, position: int = 0) -> _PartitionResult:
    topic = node.view.topics.get(name)
    if topic is None or not 0 <= data.index < len(topic.partitions):
        return _refused(data.index, ErrorCode.unknown_topic_or_partition)
    if name in INTERNAL_TOPICS:
        return _refused(data.index, ErrorCode.invalid_topic_exception,
                        f"{name} is internal: clients cannot produce to it")
    partition_log = node.leader_log(topic, data.index)
    if partition_log is None:
        result = _refused(data.index, ErrorCode.not_leader_or_follower)
        result.leader = topic.partitions[data.index]
        if remote is not None and topic.partitions[data.index].leader != node.node_id:
            result.forwarded = True  # its leader answers (produce_forwarding)
            remote.append(Remote(position, name, data, result))
        return result
    if not data.records:
        return _refused(data.index, ErrorCode.invalid_record, "no record batch")
    validated = validate_produce_records(data.records, version,
                                         _settings(node, topic.config, transactional))
    if isinstance(validated, Refusal):
        result = _refused(data.index, ErrorCode(validated.error_code), validated.message)
        result.record_errors = validated.record_errors
        return result
    header = validated.header
    result = _PartitionResult(data.index)
    result.sent_header = header
    if validated.log_append_time is not None:
        result.log_append_time = datetime.datetime.fromtimestamp(
            validated.log_append_time / 1000, datetime.timezone.utc)
    producer = None
    if header.producer_id >= 0:
        producer = ProducerAppend(header.producer_id, header.producer_epoch,
                                  header.base_sequence, header.last_sequence,
                                  transactional=header.is_transactional)
    try:
        result.pending = partition_log.append(validated.batch, [header.records_count],
                                              validated.max_timestamp, producer)
    except DuplicateBatch as exc:
        # A retry of a batch already written (or still in flight): its original offset,
        # nothing written again.
        result.pending = exc
    except LogError as exc:
        return _refused(data.index, error_for(exc), str(exc))
    result.log_start_offset = partition_log.log_start_offset
    meters = node.metrics.topic(name)
    meters.bytes_in.inc(len(validated.batch))
    meters.messages_in.inc(header.records_count)
    return result


def _settings(node, config: dict, transactional: bool = False) -> ValidationSettings:
    """What the LogValidator needs from the topic's settings and the broker's clock."""
    append_time = topic_setting(config, "message.timestamp.type") == "LogAppendTime"
    max_message_bytes = topic_setting(config, "max.message.bytes")
    return ValidationSettings(
        now_ms=int(time.time() * 1000),
        timestamp_type=LOG_APPEND_TIME if append_time else CREATE_TIME,
        timestamp_before_max_ms=topic_setting(config, "message.timestamp.before.max.ms"),
        timestamp_after_max_ms=topic_setting(config, "message.timestamp.after.max.ms"),
        max_message_bytes=max_message_bytes,
        max_decompressed_bytes=decompressed_size_limit(max_message_bytes),
        compacted=is_compacted(config),  # every record needs a key (INVALID_RECORD)
        validate_records=node.config.produce_validate_records,
        transactional_id=transactional,
        target_compression=target_codec(config.get("compression.type")))


def _response(node, version: int, results: dict[str, list[_PartitionResult]],
              listener: str | None = None):
    schema = response_schema(0, version)
    topic_schema = nested(schema, "TopicProduceResponse")
    partition_schema = nested(schema, "PartitionProduceResponse")
    leader_schema = nested(schema, "LeaderIdAndEpoch") if version >= 10 else None
    record_error_schema = nested(schema, "BatchIndexAndErrorMessage") if version >= 8 else None
    leaders: set[int] = set()
    topics = []
    metrics = node.metrics
    for name, partition_results in results.items():
        partitions = []
        for r in partition_results:
            if r.error:
                metrics.request_error(0, version, r.error.name.upper())
            base_offset = r.base_offset if not r.error else -1
            extra = {}
            if leader_schema is not None and r.leader is not None and r.leader.leader is not None:
                extra["current_leader"] = leader_schema(leader_id=r.leader.leader,
                                                        leader_epoch=r.leader.leader_epoch)
                leaders.add(r.leader.leader)
            partitions.append(build(
                partition_schema, index=r.index, error_code=r.error, base_offset=base_offset,
                log_append_time=r.log_append_time if not r.error else None,
                log_start_offset=r.log_start_offset,
                record_errors=_record_errors(record_error_schema, r.record_errors),
                error_message=r.message if r.error else None, **extra))
        topics.append(topic_schema(name=name, partition_responses=tuple(partitions)))
    endpoints = ()
    if version >= 10 and leaders:
        endpoint_schema = nested(schema, "NodeEndpoint")
        endpoints = tuple(endpoint_schema(node_id=b.node_id, host=b.endpoint(listener)[0],
                                          port=b.endpoint(listener)[1], rack=b.rack)
                          for b in (node.view.brokers.get(i) for i in sorted(leaders)) if b)
    return build(schema, responses=tuple(topics), throttle_time=NO_THROTTLE,
                 node_endpoints=endpoints)


def _record_errors(schema, errors) -> tuple:
    """KIP-467 record errors (Produce v8+)."""
    if schema is None or not errors:
        return ()
    return tuple(schema(batch_index=e.batch_index, batch_index_error_message=e.message)
                 for e in errors)
